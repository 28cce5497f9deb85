//! The Redis and Redis Cluster store: one atomic script call per decision,
//! time from Redis, exact across any number of gateways.
//!
//! Every decision is one `EVALSHA` of the script (reloaded by the client on
//! `NOSCRIPT`), assembled from `lua/` ([`script`]). The script reads the state of every key of the request, runs
//! the same algorithms as the Rust code, and writes back only if the request
//! is admitted (or a rejection must be recorded), in one step that no other
//! client can interleave with: no check-then-increment race (seed 001), no
//! `MULTI` that cannot read its own writes (seed 003).
//!
//! Keys are `<prefix>{<group>}:s3:<rule id>:<key>` ([`keys`]): the `{group}`
//! hash tag (the client's identity by default) puts all keys of one request
//! on one cluster slot, while different clients spread over the cluster.
//!
//! Failures are bounded: each call has a timeout, and after repeated failures
//! a circuit breaker answers at once without touching the network, letting one
//! probe through at growing intervals (100 ms doubling to 500 ms) until Redis
//! answers again ([`breaker`]). Errors are counted for the gateway's metrics.

mod breaker;
mod call;
mod config;
mod connect;
pub(crate) mod keys;
mod scan;
#[doc(hidden)]
pub mod script;
mod table;

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use crate::clock::{Clock, Micros, SystemClock};
use crate::rule::Verdict;
use crate::store::{KeyInfo, Mode, Op, Settle, Store, StoreError};
use breaker::{Admit, Breaker, Change};
use script::{Call, SCRIPT, argv};

use call::KINDS;
pub use call::classify;
#[cfg(feature = "tls")]
pub use config::RedisTls;
pub use config::{DEFAULT_TIMEOUT, RedisConfig, SentinelConfig, Topology, check_url, redact};
pub use connect::INSTANCE_TTL;
use connect::{Attempt, Conn, query};
pub use scan::SCAN_COUNT;

struct Inner {
    config: RedisConfig,
    script: redis::Script,
    /// The script as a Functions library, and its function's name.
    library: (String, String),
    /// Held while the library is being loaded on demand.
    loading: tokio::sync::Mutex<()>,
    /// Whether calls go through the Function: 0 not yet known, 1 yes, 2
    /// no (the server has no `FCALL`, or `functions: false`): `EVALSHA`.
    functions: std::sync::atomic::AtomicU8,
    /// Connected lazily, and again after a failed first attempt, so a gateway
    /// started while Redis is down serves (per `on_error`) and connects later.
    /// A standalone server gets [`SINGLE_CONNECTIONS`], calls taking them in
    /// turn (`next`); a cluster one connection (one per node inside).
    conn: parking_lot::Mutex<Option<Vec<Conn>>>,
    next: std::sync::atomic::AtomicUsize,
    /// The connection attempt under way, if any: its outcome, once known.
    connecting: parking_lot::Mutex<Option<Attempt>>,
    breaker: Breaker,
    /// Calls that failed, by [`StoreError::kind`] (in [`KINDS`] order).
    errors: [AtomicU64; 5],
    /// The clock of `local_clock`, else the system's: time for the
    /// breaker (the script's time is Redis's own).
    clock: Arc<dyn Clock>,
    topology: Topology,
    /// When a call was last answered (µs on `clock`): a late call after
    /// [`SILENCE`] without any answer asks whether the server is there
    /// ([`RedisStore::ask_if_alive`]).
    last_answer: AtomicU64,
    /// Whether a liveness ping is under way.
    asking: std::sync::atomic::AtomicBool,
    /// Unanswered liveness pings since the last line about them, and when
    /// that was written.
    silent_pings: AtomicU64,
    silent_logged: crate::store::LogEvery,
    /// Gateways that announced themselves in the store within
    /// [`INSTANCE_TTL`]: the most read at once within [`PEAK_HOLD`]
    /// ([`RedisStore::instances`]).
    instances: AtomicU64,
    /// When that count was last read (store clock, µs).
    instances_at: AtomicU64,
    /// Whether the announcing task runs.
    announcing: std::sync::atomic::AtomicBool,
}

/// The Redis / Redis Cluster / Sentinel store. Cheap to clone; clones
/// share connections.
#[derive(Clone)]
pub struct RedisStore {
    inner: Arc<Inner>,
}

impl std::fmt::Debug for RedisStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RedisStore")
            .field("config", &self.inner.config)
            .finish()
    }
}

impl RedisStore {
    /// A store for `config`. Checks the configuration (URLs parse) but does not
    /// wait for Redis: the first decision connects.
    pub fn new(config: RedisConfig) -> Result<Self, StoreError> {
        let topology = if config.sentinel.is_some() {
            Topology::Sentinel
        } else if config.cluster.is_empty() {
            Topology::Single
        } else {
            Topology::Cluster
        };
        if let Some(s) = &config.sentinel {
            if s.master.is_empty() {
                return Err(StoreError::Config("sentinel: `master` is empty".into()));
            }
            if s.nodes.is_empty() {
                return Err(StoreError::Config("sentinel: no `nodes`".into()));
            }
            for n in &s.nodes {
                check_url(n).map_err(StoreError::Config)?;
            }
        } else if config.cluster.is_empty() {
            let url = config
                .url
                .as_deref()
                .ok_or_else(|| StoreError::Config("redis store needs `url` or `cluster`".into()))?;
            check_url(url).map_err(StoreError::Config)?;
        } else {
            redis::cluster::ClusterClient::new(config.cluster.clone())
                .map_err(|e| StoreError::Config(e.to_string()))?;
        }
        if config.key_prefix.contains(['{', '}']) {
            return Err(StoreError::Config(
                "`key_prefix` must not contain `{` or `}` (they are the hash tag's)".into(),
            ));
        }
        let clock: Arc<dyn Clock> = match &config.local_clock {
            Some(c) => c.clone(),
            None => Arc::new(SystemClock::new()),
        };
        Ok(Self {
            inner: Arc::new(Inner {
                script: redis::Script::new(SCRIPT),
                library: script::library(),
                loading: tokio::sync::Mutex::new(()),
                functions: std::sync::atomic::AtomicU8::new(if config.functions { 0 } else { 2 }),
                conn: parking_lot::Mutex::new(None),
                next: std::sync::atomic::AtomicUsize::new(0),
                connecting: parking_lot::Mutex::new(None),
                breaker: Breaker::new(clock.clone()),
                errors: Default::default(),
                last_answer: AtomicU64::new(clock.now().get()),
                asking: std::sync::atomic::AtomicBool::new(false),
                silent_pings: AtomicU64::new(0),
                silent_logged: Default::default(),
                clock,
                config,
                topology,
                instances: AtomicU64::new(1),
                instances_at: AtomicU64::new(0),
                announcing: std::sync::atomic::AtomicBool::new(false),
            }),
        })
    }

    /// Calls that failed since the store was created.
    pub fn errors(&self) -> u64 {
        self.inner
            .errors
            .iter()
            .map(|n| n.load(Ordering::Relaxed))
            .sum()
    }

    /// Calls that failed since the store was created, by kind
    /// ([`StoreError::kind`]).
    pub fn errors_by_kind(&self) -> [(&'static str, u64); 5] {
        std::array::from_fn(|i| (KINDS[i], self.inner.errors[i].load(Ordering::Relaxed)))
    }

    fn count(&self, e: &StoreError) {
        let i = KINDS.iter().position(|k| *k == e.kind()).unwrap_or(0);
        self.inner.errors[i].fetch_add(1, Ordering::Relaxed);
    }

    /// Whether the circuit breaker is currently refusing calls.
    pub fn circuit_open(&self) -> bool {
        self.inner.breaker.is_open()
    }

    /// Whether the breaker is open and waits its longest between probes:
    /// how an outage looks once it has lasted (tests wait for it rather
    /// than for a fixed time).
    #[doc(hidden)]
    pub fn at_longest_backoff(&self) -> bool {
        self.inner.breaker.at_longest_backoff()
    }

    /// The state key and zset key of `op` (see [`keys`]).
    #[doc(hidden)]
    pub fn key_names(&self, op: &Op<'_>) -> (String, String) {
        keys::names(&self.inner.config.key_prefix, op)
    }

    /// The time the store's breaker reads (tests use a manual one).
    #[doc(hidden)]
    pub fn clock(&self) -> &Arc<dyn Clock> {
        &self.inner.clock
    }
}

impl Store for RedisStore {
    async fn grant(
        &self,
        op: Op<'_>,
        ask: &crate::store::lease::Ask,
    ) -> Result<crate::store::lease::Grant, StoreError> {
        let hk = keys::lease_name(&self.inner.config.key_prefix, &op);
        let extra = script::grant_argv(op.rule, ask);
        let reply: Vec<u8> = self
            .run_with(
                &[(op, op.rule.cost(1), 0)],
                script::Mode::Grant,
                Some(hk),
                &extra,
            )
            .await?;
        script::grant(&reply).map_err(StoreError::Protocol)
    }

    /// On a standalone server every op of the request goes in one script call:
    /// all-or-nothing. On a cluster, ops of different groups (hash slots) go in
    /// one call per group, in order; a later group's rejection does not refund
    /// an earlier group (see the README: over-counting, never over-admitting).
    async fn decide(
        &self,
        ops: &[Op<'_>],
        weight: u64,
        mode: Mode,
    ) -> Result<Vec<Verdict>, StoreError> {
        let ops: Vec<Call<'_>> = ops.iter().map(|op| (*op, op.cost(weight), 0)).collect();
        let batches = self.batches(&ops);
        let mut out = Vec::with_capacity(ops.len());
        let mut rejected = false;
        for batch in &batches {
            // A group after a rejecting one is only peeked: the request is
            // rejected already, and must not be charged there.
            let mode = match mode {
                Mode::Apply if !rejected => script::Mode::Apply,
                _ => script::Mode::Peek,
            };
            let reply: redis::Value = self.run(batch, mode).await?;
            let v = script::reply(&reply, batch.len()).map_err(StoreError::Protocol)?;
            let plain: Vec<Op<'_>> = batch.iter().map(|(op, _, _)| *op).collect();
            rejected |= !crate::store::admitted(&plain, &v);
            out.extend(v);
        }
        if batches.len() > 1 {
            // Restore the caller's order.
            let mut ordered = Vec::with_capacity(ops.len());
            for (op, _, _) in &ops {
                let (bi, oi) = batches
                    .iter()
                    .enumerate()
                    .find_map(|(bi, b)| {
                        b.iter()
                            .position(|(o, _, _)| std::ptr::eq(o.rule, op.rule) && o.key == op.key)
                            .map(|oi| (bi, oi))
                    })
                    .expect("every op is in a batch");
                let offset: usize = batches[..bi].iter().map(Vec::len).sum();
                ordered.push(out[offset + oi]);
            }
            out = ordered;
        }
        Ok(out)
    }

    async fn settle(&self, ops: &[Op<'_>], how: Settle) -> Result<(), StoreError> {
        let calls: Vec<Call<'_>> = ops
            .iter()
            .filter(|op| how.applies_to(op.rule))
            .map(|op| (*op, op.cost(how.weight()), 0))
            .collect();
        let mode = match how {
            Settle::Failure(_) => script::Mode::Failure,
            Settle::Success => script::Mode::Success,
            Settle::Charge(_) => script::Mode::Charge,
            Settle::Refund(_) => script::Mode::Refund,
        };
        for batch in self.batches(&calls) {
            self.run::<redis::Value>(&batch, mode).await?;
        }
        Ok(())
    }

    async fn release(&self, leases: &[(Op<'_>, u64, u64)]) -> Result<(), StoreError> {
        let calls: Vec<Call<'_>> = leases
            .iter()
            .map(|(op, lease, cost)| (*op, *cost, *lease))
            .collect();
        for batch in self.batches(&calls) {
            self.run::<redis::Value>(&batch, script::Mode::Release)
                .await?;
        }
        Ok(())
    }

    async fn renew(&self, leases: &[(Op<'_>, u64, u64)]) -> Result<(), StoreError> {
        let calls: Vec<Call<'_>> = leases
            .iter()
            .map(|(op, lease, cost)| (*op, *cost, *lease))
            .collect();
        for batch in self.batches(&calls) {
            self.run::<redis::Value>(&batch, script::Mode::Renew)
                .await?;
        }
        Ok(())
    }

    async fn inspect(&self, op: Op<'_>) -> Result<KeyInfo, StoreError> {
        let raw: Vec<i64> = self
            .run(&[(op, op.rule.cost(1), 0)], script::Mode::Inspect)
            .await?;
        if raw.len() != 6 {
            return Err(StoreError::Protocol("inspect: unexpected reply".into()));
        }
        let u = |v: i64| u64::try_from(v).unwrap_or(0);
        Ok(KeyInfo {
            exists: raw[0] == 1,
            remaining: u(raw[1]),
            admits: raw[5] == 1,
            reset_after: Duration::from_micros(u(raw[2])),
            ban_left: (raw[3] >= 0).then(|| Duration::from_micros(u(raw[3]))),
            ban_level: u32::try_from(raw[4]).unwrap_or(0),
        })
    }

    async fn clear(&self, op: Op<'_>) -> Result<bool, StoreError> {
        let (k, log) = self.key_names(&op);
        let mut cmd = redis::cmd("DEL");
        cmd.arg(&k).arg(&log);
        self.guarded(async {
            let n: i64 = match self.conn().await? {
                Conn::Single(mut c) => cmd.query_async(&mut c).await,
                Conn::Cluster(mut c) => cmd.query_async(&mut c).await,
            }
            .map_err(classify)?;
            Ok(n > 0)
        })
        .await
    }

    fn instances(&self) -> u64 {
        RedisStore::instances(self)
    }

    async fn ban(&self, op: Op<'_>, left: Duration) -> Result<(), StoreError> {
        let us = u64::try_from(left.as_micros()).unwrap_or(u64::MAX / 2);
        self.run::<redis::Value>(&[(op, us.max(1), 0)], script::Mode::Ban)
            .await
            .map(drop)
    }

    async fn ping(&self) -> Result<(), StoreError> {
        let pong: String = self
            .guarded(async {
                match self.conn().await? {
                    Conn::Single(mut c) => redis::cmd("PING").query_async(&mut c).await,
                    Conn::Cluster(mut c) => redis::cmd("PING").query_async(&mut c).await,
                }
                .map_err(classify)
            })
            .await?;
        if pong == "PONG" {
            Ok(())
        } else {
            Err(StoreError::Protocol(format!("PING answered {pong}")))
        }
    }
}

/// Redis is shared by every gateway pointed at it.
impl crate::store::Shared for RedisStore {
    fn is_shared(&self) -> bool {
        true
    }
    async fn connect_now(&self, within: Duration) -> Result<(), StoreError> {
        RedisStore::connect_now(self, within).await
    }
    async fn table_version(&self, name: &str) -> Result<u64, StoreError> {
        RedisStore::table_version(self, name).await
    }
    async fn table_load(&self, name: &str) -> Result<(u64, Vec<(String, String)>), StoreError> {
        RedisStore::table_load(self, name).await
    }
    async fn table_put(
        &self,
        name: &str,
        field: &str,
        value: &str,
        max: usize,
    ) -> Result<bool, StoreError> {
        RedisStore::table_put(self, name, field, value, max).await
    }
    async fn table_delete(&self, name: &str, field: &str) -> Result<bool, StoreError> {
        RedisStore::table_delete(self, name, field).await
    }
    async fn scan(
        &self,
        rule: &crate::Rule,
        budget: usize,
    ) -> Result<crate::store::Scanned, StoreError> {
        self.scan_keys(rule, budget).await
    }
    /// (Slices are the [`Leased`](crate::store::lease::Leased) wrapper's.)
    async fn give_back(&self) -> Result<(), StoreError> {
        Ok(())
    }
}
