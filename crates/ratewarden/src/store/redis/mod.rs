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
pub(crate) mod keys;
#[doc(hidden)]
pub mod script;

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use redis::aio::{ConnectionManager, ConnectionManagerConfig};
use redis::cluster_async::ClusterConnection;

use crate::clock::{Clock, Micros, SystemClock};
use crate::rule::Verdict;
use crate::store::{KeyInfo, Mode, Op, Settle, Store, StoreError};
use breaker::{Admit, Breaker, Change};
use script::{Call, SCRIPT, argv};

/// `cmd` on whichever connection.
async fn query<T: redis::FromRedisValue>(
    conn: &mut Conn,
    cmd: &redis::Cmd,
) -> redis::RedisResult<T> {
    match conn {
        Conn::Single(c) => cmd.query_async(c).await,
        Conn::Cluster(c) => cmd.query_async(c).await,
    }
}

/// Whether `e` says the server has no Functions (`FCALL` unknown: before
/// Redis 7, or a server that only speaks scripts).
/// A shared table and its version, read in one atomic call.
const TABLE_LOAD: &str = "return {redis.call('GET', KEYS[2]), redis.call('HGETALL', KEYS[1])}";
/// Sets a field within the table's bound, moving its version.
const TABLE_PUT: &str = "if redis.call('HEXISTS', KEYS[1], ARGV[1]) == 0 and \
redis.call('HLEN', KEYS[1]) >= tonumber(ARGV[3]) then return 0 end \
redis.call('HSET', KEYS[1], ARGV[1], ARGV[2]) redis.call('INCR', KEYS[2]) return 1";
/// Removes a field, moving the version when it was there.
const TABLE_DELETE: &str = "local n = redis.call('HDEL', KEYS[1], ARGV[1]) \
if n > 0 then redis.call('INCR', KEYS[2]) end return n";

fn no_functions(e: &redis::RedisError) -> bool {
    let m = e.to_string().to_ascii_lowercase();
    m.contains("unknown command") && (m.contains("fcall") || m.contains("function"))
}

/// How many names one `SCAN` step examines (its `COUNT`).
pub const SCAN_COUNT: usize = 1000;

/// What [`RedisStore::scan`] found.
#[derive(Debug, Clone, Default)]
pub struct Scanned {
    /// `(group, key)`, each once, in the order found.
    pub keys: Vec<(String, String)>,
    /// Whether every server was scanned to its end within the budget.
    pub complete: bool,
}

/// The masters' addresses in a `CLUSTER SLOTS` reply: each range's first
/// node is its master.
fn masters(slots: &redis::Value) -> Result<Vec<(String, u16)>, StoreError> {
    let bad = || StoreError::Protocol("CLUSTER SLOTS: unexpected reply".into());
    let redis::Value::Array(ranges) = slots else {
        return Err(bad());
    };
    let mut out: Vec<(String, u16)> = vec![];
    for range in ranges {
        let redis::Value::Array(parts) = range else {
            return Err(bad());
        };
        let Some(redis::Value::Array(node)) = parts.get(2) else {
            return Err(bad());
        };
        let (Some(host), Some(port)) = (node.first(), node.get(1)) else {
            return Err(bad());
        };
        let host: String = redis::from_redis_value_ref(host).map_err(|_| bad())?;
        let port: u16 = redis::from_redis_value_ref(port).map_err(|_| bad())?;
        if !out.iter().any(|(h, p)| *h == host && *p == port) {
            out.push((host, port));
        }
    }
    Ok(out)
}

/// Where the store connects, and how patiently.
#[derive(Clone)]
pub struct RedisConfig {
    /// A standalone server: `redis://[user:password@]host:port/db`
    /// (`rediss://` for TLS when the client is built with TLS support).
    pub url: Option<String>,
    /// Redis Cluster seed nodes; used instead of `url` when not empty.
    pub cluster: Vec<String>,
    /// A master found through Redis Sentinel; used instead of `url` (and
    /// `cluster`) when set.
    pub sentinel: Option<SentinelConfig>,
    /// Prepended to every key (default `rw:`).
    pub key_prefix: String,
    /// Bound on each decision's round trip ([`DEFAULT_TIMEOUT`]). A call
    /// past it is late, not a sign of an outage ([`StoreError::Late`]).
    pub timeout: Duration,
    /// Take time from this clock instead of Redis `TIME`. Leave `None` in
    /// production: gateways whose clocks disagree then still agree. Tests set
    /// it to run the shared case table on a manual clock.
    pub local_clock: Option<Arc<dyn Clock>>,
    /// Calls through a Redis Function (loaded on first use), `EVALSHA`
    /// where the server has none; `false`: always `EVALSHA`.
    pub functions: bool,
    /// Certificates for `rediss://` URLs (feature `tls`): a CA instead of
    /// the system's trust store, a client certificate for mTLS. Without
    /// it, `rediss://` verifies the server against the system's roots.
    #[cfg(feature = "tls")]
    pub tls: Option<RedisTls>,
}

/// A master found through Redis Sentinel.
#[derive(Clone, PartialEq, Eq, Default)]
pub struct SentinelConfig {
    /// The master's name the sentinels monitor (`mymaster`).
    pub master: String,
    /// The sentinels: `redis://host:26379` (`rediss://` for TLS).
    pub nodes: Vec<String>,
    /// The data nodes' password (master and replicas).
    pub password: Option<String>,
    /// The sentinels' own password, where they have one.
    pub sentinel_password: Option<String>,
}

impl std::fmt::Debug for SentinelConfig {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // Never a password in a log line.
        f.debug_struct("SentinelConfig")
            .field("master", &self.master)
            .field(
                "nodes",
                &self.nodes.iter().map(|u| redact(u)).collect::<Vec<_>>(),
            )
            .field("password", &self.password.is_some())
            .field("sentinel_password", &self.sentinel_password.is_some())
            .finish()
    }
}

/// Where the data lives: one server, a cluster, or a master that sentinels
/// name (and rename after a failover).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Topology {
    /// One server at `url`.
    Single,
    /// Redis Cluster, from its seed nodes.
    Cluster,
    /// The master that Redis Sentinel names.
    Sentinel,
}

/// The Redis client's certificates, PEM (see [`RedisConfig::tls`]).
#[cfg(feature = "tls")]
#[derive(Clone, PartialEq, Eq, Default)]
pub struct RedisTls {
    /// CA certificates that sign the servers' (replacing the system's).
    pub ca: Option<Vec<u8>>,
    /// A client certificate chain and its key, for servers that ask for one.
    pub client: Option<(Vec<u8>, Vec<u8>)>,
}

#[cfg(feature = "tls")]
impl std::fmt::Debug for RedisTls {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // Never a key in a log line.
        f.debug_struct("RedisTls")
            .field("ca", &self.ca.is_some())
            .field("client", &self.client.is_some())
            .finish()
    }
}

#[cfg(feature = "tls")]
impl RedisTls {
    fn certificates(&self) -> redis::TlsCertificates {
        redis::TlsCertificates {
            client_tls: self
                .client
                .as_ref()
                .map(|(cert, key)| redis::ClientTlsConfig {
                    client_cert: cert.clone(),
                    client_key: key.clone(),
                }),
            root_cert: self.ca.clone(),
        }
    }
}

impl Default for RedisConfig {
    fn default() -> Self {
        Self {
            url: Some("redis://127.0.0.1:6379/0".into()),
            cluster: vec![],
            sentinel: None,
            key_prefix: "rw:".into(),
            timeout: DEFAULT_TIMEOUT,
            local_clock: None,
            functions: true,
            #[cfg(feature = "tls")]
            tls: None,
        }
    }
}

impl std::fmt::Debug for RedisConfig {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RedisConfig")
            .field("url", &self.url)
            .field("cluster", &self.cluster)
            .field("sentinel", &self.sentinel)
            .field("key_prefix", &self.key_prefix)
            .field("timeout", &self.timeout)
            .field("local_clock", &self.local_clock.is_some())
            .finish()
    }
}

/// Connections to a standalone server, taken in turn by the calls: with
/// one, 64 concurrent callers reached 0.70x of the script's `-P 16`
/// ceiling on one key, with two 0.84-0.87x, with four 0.82x
/// (`benches/redis.rs`, BENCHMARKS.md): two multiplexed connections keep
/// Redis's reads fuller than one.
const SINGLE_CONNECTIONS: usize = 2;

#[derive(Clone)]
enum Conn {
    Single(ConnectionManager),
    Cluster(ClusterConnection),
}

/// A connection attempt's outcome, `None` until it is known.
type Attempt = tokio::sync::watch::Receiver<Option<Result<(), String>>>;

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
    /// [`SILENCE`] without any answer replaces the connections.
    last_answer: AtomicU64,
    /// Gateways that announced themselves in the store within
    /// [`INSTANCE_TTL`], as last read ([`RedisStore::instances`]).
    instances: AtomicU64,
    /// Whether the announcing task runs.
    announcing: std::sync::atomic::AtomicBool,
}

/// The default bound on one call. Chosen from Redis call latency measured
/// through this client on a 2-core host with two CPU-bound processes beside
/// it (BENCHMARKS.md, "Redis call latency on a busy host"): p99.9 8-8.4 ms,
/// the worst of 600,000 calls 42.6 ms (the old default was 50 ms), so a
/// call still unanswered after a second is not a busy host's ordinary
/// delay. A late call is refused, never decided locally: a bound too tight
/// turns a busy host's slow answers into refusals, and that is what it
/// costs.
pub const DEFAULT_TIMEOUT: Duration = Duration::from_secs(1);

/// A late call when nothing has been answered for this long (and at least
/// twice the timeout) replaces the connections: a server that drops
/// packets rather than refusing them is found down by the next connection
/// attempt, not waited on for ever.
const SILENCE: Duration = Duration::from_secs(3);

/// The kinds of [`StoreError`], as counted.
const KINDS: [&str; 5] = StoreError::KINDS;

/// How often a gateway announces itself in the store.
const ANNOUNCE_EVERY: Duration = Duration::from_secs(1);

/// A gateway not announced for this long is no longer counted.
pub const INSTANCE_TTL: Duration = Duration::from_secs(5);

/// Announces one gateway and counts those announced within a TTL, by
/// Redis's own clock. KEYS[1] the set; ARGV: the gateway's id, the TTL in
/// ms.
const ANNOUNCE: &str = r"
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local ttl = tonumber(ARGV[2])
redis.call('ZADD', KEYS[1], now, ARGV[1])
redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', now - ttl)
redis.call('PEXPIRE', KEYS[1], ttl)
return redis.call('ZCARD', KEYS[1])
";

/// A new store's name in the set of gateways: its host, its process and a
/// counter. A reload makes a new store, whose old name lapses after
/// [`INSTANCE_TTL`] (meanwhile each gateway's share is a little smaller:
/// the safe side).
fn instance_id() -> String {
    static N: AtomicU64 = AtomicU64::new(0);
    let host = std::fs::read_to_string("/proc/sys/kernel/hostname").unwrap_or_default();
    let t = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_micros());
    format!(
        "{}:{}:{t:x}:{}",
        host.trim(),
        std::process::id(),
        N.fetch_add(1, Ordering::Relaxed)
    )
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

/// A Redis error as the store's (STYLE.md 17):
/// - nothing applied, try later: a refused connection, or a server that
///   says it cannot serve now (`LOADING`, `BUSY`, `TRYAGAIN`,
///   `CLUSTERDOWN`, `MASTERDOWN`, `READONLY` after a failover) is
///   [`StoreError::Unavailable`], an outage;
/// - a connection that broke is an outage too ([`StoreError::Unavailable`]):
///   the server went away (a call in flight then may have been applied,
///   which the README's outage bound counts);
/// - sent, and perhaps applied, the server still there: a timeout is
///   [`StoreError::Late`];
/// - anything else the server answered (a script error, `WRONGTYPE`,
///   `NOAUTH`, `NOPERM`) is [`StoreError::Server`], and a reply that does
///   not parse [`StoreError::Protocol`]: retrying will not mend them.
pub fn classify(e: redis::RedisError) -> StoreError {
    if e.is_connection_refusal() {
        return StoreError::unavailable_from(e);
    }
    if let Some(
        "LOADING" | "BUSY" | "TRYAGAIN" | "CLUSTERDOWN" | "MASTERDOWN" | "READONLY" | "MOVED"
        | "ASK",
    ) = e.code()
    {
        return StoreError::unavailable_from(e);
    }
    if e.is_timeout() {
        return StoreError::Late(e.to_string());
    }
    // A connection that broke (reset, closed, refused on reconnecting) is
    // the server going away: an outage. A call that was on it may have
    // been applied just before: deciding it locally can admit it once
    // more, so the outage bound (README) counts the calls in flight then.
    if e.is_io_error() || e.is_connection_dropped() {
        return StoreError::unavailable_from(e);
    }
    match e.kind() {
        redis::ErrorKind::Parse | redis::ErrorKind::UnexpectedReturnType => {
            StoreError::Protocol(e.to_string())
        }
        _ => StoreError::Server(e.to_string()),
    }
}

/// Checks that `url` is a Redis URL this build can connect to, without
/// connecting: for config validation.
///
/// ```
/// use ratewarden::store::redis::check_url;
/// assert!(check_url("redis://:secret@127.0.0.1:6379/0").is_ok());
/// assert!(check_url("redis://127.0.0.1:notaport").is_err());
/// assert!(check_url("http://127.0.0.1:6379").is_err());
/// // redis:// is not a special scheme to `url`: a host is opaque, never
/// // mapped through IDNA (the build links no Unicode tables for it).
/// assert!(check_url("redis://bücher.example:6379").is_ok());
/// assert!(check_url("redis://xn--bcher-kva.example:6380").is_ok());
/// ```
pub fn check_url(url: &str) -> Result<(), String> {
    redis::Client::open(url)
        .map(drop)
        .map_err(|e| format!("`{url}` is not a usable Redis URL: {e}"))
}

/// `url` without its password (`redis://:***@host`), for logs.
///
/// ```
/// use ratewarden::store::redis::redact;
/// assert_eq!(redact("redis://:s3cret@10.0.0.5:6379/0"), "redis://:***@10.0.0.5:6379/0");
/// assert_eq!(redact("rediss://user:pw@h:6380"), "rediss://user:***@h:6380");
/// assert_eq!(redact("redis://127.0.0.1:6379"), "redis://127.0.0.1:6379");
/// ```
pub fn redact(url: &str) -> String {
    let Some((scheme, rest)) = url.split_once("://") else {
        return url.to_owned();
    };
    let (auth, host) = match rest.rsplit_once('@') {
        Some(x) => x,
        None => return url.to_owned(),
    };
    match auth.split_once(':') {
        Some((user, _)) => format!("{scheme}://{user}:***@{host}"),
        None => url.to_owned(),
    }
}

/// Bound on making a connection (calls keep their own, shorter, timeout).
const CONNECT_TIMEOUT: Duration = Duration::from_secs(2);

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
                clock,
                config,
                topology,
                instances: AtomicU64::new(1),
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

    /// The standalone server's client, with the configured certificates.
    fn client(&self) -> redis::RedisResult<redis::Client> {
        let url = self.inner.config.url.as_deref().unwrap_or_default();
        self.client_for(redis::IntoConnectionInfo::into_connection_info(url)?)
    }

    async fn connect(&self) -> Result<Vec<Conn>, StoreError> {
        let c = &self.inner.config;
        let t = c.timeout.max(Duration::from_millis(10));
        // A connection (a TLS handshake: two more round trips) may take
        // longer than one call is allowed to.
        let connect_t = t.max(CONNECT_TIMEOUT);
        if self.inner.topology != Topology::Cluster {
            let client = match self.inner.topology {
                Topology::Sentinel => tokio::time::timeout(connect_t, self.sentinel_master())
                    .await
                    .map_err(|_| {
                        StoreError::unavailable(format!(
                            "no sentinel named the master within {connect_t:?}"
                        ))
                    })??,
                _ => self.client().map_err(StoreError::unavailable_from)?,
            };
            let cfg = ConnectionManagerConfig::new()
                .set_response_timeout(Some(t))
                .set_connection_timeout(Some(connect_t))
                .set_number_of_retries(1);
            let mut conns = Vec::with_capacity(SINGLE_CONNECTIONS);
            for _ in 0..SINGLE_CONNECTIONS {
                let m = ConnectionManager::new_with_config(client.clone(), cfg.clone())
                    .await
                    .map_err(StoreError::unavailable_from)?;
                conns.push(Conn::Single(m));
            }
            // One server: the library loaded once serves every connection.
            conns[0] = self.preload(conns[0].clone()).await;
            if self.inner.topology == Topology::Sentinel {
                // The sentinels may name a master that has not yet heard
                // of its promotion, or one demoted since: confirm.
                let role: redis::Value = query(&mut conns[0], &redis::cmd("ROLE"))
                    .await
                    .map_err(classify)?;
                let is_master = match &role {
                    redis::Value::Array(v) => matches!(
                        v.first(),
                        Some(redis::Value::BulkString(b)) if b == b"master"
                    ),
                    _ => false,
                };
                if !is_master {
                    return Err(StoreError::unavailable(
                        "the node the sentinels named is not a master (yet)",
                    ));
                }
            }
            Ok(conns)
        } else {
            let builder = redis::cluster::ClusterClientBuilder::new(c.cluster.clone());
            #[cfg(feature = "tls")]
            let builder = match &c.tls {
                Some(tls) => builder.certs(tls.certificates()),
                None => builder,
            };
            let client = builder
                .connection_timeout(connect_t)
                .response_timeout(t)
                .retries(1)
                .build()
                .map_err(StoreError::unavailable_from)?;
            let conn = client
                .get_async_connection()
                .await
                .map_err(StoreError::unavailable_from)?;
            Ok(vec![self.preload(Conn::Cluster(conn)).await])
        }
    }

    /// A client for the master the sentinels name now: each sentinel asked
    /// in turn (`SENTINEL get-master-addr-by-name`), the first answer
    /// taken; [`connect`](Self::connect) confirms the node's `ROLE`. A
    /// `rediss://` sentinel list means TLS to the sentinels and to the
    /// master, with `tls`'s certificates where given.
    async fn sentinel_master(&self) -> Result<redis::Client, StoreError> {
        let c = &self.inner.config;
        let sc = c
            .sentinel
            .as_ref()
            .ok_or_else(|| StoreError::Config("no sentinel section".into()))?;
        let tls = sc.nodes.iter().any(|n| n.starts_with("rediss://"));
        let mut last = String::from("no sentinel answered");
        for n in &sc.nodes {
            let mut info = redis::IntoConnectionInfo::into_connection_info(n.as_str())
                .map_err(|e| StoreError::Config(e.to_string()))?;
            if let Some(pw) = &sc.sentinel_password {
                let settings = info.redis_settings().clone().set_password(pw);
                info = info.set_redis_settings(settings);
            }
            let asked = async {
                let mut con = self
                    .client_for(info)
                    .map_err(|e| e.to_string())?
                    .get_multiplexed_async_connection()
                    .await
                    .map_err(|e| e.to_string())?;
                redis::cmd("SENTINEL")
                    .arg("get-master-addr-by-name")
                    .arg(&sc.master)
                    .query_async::<Option<(String, u16)>>(&mut con)
                    .await
                    .map_err(|e| e.to_string())
            };
            match tokio::time::timeout(c.timeout.max(CONNECT_TIMEOUT), asked).await {
                Ok(Ok(Some((host, port)))) => {
                    let scheme = if tls { "rediss" } else { "redis" };
                    let host = if host.contains(':') {
                        format!("[{host}]")
                    } else {
                        host
                    };
                    let mut master = redis::IntoConnectionInfo::into_connection_info(format!(
                        "{scheme}://{host}:{port}/0"
                    ))
                    .map_err(StoreError::unavailable_from)?;
                    if let Some(pw) = &sc.password {
                        let settings = master.redis_settings().clone().set_password(pw);
                        master = master.set_redis_settings(settings);
                    }
                    return self
                        .client_for(master)
                        .map_err(StoreError::unavailable_from);
                }
                Ok(Ok(None)) => {
                    last = format!("{} does not know master `{}`", redact(n), sc.master);
                }
                Ok(Err(e)) => last = format!("{}: {e}", redact(n)),
                Err(_) => last = format!("{}: no answer", redact(n)),
            }
        }
        Err(StoreError::unavailable(last))
    }

    /// A client for `info`, with the configured certificates for TLS.
    fn client_for(&self, info: redis::ConnectionInfo) -> redis::RedisResult<redis::Client> {
        #[cfg(feature = "tls")]
        if let Some(tls) = &self.inner.config.tls {
            return redis::Client::build_with_tls(info, tls.certificates());
        }
        redis::Client::open(info)
    }

    /// Gateways that announced themselves in the store within
    /// [`INSTANCE_TTL`], as last read (1 until read).
    pub fn instances(&self) -> u64 {
        self.inner.instances.load(Ordering::Relaxed).max(1)
    }

    /// Starts announcing this gateway every [`ANNOUNCE_EVERY`] on the
    /// connections made, and reading how many announced, for the share
    /// each gateway takes during an outage. The task ends with the store.
    fn announce(&self) {
        if self.inner.announcing.swap(true, Ordering::Relaxed) {
            return;
        }
        let weak = Arc::downgrade(&self.inner);
        tokio::spawn(async move {
            let script = redis::Script::new(ANNOUNCE);
            let ttl = INSTANCE_TTL.as_millis().to_string();
            let id = instance_id();
            loop {
                let Some(inner) = weak.upgrade() else { return };
                let store = RedisStore { inner };
                let key = format!("{}{{ratewarden}}:gateways", store.inner.config.key_prefix);
                if let Some(conn) = store.pick() {
                    let mut inv = script.prepare_invoke();
                    inv.key(&key).arg(&id).arg(&ttl);
                    let t = store.inner.config.timeout;
                    let counted = tokio::time::timeout(t, async {
                        match conn {
                            Conn::Single(mut c) => inv.invoke_async::<u64>(&mut c).await,
                            Conn::Cluster(mut c) => inv.invoke_async::<u64>(&mut c).await,
                        }
                    })
                    .await;
                    if let Ok(Ok(n)) = counted {
                        store.inner.instances.store(n.max(1), Ordering::Relaxed);
                    }
                }
                drop(store);
                tokio::time::sleep(ANNOUNCE_EVERY).await;
            }
        });
    }

    /// Forgets the connections: the next call connects afresh (and, under
    /// Sentinel, asks the sentinels where the master is now). Calls under
    /// way keep theirs.
    fn reconnect(&self) {
        if self.inner.topology != Topology::Cluster {
            *self.inner.conn.lock() = None;
        }
    }

    /// The next of the connections made, if they are.
    fn pick(&self) -> Option<Conn> {
        let conns = self.inner.conn.lock();
        let conns = conns.as_ref()?;
        let i = self.inner.next.fetch_add(1, Ordering::Relaxed) % conns.len();
        Some(conns[i].clone())
    }

    /// A connection (the next, where there are several), made first if
    /// there is none. The attempt runs in a task of its own: a call that
    /// times out waiting for it (its timeout is one decision's, a TLS
    /// handshake over a long link may take longer) leaves it to finish for
    /// the calls after it, instead of cancelling it and starting over each
    /// time.
    async fn conn(&self) -> Result<Conn, StoreError> {
        let mut outcome = {
            if let Some(c) = self.pick() {
                return Ok(c);
            }
            let mut connecting = self.inner.connecting.lock();
            match connecting.as_ref() {
                Some(rx) => rx.clone(),
                None => {
                    let (tx, rx) = tokio::sync::watch::channel(None);
                    *connecting = Some(rx.clone());
                    let store = self.clone();
                    tokio::spawn(async move {
                        let made = match store.connect().await {
                            Ok(c) => {
                                *store.inner.conn.lock() = Some(c);
                                store.announce();
                                Ok(())
                            }
                            Err(e) => Err(e.to_string()),
                        };
                        *store.inner.connecting.lock() = None;
                        let _ = tx.send(Some(made));
                    });
                    rx
                }
            }
        };
        let made = outcome
            .wait_for(Option::is_some)
            .await
            .map_err(|_| StoreError::unavailable("the connection attempt was abandoned"))?
            .clone();
        match made {
            Some(Ok(())) => self
                .pick()
                .ok_or_else(|| StoreError::unavailable("not connected")),
            Some(Err(e)) => Err(StoreError::unavailable(e)),
            None => Err(StoreError::unavailable("not connected")),
        }
    }

    /// Connects now rather than on the first decision, waiting at most
    /// `within`: a gateway calls it before it takes traffic, so that its
    /// first decisions are Redis's (on a cluster, a first connection
    /// takes longer than one decision's timeout, and those decisions would
    /// otherwise fall to `on_error`). An error leaves the connecting to
    /// the calls that follow.
    pub async fn connect_now(&self, within: Duration) -> Result<(), StoreError> {
        match tokio::time::timeout(within, self.conn()).await {
            Ok(r) => r.map(drop),
            Err(_) => Err(StoreError::unavailable(format!(
                "not connected within {within:?}"
            ))),
        }
    }

    /// One command on a connection, bounded and guarded as a decision is.
    async fn command<T: redis::FromRedisValue>(&self, cmd: redis::Cmd) -> Result<T, StoreError> {
        self.guarded(async {
            match self.conn().await? {
                Conn::Single(mut c) => cmd.query_async(&mut c).await,
                Conn::Cluster(mut c) => cmd.query_async(&mut c).await,
            }
            .map_err(classify)
        })
        .await
    }

    /// The hash and version keys of a shared table named `name` (one hash
    /// slot on a cluster: the name is their hash tag).
    fn table_keys(&self, name: &str) -> (String, String) {
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

    /// The state key and zset key of `op` (see [`keys`]).
    #[doc(hidden)]
    pub fn key_names(&self, op: &Op<'_>) -> (String, String) {
        keys::names(&self.inner.config.key_prefix, op)
    }

    /// One script call of `ops`, bounded by the timeout and guarded by the
    /// breaker: `FCALL` of the library's function (loaded when missing:
    /// first use, a restarted or new node), or `EVALSHA` of the script
    /// where the server has no Functions (before Redis 7) or they are off.
    /// The reply is an apply or peek call's bytes or integer
    /// ([`script::reply`]), an inspection's integers, or nothing much.
    async fn run<T: redis::FromRedisValue>(
        &self,
        ops: &[Call<'_>],
        mode: script::Mode,
    ) -> Result<T, StoreError> {
        self.run_with(ops, mode, None, &[]).await
    }

    /// [`run`](Self::run) with one more key and more ARGV after the ops'
    /// (a grant's).
    async fn run_with<T: redis::FromRedisValue>(
        &self,
        ops: &[Call<'_>],
        mode: script::Mode,
        key: Option<String>,
        extra: &[String],
    ) -> Result<T, StoreError> {
        let now = self
            .inner
            .config
            .local_clock
            .as_ref()
            .map_or(Micros::ZERO, |c| c.now());
        let local = if now > Micros::ZERO {
            now
        } else {
            self.inner.clock.now()
        };
        let mut keys = Vec::with_capacity(ops.len() * 2 + 1);
        let mut args = match ops {
            // Most calls: one op applied, in the compact form.
            [(op, cost, _)] if mode == script::Mode::Apply && key.is_none() => {
                let (k, log) = self.key_names(op);
                keys.push(k);
                if script::keeps_zset(op.rule) {
                    keys.push(log);
                }
                script::argv_one(op, *cost, now, local)
            }
            _ => {
                for (op, _, _) in ops {
                    let (k, log) = self.key_names(op);
                    keys.push(k);
                    keys.push(log);
                }
                argv(ops, mode, now, local)
            }
        };
        keys.extend(key);
        args.extend_from_slice(extra);
        self.guarded(async {
            let mut conn = self.conn().await?;
            if self.inner.functions.load(Ordering::Relaxed) != 2 {
                match self.fcall(&mut conn, &keys, &args).await {
                    Err(e) if no_functions(&e) => {
                        self.inner.functions.store(2, Ordering::Relaxed);
                        tracing::info!(redis = %self.target(), "redis has no Functions (FCALL): the script goes by EVALSHA");
                    }
                    other => return other.map_err(classify),
                }
            }
            let mut inv = self.inner.script.prepare_invoke();
            for k in &keys {
                inv.key(k);
            }
            for a in &args {
                inv.arg(a);
            }
            match conn {
                Conn::Single(mut c) => inv.invoke_async(&mut c).await,
                Conn::Cluster(mut c) => inv.invoke_async(&mut c).await,
            }
            .map_err(classify)
        })
        .await
    }

    /// A new connection's servers get the script before the first decision
    /// needs it: the library (`FUNCTION LOAD`, every master of a cluster),
    /// or where there are no Functions the script (`SCRIPT LOAD`). Without
    /// this, a burst of first decisions each found it missing and loaded
    /// it (a 30 KB compile each), and their timeouts sent them to
    /// `on_error`. A failure here is left to the calls, which load on
    /// demand.
    async fn preload(&self, mut conn: Conn) -> Conn {
        if self.inner.functions.load(Ordering::Relaxed) != 2 {
            let mut load = redis::cmd("FUNCTION");
            load.arg("LOAD").arg(&self.inner.library.0);
            match query::<String>(&mut conn, &load).await {
                Ok(_) => return conn,
                Err(e) if e.to_string().contains("already exists") => return conn,
                Err(e) if no_functions(&e) => {
                    self.inner.functions.store(2, Ordering::Relaxed);
                    tracing::info!(redis = %self.target(), "redis has no Functions (FCALL): the script goes by EVALSHA");
                }
                Err(_) => return conn,
            }
        }
        let mut load = redis::cmd("SCRIPT");
        load.arg("LOAD").arg(SCRIPT);
        let _ = query::<String>(&mut conn, &load).await;
        conn
    }

    /// `FCALL` of the library's function; on a server that does not have
    /// it yet, `FUNCTION LOAD` (to every master of a cluster) and again.
    async fn fcall<T: redis::FromRedisValue>(
        &self,
        conn: &mut Conn,
        keys: &[String],
        args: &[String],
    ) -> redis::RedisResult<T> {
        let (library, name) = &self.inner.library;
        let mut call = redis::cmd("FCALL");
        call.arg(name).arg(keys.len()).arg(keys).arg(args);
        let first = query(conn, &call).await;
        match first {
            Err(e) if e.to_string().contains("Function not found") => {
                // One load at a time; the callers queued behind it find
                // the function there.
                let _one = self.inner.loading.lock().await;
                if let Ok(v) = query(conn, &call).await {
                    return Ok(v);
                }
                let mut load = redis::cmd("FUNCTION");
                load.arg("LOAD").arg(library);
                match query::<String>(conn, &load).await {
                    Ok(_) => {}
                    // Loaded meanwhile by another caller or gateway.
                    Err(e) if e.to_string().contains("already exists") => {}
                    Err(e) => return Err(e),
                }
                let answer = query(conn, &call).await;
                if answer.is_ok() {
                    self.inner.functions.store(1, Ordering::Relaxed);
                }
                answer
            }
            other => {
                if other.is_ok() {
                    self.inner.functions.store(1, Ordering::Relaxed);
                }
                other
            }
        }
    }

    /// Runs `call` unless the breaker is open, within the timeout, and
    /// tells the breaker how it went.
    ///
    /// Only an outage ([`StoreError::Unavailable`]: nothing applied) counts
    /// against the breaker. A late call says nothing of the server's
    /// health, since a busy host makes answers late; it is reported as
    /// [`StoreError::Late`], and only when nothing at all has been
    /// answered for [`SILENCE`] are the connections replaced, so that a
    /// server that silently drops packets is found down by the next
    /// connection attempt. A call that timed out before any connection
    /// was made sent nothing: that is unavailable, not late.
    async fn guarded<T>(
        &self,
        call: impl Future<Output = Result<T, StoreError>>,
    ) -> Result<T, StoreError> {
        // Only the wait is generic: the breaker's admission and the
        // outcome's accounting are compiled once, not once per call's type
        // (issue 38, the build).
        let admit = self.admit()?;
        let timeout = self.inner.config.timeout;
        let res = match tokio::time::timeout(timeout, call).await {
            Ok(r) => r,
            Err(_) => Err(self.timed_out(timeout)),
        };
        match res {
            Ok(v) => {
                self.answered();
                Ok(v)
            }
            Err(e) => Err(self.failed(admit, e)),
        }
    }

    /// The breaker's word on a call about to be made: refused while open
    /// (counted), or let through (perhaps as the probe).
    fn admit(&self) -> Result<Admit, StoreError> {
        let admit = self.inner.breaker.admit_as();
        if admit == Admit::Refused {
            let e = StoreError::unavailable("circuit open: redis failing");
            self.count(&e);
            return Err(e);
        }
        Ok(admit)
    }

    /// What a call that ran out of `timeout` is: unavailable when no
    /// connection was made (nothing was sent), late otherwise.
    fn timed_out(&self, timeout: Duration) -> StoreError {
        if self.pick().is_none() {
            StoreError::unavailable(format!("not connected within {timeout:?}"))
        } else {
            StoreError::Late(format!("no answer within {timeout:?}"))
        }
    }

    /// A call answered (well, or with the server's own error): the server
    /// is there. Tells the breaker, and logs a recovery.
    fn answered(&self) {
        self.inner
            .last_answer
            .store(self.inner.clock.now().get(), Ordering::Relaxed);
        if let Change::Closed(after) = self.inner.breaker.success() {
            tracing::info!(redis = %self.target(), outage = ?after.as_duration(), "redis answering again: circuit closed");
        }
    }

    /// A call that failed with `error`: tells the breaker, the counters
    /// and the log, and gives back the error the caller sees.
    fn failed(&self, admit: Admit, error: StoreError) -> StoreError {
        let timeout = self.inner.config.timeout;
        // A late answer in an outage (a probe, or a call while calls are
        // failing for want of the server) is part of that outage: the
        // server is going or gone, not busy (a cluster client's probe during
        // a failover waits on the dead node's slots). Such a call may have been
        // applied just before it went: the README's outage bound counts
        // the calls in flight then.
        let error = match error {
            StoreError::Late(e) if admit == Admit::Probe || self.inner.breaker.failing() => {
                StoreError::unavailable(format!("{e}, while redis is failing"))
            }
            other => other,
        };
        // Log lines on changes only (and the target, a string made from
        // the URL, made only for them): an outage is three lines (the first
        // failure, the circuit opening, the recovery), not one per call.
        match &error {
            StoreError::Server(_) | StoreError::Protocol(_) => {
                self.answered();
                self.count(&error);
            }
            late @ StoreError::Late(e) => {
                self.count(late);
                self.inner.breaker.late();
                let silent =
                    self.inner.clock.now().saturating_sub(Micros::new(
                        self.inner.last_answer.load(Ordering::Relaxed),
                    ));
                if silent.as_duration() >= SILENCE.max(timeout * 2) && self.pick().is_some() {
                    tracing::warn!(redis = %self.target(), error = %e, silent = ?silent.as_duration(), "redis silent: connecting afresh");
                    self.reconnect();
                }
            }
            e => {
                self.count(e);
                // Connect afresh on the next call: a restarted server's
                // new connection, or under Sentinel the new master's.
                self.reconnect();
                match self.inner.breaker.failure() {
                    Change::Failing => {
                        tracing::warn!(redis = %self.target(), error = %e, "redis call failed");
                    }
                    Change::Opened => tracing::warn!(
                        redis = %self.target(),
                        error = %e,
                        "redis unreachable: circuit open, calls fail at once (one probe every 100 ms to 500 ms)"
                    ),
                    _ => tracing::debug!(redis = %self.target(), error = %e, "redis call failed"),
                }
            }
        }
        error
    }

    /// Groups of ops that can go in one script call: all of them on a
    /// standalone server; ops sharing a group (hash slot) on a cluster.
    fn batches<'a>(&self, ops: &[Call<'a>]) -> Vec<Vec<Call<'a>>> {
        if self.inner.topology != Topology::Cluster {
            return vec![ops.to_vec()];
        }
        let mut out: Vec<Vec<Call<'a>>> = vec![];
        for op in ops {
            match out.iter_mut().find(|b| b[0].0.group == op.0.group) {
                Some(b) => b.push(*op),
                None => out.push(vec![*op]),
            }
        }
        out
    }

    /// Where the store points, for log lines: the URL or the first seed,
    /// without a password.
    fn target(&self) -> String {
        let c = &self.inner.config;
        if let Some(sc) = &c.sentinel {
            return format!("sentinel {} via {}", sc.master, redact(&sc.nodes[0]));
        }
        let url = c
            .url
            .as_deref()
            .or(c.cluster.first().map(String::as_str))
            .unwrap_or("");
        redact(url)
    }

    /// The keys of `rule` held in Redis, by a bounded `SCAN`: on each
    /// server (every master of a cluster) at most `budget` names are
    /// examined, `COUNT` [`SCAN_COUNT`] at a time, each step a call of its
    /// own under the timeout and the breaker. `(group, key)` pairs, as
    /// [`Op::grouped`] takes them. Only strings are listed: every stored
    /// state is one (`store` in `lua/rule.lua`), and a key's zset (`:log`)
    /// would otherwise read as another key.
    pub async fn scan(&self, rule: &crate::Rule, budget: usize) -> Result<Scanned, StoreError> {
        let prefix = &self.inner.config.key_prefix;
        let pattern = keys::pattern(prefix, rule.id());
        let nodes = match self.guarded(self.conn()).await? {
            Conn::Single(_) => vec![None],
            Conn::Cluster(mut c) => {
                let slots = self
                    .guarded(async {
                        redis::cmd("CLUSTER")
                            .arg("SLOTS")
                            .query_async::<redis::Value>(&mut c)
                            .await
                            .map_err(classify)
                    })
                    .await?;
                masters(&slots)?.into_iter().map(Some).collect()
            }
        };
        let mut out = Scanned {
            keys: vec![],
            complete: true,
        };
        let mut seen = std::collections::HashSet::new();
        for node in nodes {
            let (mut cursor, mut examined) = (0u64, 0usize);
            loop {
                let mut cmd = redis::cmd("SCAN");
                cmd.arg(cursor)
                    .arg("MATCH")
                    .arg(&pattern)
                    .arg("COUNT")
                    .arg(SCAN_COUNT)
                    .arg("TYPE")
                    .arg("string");
                let (next, names): (u64, Vec<String>) = self
                    .guarded(async {
                        match (self.conn().await?, &node) {
                            (Conn::Single(mut c), _) => cmd.query_async(&mut c).await,
                            (Conn::Cluster(mut c), Some((host, port))) => {
                                let routing = redis::cluster_routing::RoutingInfo::SingleNode(
                                    redis::cluster_routing::SingleNodeRoutingInfo::ByAddress {
                                        host: host.clone(),
                                        port: *port,
                                    },
                                );
                                c.route_command(cmd, routing)
                                    .await
                                    .and_then(|v| Ok(redis::from_redis_value(v)?))
                            }
                            (Conn::Cluster(_), None) => {
                                return Err(StoreError::Protocol("no cluster node".into()));
                            }
                        }
                        .map_err(classify)
                    })
                    .await?;
                for name in &names {
                    if let Some(found) = keys::parse(prefix, rule.id(), name)
                        && seen.insert(found.clone())
                    {
                        out.keys.push(found);
                    }
                }
                examined += SCAN_COUNT;
                cursor = next;
                if cursor == 0 {
                    break;
                }
                if examined >= budget {
                    out.complete = false;
                    break;
                }
            }
        }
        Ok(out)
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
