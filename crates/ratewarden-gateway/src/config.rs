//! The gateway's configuration: parse the YAML (keeping every value's line
//! and column), then validate it into a [`Config`] ready to run. One
//! validator serves `serve`, `validate` and reload.
//!
//! A file whose root key is `rateLimiter:` is in the format of the Go gateway
//! of seed 002 and is translated (see [`compat`]).

use std::fmt;
use std::net::SocketAddr;
use std::num::NonZeroU64;
use std::str::FromStr;
use std::time::Duration;

use http::{HeaderName, Method, StatusCode, Uri};
use ipnet::IpNet;
use ratewarden::algorithm::Kind;
use ratewarden::{Counting, HeaderStyle, OnError, Penalty, Rule, RuleSpec};
use ratewarden_tower::identity::ClientIp;
use regex::Regex;
use serde::Deserialize;
use serde_saphyr::Spanned;

/// A configuration error, located in its file.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{file}:{line}:{column}: `{key}`: {message}")]
pub struct ConfigError {
    /// The file (or `<built-in>`).
    pub file: String,
    /// 1-based line; 0 when unknown.
    pub line: u64,
    /// 1-based column; 0 when unknown.
    pub column: u64,
    /// The offending key.
    pub key: String,
    /// What is wrong.
    pub message: String,
}

type Sp<T> = Spanned<T>;

// ------------------------------------------------------------------ the file

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct File {
    listen: Option<Sp<String>>,
    workers: Option<Sp<i64>>,
    #[serde(alias = "target")]
    upstream: Option<Sp<String>>,
    upstream_timeout: Option<Sp<String>>,
    client_idle_timeout: Option<Sp<String>>,
    #[serde(default = "default_admin")]
    admin: Option<AdminFile>,
    store: Option<StoreFile>,
    identity: Option<IdentityFile>,
    #[serde(default)]
    allow: Vec<Sp<String>>,
    #[serde(default)]
    deny: Vec<Sp<String>>,
    headers: Option<Vec<Sp<String>>>,
    status: Option<Sp<i64>>,
    #[serde(default)]
    rules: Vec<RuleFile>,
}

fn default_admin() -> Option<AdminFile> {
    Some(AdminFile {
        listen: None,
        token: None,
    })
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct AdminFile {
    listen: Option<Sp<String>>,
    token: Option<String>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct StoreFile {
    #[serde(rename = "type")]
    kind: Sp<String>,
    max_keys: Option<Sp<i64>>,
    url: Option<Sp<String>>,
    cluster: Option<Vec<Sp<String>>>,
    key_prefix: Option<Sp<String>>,
    timeout: Option<Sp<String>>,
    on_error: Option<Sp<String>>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct IdentityFile {
    from: Option<Sp<String>>,
    header: Option<Sp<String>>,
    missing: Option<Sp<String>>,
    #[serde(default)]
    trusted_proxies: Vec<Sp<String>>,
    ipv6_prefix: Option<Sp<i64>>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct RuleFile {
    name: Sp<String>,
    #[serde(rename = "match")]
    matcher: Option<MatchFile>,
    key: Option<Vec<Sp<String>>>,
    algorithm: Option<Sp<String>>,
    limit: Sp<i64>,
    window: Sp<String>,
    burst: Option<Sp<i64>>,
    mode: Option<Sp<String>>,
    max_delay: Option<Sp<String>>,
    min_interval: Option<Sp<String>>,
    penalty: Option<PenaltyFile>,
    count: Option<Sp<String>>,
    reset_on_success: Option<bool>,
    failure_status: Option<Vec<Sp<i64>>>,
    count_rejected: Option<bool>,
    cost: Option<Sp<i64>>,
    shadow: Option<bool>,
}

#[derive(Debug, Deserialize)]
#[serde(untagged)]
enum PenaltyFile {
    Plain(String),
    Full(PenaltyFull),
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct PenaltyFull {
    duration: String,
    multiplier: Option<u32>,
    max: Option<String>,
    memory: Option<String>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct MatchFile {
    methods: Option<Vec<Sp<String>>>,
    path: Option<Sp<String>>,
    path_prefix: Option<Sp<String>>,
    path_regex: Option<Sp<String>>,
}

// ------------------------------------------------------------------ the result

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
    /// Path condition.
    pub path: PathMatch,
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
    /// Whether a request matches.
    pub fn matches(&self, method: &Method, path: &str) -> bool {
        (self.methods.is_empty() || self.methods.contains(method))
            && match &self.path {
                PathMatch::Any => true,
                PathMatch::Exact(p) => path == p,
                PathMatch::Prefix(p) => path.starts_with(p.as_str()),
                PathMatch::Regex(r) => r.is_match(path),
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

// ------------------------------------------------------------------ parsing

/// Parses a duration with a unit: `500ms`, `3s`, `5m`, `1h`, `1d`.
pub fn parse_duration(s: &str) -> Result<Duration, String> {
    let s = s.trim();
    let split = s
        .find(|c: char| !c.is_ascii_digit())
        .ok_or_else(|| format!("`{s}` has no unit: write e.g. `{s}s` (units: ms, s, m, h, d)"))?;
    let (n, unit) = s.split_at(split);
    let n: u64 = n
        .parse()
        .map_err(|_| format!("`{s}` is not a duration like `500ms`, `3s`, `5m`, `1h`, `1d`"))?;
    let d = match unit {
        "ms" => Duration::from_millis(n),
        "s" => Duration::from_secs(n),
        "m" => Duration::from_secs(n * 60),
        "h" => Duration::from_secs(n * 3600),
        "d" => Duration::from_secs(n * 86_400),
        _ => {
            return Err(format!(
                "`{s}`: unknown unit `{unit}` (units: ms, s, m, h, d)"
            ));
        }
    };
    Ok(d)
}

/// The closest of `candidates` to `word`, if reasonably close.
pub fn suggest<'a>(word: &str, candidates: impl IntoIterator<Item = &'a str>) -> Option<&'a str> {
    fn distance(a: &str, b: &str) -> usize {
        let b: Vec<char> = b.chars().collect();
        let mut row: Vec<usize> = (0..=b.len()).collect();
        for (i, ca) in a.chars().enumerate() {
            let mut prev = row[0];
            row[0] = i + 1;
            for (j, &cb) in b.iter().enumerate() {
                let cur = row[j + 1];
                row[j + 1] = (prev + usize::from(ca != cb)).min(row[j] + 1).min(cur + 1);
                prev = cur;
            }
        }
        row[b.len()]
    }
    candidates
        .into_iter()
        .map(|c| (distance(word, c), c))
        .filter(|(d, c)| *d <= (c.len() / 3).max(2))
        .min()
        .map(|(_, c)| c)
}

struct Ctx<'a> {
    file: &'a str,
}

impl Ctx<'_> {
    fn err<T>(
        &self,
        key: &str,
        at: Option<&serde_saphyr::Location>,
        message: impl Into<String>,
    ) -> Result<T, ConfigError> {
        Err(ConfigError {
            file: self.file.to_owned(),
            line: at.map_or(0, |l| l.line()),
            column: at.map_or(0, |l| l.column()),
            key: key.to_owned(),
            message: message.into(),
        })
    }

    fn duration(&self, key: &str, v: &Sp<String>) -> Result<Duration, ConfigError> {
        match parse_duration(&v.value) {
            Ok(d) => Ok(d),
            Err(m) => self.err(key, Some(&v.referenced), m),
        }
    }

    fn positive(&self, key: &str, v: &Sp<i64>) -> Result<u64, ConfigError> {
        if v.value < 1 {
            return self.err(
                key,
                Some(&v.referenced),
                format!("must be a whole number >= 1, not {}", v.value),
            );
        }
        Ok(v.value as u64)
    }
}

/// Turns a serde-saphyr error into ours, with a suggestion for unknown keys.
fn parse_error(file: &str, e: &serde_saphyr::Error) -> ConfigError {
    let loc = e.location();
    let text = e.to_string();
    // The first line is the message ("error: line L column C: ..."); the rest
    // is a rendered snippet, which our own `file:line:column` replaces.
    let first = text.lines().next().unwrap_or("invalid YAML");
    let first = first.strip_prefix("error: ").unwrap_or(first);
    let first = match first.split_once(": ") {
        Some((pos, rest)) if pos.starts_with("line ") => rest,
        _ => first,
    };
    let mut message = first.to_owned();
    let mut key = String::from("(document)");
    if let Some(rest) = first.strip_prefix("unknown field `") {
        let (unknown, tail) = rest.split_once('`').unwrap_or((rest, ""));
        let expected: Vec<&str> = tail
            .trim_start_matches(", expected one of ")
            .trim_start_matches(", expected ")
            .split(", ")
            .map(|k| k.trim_matches('`'))
            .filter(|k| !k.is_empty())
            .collect();
        message = match suggest(unknown, expected.iter().copied()) {
            Some(s) => format!("unknown key `{unknown}`; did you mean `{s}`?"),
            None => format!(
                "unknown key `{unknown}`; valid keys here: {}",
                expected.join(", ")
            ),
        };
        key = unknown.to_owned();
    } else if let Some(rest) = first.strip_prefix("missing field `") {
        key = rest.split('`').next().unwrap_or_default().to_owned();
        message = format!("`{key}` is required here");
    }
    ConfigError {
        file: file.to_owned(),
        line: loc.map_or(0, |l| l.line()),
        column: loc.map_or(0, |l| l.column()),
        key,
        message,
    }
}

/// Parses and validates a configuration text.
pub fn load(text: &str, file: &str, overrides: &Overrides) -> Result<Config, ConfigError> {
    let is_compat = text
        .lines()
        .any(|l| l.trim_end().starts_with("rateLimiter:"));
    if is_compat {
        let f: compat::CompatFile =
            serde_saphyr::from_str(text).map_err(|e| parse_error(file, &e))?;
        return compat::translate(f, file, overrides);
    }
    let f: File = serde_saphyr::from_str(text).map_err(|e| parse_error(file, &e))?;
    validate(f, file, overrides)
}

fn validate(f: File, file: &str, o: &Overrides) -> Result<Config, ConfigError> {
    let cx = Ctx { file };
    let addr = |key: &str, s: &Sp<String>| -> Result<SocketAddr, ConfigError> {
        match s.value.parse() {
            Ok(a) => Ok(a),
            Err(_) => cx.err(
                key,
                Some(&s.referenced),
                format!("`{}` is not an address like 127.0.0.1:8080", s.value),
            ),
        }
    };
    let listen = match (&o.listen, &f.listen) {
        (Some(l), _) => l.parse().map_err(|_| ConfigError {
            file: "--listen".into(),
            line: 0,
            column: 0,
            key: "listen".into(),
            message: format!("`{l}` is not an address"),
        })?,
        (None, Some(l)) => addr("listen", l)?,
        (None, None) => "127.0.0.1:8080".parse().expect("valid"),
    };
    let workers = match (o.workers, &f.workers) {
        (Some(n), _) => n.max(1),
        (None, Some(w)) => cx.positive("workers", w)? as usize,
        (None, None) => std::thread::available_parallelism().map_or(1, |n| n.get()),
    };
    let upstream = match (&o.upstream, &f.upstream) {
        (Some(u), _) => parse_upstream(u).map_err(|m| ConfigError {
            file: "--upstream".into(),
            line: 0,
            column: 0,
            key: "upstream".into(),
            message: m,
        })?,
        (None, Some(u)) => match parse_upstream(&u.value) {
            Ok(up) => up,
            Err(m) => return cx.err("upstream", Some(&u.referenced), m),
        },
        (None, None) => Upstream::Echo,
    };
    let upstream_timeout = match &f.upstream_timeout {
        Some(t) => cx.duration("upstream_timeout", t)?,
        None => Duration::from_secs(30),
    };
    let client_idle_timeout = match &f.client_idle_timeout {
        Some(t) => match cx.duration("client_idle_timeout", t)? {
            d if d.is_zero() => {
                return cx.err(
                    "client_idle_timeout",
                    Some(&t.referenced),
                    "must be longer than 0",
                );
            }
            d => d,
        },
        None => crate::idle::IDLE_TIMEOUT,
    };
    let admin = match f.admin {
        None => None,
        Some(a) => {
            let listen = match (&o.admin_listen, &a.listen) {
                (Some(l), _) => l.parse().map_err(|_| ConfigError {
                    file: "--admin-listen".into(),
                    line: 0,
                    column: 0,
                    key: "admin.listen".into(),
                    message: format!("`{l}` is not an address"),
                })?,
                (None, Some(l)) => addr("admin.listen", l)?,
                (None, None) => "127.0.0.1:9090".parse().expect("valid"),
            };
            Some((listen, a.token))
        }
    };
    let store = match f.store {
        None => StoreSpec::Memory {
            max_keys: 1_000_000,
        },
        Some(s) => store_spec(&cx, s)?,
    };
    let identity = identity(&cx, f.identity)?;
    let pattern = |key: &str, s: &Sp<String>| -> Pattern {
        let v = s.value.trim();
        if let Ok(net) = v.parse::<IpNet>() {
            Pattern::Net(net)
        } else if let Ok(ip) = v.parse::<std::net::IpAddr>() {
            Pattern::Net(IpNet::from(ip))
        } else {
            let _ = key;
            Pattern::Identity(v.to_owned())
        }
    };
    let allow = f.allow.iter().map(|s| pattern("allow", s)).collect();
    let deny = f.deny.iter().map(|s| pattern("deny", s)).collect();
    let headers = match &f.headers {
        None => HeaderStyle::default(),
        Some(list) => {
            let mut style = HeaderStyle {
                legacy: false,
                ietf: false,
            };
            for h in list {
                match h.value.as_str() {
                    "legacy" => style.legacy = true,
                    "ietf" => style.ietf = true,
                    other => {
                        return cx.err(
                            "headers",
                            Some(&h.referenced),
                            format!("unknown header style `{other}` (legacy, ietf)"),
                        );
                    }
                }
            }
            style
        }
    };
    let status = match &f.status {
        None => StatusCode::TOO_MANY_REQUESTS,
        Some(s) => match u16::try_from(s.value)
            .ok()
            .and_then(|v| StatusCode::from_u16(v).ok())
        {
            Some(st) if (400..600).contains(&st.as_u16()) => st,
            _ => {
                return cx.err(
                    "status",
                    Some(&s.referenced),
                    format!("{} is not a 4xx or 5xx status", s.value),
                );
            }
        },
    };
    let mut rules: Vec<GatewayRule> = vec![];
    for r in f.rules {
        let name_at = r.name.referenced;
        if rules.iter().any(|g| g.rule.name() == r.name.value) {
            return cx.err(
                "name",
                Some(&name_at),
                format!("duplicate rule name `{}`", r.name.value),
            );
        }
        rules.push(rule(&cx, r)?);
    }
    Ok(Config {
        listen,
        workers,
        upstream,
        upstream_timeout,
        client_idle_timeout,
        admin,
        store,
        identity,
        allow,
        deny,
        headers,
        status,
        rules,
    })
}

fn parse_upstream(s: &str) -> Result<Upstream, String> {
    if s == "echo" {
        return Ok(Upstream::Echo);
    }
    let uri: Uri = s
        .parse()
        .map_err(|_| format!("`{s}` is not a URL like http://127.0.0.1:9000"))?;
    match uri.scheme_str() {
        // https loads (seed 002's file names one) but this build has no TLS
        // client: such a request is answered 502 with a problem saying so.
        Some("http" | "https") if uri.host().is_some() => Ok(Upstream::Url(uri)),
        _ => Err(format!("`{s}` is not a URL like http://127.0.0.1:9000")),
    }
}

fn store_spec(cx: &Ctx<'_>, s: StoreFile) -> Result<StoreSpec, ConfigError> {
    match s.kind.value.as_str() {
        "memory" => {
            for (k, present) in [
                ("url", s.url.is_some()),
                ("cluster", s.cluster.is_some()),
                ("key_prefix", s.key_prefix.is_some()),
                ("timeout", s.timeout.is_some()),
                ("on_error", s.on_error.is_some()),
            ] {
                if present {
                    return cx.err(
                        k,
                        Some(&s.kind.referenced),
                        format!("`{k}` is only valid with `type: redis`"),
                    );
                }
            }
            let max_keys = match &s.max_keys {
                Some(m) => cx.positive("max_keys", m)? as usize,
                None => 1_000_000,
            };
            Ok(StoreSpec::Memory { max_keys })
        }
        "redis" => {
            if let Some(m) = &s.max_keys {
                return cx.err(
                    "max_keys",
                    Some(&m.referenced),
                    "`max_keys` is only valid with `type: memory`",
                );
            }
            let cluster: Vec<String> = s
                .cluster
                .unwrap_or_default()
                .into_iter()
                .map(|c| c.value)
                .collect();
            if s.url.is_none() && cluster.is_empty() {
                return cx.err(
                    "store",
                    Some(&s.kind.referenced),
                    "a redis store needs `url` or `cluster`",
                );
            }
            let timeout = match &s.timeout {
                Some(t) => cx.duration("timeout", t)?,
                None => Duration::from_millis(50),
            };
            let on_error = match &s.on_error {
                None => OnError::Local,
                Some(v) => match v.value.as_str() {
                    "local" => OnError::Local,
                    "allow" => OnError::Allow,
                    "deny" => OnError::Deny,
                    other => {
                        return cx.err(
                            "on_error",
                            Some(&v.referenced),
                            format!("`{other}`: expected local, allow or deny"),
                        );
                    }
                },
            };
            let key_prefix = s.key_prefix.map_or_else(|| "rw:".to_owned(), |p| p.value);
            if key_prefix.contains(['{', '}']) {
                return cx.err("key_prefix", None, "must not contain `{` or `}`");
            }
            Ok(StoreSpec::Redis {
                url: s.url.map(|u| u.value),
                cluster,
                key_prefix,
                timeout,
                on_error,
            })
        }
        other => cx.err(
            "type",
            Some(&s.kind.referenced),
            match suggest(other, ["memory", "redis"]) {
                Some(s) => format!("unknown store `{other}`; did you mean `{s}`?"),
                None => format!("unknown store `{other}` (memory, redis)"),
            },
        ),
    }
}

fn identity(cx: &Ctx<'_>, f: Option<IdentityFile>) -> Result<Identity, ConfigError> {
    let Some(f) = f else {
        return Ok(Identity {
            from: IdentityFrom::Ip,
            client_ip: ClientIp::default(),
            missing: Missing::Ip,
        });
    };
    let mut trusted = vec![];
    for t in &f.trusted_proxies {
        let v = t.value.trim();
        match v
            .parse::<IpNet>()
            .or_else(|_| v.parse::<std::net::IpAddr>().map(IpNet::from))
        {
            Ok(n) => trusted.push(n),
            Err(_) => {
                return cx.err(
                    "trusted_proxies",
                    Some(&t.referenced),
                    format!("`{v}` is not a CIDR like 10.0.0.0/8"),
                );
            }
        }
    }
    let ipv6_prefix = match &f.ipv6_prefix {
        Some(p) if (1..=128).contains(&p.value) => p.value as u8,
        Some(p) => {
            return cx.err(
                "ipv6_prefix",
                Some(&p.referenced),
                "must be between 1 and 128",
            );
        }
        None => 64,
    };
    let header = match &f.header {
        Some(h) => match HeaderName::from_bytes(h.value.as_bytes()) {
            Ok(n) => Some(n),
            Err(_) => {
                return cx.err(
                    "header",
                    Some(&h.referenced),
                    format!("`{}` is not a header name", h.value),
                );
            }
        },
        None => None,
    };
    let from = f.from.as_ref().map_or("ip", |v| v.value.as_str());
    let (from, forwarded) = match from {
        "ip" => (IdentityFrom::Ip, false),
        "forwarded" => (IdentityFrom::Ip, true),
        "header" => match header.clone() {
            Some(h) => (IdentityFrom::Header(h), false),
            None => {
                return cx.err(
                    "header",
                    f.from.as_ref().map(|v| &v.referenced),
                    "`from: header` needs `header: NAME`",
                );
            }
        },
        other => {
            return cx.err(
                "from",
                f.from.as_ref().map(|v| &v.referenced),
                format!("`{other}`: expected ip, forwarded or header"),
            );
        }
    };
    let missing = match f.missing.as_ref().map(|m| (m.value.as_str(), m)) {
        None | Some(("ip", _)) => Missing::Ip,
        Some(("reject", _)) => Missing::Reject,
        Some(("anonymous", _)) => Missing::Anonymous,
        Some((other, m)) => {
            return cx.err(
                "missing",
                Some(&m.referenced),
                format!("`{other}`: expected ip, reject or anonymous"),
            );
        }
    };
    Ok(Identity {
        from,
        client_ip: ClientIp {
            forwarded,
            trusted_proxies: trusted,
            ipv6_prefix,
        },
        missing,
    })
}

fn rule(cx: &Ctx<'_>, r: RuleFile) -> Result<GatewayRule, ConfigError> {
    let at = r.name.referenced;
    let kind = match &r.algorithm {
        None => Kind::default(),
        Some(a) => match Kind::from_str(&a.value) {
            Ok(k) => k,
            Err(_) => {
                let names = Kind::ALL.map(Kind::name);
                let hint = match suggest(&a.value, names) {
                    Some(s) => format!("; did you mean `{s}`?"),
                    None => format!(" ({})", names.join(", ")),
                };
                return cx.err(
                    "algorithm",
                    Some(&a.referenced),
                    format!("unknown algorithm `{}`{hint}", a.value),
                );
            }
        },
    };
    let limit = cx.positive("limit", &r.limit)?;
    let window = cx.duration("window", &r.window)?;
    if window.is_zero() {
        return cx.err(
            "window",
            Some(&r.window.referenced),
            "must be longer than zero",
        );
    }
    let burst = match &r.burst {
        Some(b) => Some(NonZeroU64::new(cx.positive("burst", b)?).expect("positive")),
        None => None,
    };
    let mode = r.mode.as_ref().map_or("reject", |m| m.value.as_str());
    let max_delay = match (mode, &r.max_delay) {
        ("delay", Some(d)) => Some(cx.duration("max_delay", d)?),
        ("delay", None) => Some(window),
        ("reject", None) => None,
        ("reject", Some(d)) => {
            return cx.err(
                "max_delay",
                Some(&d.referenced),
                "`max_delay` needs `mode: delay`",
            );
        }
        (other, _) => {
            let at = r.mode.as_ref().map(|m| &m.referenced);
            return cx.err("mode", at, format!("`{other}`: expected reject or delay"));
        }
    };
    let min_interval = match &r.min_interval {
        Some(m) => Some(cx.duration("min_interval", m)?),
        None => None,
    };
    let penalty = match &r.penalty {
        None => None,
        Some(PenaltyFile::Plain(s)) => Some(Penalty::fixed(
            parse_duration(s).or_else(|m| cx.err("penalty", Some(&at), m))?,
        )),
        Some(PenaltyFile::Full(p)) => {
            let d = |s: &str, key: &str| parse_duration(s).or_else(|m| cx.err(key, Some(&at), m));
            let duration = d(&p.duration, "penalty.duration")?;
            Some(Penalty {
                duration,
                multiplier: p.multiplier.unwrap_or(1),
                max: match &p.max {
                    Some(m) => d(m, "penalty.max")?,
                    None => duration,
                },
                memory: match &p.memory {
                    Some(m) => d(m, "penalty.memory")?,
                    None => Duration::ZERO,
                },
            })
        }
    };
    let counting = match r.count.as_ref().map(|c| (c.value.as_str(), c)) {
        None | Some(("all", _)) => {
            if r.reset_on_success.is_some() {
                return cx.err(
                    "reset_on_success",
                    Some(&at),
                    "`reset_on_success` needs `count: failures`",
                );
            }
            Counting::All
        }
        Some(("failures", _)) => Counting::Failures {
            reset_on_success: r.reset_on_success.unwrap_or(true),
        },
        Some((other, c)) => {
            return cx.err(
                "count",
                Some(&c.referenced),
                format!("`{other}`: expected all or failures"),
            );
        }
    };
    let failure_status = match &r.failure_status {
        None => vec![(400, 428), (430, 499)],
        Some(list) => {
            let mut out = vec![];
            for s in list {
                if !(100..600).contains(&s.value) {
                    return cx.err(
                        "failure_status",
                        Some(&s.referenced),
                        format!("{} is not an HTTP status", s.value),
                    );
                }
                out.push((s.value as u16, s.value as u16));
            }
            out
        }
    };
    let cost = match &r.cost {
        Some(c) => NonZeroU64::new(cx.positive("cost", c)?).expect("positive"),
        None => NonZeroU64::MIN,
    };
    let spec = RuleSpec {
        name: r.name.value.clone(),
        algorithm: kind,
        limit: NonZeroU64::new(limit).expect("positive"),
        window,
        burst,
        max_delay,
        min_interval,
        penalty,
        counting,
        count_rejected: r.count_rejected.unwrap_or(false),
        cost,
        shadow: r.shadow.unwrap_or(false),
    };
    let rule = match Rule::new(spec) {
        Ok(rule) => rule,
        Err(e) => return cx.err("name", Some(&at), format!("rule `{}`: {e}", r.name.value)),
    };
    let mut methods = vec![];
    let mut path = PathMatch::Any;
    if let Some(m) = r.matcher {
        for meth in m.methods.unwrap_or_default() {
            match Method::from_bytes(meth.value.to_ascii_uppercase().as_bytes()) {
                Ok(x) => methods.push(x),
                Err(_) => {
                    return cx.err(
                        "methods",
                        Some(&meth.referenced),
                        format!("`{}` is not a method", meth.value),
                    );
                }
            }
        }
        let given = [
            m.path.is_some(),
            m.path_prefix.is_some(),
            m.path_regex.is_some(),
        ];
        if given.iter().filter(|g| **g).count() > 1 {
            return cx.err(
                "match",
                Some(&at),
                "use one of `path`, `path_prefix`, `path_regex`",
            );
        }
        if let Some(p) = m.path {
            path = PathMatch::Exact(p.value);
        } else if let Some(p) = m.path_prefix {
            path = PathMatch::Prefix(p.value);
        } else if let Some(p) = m.path_regex {
            // Bounded compiled size: a config cannot make matching blow up.
            match regex::RegexBuilder::new(&p.value)
                .size_limit(1 << 20)
                .build()
            {
                Ok(re) => path = PathMatch::Regex(re),
                Err(e) => {
                    let first = e
                        .to_string()
                        .lines()
                        .last()
                        .unwrap_or("invalid")
                        .trim()
                        .to_owned();
                    return cx.err(
                        "path_regex",
                        Some(&p.referenced),
                        format!("invalid regex `{}`: {first}", p.value),
                    );
                }
            }
        }
    }
    let key = match r.key {
        None => vec![KeyPart::Identity],
        Some(parts) => {
            let mut out = vec![];
            for p in parts {
                out.push(match p.value.as_str() {
                    "identity" => KeyPart::Identity,
                    "method" => KeyPart::Method,
                    "path" => KeyPart::Path,
                    "global" => KeyPart::Global,
                    h if h.starts_with("header:") => match HeaderName::from_bytes(&h.as_bytes()["header:".len()..]) {
                        Ok(n) => KeyPart::Header(n),
                        Err(_) => return cx.err("key", Some(&p.referenced), format!("`{h}`: bad header name")),
                    },
                    other => {
                        return cx.err("key", Some(&p.referenced), format!("`{other}`: key parts are identity, method, path, header:NAME, global"));
                    }
                });
            }
            out
        }
    };
    Ok(GatewayRule {
        rule,
        matcher: Matcher { methods, path },
        key,
        failure_status,
    })
}

impl fmt::Display for Upstream {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Upstream::Echo => f.write_str("the built-in echo upstream"),
            Upstream::Url(u) => write!(f, "{u}"),
        }
    }
}

pub mod compat {
    //! The Go gateway's format (seed 002): `rateLimiter:` with `strategy`,
    //! `identity`, `client`, `apis`, `target`. Translated as that post
    //! describes: one `client` rule on every request, one rule per API (per
    //! client), the chosen strategy for all, legacy `X-RateLimit-*` headers.
    //! `windowSeconds` is the window; for the bucket strategies
    //! `refillSeconds` is the time in which `limit` tokens are refilled.
    //! `expireSeconds` is accepted and not needed: every state expires
    //! exactly when it no longer matters.

    use super::*;

    #[derive(Debug, Deserialize)]
    #[serde(deny_unknown_fields)]
    pub(super) struct CompatFile {
        #[serde(rename = "rateLimiter")]
        rate_limiter: Root,
    }

    #[derive(Debug, Deserialize)]
    #[serde(deny_unknown_fields)]
    struct Root {
        strategy: Option<Sp<String>>,
        identity: Option<CompatIdentity>,
        client: Option<Limit>,
        #[serde(default)]
        apis: Vec<Api>,
        target: Option<Sp<String>>,
    }

    #[derive(Debug, Deserialize)]
    #[serde(deny_unknown_fields)]
    struct CompatIdentity {
        key: Option<Sp<String>>,
        header: Option<Sp<String>>,
    }

    #[derive(Debug, Deserialize)]
    #[serde(deny_unknown_fields, rename_all = "camelCase")]
    struct Limit {
        limit: Sp<i64>,
        window_seconds: Option<Sp<i64>>,
        refill_seconds: Option<Sp<i64>>,
        expire_seconds: Option<Sp<i64>>,
    }

    #[derive(Debug, Deserialize)]
    #[serde(deny_unknown_fields, rename_all = "camelCase")]
    struct Api {
        identifier: Sp<String>,
        path: ApiPath,
        method: Option<Sp<String>>,
        limit: Sp<i64>,
        window_seconds: Option<Sp<i64>>,
        refill_seconds: Option<Sp<i64>>,
        expire_seconds: Option<Sp<i64>>,
    }

    #[derive(Debug, Deserialize)]
    #[serde(deny_unknown_fields)]
    struct ApiPath {
        expression: Sp<String>,
        value: Sp<String>,
    }

    fn strategy(cx: &Ctx<'_>, s: &Option<Sp<String>>) -> Result<Kind, ConfigError> {
        let Some(s) = s else {
            return Ok(Kind::default());
        };
        let norm = s.value.trim().replace([' ', '-'], "_");
        let norm = if norm == "fixed_window_counter" {
            "fixed_window".to_owned()
        } else {
            norm
        };
        match Kind::from_str(&norm) {
            Ok(k) if k != Kind::Gcra => Ok(k),
            _ => cx.err(
                "strategy",
                Some(&s.referenced),
                format!("unknown strategy `{}` (token_bucket, leaky_bucket, fixed_window_counter, sliding_window_log, sliding_window_counter)", s.value),
            ),
        }
    }

    fn window(
        cx: &Ctx<'_>,
        kind: Kind,
        w: &Option<Sp<i64>>,
        r: &Option<Sp<i64>>,
        at: &serde_saphyr::Location,
    ) -> Result<String, ConfigError> {
        let bucket = matches!(kind, Kind::TokenBucket | Kind::LeakyBucket);
        let (key, v) = match (bucket, r, w) {
            (true, Some(r), _) => ("refillSeconds", r),
            (_, _, Some(w)) => ("windowSeconds", w),
            (false, Some(r), None) => ("refillSeconds", r),
            (_, None, None) => {
                return cx.err(
                    "windowSeconds",
                    Some(at),
                    "`windowSeconds` (or `refillSeconds` for bucket strategies) is required",
                );
            }
        };
        Ok(format!("{}s", cx.positive(key, v)?))
    }

    /// A rule of the Go format: only a name, a match, a limit and a window;
    /// every modifier at its default.
    fn compat_rule(
        name: Sp<String>,
        matcher: Option<MatchFile>,
        limit: Sp<i64>,
        window: Sp<String>,
        kind: Kind,
    ) -> RuleFile {
        RuleFile {
            name,
            matcher,
            key: None,
            algorithm: Some(Sp::new(
                kind.name().into(),
                serde_saphyr::Location::UNKNOWN,
                serde_saphyr::Location::UNKNOWN,
            )),
            limit,
            window,
            burst: None,
            mode: None,
            max_delay: None,
            min_interval: None,
            penalty: None,
            count: None,
            reset_on_success: None,
            failure_status: None,
            count_rejected: None,
            cost: None,
            shadow: None,
        }
    }

    pub(super) fn translate(
        f: CompatFile,
        file: &str,
        o: &Overrides,
    ) -> Result<Config, ConfigError> {
        let cx = Ctx { file };
        let root = f.rate_limiter;
        let kind = strategy(&cx, &root.strategy)?;
        let mut rules = vec![];
        let sp = |s: String| {
            Sp::new(
                s,
                serde_saphyr::Location::UNKNOWN,
                serde_saphyr::Location::UNKNOWN,
            )
        };
        if let Some(c) = root.client {
            let _ = &c.expire_seconds;
            rules.push(compat_rule(
                sp("client".into()),
                None,
                c.limit.clone(),
                sp(window(
                    &cx,
                    kind,
                    &c.window_seconds,
                    &c.refill_seconds,
                    &c.limit.referenced,
                )?),
                kind,
            ));
        }
        for api in root.apis {
            let _ = &api.expire_seconds;
            let (path, prefix_none) = match api.path.expression.value.as_str() {
                "plain" => (Some(api.path.value.clone()), None),
                "regex" => (None, Some(api.path.value.clone())),
                other => {
                    return cx.err(
                        "expression",
                        Some(&api.path.expression.referenced),
                        format!("`{other}`: expected plain or regex"),
                    );
                }
            };
            rules.push(compat_rule(
                api.identifier.clone(),
                Some(MatchFile {
                    methods: api.method.clone().map(|m| vec![m]),
                    path,
                    path_prefix: None,
                    path_regex: prefix_none,
                }),
                api.limit.clone(),
                sp(window(
                    &cx,
                    kind,
                    &api.window_seconds,
                    &api.refill_seconds,
                    &api.identifier.referenced,
                )?),
                kind,
            ));
        }
        // identity.key: ipv4 with header X-Forwarded-For: the post reads the
        // client address from that header, as its proxy in front sets it.
        let identity = match root.identity {
            None => None,
            Some(i) => {
                let _ = &i.key;
                match i.header {
                    Some(h)
                        if h.value.eq_ignore_ascii_case("x-forwarded-for")
                            || h.value.eq_ignore_ascii_case("forwarded") =>
                    {
                        Some(IdentityFile {
                            from: Some(sp("forwarded".into())),
                            header: None,
                            missing: None,
                            trusted_proxies: vec![sp("0.0.0.0/0".into()), sp("::/0".into())],
                            ipv6_prefix: None,
                        })
                    }
                    Some(h) => Some(IdentityFile {
                        from: Some(sp("header".into())),
                        header: Some(h),
                        missing: None,
                        trusted_proxies: vec![],
                        ipv6_prefix: None,
                    }),
                    None => None,
                }
            }
        };
        let file = File {
            listen: None,
            workers: None,
            upstream: root.target,
            upstream_timeout: None,
            client_idle_timeout: None,
            admin: default_admin(),
            store: None,
            identity,
            allow: vec![],
            deny: vec![],
            headers: Some(vec![sp("legacy".into())]),
            status: None,
            rules,
        };
        validate(file, cx.file, o)
    }
}
