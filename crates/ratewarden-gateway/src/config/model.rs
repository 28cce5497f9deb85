//! The validated configuration: what the gateway runs.

use std::fmt;
use std::net::SocketAddr;
use std::time::Duration;

use http::{HeaderName, Method, StatusCode, Uri};
use ipnet::IpNet;
use ratewarden::{HeaderStyle, OnError, Rule};
use ratewarden_tower::identity::ClientIp;
use regex::Regex;

pub use crate::proxy::forward::UpstreamPath;

/// Where admitted requests go.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Upstream {
    /// The built-in echo upstream (no `upstream:`, or `--upstream echo`).
    Echo,
    /// An HTTP origin: scheme, host, port, optional path prefix.
    Url(Uri),
}

/// Which store, and how it fails.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum StoreSpec {
    /// In-process.
    Memory {
        /// Bound on keys held.
        max_keys: usize,
    },
    /// Redis or Redis Cluster.
    Redis {
        /// Standalone URL.
        url: Option<String>,
        /// Cluster seed nodes.
        cluster: Vec<String>,
        /// Key prefix.
        key_prefix: String,
        /// Per-call timeout.
        timeout: Duration,
        /// What to do when Redis fails.
        on_error: OnError,
    },
}

/// Where the identity comes from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum IdentityFrom {
    /// The peer address (or forwarded, per [`ClientIp::forwarded`]).
    Ip,
    /// A header's value.
    Header(HeaderName),
}

/// What to do when `from: header` finds no header.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Missing {
    /// Use the client address.
    Ip,
    /// Reject with 400.
    Reject,
    /// One shared identity, `anonymous`.
    Anonymous,
}

/// How requests are identified.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Identity {
    /// Header or address.
    pub from: IdentityFrom,
    /// Client-address resolution (trusted proxies, IPv6 prefix).
    pub client_ip: ClientIp,
    /// With `from: header`.
    pub missing: Missing,
}

/// One part of a rule's key.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum KeyPart {
    /// The request's identity.
    Identity,
    /// The method.
    Method,
    /// The path (without query).
    Path,
    /// A header's value.
    Header(HeaderName),
    /// One key for all clients.
    Global,
}

/// Which requests a rule applies to.
#[derive(Debug, Clone)]
pub struct Matcher {
    /// Empty = any method.
    pub methods: Vec<Method>,
    /// Path condition, on the normalised path (see
    /// [`ratewarden_tower::path`]).
    pub path: PathMatch,
    /// `case_insensitive: true`: paths compare in ASCII lower case (the
    /// pattern is stored lower-cased; a regex gets the `i` flag).
    pub case_insensitive: bool,
}

/// A path condition.
#[derive(Debug, Clone)]
pub enum PathMatch {
    /// Any path.
    Any,
    /// Exactly this path.
    Exact(String),
    /// Paths starting with this.
    Prefix(String),
    /// Paths the (linear-time) regex matches.
    Regex(Regex),
}

impl Matcher {
    /// Whether a request with this method and (normalised) path matches.
    ///
    /// ```
    /// use http::Method;
    /// use ratewarden_gateway::config::{Matcher, PathMatch};
    /// let m = Matcher { methods: vec![], path: PathMatch::Prefix("/api/".into()), case_insensitive: true };
    /// assert!(m.matches(&Method::GET, "/API/items"));
    /// assert!(!m.matches(&Method::GET, "/apix"));
    /// ```
    pub fn matches(&self, method: &Method, path: &str) -> bool {
        if !(self.methods.is_empty() || self.methods.contains(method)) {
            return false;
        }
        let with = |path: &str| match &self.path {
            PathMatch::Any => true,
            PathMatch::Exact(p) => path == p,
            PathMatch::Prefix(p) => path.starts_with(p.as_str()),
            PathMatch::Regex(r) => r.is_match(path),
        };
        match self.path {
            PathMatch::Exact(_) | PathMatch::Prefix(_)
                if self.case_insensitive && path.bytes().any(|b| b.is_ascii_uppercase()) =>
            {
                with(&path.to_ascii_lowercase())
            }
            _ => with(path),
        }
    }
}

/// A rule as the gateway runs it.
#[derive(Debug, Clone)]
pub struct GatewayRule {
    /// The limiter rule.
    pub rule: Rule,
    /// When it applies.
    pub matcher: Matcher,
    /// Its key.
    pub key: Vec<KeyPart>,
    /// Upstream statuses that count as failures (`count: failures`).
    pub failure_status: Vec<(u16, u16)>,
}

impl GatewayRule {
    /// Whether this rule's keys are grouped by the client's identity (their
    /// key contains it), else each by itself; see [`Self::group`].
    pub fn grouped_by_identity(&self) -> bool {
        self.key.contains(&KeyPart::Identity)
    }

    /// The Redis Cluster group (hash tag) of a key of this rule: the client's
    /// identity when the key contains it (so all of one client's keys share
    /// a slot), else the key itself (a key shared by clients, such as
    /// `global` or an API key header, is one slot of its own). A function of
    /// the key alone, so the proxy and the admin API name the same counter.
    /// `identity` may be omitted when the key is the identity alone.
    pub fn group(&self, key: &str, identity: Option<&str>) -> Result<String, String> {
        if !self.grouped_by_identity() {
            return Ok(key.to_owned());
        }
        match identity {
            Some(id) => Ok(id.to_owned()),
            None if self.key == [KeyPart::Identity] => Ok(key.to_owned()),
            None => Err(format!(
                "rule `{}` is keyed by more than the identity: pass `identity` too",
                self.rule.name()
            )),
        }
    }

    /// Whether `status` is a failure for this rule.
    pub fn is_failure(&self, status: u16) -> bool {
        self.failure_status
            .iter()
            .any(|&(lo, hi)| (lo..=hi).contains(&status))
    }
}

/// A validated configuration.
#[derive(Debug, Clone)]
pub struct Config {
    /// Proxy listener.
    pub listen: SocketAddr,
    /// Threads serving requests.
    pub workers: usize,
    /// Where admitted requests go.
    pub upstream: Upstream,
    /// Bound on an upstream exchange (until response headers).
    pub upstream_timeout: Duration,
    /// A client connection with no I/O for this long while none of its
    /// requests is being answered is closed (within twice this).
    pub client_idle_timeout: Duration,
    /// A request head must arrive within this of its first bytes (408).
    pub client_header_timeout: Duration,
    /// A request body must arrive within this of its head (408).
    pub client_body_timeout: Duration,
    /// Keep request header fields whose names contain `_` (nginx's
    /// `underscores_in_headers`); dropped by default.
    pub underscores_in_headers: bool,
    /// Which target goes upstream.
    pub upstream_path: UpstreamPath,
    /// Admin listener and token; `None` turns the admin API off.
    pub admin: Option<(SocketAddr, Option<String>)>,
    /// The store.
    pub store: StoreSpec,
    /// Identity.
    pub identity: Identity,
    /// Never limited.
    pub allow: Vec<Pattern>,
    /// Always 403.
    pub deny: Vec<Pattern>,
    /// Which headers.
    pub headers: HeaderStyle,
    /// Status of a rejection.
    pub status: StatusCode,
    /// Rules, in file order.
    pub rules: Vec<GatewayRule>,
}

/// An `allow:` / `deny:` entry: a CIDR, an address, or an identity.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Pattern {
    /// A network.
    Net(IpNet),
    /// An exact identity (e.g. a user id from a header).
    Identity(String),
}

impl Pattern {
    /// Whether the client (address `ip`, identity `id`) matches.
    pub fn matches(&self, ip: std::net::IpAddr, id: &str) -> bool {
        match self {
            Pattern::Net(n) => n.contains(&ip),
            Pattern::Identity(s) => s == id,
        }
    }
}

/// Overrides from the command line.
#[derive(Debug, Clone, Default)]
pub struct Overrides {
    /// `--listen`
    pub listen: Option<String>,
    /// `--admin-listen`
    pub admin_listen: Option<String>,
    /// `--upstream`
    pub upstream: Option<String>,
    /// `--workers`
    pub workers: Option<usize>,
}

/// The built-in example: every client, 100 requests per minute, in memory.
pub const EMBEDDED: &str = "\
# ratewarden's built-in example (used when no config file is given)
listen: 127.0.0.1:8080
admin:
  listen: 127.0.0.1:9090
rules:
  - name: per-client
    limit: 100
    window: 60s
";

impl fmt::Display for Upstream {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Upstream::Echo => f.write_str("the built-in echo upstream"),
            Upstream::Url(u) => write!(f, "{u}"),
        }
    }
}
