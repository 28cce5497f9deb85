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
    /// slices ([`Leased`]); its refusals kept while they hold
    /// ([`Refusals`]).
    Redis(Arc<Leased<Fallback<RedisStore>>>, Arc<Refusals>),
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
                AnyStore::Redis(
                    Arc::new(Leased::new(Fallback::new(
                        redis,
                        *on_error,
                        MemoryStore::default(),
                    ))),
                    Arc::new(Refusals::new()),
                )
            }
        })
    }

    /// Errors the store counted, by kind (Redis only: 0 for memory).
    pub fn errors(&self) -> Vec<(&'static str, u64)> {
        match self {
            AnyStore::Memory(_) => StoreError::KINDS.iter().map(|k| (*k, 0)).collect(),
            AnyStore::Redis(f, _) => f.inner().primary().errors_by_kind().to_vec(),
        }
    }

    /// Whether the gateway answers requests as its `on_error` says, the
    /// store's health, and its last error while not up (memory: always
    /// ready and up).
    pub fn health(&self) -> (bool, ratewarden::Health, Option<String>) {
        match self {
            AnyStore::Memory(_) => (true, ratewarden::Health::Up, None),
            AnyStore::Redis(f, _) => {
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
            AnyStore::Redis(f, _) => f.inner().local(),
        }
    }

    /// Gateways sharing the store, as it last knew (1 for memory).
    pub fn instances(&self) -> u64 {
        match self {
            AnyStore::Memory(_) => 1,
            AnyStore::Redis(f, _) => f.inner().primary().instances(),
        }
    }

    /// The policy when the store cannot decide (`local` for memory, which
    /// always can).
    pub fn on_error(&self) -> &'static str {
        match self {
            AnyStore::Memory(_) => "local",
            AnyStore::Redis(f, _) => match f.inner().policy() {
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
            AnyStore::Redis(f, _) => f.counts(),
        }
    }

    /// The refusals kept from the shared store (Redis only).
    pub(crate) fn refusals(&self) -> Option<&Refusals> {
        match self {
            AnyStore::Memory(_) => None,
            AnyStore::Redis(_, r) => Some(r),
        }
    }

    /// Drops expired in-memory states: the memory store's, or those of the
    /// Redis store's local fallback (`on_error: local`).
    pub fn purge(&self) {
        match self {
            AnyStore::Memory(m) => m.purge_expired(),
            AnyStore::Redis(f, _) => f.inner().local().purge_expired(),
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
            AnyStore::Redis(s, refusals) => {
                if let Some(kept) = refusals.get(ops, weight, mode) {
                    return Ok(kept);
                }
                let at = std::time::Instant::now();
                let verdicts = Box::pin(s.decide(ops, weight, mode)).await?;
                // Only the shared store's own refusals: one made locally
                // during an outage is this gateway's share, not the store's.
                if !s.inner().in_outage() {
                    refusals.put(ops, weight, mode, at, &verdicts);
                }
                Ok(verdicts)
            }
        }
    }

    async fn settle(&self, ops: &[Op<'_>], how: Settle) -> Result<(), StoreError> {
        match self {
            AnyStore::Memory(s) => s.settle(ops, how).await,
            AnyStore::Redis(s, _) => Box::pin(s.settle(ops, how)).await,
        }
    }

    async fn release(&self, leases: &[(Op<'_>, u64, u64)]) -> Result<(), StoreError> {
        match self {
            AnyStore::Memory(s) => s.release(leases).await,
            AnyStore::Redis(s, _) => Box::pin(s.release(leases)).await,
        }
    }

    async fn renew(&self, leases: &[(Op<'_>, u64, u64)]) -> Result<(), StoreError> {
        match self {
            AnyStore::Memory(s) => s.renew(leases).await,
            AnyStore::Redis(s, _) => Box::pin(s.renew(leases)).await,
        }
    }

    async fn grant(&self, op: Op<'_>, ask: &Ask) -> Result<Grant, StoreError> {
        match self {
            AnyStore::Memory(s) => s.grant(op, ask).await,
            AnyStore::Redis(s, _) => Box::pin(s.grant(op, ask)).await,
        }
    }

    async fn inspect(&self, op: Op<'_>) -> Result<KeyInfo, StoreError> {
        match self {
            AnyStore::Memory(s) => s.inspect(op).await,
            AnyStore::Redis(s, _) => Box::pin(s.inspect(op)).await,
        }
    }

    async fn clear(&self, op: Op<'_>) -> Result<bool, StoreError> {
        match self {
            AnyStore::Memory(s) => s.clear(op).await,
            AnyStore::Redis(s, refusals) => {
                let existed = Box::pin(s.clear(op)).await?;
                // Its refusals are no longer the store's: dropped here, and
                // on every gateway at its next poll of the marker.
                refusals.clear();
                let stamp = std::time::SystemTime::now()
                    .duration_since(std::time::UNIX_EPOCH)
                    .map_or(0, |d| d.as_nanos());
                if let Err(e) = Box::pin(s.table_put(CLEARED, "at", &stamp.to_string(), 1)).await {
                    tracing::warn!(error = %e, "cleared, but the other gateways were not told: their kept refusals of the key lapse by themselves");
                }
                Ok(existed)
            }
        }
    }

    async fn ban(&self, op: Op<'_>, left: std::time::Duration) -> Result<(), StoreError> {
        match self {
            AnyStore::Memory(s) => s.ban(op, left).await,
            AnyStore::Redis(s, _) => Box::pin(s.ban(op, left)).await,
        }
    }

    async fn ping(&self) -> Result<(), StoreError> {
        match self {
            AnyStore::Memory(s) => s.ping().await,
            AnyStore::Redis(s, _) => Box::pin(s.ping()).await,
        }
    }
}

/// Either store's side shared with other gateways: the memory store's
/// trivial answers, or Redis's (boxed, as above).
impl Shared for AnyStore {
    fn is_shared(&self) -> bool {
        matches!(self, AnyStore::Redis(..))
    }

    async fn connect_now(&self, within: std::time::Duration) -> Result<(), StoreError> {
        match self {
            AnyStore::Memory(s) => s.connect_now(within).await,
            AnyStore::Redis(s, _) => Box::pin(s.connect_now(within)).await,
        }
    }

    async fn table_version(&self, name: &str) -> Result<u64, StoreError> {
        match self {
            AnyStore::Memory(s) => s.table_version(name).await,
            AnyStore::Redis(s, _) => Box::pin(s.table_version(name)).await,
        }
    }

    async fn table_load(&self, name: &str) -> Result<(u64, Vec<(String, String)>), StoreError> {
        match self {
            AnyStore::Memory(s) => s.table_load(name).await,
            AnyStore::Redis(s, _) => Box::pin(s.table_load(name)).await,
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
            AnyStore::Redis(s, _) => Box::pin(s.table_put(name, field, value, max)).await,
        }
    }

    async fn table_delete(&self, name: &str, field: &str) -> Result<bool, StoreError> {
        match self {
            AnyStore::Memory(s) => s.table_delete(name, field).await,
            AnyStore::Redis(s, _) => Box::pin(s.table_delete(name, field)).await,
        }
    }

    async fn scan(&self, rule: &ratewarden::Rule, budget: usize) -> Result<Scanned, StoreError> {
        match self {
            AnyStore::Memory(s) => s.scan(rule, budget).await,
            AnyStore::Redis(s, _) => Box::pin(s.scan(rule, budget)).await,
        }
    }

    async fn give_back(&self) -> Result<(), StoreError> {
        match self {
            AnyStore::Memory(s) => s.give_back().await,
            AnyStore::Redis(s, _) => Box::pin(Shared::give_back(s.as_ref())).await,
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

/// A table `state_dir` keeps (overrides, consumers), read at start: the
/// file `name`'s entries, `None` without `state_dir`, on a shared store
/// (which keeps its own), without the file, or when it cannot be read
/// (logged, naming `what`).
pub(crate) fn read_state(
    dir: Option<&std::path::Path>,
    shared: bool,
    name: &str,
    what: &str,
) -> Option<std::collections::BTreeMap<String, serde_json::Value>> {
    let dir = dir.filter(|_| !shared)?;
    let path = dir.join(name);
    let text = match std::fs::read_to_string(&path) {
        Ok(t) => t,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return None,
        Err(e) => {
            tracing::error!(file = %path.display(), error = %e, "{what} not read from state_dir");
            return None;
        }
    };
    match serde_json::from_str(&text) {
        Ok(table) => Some(table),
        Err(_) => {
            tracing::error!(file = %path.display(), "{what} file is not what ratewarden writes: not read");
            None
        }
    }
}

/// Writes a table to `state_dir` whole (memory store only: a shared store
/// keeps its own), with [`write_state`]. A failure is logged, naming
/// `what`: the change is in force, and kept until the restart. `table` is
/// made only when it is written.
pub(crate) async fn save_state<T: serde::Serialize>(
    dir: Option<std::path::PathBuf>,
    shared: bool,
    name: &'static str,
    what: &str,
    table: impl FnOnce() -> std::collections::BTreeMap<String, T>,
) {
    let Some(dir) = dir.filter(|_| !shared) else {
        return;
    };
    let text = serde_json::to_vec_pretty(&table()).unwrap_or_default();
    if let Err(e) = write_state(dir, name, text).await {
        tracing::error!(error = %e, "{what} not written to state_dir: in force until a restart");
    }
}

/// Refusals the shared store made, answered here until they lapse, with no
/// store call (issue 51): under a flood from one key, Redis is asked about
/// it once per refusal period instead of once per request.
///
/// Exact by construction. When the store refuses a request's ops with a
/// retry time T (the earliest of the refusing rules'), no request of the
/// same ops and weights can be admitted before T: time alone frees them,
/// and nothing a refused request does changes its keys' states (a refused
/// request is charged nothing; a ban's refusal writes nothing). T is
/// counted from before the call was sent, so the cache never refuses what
/// the store would admit, and never admits: at T the store decides again.
/// Kept only where that reasoning holds, else the store is asked:
/// - not for rules whose state other things change: `concurrency` (a lease
///   given back frees a slot), `count: failures` (a reported success
///   clears), `count_rejected` (each refusal is charged), a rule charged by
///   its answer (a refund frees units), leased rules (their slices are
///   local already);
/// - what an operator changes drops it: a key cleared or unbanned
///   (`DELETE /v1/keys`, `/v1/bans`) here at once, and on every gateway
///   within a poll (a shared marker, [`CLEARED`]); an override or a tier
///   change is a rule of its own id, which no cached refusal names.
///
/// Bounded ([`REFUSALS_KEPT`]); the whole op set, keys included, is
/// compared on a hit (a hash collision is a miss).
#[derive(Debug)]
pub struct Refusals {
    shards: Vec<parking_lot::Mutex<std::collections::HashMap<u64, Refused>>>,
    hasher: foldhash::fast::RandomState,
    /// Rules charged by their answer, by name (their tiers and overrides
    /// too): never cached (set at each load).
    excluded: parking_lot::RwLock<Vec<String>>,
    /// Requests answered from the cache.
    hits: std::sync::atomic::AtomicU64,
}

/// The most refusals kept.
pub(crate) const REFUSALS_KEPT: usize = 65_536;
/// The longest a refusal is kept (one that no time frees is asked again
/// after this).
const REFUSAL_FOR: std::time::Duration = std::time::Duration::from_secs(60);
const REFUSAL_SHARDS: usize = 16;
/// The shared marker every gateway follows: moved when a key is cleared or
/// unbanned, so that each drops its cached refusals.
pub(crate) const CLEARED: &str = "cleared";

#[derive(Debug)]
struct Refused {
    ops: Vec<(u64, Box<str>, u64)>,
    weight: u64,
    /// When the call was sent.
    at: std::time::Instant,
    until: std::time::Instant,
    verdicts: Vec<Verdict>,
}

impl Refusals {
    fn new() -> Self {
        Self {
            shards: (0..REFUSAL_SHARDS)
                .map(|_| parking_lot::Mutex::new(std::collections::HashMap::new()))
                .collect(),
            hasher: foldhash::fast::RandomState::default(),
            excluded: parking_lot::RwLock::new(vec![]),
            hits: std::sync::atomic::AtomicU64::new(0),
        }
    }

    /// The rules (by name) charged by their answers, never cached; what
    /// was kept is dropped (a load may have changed any rule).
    pub(crate) fn exclude(&self, names: Vec<String>) {
        *self.excluded.write() = names;
        self.clear();
    }

    /// Drops every refusal kept.
    pub(crate) fn clear(&self) {
        for s in &self.shards {
            s.lock().clear();
        }
    }

    /// Requests answered from the cache so far.
    pub(crate) fn hits(&self) -> u64 {
        self.hits.load(std::sync::atomic::Ordering::Relaxed)
    }

    fn signature(&self, ops: &[Op<'_>], weight: u64) -> u64 {
        use std::hash::{BuildHasher as _, Hash as _, Hasher as _};
        let mut h = self.hasher.build_hasher();
        weight.hash(&mut h);
        for op in ops {
            op.rule.id().hash(&mut h);
            op.key.hash(&mut h);
            op.weight.hash(&mut h);
        }
        h.finish()
    }

    fn eligible(&self, ops: &[Op<'_>]) -> bool {
        let excluded = self.excluded.read();
        ops.iter().all(|op| {
            let s = op.rule.spec();
            !s.algorithm.holds_leases()
                && s.counting == ratewarden::Counting::All
                && !s.count_rejected
                && s.distribution.is_none()
                && !excluded.iter().any(|n| n == op.rule.name())
        })
    }

    /// The store's verdicts on `ops`, when a refusal of them is kept and
    /// still holds: its verdicts, their times counted down.
    fn get(&self, ops: &[Op<'_>], weight: u64, mode: Mode) -> Option<Vec<Verdict>> {
        if mode != Mode::Apply {
            return None;
        }
        let sig = self.signature(ops, weight);
        let shard = self.shards[sig as usize % REFUSAL_SHARDS].lock();
        let r = shard.get(&sig)?;
        let now = std::time::Instant::now();
        let same = r.weight == weight
            && r.ops.len() == ops.len()
            && r.ops.iter().zip(ops).all(|((id, key, w), op)| {
                *id == op.rule.id() && **key == *op.key && *w == op.weight
            });
        if !same || now >= r.until {
            return None;
        }
        let gone = ratewarden::clock::Micros::from(now - r.at);
        let verdicts = r
            .verdicts
            .iter()
            .map(|v| {
                let mut v = *v;
                v.check.retry_after = later(v.check.retry_after, gone);
                v.check.reset_after = later(v.check.reset_after, gone);
                v
            })
            .collect();
        self.hits.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        Some(verdicts)
    }

    /// Keeps the store's refusal of `ops` (asked at `at`), when it is one
    /// the cache may answer (see the type).
    fn put(
        &self,
        ops: &[Op<'_>],
        weight: u64,
        mode: Mode,
        at: std::time::Instant,
        verdicts: &[Verdict],
    ) {
        if mode != Mode::Apply || verdicts.len() != ops.len() {
            return;
        }
        // The earliest a refusing (enforced) rule frees the request.
        let wait = ops
            .iter()
            .zip(verdicts)
            .filter(|(op, v)| !v.allowed() && !op.rule.is_shadow())
            .map(|(_, v)| v.check.retry_after)
            .min();
        let Some(wait) = wait else { return };
        if wait.get() == 0 || !self.eligible(ops) {
            return;
        }
        let wait = std::time::Duration::from_micros(wait.get()).min(REFUSAL_FOR);
        let sig = self.signature(ops, weight);
        let mut shard = self.shards[sig as usize % REFUSAL_SHARDS].lock();
        if shard.len() >= REFUSALS_KEPT / REFUSAL_SHARDS && !shard.contains_key(&sig) {
            let now = std::time::Instant::now();
            shard.retain(|_, r| r.until > now);
            if shard.len() >= REFUSALS_KEPT / REFUSAL_SHARDS {
                return;
            }
        }
        shard.insert(
            sig,
            Refused {
                ops: ops
                    .iter()
                    .map(|op| (op.rule.id(), op.key.into(), op.weight))
                    .collect(),
                weight,
                at,
                until: at + wait,
                verdicts: verdicts.to_vec(),
            },
        );
    }
}

/// `t` less `gone`, never below zero; [`ratewarden::algorithm::NEVER`]
/// stays never.
fn later(
    t: ratewarden::clock::Micros,
    gone: ratewarden::clock::Micros,
) -> ratewarden::clock::Micros {
    if t == ratewarden::clock::Micros::MAX {
        t
    } else {
        t.saturating_sub(gone)
    }
}
