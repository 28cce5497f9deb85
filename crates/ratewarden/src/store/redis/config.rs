//! Where the store connects: a standalone server, a cluster's seeds or a
//! Sentinel group, with TLS; checked and shown without a password.

use std::sync::Arc;
use std::time::Duration;

use crate::clock::Clock;

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
    pub(super) fn certificates(&self) -> redis::TlsCertificates {
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

/// The default bound on one call. Chosen from Redis call latency measured
/// through this client on a 2-core host with two CPU-bound processes beside
/// it (BENCHMARKS.md, "Redis call latency on a busy host"): p99.9 8-8.4 ms,
/// the worst of 600,000 calls 42.6 ms (the old default was 50 ms), so a
/// call still unanswered after a second is not a busy host's ordinary
/// delay. A late call is refused, never decided locally: a bound too tight
/// turns a busy host's slow answers into refusals, and that is what it
/// costs.
pub const DEFAULT_TIMEOUT: Duration = Duration::from_secs(1);

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
