//! The validated configuration: what the gateway runs.

use std::fmt;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use http::{StatusCode, Uri};
use ratewarden::{HeaderStyle, OnError, RedisTls};

pub use crate::tls::{ClientTls, ServerTls};

pub use ratewarden_tower::identity::{ClientIp, ForwardHeader};
pub use ratewarden_tower::policy::{
    Condition, HostPattern, IdentitySource, KeyHasher, KeyPart, Matcher, Missing, MissingPart,
    PathMatch, Pattern, Policy, PolicyRule, Test,
};

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
// Made once per load and compared on reload, never moved on a request's
// path: the size of its larger variant costs nothing worth a box.
#[allow(clippy::large_enum_variant)]
pub enum StoreSpec {
    /// In-process.
    Memory {
        /// Bound on keys held.
        max_keys: usize,
    },
    /// Redis, Redis Cluster, or a master Redis Sentinel names.
    Redis {
        /// Standalone URL.
        url: Option<String>,
        /// Cluster seed nodes.
        cluster: Vec<String>,
        /// A master found through Redis Sentinel.
        sentinel: Option<ratewarden::store::redis::SentinelConfig>,
        /// Key prefix.
        key_prefix: String,
        /// Per-call timeout.
        timeout: Duration,
        /// What to do when Redis fails.
        on_error: OnError,
        /// Certificates for `rediss://` (`store.tls`).
        tls: Option<RedisTls>,
    },
}

/// A validated configuration.
#[derive(Debug, Clone)]
pub struct Config {
    /// Proxy listener; `None`: `listen: off` (a gateway of `authz:` or
    /// `rls:` alone).
    pub listen: Option<SocketAddr>,
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
    /// `client_max_body_size` in bytes (`0`: no bound): a larger request
    /// body is a 413 (nginx's default 1 MiB).
    pub client_max_body_size: u64,
    /// Keep request header fields whose names contain `_` (nginx's
    /// `underscores_in_headers`); dropped by default.
    pub underscores_in_headers: bool,
    /// `preserve_host`: the client's `Host` goes upstream rather than the
    /// server's (routes may say otherwise). Off by default, as nginx's
    /// `proxy_set_header Host $proxy_host`.
    pub preserve_host: bool,
    /// `forwarded: true`: an RFC 7239 `Forwarded` element (`for`, `host`,
    /// `proto`) on every forwarded request, appended to a trusted proxy's,
    /// a client's replaced.
    pub forwarded: bool,
    /// `x_forwarded_for: append`: every client's `X-Forwarded-For` goes
    /// upstream with the peer appended (nginx's
    /// `$proxy_add_x_forwarded_for`); by default (`replace`) only a
    /// trusted proxy's is kept, and any other client's is replaced by its
    /// address, as Traefik and Caddy do: an app behind the gateway that
    /// trusts its one hop then never believes an address a client wrote.
    pub x_forwarded_for_append: bool,
    /// `request_headers` at the top level: for the routes without their own.
    pub request_headers: RequestHeaders,
    /// Which target goes upstream.
    pub upstream_path: UpstreamPath,
    /// Admin listener and token; `None` turns the admin API off.
    pub admin: Option<(SocketAddr, Option<String>)>,
    /// TLS on the proxy listener (`tls:`).
    pub tls: Option<ServerTls>,
    /// TLS on the admin listener (`admin.tls:`), client certificates
    /// required with `client_ca`.
    pub admin_tls: Option<ServerTls>,
    /// The TLS client of an https upstream (`upstream_tls:`, or the
    /// system's roots); `None` for http and echo.
    pub upstream_tls: Option<ClientTls>,
    /// Every certificate, key and CA file the config read: a change to
    /// one reloads the config, as a change to the config file does.
    pub tls_files: Vec<PathBuf>,
    /// `/healthz`, `/readyz` and `/metrics` need the admin token too
    /// (`admin.token_for_probes`; off: probes and Prometheus need no secret).
    pub admin_token_for_probes: bool,
    /// Names besides addresses and `localhost` that the admin listener
    /// answers under (`admin.hosts`; lower case, without a port): a
    /// request for any other `Host` is refused before any handler runs,
    /// so that a page whose name was rebound to the admin listener's
    /// address (DNS rebinding) cannot drive it.
    pub admin_hosts: Vec<String>,
    /// The log's format and level (read at start).
    pub log: LogSpec,
    /// The access log, if any (read at start).
    pub access_log: Option<AccessSpec>,
    /// OpenTelemetry traces (`tracing:`, and the `OTEL_*` variables, which
    /// win): off when neither names an endpoint.
    pub tracing: TraceSpec,
    /// Routes to other upstreams, tried in order before the default.
    pub routes: Vec<RouteSpec>,
    /// The store.
    pub store: StoreSpec,
    /// Identity, `allow`, `deny` and the rules: what the one admission
    /// path runs (see [`ratewarden_tower::admission`]).
    pub policy: Policy,
    /// Which headers.
    pub headers: HeaderStyle,
    /// Status of a rejection.
    pub status: StatusCode,
    /// Envoy's rate limit service (`rls:`).
    pub rls: Option<crate::config::rls::RlsSpec>,
    /// The rules charged by what their answers cost, and how each reads
    /// it.
    pub costs: Vec<std::sync::Arc<super::cost::CostSpec>>,
    /// Rules whose refusals take another shape than a problem body.
    pub refusals: Vec<(String, super::cost::RefusalShape)>,
    /// Rules whose requests need a trusted token (`jwt_required: true`),
    /// by name.
    pub token_rules: Vec<String>,
    /// Token verification for `jwt:CLAIM` key parts (`jwt:`).
    pub jwt: Option<crate::jwt::Verifier>,
    /// The most runtime overrides (`overrides.max`, default
    /// [`OVERRIDES_MAX`]).
    pub overrides_max: usize,
    /// `state_dir`: where the memory store's overrides are kept across
    /// restarts (`None`: in the process only).
    pub state_dir: Option<std::path::PathBuf>,
    /// The authorisation listener (`authz.listen`): nginx `auth_request`,
    /// Traefik/Caddy forward auth, Envoy `ext_authz` (HTTP and gRPC).
    pub authz: Option<SocketAddr>,
    /// `consumers:`: API keys that name consumers.
    pub consumers: Option<ConsumersSpec>,
}

/// `consumers:`: where a request's API key is, what an unknown one gets,
/// and the consumers a file names.
#[derive(Debug, Clone)]
pub struct ConsumersSpec {
    /// Where the key is.
    pub from: ApiKeyFrom,
    /// A key that names no consumer (unknown, revoked, expired): 401, or
    /// as if no key was sent.
    pub reject_unknown: bool,
    /// The most consumers the admin API may make (`consumers.max`).
    pub max: usize,
    /// The keyed hash keys are kept as (`key_secret`'s).
    pub hasher: KeyHasher,
    /// The consumers `consumers.file` names, read at each load.
    pub file: Vec<ratewarden_tower::consumers::Consumer>,
}

/// Where a request's API key is.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ApiKeyFrom {
    /// A header's value.
    Header(http::HeaderName),
    /// `Authorization: Bearer KEY`.
    Authorization,
    /// A query parameter.
    Query(String),
}

/// How many consumers the admin API may make unless `consumers.max` says.
pub const CONSUMERS_MAX: usize = 100_000;

/// How many runtime overrides may be set unless `overrides.max` says.
pub const OVERRIDES_MAX: usize = 10_000;

impl Config {
    /// Whether `peer` is one of `identity.trusted_proxies`: its
    /// `X-Forwarded-*` and `Forwarded` fields are believed.
    pub fn trusts(&self, peer: std::net::IpAddr) -> bool {
        self.policy
            .identity
            .client_ip()
            .is_some_and(|c| c.trusted(peer))
    }

    /// Whether the `X-Forwarded-For` that `peer` sent goes upstream (with
    /// the peer appended), or is replaced by the peer alone (see
    /// [`Config::x_forwarded_for_append`]).
    pub fn keeps_forwarded_for(&self, peer: std::net::IpAddr) -> bool {
        self.x_forwarded_for_append || self.trusts(peer)
    }
}

/// A route: which requests, and where they go.
#[derive(Debug, Clone)]
pub struct RouteSpec {
    /// Its name (rules may match on it).
    pub name: String,
    /// Which requests (method, normalised path).
    pub matcher: Matcher,
    /// Where they go.
    pub group: GroupSpec,
}

/// Upstream servers, balanced and checked.
#[derive(Debug, Clone)]
pub struct GroupSpec {
    /// The servers.
    pub servers: Vec<ServerSpec>,
    /// Whether the client's `Host` goes upstream (the route's own
    /// `preserve_host`; `None`: the top level's).
    pub preserve_host: Option<bool>,
    /// Fields set or removed upstream (the route's own `request_headers`;
    /// `None`: the top level's).
    pub request_headers: Option<RequestHeaders>,
    /// How one is chosen.
    pub balance: Balance,
    /// Ejection after failures in a row (on by default with two servers or more).
    pub passive: Option<Passive>,
    /// A periodic `GET`.
    pub active: Option<Active>,
}

/// One upstream server.
#[derive(Debug, Clone)]
pub struct ServerSpec {
    /// Its URL.
    pub url: Uri,
    /// Its TLS client (https).
    pub tls: Option<ClientTls>,
    /// The HTTP it is spoken to in (`protocol:`).
    pub protocol: Protocol,
}

/// Which HTTP a server is spoken to in (a server's `protocol:`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Protocol {
    /// By its URL: `http://` HTTP/1.1, `https://` h2 or HTTP/1.1 as the
    /// server chooses by ALPN, `h2c://` HTTP/2 with prior knowledge.
    #[default]
    Auto,
    /// HTTP/1.1 only (an `https://` server is not offered h2).
    Http1,
    /// HTTP/2 only: with prior knowledge on `http://` (h2c), by ALPN on
    /// `https://` (offered alone).
    H2,
}

impl Config {
    /// The server of the top-level `upstream:` (`None`: the echo upstream).
    pub fn default_server(&self) -> Option<ServerSpec> {
        match &self.upstream {
            Upstream::Url(u) => Some(ServerSpec {
                url: u.clone(),
                tls: self.upstream_tls.clone(),
                protocol: Protocol::Auto,
            }),
            Upstream::Echo => None,
        }
    }
}

/// `tracing:` with the `OTEL_*` variables applied.
#[derive(Debug, Clone, PartialEq)]
pub struct TraceSpec {
    /// Where spans go; `None`: tracing is off.
    pub endpoint: Option<TraceEndpoint>,
    /// gRPC or protobuf over HTTP.
    pub protocol: TraceProtocol,
    /// For traces that start here (a sampled parent is always followed).
    pub sampler: TraceSampler,
    /// `service.name` (`OTEL_SERVICE_NAME` wins).
    pub service_name: String,
    /// `OTEL_RESOURCE_ATTRIBUTES`.
    pub resource: Vec<(String, String)>,
    /// `OTEL_EXPORTER_OTLP_HEADERS`.
    pub headers: Vec<(String, String)>,
}

impl Default for TraceSpec {
    fn default() -> Self {
        Self {
            endpoint: None,
            protocol: TraceProtocol::Grpc,
            sampler: TraceSampler::Ratio(1.0),
            service_name: "ratewarden".into(),
            resource: vec![],
            headers: vec![],
        }
    }
}

/// How spans are sent.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TraceProtocol {
    /// OTLP over gRPC (port 4317).
    Grpc,
    /// OTLP's protobuf over HTTP (port 4318, `/v1/traces`).
    HttpProtobuf,
}

/// Which traces that start here are recorded.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum TraceSampler {
    /// This share, by trace id (0 to 1).
    Ratio(f64),
    /// Only those a parent sampled (`parentbased_always_off`).
    Off,
}

/// A collector's address and the path spans are sent to.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TraceEndpoint {
    /// `host:port`.
    pub authority: String,
    /// `/v1/traces` over HTTP; gRPC's method path.
    pub path: String,
}

/// `log:`: how the gateway's own log is written.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LogSpec {
    /// Text (coloured only on a terminal) or one JSON object per line.
    pub format: LogFormat,
    /// A `tracing` filter: `info`, `warn`, `ratewarden=debug,info`...
    /// (`RUST_LOG`, when set, wins).
    pub level: String,
}

impl Default for LogSpec {
    fn default() -> Self {
        Self {
            format: LogFormat::Text,
            level: "info".into(),
        }
    }
}

/// The log's format.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LogFormat {
    /// Human-readable lines.
    Text,
    /// One JSON object per line.
    Json,
}

/// Which target goes upstream (`upstream_path:`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum UpstreamPath {
    /// The target as the client sent it (nginx's `proxy_pass` without a URI).
    #[default]
    Original,
    /// The path in RFC 3986 normal form (see [`ratewarden_tower::path::normalize_for_upstream`]),
    /// the query as sent.
    Normalized,
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
upstream: echo
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

/// How long a client connection may sit without any I/O while no request
/// of it is being answered, unless `client_idle_timeout` says (nginx:
/// `client_header_timeout` 60 s).
pub const IDLE_TIMEOUT: Duration = Duration::from_secs(60);

/// The name of the route of the top-level `upstream:`.
pub const DEFAULT_ROUTE: &str = "default";

/// How lines are written.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AccessFormat {
    /// One JSON object per line.
    Json,
    /// nginx's `combined`, with the request id and time appended.
    Combined,
}

/// Where lines go.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum AccessSink {
    /// Standard output (beside the log, when that goes there too).
    Stdout,
    /// A file, appended to.
    File(PathBuf),
}

/// `access_log:` as configured.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AccessSpec {
    /// Where.
    pub sink: AccessSink,
    /// How.
    pub format: AccessFormat,
}

/// How a group chooses a server.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Balance {
    /// Each server in turn.
    #[default]
    RoundRobin,
    /// The server with the fewest requests in flight (ties in turn).
    LeastRequests,
    /// The same client to the same server while the servers stay up
    /// (rendezvous hashing of the identity: one server going away moves
    /// only its own clients).
    Hash,
}

/// Ejection after failures in a row.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Passive {
    /// Failures in a row that eject a server.
    pub failures: u32,
    /// How long the first ejection lasts.
    pub eject_for: Duration,
}

impl Default for Passive {
    /// nginx ejects after 1 failure for 10 s; 3 in a row is kinder to a
    /// server that dropped one connection.
    fn default() -> Self {
        Self {
            failures: 3,
            eject_for: Duration::from_secs(10),
        }
    }
}

/// A periodic `GET path`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Active {
    /// The path asked for.
    pub path: String,
    /// How often.
    pub interval: Duration,
    /// How long an answer may take.
    pub timeout: Duration,
}

/// Headers that describe one hop, never forwarded (RFC 9110 §7.6.1), nor
/// set by `request_headers`.
pub const HOP_BY_HOP: [&str; 8] = [
    "connection",
    "keep-alive",
    "proxy-authenticate",
    "proxy-authorization",
    "te",
    "trailer",
    "transfer-encoding",
    "upgrade",
];

/// `request_headers:` of a route (or the top level): fields set on, or
/// removed from, what goes upstream, after the gateway's own.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct RequestHeaders {
    /// Set, replacing any the client sent under the name (`Host` too: the
    /// upstream-facing Host, whatever `preserve_host` says).
    pub set: Vec<(http::HeaderName, http::HeaderValue)>,
    /// Removed.
    pub remove: Vec<http::HeaderName>,
}

impl RequestHeaders {
    /// Whether a field named `name` (any case) is set or removed here: the
    /// client's is then not forwarded.
    pub fn replaces(&self, name: &[u8]) -> bool {
        self.set
            .iter()
            .map(|(n, _)| n)
            .chain(&self.remove)
            .any(|n| n.as_str().as_bytes().eq_ignore_ascii_case(name))
    }

    /// The value set for `name`, if any.
    pub fn get(&self, name: &str) -> Option<&http::HeaderValue> {
        self.set
            .iter()
            .find(|(n, _)| n.as_str() == name)
            .map(|(_, v)| v)
    }
}
