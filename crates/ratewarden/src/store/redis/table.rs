//! Shared tables: a hash and its version counter (one slot: the table's
//! name is their hash tag), read whole only when the version moved; what
//! every gateway of a fleet reads alike (runtime overrides).

use super::*;

/// Whether `e` says the server has no Functions (`FCALL` unknown: before
/// Redis 7, or a server that only speaks scripts).
/// A shared table and its version, read in one atomic call.
pub(super) const TABLE_LOAD: &str =
    "return {redis.call('GET', KEYS[2]), redis.call('HGETALL', KEYS[1])}";

/// Sets a field within the table's bound, moving its version.
pub(super) const TABLE_PUT: &str = "if redis.call('HEXISTS', KEYS[1], ARGV[1]) == 0 and \
redis.call('HLEN', KEYS[1]) >= tonumber(ARGV[3]) then return 0 end \
redis.call('HSET', KEYS[1], ARGV[1], ARGV[2]) redis.call('INCR', KEYS[2]) return 1";

/// Removes a field, moving the version when it was there.
pub(super) const TABLE_DELETE: &str = "local n = redis.call('HDEL', KEYS[1], ARGV[1]) \
if n > 0 then redis.call('INCR', KEYS[2]) end return n";

impl RedisStore {
    /// The hash and version keys of a shared table named `name` (one hash
    /// slot on a cluster: the name is their hash tag).
    pub(super) fn table_keys(&self, name: &str) -> (String, String) {
        let p = &self.inner.config.key_prefix;
        (format!("{p}{{{name}}}"), format!("{p}{{{name}}}:v"))
    }

    /// A shared table's version: a counter every change moves (0 before
    /// the first). Reading it is how gateways learn of a change without
    /// reading the table (one small GET).
    pub async fn table_version(&self, name: &str) -> Result<u64, StoreError> {
        let (_, v) = self.table_keys(name);
        let got: Option<u64> = self.command(redis::cmd("GET").arg(v).clone()).await?;
        Ok(got.unwrap_or(0))
    }

    /// A shared table whole, with its version, read atomically.
    pub async fn table_load(&self, name: &str) -> Result<(u64, Vec<(String, String)>), StoreError> {
        let (h, v) = self.table_keys(name);
        let mut cmd = redis::cmd("EVAL");
        cmd.arg(TABLE_LOAD).arg(2).arg(h).arg(v);
        let (version, flat): (Option<u64>, Vec<String>) = self.command(cmd).await?;
        let mut out = Vec::with_capacity(flat.len() / 2);
        let mut it = flat.into_iter();
        while let (Some(f), Some(val)) = (it.next(), it.next()) {
            out.push((f, val));
        }
        Ok((version.unwrap_or(0), out))
    }

    /// Sets `field` of a shared table to `value` unless the table holds
    /// `max` fields already and `field` is not one of them; moves the
    /// version. `false`: the table is full.
    pub async fn table_put(
        &self,
        name: &str,
        field: &str,
        value: &str,
        max: usize,
    ) -> Result<bool, StoreError> {
        let (h, v) = self.table_keys(name);
        let mut cmd = redis::cmd("EVAL");
        cmd.arg(TABLE_PUT)
            .arg(2)
            .arg(h)
            .arg(v)
            .arg(field)
            .arg(value)
            .arg(max);
        let done: i64 = self.command(cmd).await?;
        Ok(done == 1)
    }

    /// Removes `field` of a shared table (moving the version when it was
    /// there); whether it was.
    pub async fn table_delete(&self, name: &str, field: &str) -> Result<bool, StoreError> {
        let (h, v) = self.table_keys(name);
        let mut cmd = redis::cmd("EVAL");
        cmd.arg(TABLE_DELETE).arg(2).arg(h).arg(v).arg(field);
        let n: i64 = self.command(cmd).await?;
        Ok(n > 0)
    }
}
