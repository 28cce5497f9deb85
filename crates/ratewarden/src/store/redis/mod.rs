//! The Redis and Redis Cluster store: one atomic script call per decision,
//! time from Redis, exact across any number of gateways.
//!
//! Every decision is one `EVALSHA` of `decide.lua` (reloaded by the client on
//! `NOSCRIPT`). The script reads the state of every key of the request, runs
//! the same algorithms as the Rust code, and writes back only if the request
//! is admitted (or a rejection must be recorded), in one step that no other
//! client can interleave with: no check-then-increment race (seed 001), no
//! `MULTI` that cannot read its own writes (seed 003).
//!
//! Keys are `<prefix>{<group>}:<rule id>:<key>`: the `{group}` hash tag (the
//! client's identity by default) puts all keys of one request on one cluster
//! slot, while different clients spread over the cluster.
//!
//! Failures are bounded: each call has a timeout, and after repeated failures
//! a circuit breaker answers at once without touching the network, letting one
//! probe through at growing intervals (100 ms doubling to 5 s) until Redis
//! answers again. Errors are counted for the gateway's metrics.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use redis::aio::{ConnectionManager, ConnectionManagerConfig};
use redis::cluster_async::ClusterConnection;

use crate::algorithm::{Check, NEVER};
use crate::clock::{Clock, micros};
use crate::rule::{Counting, Reason, Verdict};
use crate::store::{KeyInfo, Mode, Op, Store, StoreError};

const SCRIPT: &str = include_str!("decide.lua");
/// Values per op in ARGV; see the contract at the top of decide.lua.
const FIELDS: usize = 15;

/// Where the store connects, and how patiently.
#[derive(Clone)]
pub struct RedisConfig {
    /// A standalone server: `redis://[user:password@]host:port/db`
    /// (`rediss://` for TLS when the client is built with TLS support).
    pub url: Option<String>,
    /// Redis Cluster seed nodes; used instead of `url` when not empty.
    pub cluster: Vec<String>,
    /// Prepended to every key (default `rw:`).
    pub key_prefix: String,
    /// Bound on each decision's round trip (default 50 ms).
    pub timeout: Duration,
    /// Take time from this clock instead of Redis `TIME`. Leave `None` in
    /// production: gateways whose clocks disagree then still agree. Tests set
    /// it to run the shared case table on a manual clock.
    pub local_clock: Option<Arc<dyn Clock>>,
}

impl Default for RedisConfig {
    fn default() -> Self {
        Self {
            url: Some("redis://127.0.0.1:6379/0".into()),
            cluster: vec![],
            key_prefix: "rw:".into(),
            timeout: Duration::from_millis(50),
            local_clock: None,
        }
    }
}

impl std::fmt::Debug for RedisConfig {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RedisConfig")
            .field("url", &self.url)
            .field("cluster", &self.cluster)
            .field("key_prefix", &self.key_prefix)
            .field("timeout", &self.timeout)
            .field("local_clock", &self.local_clock.is_some())
            .finish()
    }
}

#[derive(Clone)]
enum Conn {
    Single(ConnectionManager),
    Cluster(ClusterConnection),
}

/// Stops hammering a dead server: after `THRESHOLD` consecutive failures the
/// circuit opens; while open, calls fail at once; when the backoff has passed,
/// one call is let through as a probe.
struct Breaker {
    state: parking_lot::Mutex<BreakerState>,
}

struct BreakerState {
    failures: u32,
    open_until: Option<Instant>,
    backoff: Duration,
    probing: bool,
}

const THRESHOLD: u32 = 3;
const MIN_BACKOFF: Duration = Duration::from_millis(100);
const MAX_BACKOFF: Duration = Duration::from_secs(5);

impl Breaker {
    fn new() -> Self {
        Self {
            state: parking_lot::Mutex::new(BreakerState {
                failures: 0,
                open_until: None,
                backoff: MIN_BACKOFF,
                probing: false,
            }),
        }
    }

    /// Whether a call may go to the network now.
    fn admit(&self) -> bool {
        let mut s = self.state.lock();
        match s.open_until {
            None => true,
            Some(until) if Instant::now() < until || s.probing => false,
            Some(_) => {
                s.probing = true;
                true
            }
        }
    }

    fn success(&self) {
        let mut s = self.state.lock();
        s.failures = 0;
        s.open_until = None;
        s.backoff = MIN_BACKOFF;
        s.probing = false;
    }

    fn failure(&self) {
        let mut s = self.state.lock();
        s.failures += 1;
        if s.probing || s.failures >= THRESHOLD {
            s.open_until = Some(Instant::now() + s.backoff);
            s.backoff = (s.backoff * 2).min(MAX_BACKOFF);
            s.probing = false;
        }
    }

    fn is_open(&self) -> bool {
        self.state.lock().open_until.is_some()
    }
}

struct Inner {
    config: RedisConfig,
    script: redis::Script,
    /// Connected lazily, and again after a failed first attempt, so a gateway
    /// started while Redis is down serves (per `on_error`) and connects later.
    conn: tokio::sync::Mutex<Option<Conn>>,
    breaker: Breaker,
    errors: AtomicU64,
}

/// The Redis / Redis Cluster store. Cheap to clone; clones share connections.
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

fn unavailable(e: impl std::fmt::Display) -> StoreError {
    StoreError::Unavailable(e.to_string())
}

/// Checks that `url` is a Redis URL this build can connect to, without
/// connecting: for config validation.
///
/// ```
/// use ratewarden::store::redis::check_url;
/// assert!(check_url("redis://:secret@127.0.0.1:6379/0").is_ok());
/// assert!(check_url("redis://127.0.0.1:notaport").is_err());
/// assert!(check_url("http://127.0.0.1:6379").is_err());
/// ```
pub fn check_url(url: &str) -> Result<(), String> {
    redis::Client::open(url)
        .map(drop)
        .map_err(|e| format!("`{url}` is not a usable Redis URL: {e}"))
}

impl RedisStore {
    /// A store for `config`. Checks the configuration (URLs parse) but does not
    /// wait for Redis: the first decision connects.
    pub fn new(config: RedisConfig) -> Result<Self, StoreError> {
        if config.cluster.is_empty() {
            let url = config.url.as_deref().ok_or_else(|| {
                StoreError::Protocol("redis store needs `url` or `cluster`".into())
            })?;
            redis::Client::open(url).map_err(|e| StoreError::Protocol(format!("{url}: {e}")))?;
        } else {
            redis::cluster::ClusterClient::new(config.cluster.clone())
                .map_err(|e| StoreError::Protocol(e.to_string()))?;
        }
        if config.key_prefix.contains(['{', '}']) {
            return Err(StoreError::Protocol(
                "`key_prefix` must not contain `{` or `}` (they are the hash tag's)".into(),
            ));
        }
        Ok(Self {
            inner: Arc::new(Inner {
                script: redis::Script::new(SCRIPT),
                conn: tokio::sync::Mutex::new(None),
                breaker: Breaker::new(),
                errors: AtomicU64::new(0),
                config,
            }),
        })
    }

    /// Decisions that failed for want of Redis since the store was created.
    pub fn errors(&self) -> u64 {
        self.inner.errors.load(Ordering::Relaxed)
    }

    /// Whether the circuit breaker is currently refusing calls.
    pub fn circuit_open(&self) -> bool {
        self.inner.breaker.is_open()
    }

    async fn connect(&self) -> Result<Conn, StoreError> {
        let c = &self.inner.config;
        let t = c.timeout.max(Duration::from_millis(10));
        if c.cluster.is_empty() {
            let client =
                redis::Client::open(c.url.as_deref().unwrap_or_default()).map_err(unavailable)?;
            let cfg = ConnectionManagerConfig::new()
                .set_response_timeout(Some(t))
                .set_connection_timeout(Some(t))
                .set_number_of_retries(1);
            let m = ConnectionManager::new_with_config(client, cfg)
                .await
                .map_err(unavailable)?;
            Ok(Conn::Single(m))
        } else {
            let client = redis::cluster::ClusterClientBuilder::new(c.cluster.clone())
                .connection_timeout(t)
                .response_timeout(t)
                .retries(1)
                .build()
                .map_err(unavailable)?;
            let conn = client.get_async_connection().await.map_err(unavailable)?;
            Ok(Conn::Cluster(conn))
        }
    }

    async fn conn(&self) -> Result<Conn, StoreError> {
        let mut slot = self.inner.conn.lock().await;
        if let Some(c) = slot.as_ref() {
            return Ok(c.clone());
        }
        let c = self.connect().await?;
        *slot = Some(c.clone());
        Ok(c)
    }

    /// `<prefix>{<group>}:<rule id>:<key>` and its log's name.
    fn key_names(&self, op: &Op<'_>) -> (String, String) {
        // The group must not end the hash tag early or leave it empty (an
        // empty `{}` hashes the whole key, and the keys would scatter).
        let group: String = op
            .group
            .chars()
            .map(|c| if c == '{' || c == '}' { '_' } else { c })
            .collect();
        let group = if group.is_empty() { "_".into() } else { group };
        let base = format!(
            "{}{{{group}}}:{:016x}:{}",
            self.inner.config.key_prefix,
            op.rule.id(),
            op.key
        );
        let log = format!("{base}:log");
        (base, log)
    }

    fn invocation(&self, ops: &[Op<'_>], weight: u64, mode: u8) -> redis::ScriptInvocation<'_> {
        let mut inv = self.inner.script.prepare_invoke();
        let now = self
            .inner
            .config
            .local_clock
            .as_ref()
            .map_or(0, |c| c.now());
        inv.arg(mode).arg(ops.len()).arg(now);
        for op in ops {
            let (k, log) = self.key_names(op);
            inv.key(k).key(log);
            let spec = op.rule.spec();
            let (kind, p) = op.rule.params().script_params();
            inv.arg(kind);
            for v in p {
                // u64::MAX marks "none" (leaky bucket reject mode).
                if v == u64::MAX {
                    inv.arg(-1i64);
                } else {
                    inv.arg(v);
                }
            }
            inv.arg(spec.min_interval.map_or(0, micros));
            match &spec.penalty {
                Some(pen) => {
                    inv.arg(micros(pen.duration))
                        .arg(pen.multiplier)
                        .arg(micros(pen.max))
                        .arg(micros(pen.memory));
                }
                None => {
                    inv.arg(0).arg(1).arg(0).arg(0);
                }
            }
            let (failures, reset) = match spec.counting {
                Counting::All => (0, 0),
                Counting::Failures { reset_on_success } => (1, u8::from(reset_on_success)),
            };
            inv.arg(failures)
                .arg(reset)
                .arg(u8::from(spec.count_rejected))
                .arg(u8::from(spec.shadow))
                .arg(op.rule.cost(weight));
        }
        debug_assert_eq!(FIELDS, 15);
        inv
    }

    /// One script call, bounded by the timeout and guarded by the breaker.
    async fn call(&self, inv: redis::ScriptInvocation<'_>) -> Result<Vec<i64>, StoreError> {
        if !self.inner.breaker.admit() {
            self.inner.errors.fetch_add(1, Ordering::Relaxed);
            return Err(StoreError::Unavailable(
                "circuit open: redis failing".into(),
            ));
        }
        let attempt = async {
            let conn = self.conn().await?;
            let res: redis::RedisResult<Vec<i64>> = match conn {
                Conn::Single(mut c) => inv.invoke_async(&mut c).await,
                Conn::Cluster(mut c) => inv.invoke_async(&mut c).await,
            };
            res.map_err(|e| {
                if e.is_io_error() || e.is_timeout() || e.is_connection_dropped() {
                    unavailable(e)
                } else {
                    StoreError::Protocol(e.to_string())
                }
            })
        };
        let res = match tokio::time::timeout(self.inner.config.timeout, attempt).await {
            Ok(r) => r,
            Err(_) => Err(StoreError::Unavailable(format!(
                "no answer within {:?}",
                self.inner.config.timeout
            ))),
        };
        match &res {
            Ok(_) => self.inner.breaker.success(),
            Err(_) => {
                self.inner.errors.fetch_add(1, Ordering::Relaxed);
                self.inner.breaker.failure();
            }
        }
        res
    }

    /// Groups of ops that can go in one script call: all of them on a
    /// standalone server; ops sharing a group (hash slot) on a cluster.
    fn batches<'o, 'a>(&self, ops: &'o [Op<'a>]) -> Vec<Vec<Op<'a>>> {
        if self.inner.config.cluster.is_empty() {
            return vec![ops.to_vec()];
        }
        let mut out: Vec<Vec<Op<'a>>> = vec![];
        for op in ops {
            match out.iter_mut().find(|b| b[0].group == op.group) {
                Some(b) => b.push(*op),
                None => out.push(vec![*op]),
            }
        }
        out
    }
}

fn verdicts_from(raw: &[i64], n: usize) -> Result<Vec<Verdict>, StoreError> {
    if raw.len() != n * 6 {
        return Err(StoreError::Protocol(format!(
            "script returned {} values for {n} ops",
            raw.len()
        )));
    }
    let u = |v: i64| u64::try_from(v).unwrap_or(0);
    Ok(raw
        .chunks(6)
        .map(|c| Verdict {
            check: Check {
                allowed: c[0] == 1,
                remaining: u(c[2]),
                reset_after: u(c[3]),
                retry_after: if c[4] < 0 { NEVER } else { u(c[4]) },
                delay: u(c[5]),
            },
            reason: match c[1] {
                0 => None,
                2 => Some(Reason::Banned),
                3 => Some(Reason::MinInterval),
                _ => Some(Reason::Limit),
            },
        })
        .collect())
}

impl Store for RedisStore {
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
        let code = if mode == Mode::Apply { 0 } else { 1 };
        let mut out = Vec::with_capacity(ops.len());
        let batches = self.batches(ops);
        let mut rejected = false;
        for batch in &batches {
            // A group after a rejecting one is only peeked: the request is
            // rejected already, and must not be charged there.
            let code = if rejected { 1 } else { code };
            let raw = self.call(self.invocation(batch, weight, code)).await?;
            let v = verdicts_from(&raw, batch.len())?;
            rejected |= !crate::store::admitted(batch, &v);
            out.extend(v);
        }
        if batches.len() > 1 {
            // Restore the caller's order.
            let mut ordered = Vec::with_capacity(ops.len());
            for op in ops {
                let (bi, oi) = batches
                    .iter()
                    .enumerate()
                    .find_map(|(bi, b)| {
                        b.iter()
                            .position(|o| std::ptr::eq(o.rule, op.rule) && o.key == op.key)
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

    async fn settle(&self, ops: &[Op<'_>], weight: u64, failure: bool) -> Result<(), StoreError> {
        let ops: Vec<Op<'_>> = ops
            .iter()
            .filter(|op| op.rule.counts_failures())
            .copied()
            .collect();
        for batch in self.batches(&ops) {
            let mode = if failure { 2 } else { 3 };
            self.call(self.invocation(&batch, weight, mode)).await?;
        }
        Ok(())
    }

    async fn inspect(&self, op: Op<'_>) -> Result<KeyInfo, StoreError> {
        let raw = self.call(self.invocation(&[op], 1, 4)).await?;
        if raw.len() != 5 {
            return Err(StoreError::Protocol("inspect: unexpected reply".into()));
        }
        let u = |v: i64| u64::try_from(v).unwrap_or(0);
        Ok(KeyInfo {
            exists: raw[0] == 1,
            remaining: u(raw[1]),
            reset_after: Duration::from_micros(u(raw[2])),
            ban_left: (raw[3] >= 0).then(|| Duration::from_micros(u(raw[3]))),
            ban_level: u32::try_from(raw[4]).unwrap_or(0),
        })
    }

    async fn clear(&self, op: Op<'_>) -> Result<bool, StoreError> {
        let (k, log) = self.key_names(&op);
        if !self.inner.breaker.admit() {
            return Err(StoreError::Unavailable(
                "circuit open: redis failing".into(),
            ));
        }
        let mut cmd = redis::cmd("DEL");
        cmd.arg(&k).arg(&log);
        let fut = async {
            let n: i64 = match self.conn().await? {
                Conn::Single(mut c) => cmd.query_async(&mut c).await,
                Conn::Cluster(mut c) => cmd.query_async(&mut c).await,
            }
            .map_err(unavailable)?;
            Ok::<_, StoreError>(n > 0)
        };
        tokio::time::timeout(self.inner.config.timeout, fut)
            .await
            .map_err(|_| unavailable("timeout"))?
    }

    async fn ping(&self) -> Result<(), StoreError> {
        let fut = async {
            let pong: String = match self.conn().await? {
                Conn::Single(mut c) => redis::cmd("PING").query_async(&mut c).await,
                Conn::Cluster(mut c) => redis::cmd("PING").query_async(&mut c).await,
            }
            .map_err(unavailable)?;
            if pong == "PONG" {
                Ok(())
            } else {
                Err(StoreError::Protocol(format!("PING answered {pong}")))
            }
        };
        tokio::time::timeout(self.inner.config.timeout, fut)
            .await
            .map_err(|_| unavailable("timeout"))?
    }
}
