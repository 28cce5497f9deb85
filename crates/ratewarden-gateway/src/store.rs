//! The store the gateway runs on, chosen by `store.type`.

use std::sync::Arc;

use ratewarden::clock::Clock;
use ratewarden::store::lease::{Ask, Grant, Leased};
use ratewarden::store::redis::{RedisConfig, RedisStore};
use ratewarden::store::{Scanned, Shared};
use ratewarden::{Fallback, KeyInfo, MemoryStore, Mode, Op, Settle, Store, StoreError, Verdict};

use crate::config::StoreSpec;

/// Memory or Redis (with its `on_error` fallback).
#[derive(Debug, Clone)]
pub enum AnyStore {
    /// In-process.
    Memory(MemoryStore),
    /// Redis, falling back per `on_error`, its leased rules answered from
    /// slices ([`Leased`]).
    Redis(Arc<Leased<Fallback<RedisStore>>>),
}

impl AnyStore {
    /// The store a spec describes; `clock` replaces the system clock of a
    /// memory store (tests).
    pub fn new(spec: &StoreSpec, clock: Option<Arc<dyn Clock>>) -> Result<Self, StoreError> {
        Ok(match spec {
            StoreSpec::Memory { max_keys } => {
                let b = MemoryStore::builder().max_keys(*max_keys);
                AnyStore::Memory(match clock {
                    Some(c) => b.clock(c).build(),
                    None => b.build(),
                })
            }
            StoreSpec::Redis {
                url,
                cluster,
                sentinel,
                key_prefix,
                timeout,
                on_error,
                tls,
            } => {
                // The Redis client builds its rustls config from the
                // process's provider.
                crate::tls::install_provider();
                let redis = RedisStore::new(RedisConfig {
                    url: url.clone(),
                    cluster: cluster.clone(),
                    sentinel: sentinel.clone(),
                    key_prefix: key_prefix.clone(),
                    timeout: *timeout,
                    local_clock: None,
                    functions: true,
                    tls: tls.clone(),
                })?;
                AnyStore::Redis(Arc::new(Leased::new(Fallback::new(
                    redis,
                    *on_error,
                    MemoryStore::default(),
                ))))
            }
        })
    }

    /// Errors the store counted, by kind (Redis only: 0 for memory).
    pub fn errors(&self) -> Vec<(&'static str, u64)> {
        match self {
            AnyStore::Memory(_) => StoreError::KINDS.iter().map(|k| (*k, 0)).collect(),
            AnyStore::Redis(f) => f.inner().primary().errors_by_kind().to_vec(),
        }
    }

    /// Whether the gateway answers requests as its `on_error` says, the
    /// store's health, and its last error while not up (memory: always
    /// ready and up).
    pub fn health(&self) -> (bool, ratewarden::Health, Option<String>) {
        match self {
            AnyStore::Memory(_) => (true, ratewarden::Health::Up, None),
            AnyStore::Redis(f) => {
                let fb = f.inner();
                let (h, e) = fb.health();
                (fb.ready(), h, e)
            }
        }
    }

    /// The in-process store this gateway decides with: the store itself,
    /// or Redis's fallback for `on_error: local`.
    pub fn memory(&self) -> &MemoryStore {
        match self {
            AnyStore::Memory(m) => m,
            AnyStore::Redis(f) => f.inner().local(),
        }
    }

    /// Gateways sharing the store, as it last knew (1 for memory).
    pub fn instances(&self) -> u64 {
        match self {
            AnyStore::Memory(_) => 1,
            AnyStore::Redis(f) => f.inner().primary().instances(),
        }
    }

    /// The policy when the store cannot decide (`local` for memory, which
    /// always can).
    pub fn on_error(&self) -> &'static str {
        match self {
            AnyStore::Memory(_) => "local",
            AnyStore::Redis(f) => match f.inner().policy() {
                ratewarden::OnError::Local => "local",
                ratewarden::OnError::Allow => "allow",
                ratewarden::OnError::Deny => "deny",
            },
        }
    }

    /// Slices granted to leased rules, and decisions answered from them
    /// (Redis only).
    pub fn leases(&self) -> (u64, u64) {
        match self {
            AnyStore::Memory(_) => (0, 0),
            AnyStore::Redis(f) => f.counts(),
        }
    }

    /// Drops expired in-memory states: the memory store's, or those of the
    /// Redis store's local fallback (`on_error: local`).
    pub fn purge(&self) {
        match self {
            AnyStore::Memory(m) => m.purge_expired(),
            AnyStore::Redis(f) => f.inner().local().purge_expired(),
        };
    }
}

// The Redis futures are boxed: a Redis call's future is about 2 KB, and an
// unboxed one makes every store future that size, memory store included.
// Each request's admission future holds one and is moved while it is built,
// which measurably cost the memory store's forwarding path (BENCHMARKS.md,
// "one admission path"); the allocation is nothing next to a round trip.
impl Store for AnyStore {
    async fn decide(
        &self,
        ops: &[Op<'_>],
        weight: u64,
        mode: Mode,
    ) -> Result<Vec<Verdict>, StoreError> {
        match self {
            AnyStore::Memory(s) => Ok(s.decide_now(ops, weight, mode)),
            AnyStore::Redis(s) => Box::pin(s.decide(ops, weight, mode)).await,
        }
    }

    async fn settle(&self, ops: &[Op<'_>], how: Settle) -> Result<(), StoreError> {
        match self {
            AnyStore::Memory(s) => s.settle(ops, how).await,
            AnyStore::Redis(s) => Box::pin(s.settle(ops, how)).await,
        }
    }

    async fn release(&self, leases: &[(Op<'_>, u64, u64)]) -> Result<(), StoreError> {
        match self {
            AnyStore::Memory(s) => s.release(leases).await,
            AnyStore::Redis(s) => Box::pin(s.release(leases)).await,
        }
    }

    async fn renew(&self, leases: &[(Op<'_>, u64, u64)]) -> Result<(), StoreError> {
        match self {
            AnyStore::Memory(s) => s.renew(leases).await,
            AnyStore::Redis(s) => Box::pin(s.renew(leases)).await,
        }
    }

    async fn grant(&self, op: Op<'_>, ask: &Ask) -> Result<Grant, StoreError> {
        match self {
            AnyStore::Memory(s) => s.grant(op, ask).await,
            AnyStore::Redis(s) => Box::pin(s.grant(op, ask)).await,
        }
    }

    async fn inspect(&self, op: Op<'_>) -> Result<KeyInfo, StoreError> {
        match self {
            AnyStore::Memory(s) => s.inspect(op).await,
            AnyStore::Redis(s) => Box::pin(s.inspect(op)).await,
        }
    }

    async fn clear(&self, op: Op<'_>) -> Result<bool, StoreError> {
        match self {
            AnyStore::Memory(s) => s.clear(op).await,
            AnyStore::Redis(s) => Box::pin(s.clear(op)).await,
        }
    }

    async fn ban(&self, op: Op<'_>, left: std::time::Duration) -> Result<(), StoreError> {
        match self {
            AnyStore::Memory(s) => s.ban(op, left).await,
            AnyStore::Redis(s) => Box::pin(s.ban(op, left)).await,
        }
    }

    async fn ping(&self) -> Result<(), StoreError> {
        match self {
            AnyStore::Memory(s) => s.ping().await,
            AnyStore::Redis(s) => Box::pin(s.ping()).await,
        }
    }
}

/// Either store's side shared with other gateways: the memory store's
/// trivial answers, or Redis's (boxed, as above).
impl Shared for AnyStore {
    fn is_shared(&self) -> bool {
        matches!(self, AnyStore::Redis(_))
    }

    async fn connect_now(&self, within: std::time::Duration) -> Result<(), StoreError> {
        match self {
            AnyStore::Memory(s) => s.connect_now(within).await,
            AnyStore::Redis(s) => Box::pin(s.connect_now(within)).await,
        }
    }

    async fn table_version(&self, name: &str) -> Result<u64, StoreError> {
        match self {
            AnyStore::Memory(s) => s.table_version(name).await,
            AnyStore::Redis(s) => Box::pin(s.table_version(name)).await,
        }
    }

    async fn table_load(&self, name: &str) -> Result<(u64, Vec<(String, String)>), StoreError> {
        match self {
            AnyStore::Memory(s) => s.table_load(name).await,
            AnyStore::Redis(s) => Box::pin(s.table_load(name)).await,
        }
    }

    async fn table_put(
        &self,
        name: &str,
        field: &str,
        value: &str,
        max: usize,
    ) -> Result<bool, StoreError> {
        match self {
            AnyStore::Memory(s) => s.table_put(name, field, value, max).await,
            AnyStore::Redis(s) => Box::pin(s.table_put(name, field, value, max)).await,
        }
    }

    async fn table_delete(&self, name: &str, field: &str) -> Result<bool, StoreError> {
        match self {
            AnyStore::Memory(s) => s.table_delete(name, field).await,
            AnyStore::Redis(s) => Box::pin(s.table_delete(name, field)).await,
        }
    }

    async fn scan(&self, rule: &ratewarden::Rule, budget: usize) -> Result<Scanned, StoreError> {
        match self {
            AnyStore::Memory(s) => s.scan(rule, budget).await,
            AnyStore::Redis(s) => Box::pin(s.scan(rule, budget)).await,
        }
    }

    async fn give_back(&self) -> Result<(), StoreError> {
        match self {
            AnyStore::Memory(s) => s.give_back().await,
            AnyStore::Redis(s) => Box::pin(Shared::give_back(s.as_ref())).await,
        }
    }
}

/// A shared table as one gateway follows it (runtime overrides,
/// consumers): every poll, one GET of its version, and the whole table
/// read again only when the version moved.
#[derive(Debug)]
pub(crate) struct TableFollower {
    name: &'static str,
    version: Option<u64>,
}

impl TableFollower {
    /// The table `name`, not yet read.
    pub(crate) fn new(name: &'static str) -> Self {
        Self {
            name,
            version: None,
        }
    }

    /// Whether the table has been read once.
    pub(crate) fn read_once(&self) -> bool {
        self.version.is_some()
    }

    /// The table's version and fields when it changed since the last
    /// read (or was never read); `None` when it did not, when `store` is
    /// shared by no one, or when the store could not be asked (the
    /// store's own outage lines say so).
    pub(crate) async fn changed(
        &mut self,
        store: &AnyStore,
    ) -> Option<(u64, Vec<(String, String)>)> {
        if !store.is_shared() {
            return None;
        }
        let v = store.table_version(self.name).await.ok()?;
        if self.version == Some(v) {
            return None;
        }
        let (v, fields) = store.table_load(self.name).await.ok()?;
        Some((v, fields))
    }

    /// Records that the table at version `v` is now this gateway's.
    pub(crate) fn read(&mut self, v: u64) {
        self.version = Some(v);
    }
}

/// Writes `bytes` to `dir/name` whole: a new file, synced, renamed over
/// the old (a crash leaves one or the other, never half), readable by the
/// owner only (what is kept there names customers).
pub(crate) async fn write_state(
    dir: std::path::PathBuf,
    name: &'static str,
    bytes: Vec<u8>,
) -> std::io::Result<()> {
    tokio::task::spawn_blocking(move || {
        use std::io::Write as _;
        use std::os::unix::fs::OpenOptionsExt as _;
        let tmp = dir.join(format!("{name}.new"));
        let mut f = std::fs::OpenOptions::new()
            .write(true)
            .create(true)
            .truncate(true)
            .mode(0o600)
            .open(&tmp)?;
        f.write_all(&bytes)?;
        f.sync_all()?;
        std::fs::rename(&tmp, dir.join(name))?;
        // The rename itself made durable.
        std::fs::File::open(&dir)?.sync_all()
    })
    .await
    .map_err(std::io::Error::other)?
}

/// `dir/name`'s text, `Ok(None)` when there is no such file.
pub(crate) fn read_state(dir: &std::path::Path, name: &str) -> std::io::Result<Option<String>> {
    match std::fs::read_to_string(dir.join(name)) {
        Ok(t) => Ok(Some(t)),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
        Err(e) => Err(e),
    }
}
