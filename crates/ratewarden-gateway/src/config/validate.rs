//! From the file as written to a [`Config`]: every value checked, every
//! error recorded with the key and place at fault, and validation carried
//! on past an error so that one run reports them all. One validator serves
//! `serve`, `validate` and reload, so what one accepts the others do.

use std::net::{IpAddr, SocketAddr};
use std::num::NonZeroU64;
use std::str::FromStr;
use std::time::Duration;

use http::{HeaderName, Method, StatusCode, Uri};
use ipnet::IpNet;
use ratewarden::algorithm::Kind;
use ratewarden::{Counting, HeaderStyle, OnError, Penalty, Rule, RuleSpec};
use ratewarden_tower::path;
use serde_saphyr::Location;

use super::diag::{Diag, parse_duration, suggest};
use super::model::*;
use super::schema::*;

/// Default `client_header_timeout` (nginx's is 60 s; a head that takes
/// longer than 10 s is a slow-loris, not a client).
pub const HEADER_TIMEOUT: Duration = Duration::from_secs(10);
/// Default `client_max_body_size` (nginx's 1 MiB).
pub const MAX_BODY_SIZE: u64 = 1 << 20;

/// A size as nginx writes one: bytes, or a number with `k`, `m` or `g`
/// (binary: `1m` is 1,048,576); `0` for no bound.
///
/// ```
/// use ratewarden_gateway::config::parse_size;
/// assert_eq!(parse_size("1m"), Ok(1 << 20));
/// assert_eq!(parse_size("512"), Ok(512));
/// assert_eq!(parse_size("10K"), Ok(10 << 10));
/// assert!(parse_size("1 MB").is_err());
/// ```
pub fn parse_size(s: &str) -> Result<u64, String> {
    let t = s.trim();
    let (digits, unit) = t.split_at(t.find(|c: char| !c.is_ascii_digit()).unwrap_or(t.len()));
    let shift = match unit.to_ascii_lowercase().as_str() {
        "" => 0,
        "k" => 10,
        "m" => 20,
        "g" => 30,
        _ => {
            return Err(format!(
                "`{s}` is not a size: bytes, or a number with k, m or g (`1m`; `0`: no bound)"
            ));
        }
    };
    let n: u64 = digits
        .parse()
        .map_err(|_| format!("`{s}` is not a size: bytes, or a number with k, m or g (`1m`)"))?;
    n.checked_mul(1 << shift)
        .ok_or_else(|| format!("`{s}` is too large"))
}

/// Default `client_body_timeout` (nginx's 60 s).
pub const BODY_TIMEOUT: Duration = Duration::from_secs(60);

impl Diag<'_> {
    fn duration(&self, key: &str, v: &Sp<String>) -> Option<Duration> {
        self.check(key, Some(&v.referenced), parse_duration(&v.value))
    }

    /// A duration that must be longer than zero, or `default` when absent.
    fn positive_duration(
        &self,
        key: &str,
        v: &Option<Sp<String>>,
        default: Duration,
    ) -> Option<Duration> {
        let Some(v) = v else { return Some(default) };
        match self.duration(key, v)? {
            d if d.is_zero() => {
                self.error(key, Some(&v.referenced), "must be longer than 0");
                None
            }
            d => Some(d),
        }
    }

    fn positive(&self, key: &str, v: &Sp<i64>) -> Option<u64> {
        if v.value < 1 {
            self.error(
                key,
                Some(&v.referenced),
                format!("must be a whole number >= 1, not {}", v.value),
            );
            return None;
        }
        Some(v.value as u64)
    }

    /// `v` as one of `choices` (`(name, value)`), with a suggestion if not.
    fn choice<T: Copy>(&self, key: &str, v: &Sp<String>, choices: &[(&str, T)]) -> Option<T> {
        if let Some((_, t)) = choices.iter().find(|(n, _)| *n == v.value) {
            return Some(*t);
        }
        let names: Vec<&str> = choices.iter().map(|(n, _)| *n).collect();
        let hint = match suggest(&v.value, names.iter().copied()) {
            Some(s) => format!("; did you mean `{s}`?"),
            None => format!(" (expected {})", names.join(", ")),
        };
        self.error(
            key,
            Some(&v.referenced),
            format!("`{}` is not valid{hint}", v.value),
        );
        None
    }
}

/// Applies `f` to the value when there is one; `Some(None)` when absent,
/// `None` when present and invalid.
/// A list of header families (`legacy`, `ietf`) at `key`: the style with
/// those on, the others off; `None` if one is not a family.
fn header_style(d: &Diag<'_>, key: &str, list: &[Sp<String>]) -> Option<HeaderStyle> {
    let mut style = HeaderStyle {
        legacy: false,
        ietf: false,
    };
    let mut ok = true;
    for h in list {
        match d.choice(key, h, &[("legacy", 0), ("ietf", 1)]) {
            Some(0) => style.legacy = true,
            Some(_) => style.ietf = true,
            None => ok = false,
        }
    }
    ok.then_some(style)
}

/// `rls:`: the listener, the headers, and the domains of `rls.config`
/// (a file or a directory of them, in envoyproxy/ratelimit's format) and
/// of `rls.domains`.
fn rls_spec(d: &Diag<'_>, r: Sp<super::schema::RlsFile>) -> Option<crate::config::rls::RlsSpec> {
    let r = r.value;
    let listen = socket_addr(d, "rls.listen", &r.listen);
    // Envoy's own service sends none unless asked.
    let listed = r.headers.as_deref().unwrap_or_default();
    let envoy = listed.iter().any(|h| h.value == "envoy");
    let others: Vec<Sp<String>> = listed
        .iter()
        .filter(|h| h.value != "envoy")
        .cloned()
        .collect();
    let headers = header_style(d, "rls.headers", &others);
    let names = r.header_names.as_ref().map(|n| &n.value);
    let name = |given: Option<&Sp<String>>, default: &str, key: &str| -> Option<String> {
        match given {
            None => Some(default.to_owned()),
            Some(v) if http::HeaderName::from_bytes(v.value.as_bytes()).is_ok() => {
                Some(v.value.clone())
            }
            Some(v) => {
                d.error(
                    key,
                    Some(&v.referenced),
                    format!("`{}` is not a header name", v.value),
                );
                None
            }
        }
    };
    let envoy_headers = match (envoy, names) {
        (false, Some(_)) => {
            d.error(
                "rls.header_names",
                r.header_names.as_ref().map(|n| &n.referenced),
                "`header_names` names the `envoy` headers: add `envoy` to `rls.headers`",
            );
            None
        }
        (false, None) => Some(None),
        (true, n) => {
            let limit = name(
                n.and_then(|n| n.limit.as_ref()),
                "RateLimit-Limit",
                "rls.header_names.limit",
            );
            let remaining = name(
                n.and_then(|n| n.remaining.as_ref()),
                "RateLimit-Remaining",
                "rls.header_names.remaining",
            );
            let reset = name(
                n.and_then(|n| n.reset.as_ref()),
                "RateLimit-Reset",
                "rls.header_names.reset",
            );
            match (limit, remaining, reset) {
                (Some(a), Some(b), Some(c)) => Some(Some([a, b, c])),
                _ => None,
            }
        }
    };
    let mut files: Vec<(String, crate::config::rls::DomainFile)> = vec![];
    let mut ok = true;
    if let Some(path) = &r.config {
        match crate::config::rls::read_files(d, path) {
            Some(read) => files.extend(read),
            None => ok = false,
        }
    }
    for (i, dom) in r.domains.into_iter().enumerate() {
        files.push((format!("rls.domains[{i}]"), dom));
    }
    let domains = match crate::config::rls::build(&files) {
        Ok(domains) => Some(domains),
        Err(errors) => {
            for (file, key, message) in errors {
                d.error_in(&file, &key, message);
            }
            None
        }
    };
    if !ok {
        return None;
    }
    Some(crate::config::rls::RlsSpec {
        listen: listen?,
        headers: headers?,
        envoy_headers: envoy_headers?,
        domains: std::sync::Arc::new(domains?),
        source: r.config.map(|p| std::path::PathBuf::from(p.value)),
    })
}

fn opt<S, T>(v: &Option<S>, f: impl FnOnce(&S) -> Option<T>) -> Option<Option<T>> {
    match v {
        None => Some(None),
        Some(v) => f(v).map(Some),
    }
}

fn socket_addr(d: &Diag<'_>, key: &str, s: &Sp<String>) -> Option<SocketAddr> {
    d.check(
        key,
        Some(&s.referenced),
        s.value
            .parse()
            .map_err(|_| format!("`{}` is not an address like 127.0.0.1:8080", s.value)),
    )
}

fn flag_addr(d: &Diag<'_>, flag: &str, key: &str, v: &str) -> Option<SocketAddr> {
    match v.parse() {
        Ok(a) => Some(a),
        Err(_) => {
            d.error_in(flag, key, format!("`{v}` is not an address"));
            None
        }
    }
}

/// Whether two listeners would want the same port: the same address, or
/// the same port with either on every interface (port 0 is never taken).
fn clash(a: SocketAddr, b: SocketAddr) -> bool {
    a.port() != 0
        && a.port() == b.port()
        && (a.ip() == b.ip() || a.ip().is_unspecified() || b.ip().is_unspecified())
}

pub(crate) fn validate(mut f: File, d: &Diag<'_>, o: &Overrides) -> Option<Config> {
    let rls = match f.rls.take() {
        None => Some(None),
        Some(r) => rls_spec(d, r).map(Some),
    };
    let listen = match (&o.listen, &f.listen) {
        (Some(l), _) => flag_addr(d, "--listen", "listen", l),
        (None, Some(l)) => socket_addr(d, "listen", l),
        (None, None) => Some(SocketAddr::from(([127, 0, 0, 1], 8080))),
    };
    let workers = match (o.workers, &f.workers) {
        (Some(n), _) => Some(n.max(1)),
        (None, Some(w)) => d.positive("workers", w).map(|n| n as usize),
        (None, None) => Some(std::thread::available_parallelism().map_or(1, |n| n.get())),
    };
    let upstream = match (&o.upstream, &f.upstream) {
        (Some(u), _) => match parse_upstream(u) {
            Ok(up) => Some(up),
            Err(m) => {
                d.error_in("--upstream", "upstream", m);
                None
            }
        },
        (None, Some(u)) => d.check("upstream", Some(&u.referenced), parse_upstream(&u.value)),
        (None, None) => Some(Upstream::Echo),
    };
    let upstream_timeout = d.positive_duration(
        "upstream_timeout",
        &f.upstream_timeout,
        Duration::from_secs(30),
    );
    let x_forwarded_for_append = match &f.x_forwarded_for {
        None => Some(false),
        Some(v) => d.choice(
            "x_forwarded_for",
            v,
            &[("replace", false), ("append", true)],
        ),
    };
    let upstream_path = match &f.upstream_path {
        None => Some(UpstreamPath::Original),
        Some(v) => d.choice(
            "upstream_path",
            v,
            &[
                ("original", UpstreamPath::Original),
                ("normalized", UpstreamPath::Normalized),
            ],
        ),
    };
    let client_idle_timeout = d.positive_duration(
        "client_idle_timeout",
        &f.client_idle_timeout,
        super::IDLE_TIMEOUT,
    );
    let client_header_timeout = d.positive_duration(
        "client_header_timeout",
        &f.client_header_timeout,
        HEADER_TIMEOUT,
    );
    let client_body_timeout =
        d.positive_duration("client_body_timeout", &f.client_body_timeout, BODY_TIMEOUT);
    let client_max_body_size = match &f.client_max_body_size {
        None => Some(MAX_BODY_SIZE),
        Some(v) => d.check(
            "client_max_body_size",
            Some(&v.referenced),
            parse_size(&v.value),
        ),
    };
    let admin = match &f.admin {
        None => Some(None),
        Some(a) => admin(d, a, o, listen).map(Some),
    };
    let tls = opt(&f.tls, |t| super::tls::listener(d, "tls", t, false));
    let admin_tls = match f.admin.as_ref().and_then(|a| a.tls.as_ref()) {
        None => Some(None),
        Some(t) => super::tls::listener(d, "admin.tls", t, true).map(Some),
    };
    let routes_https = f.routes.iter().any(|r| match &r.upstream.value {
        RouteUpstreamFile::Url(u) => u.starts_with("https://"),
        RouteUpstreamFile::Group(g) => g.servers.iter().any(|u| u.url().starts_with("https://")),
    });
    let upstream_tls =
        super::tls::upstream(d, upstream.as_ref(), f.upstream_tls.as_ref(), routes_https);
    let keep_underscores = f.underscores_in_headers.as_ref().is_some_and(|u| u.value);
    let top_request_headers = match &f.request_headers {
        None => Some(super::RequestHeaders::default()),
        Some(h) => request_headers(d, h, keep_underscores),
    };
    let routes = routes(d, &f.routes, f.upstream_tls.as_ref(), keep_underscores);
    let route_names: Vec<String> = f.routes.iter().map(|r| r.name.value.clone()).collect();
    let log = log_spec(d, f.log.as_ref());
    let access_log = opt(&f.access_log, |a| access_spec(d, a));
    let admin_token_for_probes = f
        .admin
        .as_ref()
        .and_then(|a| a.token_for_probes.as_ref())
        .is_some_and(|t| t.value);
    let admin_hosts = admin_hosts(
        d,
        f.admin
            .as_ref()
            .and_then(|a| a.hosts.as_deref())
            .unwrap_or_default(),
    );
    let mut tls_files = vec![];
    let store = match f.store {
        None => Some(StoreSpec::Memory {
            max_keys: 1_000_000,
        }),
        Some(s) => store_spec(d, s, &mut tls_files),
    };
    let identity = identity(d, f.identity, f.jwt.is_some());
    let by_header = matches!(
        identity,
        Some(IdentitySource::Header { .. } | IdentitySource::Claim { .. })
    );
    let allow = patterns(d, "allow", &f.allow, by_header);
    let deny = patterns(d, "deny", &f.deny, by_header);
    let authz = match &f.authz {
        None => Some(None),
        Some(a) => socket_addr(d, "authz.listen", &a.value.listen).map(Some),
    };
    if let (Some(Some(a)), Some(l), Some(f)) = (authz, listen, &f.authz)
        && clash(a, l)
    {
        d.error(
            "authz.listen",
            Some(&f.value.listen.referenced),
            format!("{a} is also the proxy's `listen` ({l}): give the authorisation listener its own port"),
        );
    }
    // An authorisation hook never sees the response: a rule that must
    // (count: failures, concurrency) would never be settled or released.
    if let Some(a) = &f.authz {
        for r in &f.rules {
            let failures = r.count.as_ref().filter(|c| c.value == "failures");
            let leases = r.algorithm.as_ref().filter(|a| a.value == "concurrency");
            if let Some(at) = failures.or(leases) {
                d.error(
                    if failures.is_some() { "count" } else { "algorithm" },
                    Some(&at.referenced),
                    format!(
                        "rule `{}`: with `authz:` (line {}) a rule cannot need the response: a proxy's hook never sees how it ended, \
                         so `count: failures` would never be charged and a `concurrency` slot never given back; \
                         decide it in the gateway, or with POST /v1/check and /v1/report",
                        r.name.value,
                        a.referenced.line()
                    ),
                );
            }
        }
    }
    let overrides_max = match f.overrides.as_ref().and_then(|o| o.value.max.as_ref()) {
        None => Some(super::model::OVERRIDES_MAX),
        Some(m) if (0..=1_000_000).contains(&m.value) => Some(m.value as usize),
        Some(m) => {
            d.error(
                "overrides.max",
                Some(&m.referenced),
                "`overrides.max` must be 0 (no overrides) to 1000000",
            );
            None
        }
    };
    let headers = match &f.headers {
        None => Some(HeaderStyle::default()),
        Some(list) => header_style(d, "headers", list),
    };
    let status = match &f.status {
        None => Some(StatusCode::TOO_MANY_REQUESTS),
        Some(s) => match u16::try_from(s.value)
            .ok()
            .and_then(|v| StatusCode::from_u16(v).ok())
        {
            Some(st) if (400..600).contains(&st.as_u16()) => Some(st),
            _ => {
                d.error(
                    "status",
                    Some(&s.referenced),
                    format!("{} is not a 4xx or 5xx status", s.value),
                );
                None
            }
        },
    };
    let mut rules: Vec<PolicyRule> = vec![];
    let mut names: Vec<String> = vec![];
    let mut rules_ok = true;
    // `key_secret`: the HMAC key of hashed key parts (never printed).
    let hasher = match &f.key_secret {
        None => Ok(None),
        Some(k) if k.value.len() < 16 => {
            d.error(
                "key_secret",
                Some(&k.referenced),
                "at least 16 bytes (32 random hex digits are a good secret: `openssl rand -hex 32`)",
            );
            Err(())
        }
        Some(k) => Ok(Some(crate::tls::key_hasher(k.value.as_bytes()))),
    };
    let (hasher, secret_ok) = match hasher {
        Ok(h) => (h, true),
        Err(()) => (None, false),
    };
    rules_ok &= secret_ok;
    // `Some(None)`: no `jwt:`; `None`: a bad one (its errors recorded).
    let jwt = match f.jwt.as_ref().map(|j| jwt_verifier(d, j)) {
        None => Some(None),
        Some(Some(v)) => Some(Some(v)),
        Some(None) => None,
    };
    let has_jwt = f.jwt.is_some();
    for r in f.rules {
        if names.contains(&r.name.value) {
            d.error(
                "name",
                Some(&r.name.referenced),
                format!("duplicate rule name `{}`", r.name.value),
            );
            rules_ok = false;
        }
        names.push(r.name.value.clone());
        match rule(d, r, &route_names, hasher.as_ref(), has_jwt) {
            Some(g) => rules.push(g),
            None => rules_ok = false,
        }
    }
    for t in [&tls, &admin_tls].into_iter().flatten().flatten() {
        tls_files.extend(t.files.iter().cloned());
    }
    for t in upstream_tls.iter().flatten() {
        tls_files.extend(t.files.iter().cloned());
    }
    // (Every https server reads the same `upstream_tls` files.)
    if let Some(t) = routes
        .iter()
        .flatten()
        .flat_map(|r| &r.group.servers)
        .find_map(|s| s.tls.as_ref())
        && tls_files.is_empty()
    {
        tls_files.extend(t.files.iter().cloned());
    }
    Some(Config {
        listen: listen?,
        workers: workers?,
        upstream: upstream?,
        upstream_timeout: upstream_timeout?,
        upstream_path: upstream_path?,
        client_idle_timeout: client_idle_timeout?,
        client_header_timeout: client_header_timeout?,
        client_body_timeout: client_body_timeout?,
        client_max_body_size: client_max_body_size?,
        underscores_in_headers: f.underscores_in_headers.is_some_and(|u| u.value),
        preserve_host: f.preserve_host.as_ref().is_some_and(|p| p.value),
        forwarded: f.forwarded.as_ref().is_some_and(|p| p.value),
        x_forwarded_for_append: x_forwarded_for_append?,
        request_headers: top_request_headers?,
        admin: admin?,
        tls_files,
        admin_token_for_probes,
        admin_hosts: admin_hosts?,
        log: log?,
        access_log: access_log?,
        routes: routes?,
        tls: tls?,
        admin_tls: admin_tls?,
        upstream_tls: upstream_tls?,
        store: store?,
        policy: Policy {
            identity: identity?,
            allow: allow?,
            deny: deny?,
            rules: rules_ok.then_some(rules)?,
            overrides: None,
        },
        headers: headers?,
        status: status?,
        rls: rls?,
        jwt: jwt?,
        overrides_max: overrides_max?,
        authz: authz?,
    })
}

fn log_spec(d: &Diag<'_>, f: Option<&Sp<LogFile>>) -> Option<LogSpec> {
    let Some(f) = f else {
        return Some(LogSpec::default());
    };
    let format = match &f.value.format {
        None => Some(LogFormat::Text),
        Some(v) => d.choice(
            "log.format",
            v,
            &[("text", LogFormat::Text), ("json", LogFormat::Json)],
        ),
    };
    let level = match &f.value.level {
        None => Some("info".to_owned()),
        Some(v) => d.check(
            "log.level",
            Some(&v.referenced),
            super::log_filter(&v.value)
                .map(|_| v.value.clone())
                .map_err(|e| {
                    format!(
                        "`{}` is not a level or filter (error, warn, info, debug, trace): {e}",
                        v.value
                    )
                }),
        ),
    };
    Some(LogSpec {
        format: format?,
        level: level?,
    })
}

fn access_spec(d: &Diag<'_>, f: &Sp<AccessLogFile>) -> Option<super::AccessSpec> {
    use super::{AccessFormat as Format, AccessSink as Sink, AccessSpec as Spec};
    let sink = match f.value.path.value.as_str() {
        "stdout" | "-" => Sink::Stdout,
        "" => {
            d.error(
                "access_log.path",
                Some(&f.value.path.referenced),
                "a file, or `stdout`",
            );
            return None;
        }
        p => Sink::File(d.path(p)),
    };
    let format = match &f.value.format {
        None => Some(Format::Json),
        Some(v) => d.choice(
            "access_log.format",
            v,
            &[("json", Format::Json), ("combined", Format::Combined)],
        ),
    };
    Some(Spec {
        sink,
        format: format?,
    })
}

/// `admin.hosts`: host names, without a scheme or a port (an address
/// needs no entry: every address is answered).
fn admin_hosts(d: &Diag<'_>, list: &[Sp<String>]) -> Option<Vec<String>> {
    let mut out = Some(vec![]);
    for h in list {
        let name = h.value.trim().trim_end_matches('.').to_ascii_lowercase();
        let valid = !name.is_empty()
            && name.len() <= 253
            && name
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'-' | b'.' | b'_'));
        if valid {
            if let Some(o) = out.as_mut() {
                o.push(name);
            }
        } else {
            d.error(
                "admin.hosts",
                Some(&h.referenced),
                format!(
                    "`{}` is not a host name: write the name alone (`admin.example.com`), without a scheme or a port",
                    h.value
                ),
            );
            out = None;
        }
    }
    out
}

fn admin(
    d: &Diag<'_>,
    a: &AdminFile,
    o: &Overrides,
    listen: Option<SocketAddr>,
) -> Option<(SocketAddr, Option<String>)> {
    let addr = match (&o.admin_listen, &a.listen) {
        (Some(l), _) => flag_addr(d, "--admin-listen", "admin.listen", l),
        (None, Some(l)) => socket_addr(d, "admin.listen", l),
        (None, None) => Some(SocketAddr::from(([127, 0, 0, 1], 9090))),
    };
    if let (Some(admin), Some(proxy)) = (addr, listen)
        && clash(admin, proxy)
    {
        let at = a.listen.as_ref().map(|l| &l.referenced);
        d.error(
            "admin.listen",
            at,
            format!(
                "{admin} is also the proxy's `listen` ({proxy}): give the admin API its own port"
            ),
        );
    }
    let token = match &a.token {
        None => Some(None),
        Some(t) if t.value.trim().is_empty() => {
            d.error(
                "admin.token",
                Some(&t.referenced),
                "an empty token could never be sent: remove `token` to leave the admin API open",
            );
            None
        }
        Some(t) if !t.value.bytes().all(|b| b.is_ascii_graphic()) => {
            d.error(
                "admin.token",
                Some(&t.referenced),
                "a token is visible ASCII without spaces (it travels in an Authorization header)",
            );
            None
        }
        Some(t) => Some(Some(t.value.clone())),
    };
    Some((addr?, token?))
}

pub(crate) fn parse_upstream(s: &str) -> Result<Upstream, String> {
    if s == "echo" {
        return Ok(Upstream::Echo);
    }
    let uri: Uri = s
        .parse()
        .map_err(|_| format!("`{s}` is not a URL like http://127.0.0.1:9000"))?;
    match uri.scheme_str() {
        // h2c: HTTP/2 with prior knowledge (gRPC servers).
        Some("http" | "https" | "h2c") if uri.host().is_some() => Ok(Upstream::Url(uri)),
        _ => Err(format!(
            "`{s}` is not a URL like http://127.0.0.1:9000 (or h2c://127.0.0.1:50051 for HTTP/2)"
        )),
    }
}

/// A server's `protocol:` (`http1` or `h2`), checked against its URL.
fn server_protocol(
    d: &Diag<'_>,
    at: Option<&Location>,
    url: &str,
    protocol: Option<&String>,
) -> Option<super::Protocol> {
    use super::Protocol;
    let Some(p) = protocol else {
        return Some(Protocol::Auto);
    };
    let p = match p.as_str() {
        "http1" | "http/1.1" => Protocol::Http1,
        "h2" | "http2" => Protocol::H2,
        other => {
            d.error(
                "protocol",
                at,
                format!(
                    "`{other}` is not a protocol: `http1`, or `h2` (with prior knowledge on http://, by ALPN on https://)"
                ),
            );
            return None;
        }
    };
    if p == Protocol::Http1 && url.starts_with("h2c://") {
        d.error(
            "protocol",
            at,
            format!("`{url}` is HTTP/2 by its scheme: `protocol: http1` contradicts it"),
        );
        return None;
    }
    Some(p)
}

fn store_spec(
    d: &Diag<'_>,
    s: StoreFile,
    files: &mut Vec<std::path::PathBuf>,
) -> Option<StoreSpec> {
    let kind = d.choice("type", &s.kind, &[("memory", true), ("redis", false)])?;
    if kind {
        let mut ok = true;
        for (k, present) in [
            ("url", s.url.is_some()),
            ("cluster", s.cluster.is_some()),
            ("key_prefix", s.key_prefix.is_some()),
            ("timeout", s.timeout.is_some()),
            ("on_error", s.on_error.is_some()),
            ("tls", s.tls.is_some()),
            ("sentinel", s.sentinel.is_some()),
        ] {
            if present {
                d.error(
                    k,
                    Some(&s.kind.referenced),
                    format!("`{k}` is only valid with `type: redis`"),
                );
                ok = false;
            }
        }
        let max_keys = match &s.max_keys {
            Some(m) => d.positive("max_keys", m).map(|n| n as usize),
            None => Some(1_000_000),
        };
        return ok.then_some(StoreSpec::Memory {
            max_keys: max_keys?,
        });
    }
    let mut ok = true;
    if let Some(m) = &s.max_keys {
        d.error(
            "max_keys",
            Some(&m.referenced),
            "`max_keys` is only valid with `type: memory`",
        );
        ok = false;
    }
    let cluster = s.cluster.unwrap_or_default();
    let sentinel = match &s.sentinel {
        None => Some(None),
        Some(sf) => {
            let mut good = true;
            if let Some(other) = s.url.as_ref().or(cluster.first()) {
                d.error(
                    "sentinel",
                    Some(&other.referenced),
                    "`sentinel` finds the master itself: give it without `url` or `cluster`",
                );
                good = false;
            }
            if sf.value.master.value.trim().is_empty() {
                d.error(
                    "master",
                    Some(&sf.value.master.referenced),
                    "the master's name the sentinels monitor (`mymaster`) must not be empty",
                );
                good = false;
            }
            if sf.value.nodes.is_empty() {
                d.error(
                    "nodes",
                    Some(&sf.referenced),
                    "`sentinel` needs `nodes`: the sentinels' URLs, like redis://127.0.0.1:26379",
                );
                good = false;
            }
            for n in &sf.value.nodes {
                good &= d
                    .check(
                        "nodes",
                        Some(&n.referenced),
                        ratewarden::store::redis::check_url(&n.value),
                    )
                    .is_some();
            }
            for pw in [&sf.value.password, &sf.value.sentinel_password]
                .into_iter()
                .flatten()
            {
                if pw.value.is_empty() {
                    d.error(
                        "password",
                        Some(&pw.referenced),
                        "an empty password: leave the key out instead",
                    );
                    good = false;
                }
            }
            good.then(|| {
                Some(ratewarden::store::redis::SentinelConfig {
                    master: sf.value.master.value.trim().to_owned(),
                    nodes: sf.value.nodes.iter().map(|n| n.value.clone()).collect(),
                    password: sf.value.password.as_ref().map(|p| p.value.clone()),
                    sentinel_password: sf.value.sentinel_password.as_ref().map(|p| p.value.clone()),
                })
            })
        }
    };
    if s.url.is_none() && cluster.is_empty() && s.sentinel.is_none() {
        d.error(
            "store",
            Some(&s.kind.referenced),
            "a redis store needs `url`, `cluster` or `sentinel`",
        );
        ok = false;
    }
    for u in s.url.iter().chain(&cluster) {
        let key = if s.url.as_ref().is_some_and(|x| std::ptr::eq(x, u)) {
            "url"
        } else {
            "cluster"
        };
        ok &= d
            .check(
                key,
                Some(&u.referenced),
                ratewarden::store::redis::check_url(&u.value),
            )
            .is_some();
    }
    let timeout = d.positive_duration(
        "timeout",
        &s.timeout,
        ratewarden::store::redis::DEFAULT_TIMEOUT,
    );
    let on_error = match &s.on_error {
        None => Some(OnError::Local),
        Some(v) => d.choice(
            "on_error",
            v,
            &[
                ("local", OnError::Local),
                ("allow", OnError::Allow),
                ("deny", OnError::Deny),
            ],
        ),
    };
    let key_prefix = match s.key_prefix {
        None => Some("rw:".to_owned()),
        Some(p) if p.value.contains(['{', '}']) => {
            d.error(
                "key_prefix",
                Some(&p.referenced),
                "must not contain `{` or `}` (they are the hash tag's)",
            );
            None
        }
        Some(p) => Some(p.value),
    };
    let tls = match &s.tls {
        None => Some(None),
        Some(t) => {
            let tls_url = s
                .url
                .iter()
                .chain(&cluster)
                .chain(s.sentinel.iter().flat_map(|x| &x.value.nodes))
                .any(|u| u.value.starts_with("rediss://"));
            if !tls_url {
                d.error(
                    "store.tls",
                    Some(&t.referenced),
                    "`store.tls` is for `rediss://` URLs (TLS); these are `redis://`",
                );
                None
            } else {
                super::tls::store(d, t).map(|(tls, read)| {
                    files.extend(read);
                    Some(tls)
                })
            }
        }
    };
    ok.then_some(())?;
    Some(StoreSpec::Redis {
        url: s.url.map(|u| u.value),
        cluster: cluster.into_iter().map(|c| c.value).collect(),
        sentinel: sentinel?,
        key_prefix: key_prefix?,
        timeout: timeout?,
        on_error: on_error?,
        tls: tls?,
    })
}

fn identity(d: &Diag<'_>, f: Option<IdentityFile>, has_jwt: bool) -> Option<IdentitySource> {
    let Some(f) = f else {
        return Some(IdentitySource::Address(ClientIp::default()));
    };
    let mut trusted = Some(vec![]);
    for t in &f.trusted_proxies {
        match parse_net(&t.value) {
            Ok(n) => {
                if let Some(v) = trusted.as_mut() {
                    v.push(n);
                }
            }
            Err(m) => {
                d.error("trusted_proxies", Some(&t.referenced), m);
                trusted = None;
            }
        }
    }
    let ipv6_prefix = match &f.ipv6_prefix {
        Some(p) if (1..=128).contains(&p.value) => Some(p.value as u8),
        Some(p) => {
            d.error(
                "ipv6_prefix",
                Some(&p.referenced),
                "must be between 1 and 128",
            );
            None
        }
        None => Some(64),
    };
    #[derive(Clone, Copy, PartialEq)]
    enum From {
        Ip,
        Forwarded,
        Header,
        Jwt,
    }
    let from = match &f.from {
        None => Some(From::Ip),
        Some(v) => d.choice(
            "from",
            v,
            &[
                ("ip", From::Ip),
                ("forwarded", From::Forwarded),
                ("header", From::Header),
                ("jwt", From::Jwt),
            ],
        ),
    };
    // With `from: forwarded`, `header` names the forwarding header the
    // operator's proxy sets (the only one read); else the identity's own.
    let forward_header = match (from, &f.header) {
        (Some(From::Forwarded), Some(h)) => match ForwardHeader::from_name(h.value.trim()) {
            Some(fh) => Some(fh),
            None => {
                d.error(
                    "header",
                    Some(&h.referenced),
                    format!(
                        "with `from: forwarded`, `header` is the forwarding header your proxy sets: x-forwarded-for (the default: nginx, HAProxy, Caddy, Traefik), forwarded (RFC 7239) or x-real-ip, not `{}`",
                        h.value
                    ),
                );
                None
            }
        },
        _ => Some(ForwardHeader::default()),
    };
    let header = match from {
        Some(From::Forwarded) => Some(None),
        _ => opt(&f.header, |h| {
            d.check(
                "header",
                Some(&h.referenced),
                HeaderName::from_bytes(h.value.as_bytes())
                    .map_err(|_| format!("`{}` is not a header name", h.value)),
            )
        }),
    };
    let missing = match &f.missing {
        None => Some(Missing::Ip),
        Some(v) => d.choice(
            "missing",
            v,
            &[
                ("ip", Missing::Ip),
                ("reject", Missing::Reject),
                ("anonymous", Missing::Anonymous),
                ("skip", Missing::Skip),
            ],
        ),
    };
    let client_ip = |forwarded| {
        Some(ClientIp {
            forwarded,
            header: forward_header?,
            trusted_proxies: trusted.clone()?,
            ipv6_prefix: ipv6_prefix?,
        })
    };
    match (from?, header?) {
        (From::Ip, _) => Some(IdentitySource::Address(client_ip(false)?)),
        (From::Forwarded, _) => Some(IdentitySource::Address(client_ip(true)?)),
        (From::Header, Some(name)) => Some(IdentitySource::Header {
            name,
            client_ip: client_ip(false)?,
            missing: missing?,
        }),
        (From::Header, None) => {
            d.error(
                "header",
                f.from.as_ref().map(|v| &v.referenced),
                "`from: header` needs `header: NAME`",
            );
            None
        }
        (From::Jwt, _) if !has_jwt => {
            d.error(
                "from",
                f.from.as_ref().map(|v| &v.referenced),
                "`from: jwt` needs a top-level `jwt:` section (where the token is, its keys)",
            );
            None
        }
        (From::Jwt, _) => Some(IdentitySource::Claim {
            claim: f
                .claim
                .as_ref()
                .map_or("sub", |c| c.value.as_str())
                .to_owned(),
            client_ip: client_ip(false)?,
            missing: missing?,
        }),
    }
}

/// A CIDR or a single address.
fn parse_net(v: &str) -> Result<IpNet, String> {
    let v = v.trim();
    v.parse::<IpNet>()
        .or_else(|_| v.parse::<IpAddr>().map(IpNet::from))
        .map_err(|_| format!("`{v}` is not an address or a CIDR like 10.0.0.0/8"))
}

/// Whether `v` is written like an address or a CIDR (digits and dots, or
/// hex and colons, maybe a `/prefix`), so that a typo in one (`/33`,
/// `10.0.0.256`) is an error rather than an identity nobody has.
fn looks_like_address(v: &str) -> bool {
    let v = v.trim();
    v.chars().any(|c| c.is_ascii_digit())
        && v.contains(['.', ':'])
        && v.chars()
            .all(|c| c.is_ascii_hexdigit() || matches!(c, '.' | ':' | '/'))
}

/// `allow:` / `deny:` entries. With the identity taken from the client's
/// address, each must be an address or a CIDR; with `from: header` an
/// entry may also be an identity, unless it is written like an address.
fn patterns(d: &Diag<'_>, key: &str, list: &[Sp<String>], by_header: bool) -> Option<Vec<Pattern>> {
    let mut out = Some(vec![]);
    for s in list {
        let v = s.value.trim();
        let p = match parse_net(v) {
            Ok(n) => Ok(Pattern::Net(n)),
            Err(m) if !by_header || looks_like_address(v) => Err(m),
            Err(_) if v.is_empty() => Err("an empty entry matches nobody".to_owned()),
            // Written as the client sends it; compared as identities are
            // kept (a `%` escaped: see `admission::STAND_IN`).
            Err(_) => Ok(Pattern::Identity(
                ratewarden_tower::admission::client_identity(v),
            )),
        };
        match p {
            Ok(p) => {
                if let Some(o) = out.as_mut() {
                    o.push(p);
                }
            }
            Err(m) => {
                let hint = if by_header {
                    ""
                } else {
                    " (identities are taken from client addresses here: entries are addresses or CIDRs)"
                };
                d.error(key, Some(&s.referenced), format!("{m}{hint}"));
                out = None;
            }
        }
    }
    out
}

/// `distribution: {mode: lease, epsilon, max_share}` (rules and Envoy
/// limits alike): epsilon 0.01 and max_share 0.25 unless given. Their
/// ranges are the rule's to check (`Rule::new`), as every parameter's.
pub(crate) fn distribution(f: &DistributionFile) -> Result<ratewarden::Distribution, String> {
    if f.mode != "lease" {
        return Err(format!(
            "unknown `distribution.mode` `{}`: the one mode is `lease`",
            f.mode
        ));
    }
    Ok(ratewarden::Distribution::lease(
        f.epsilon.unwrap_or(0.01),
        f.max_share.unwrap_or(0.25),
    ))
}

/// Whether `m` is a method token (RFC 9110 §9.1: a `tchar` sequence).
fn is_token(m: &str) -> bool {
    !m.is_empty()
        && m.bytes()
            .all(|b| b.is_ascii_alphanumeric() || b"!#$%&'*+-.^_`|~".contains(&b))
}

/// Where a rule's key is written (for errors the rule builder finds).
fn rule_location<'r>(r: &'r RuleFile, key: &str) -> &'r Location {
    let at = match key {
        "window" => r.window.as_ref().map(|w| &w.referenced),
        "limit" => r.limit.as_ref().map(|l| &l.referenced),
        "calendar" => r.calendar.as_ref().map(|c| &c.referenced),
        "status" => r.status.as_ref().map(|c| &c.referenced),
        "burst" => r.burst.as_ref().map(|b| &b.referenced),
        "mode" => r.mode.as_ref().map(|m| &m.referenced),
        "max_delay" => r.max_delay.as_ref().map(|m| &m.referenced),
        "min_interval" => r.min_interval.as_ref().map(|m| &m.referenced),
        "penalty" => r.penalty.as_ref().map(|p| &p.referenced),
        "cost" => r.cost.as_ref().map(|c| &c.referenced),
        "max_hold" => r.max_hold.as_ref().map(|m| &m.referenced),
        "distribution" => r.distribution.as_ref().map(|m| &m.referenced),
        "count" => r.count.as_ref().map(|c| &c.referenced),
        "count_rejected" => r.count_rejected.as_ref().map(|c| &c.referenced),
        _ => None,
    };
    at.unwrap_or(&r.name.referenced)
}

/// `routes:`: names unique (and not `default`), a match each, and servers
/// that are URLs (each https one with its TLS client).
/// `request_headers: {set: {NAME: VALUE}, remove: [NAME]}`: names that
/// parse and that the gateway does not own, values that can be sent.
fn request_headers(
    d: &Diag<'_>,
    f: &Sp<super::schema::RequestHeadersFile>,
    keep_underscores: bool,
) -> Option<super::RequestHeaders> {
    let mut ok = true;
    let mut out = super::RequestHeaders::default();
    let name = |n: &str, at: &serde_saphyr::Location| -> Option<HeaderName> {
        let Ok(h) = HeaderName::from_bytes(n.as_bytes()) else {
            d.error(
                "request_headers",
                Some(at),
                format!("`{n}` is not a header name"),
            );
            return None;
        };
        let lower = h.as_str();
        let why = if super::HOP_BY_HOP.contains(&lower) || lower == "content-length" {
            Some("it describes one hop or the body's framing, which the gateway writes itself")
        } else if lower == "x-forwarded-for" || lower == "x-request-id" {
            Some("the gateway sets it (the peer appended, the request's id)")
        } else if lower.starts_with("x-ratelimit-")
            || matches!(lower, "ratelimit" | "ratelimit-policy" | "retry-after")
        {
            Some("a rate-limit header is the gateway's answer to the client, not a request field")
        } else if !keep_underscores && lower.contains('_') {
            Some("names with `_` are dropped (`underscores_in_headers: false`)")
        } else {
            None
        };
        match why {
            Some(why) => {
                d.error(
                    "request_headers",
                    Some(at),
                    format!("`{n}` cannot be set or removed: {why}"),
                );
                None
            }
            None => Some(h),
        }
    };
    for (n, v) in &f.value.set {
        let h = name(n, &v.referenced);
        let value = match http::HeaderValue::from_str(&v.value) {
            Ok(value) => Some(value),
            Err(_) => {
                d.error(
                    "request_headers",
                    Some(&v.referenced),
                    format!(
                        "`{}` is not a header value (visible ASCII and spaces)",
                        v.value
                    ),
                );
                None
            }
        };
        match (h, value) {
            (Some(h), Some(v)) => out.set.push((h, v)),
            _ => ok = false,
        }
    }
    for n in &f.value.remove {
        match name(&n.value, &n.referenced) {
            Some(h) if h == http::header::HOST => {
                d.error(
                    "request_headers",
                    Some(&n.referenced),
                    "`Host` cannot be removed (set it, or `preserve_host`)",
                );
                ok = false;
            }
            Some(h) => out.remove.push(h),
            None => ok = false,
        }
    }
    ok.then_some(out)
}

fn routes(
    d: &Diag<'_>,
    routes: &[RouteFile],
    upstream_tls: Option<&Sp<UpstreamTlsFile>>,
    keep_underscores: bool,
) -> Option<Vec<RouteSpec>> {
    use super::{Active, Balance, Passive};
    let mut out = Some(vec![]);
    let mut seen: Vec<&str> = vec![];
    for r in routes {
        let name = &r.name;
        let at = Some(&name.referenced);
        let name_ok = !name.value.is_empty()
            && name.value.len() <= 128
            && name
                .value
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || b"-_.".contains(&b));
        if !name_ok {
            d.error(
                "name",
                at,
                "a route name is 1-128 letters, digits, `-`, `_` or `.`",
            );
        } else if name.value == super::DEFAULT_ROUTE {
            d.error("name", at, "`default` is the top-level `upstream`'s route");
        } else if seen.contains(&name.value.as_str()) {
            d.error("name", at, format!("duplicate route name `{}`", name.value));
        }
        seen.push(&name.value);
        let matcher = match &r.matcher {
            None => Some(Matcher::any()),
            Some(m) => {
                if let Some(route) = &m.value.route {
                    d.error(
                        "route",
                        Some(&route.referenced),
                        "a route's `match` cannot name a route (rules can)",
                    );
                    None
                } else {
                    matcher(d, m, &[])
                }
            }
        };
        let up_at = Some(&r.upstream.referenced);
        let (urls, balance, health): (Vec<(&String, Option<&String>)>, _, _) =
            match &r.upstream.value {
                RouteUpstreamFile::Url(u) => (vec![(u, None)], None, None),
                RouteUpstreamFile::Group(g) => (
                    g.servers.iter().map(|s| (s.url(), s.protocol())).collect(),
                    g.balance.as_ref(),
                    g.health.as_ref(),
                ),
            };
        if urls.is_empty() {
            d.error("servers", up_at, "a route needs at least one server");
        }
        let mut servers = Some(vec![]);
        for (u, protocol) in urls {
            let protocol = server_protocol(d, up_at, u, protocol);
            let server = match parse_upstream(u) {
                Ok(Upstream::Url(url)) => {
                    if url.scheme_str() == Some("https") {
                        super::tls::client_for(d, &url, upstream_tls).map(|t| (url, Some(t)))
                    } else {
                        Some((url, None))
                    }
                }
                Ok(Upstream::Echo) => {
                    d.error(
                        "servers",
                        up_at,
                        "`echo` is for the top-level `upstream` only",
                    );
                    None
                }
                Err(m) => {
                    d.error("servers", up_at, m);
                    None
                }
            };
            match (server, protocol, servers.as_mut()) {
                (Some((url, tls)), Some(protocol), Some(v)) => {
                    v.push(ServerSpec { url, tls, protocol })
                }
                _ => servers = None,
            }
        }
        let balance = match balance.map(String::as_str) {
            None | Some("round_robin") => Some(Balance::RoundRobin),
            Some("least_requests") => Some(Balance::LeastRequests),
            Some("hash") => Some(Balance::Hash),
            Some(other) => {
                d.error(
                    "balance",
                    up_at,
                    format!("`{other}` is not a balance (round_robin, least_requests or hash)"),
                );
                None
            }
        };
        let dur = |key: &str, v: &Option<String>, default: Duration| -> Option<Duration> {
            match v {
                None => Some(default),
                Some(v) => match parse_duration(v) {
                    Ok(d0) if !d0.is_zero() => Some(d0),
                    Ok(_) => {
                        d.error(key, up_at, "must be longer than 0");
                        None
                    }
                    Err(e) => {
                        d.error(key, up_at, e);
                        None
                    }
                },
            }
        };
        let passive = match health.and_then(|h| h.passive.as_ref()) {
            None => Some(Some(Passive::default())),
            Some(p) => {
                let failures = match p.failures {
                    None => Some(3),
                    Some(n) if (1..=1000).contains(&n) => Some(n as u32),
                    Some(n) => {
                        d.error("failures", up_at, format!("{n}: between 1 and 1000"));
                        None
                    }
                };
                let eject_for = dur("eject_for", &p.eject_for, Duration::from_secs(10));
                failures.zip(eject_for).map(|(failures, eject_for)| {
                    Some(Passive {
                        failures,
                        eject_for,
                    })
                })
            }
        };
        let active = match health.and_then(|h| h.active.as_ref()) {
            None => Some(None),
            Some(a) => {
                let path_ok =
                    a.path.starts_with('/') && a.path.bytes().all(|b| b.is_ascii_graphic());
                if !path_ok {
                    d.error("path", up_at, format!("`{}` is not a request path", a.path));
                }
                let interval = dur("interval", &a.interval, Duration::from_secs(5));
                let timeout = dur("timeout", &a.timeout, Duration::from_secs(1));
                match (path_ok, interval, timeout) {
                    (true, Some(interval), Some(timeout)) => Some(Some(Active {
                        path: a.path.clone(),
                        interval,
                        timeout,
                    })),
                    _ => None,
                }
            }
        };
        let request_headers = match &r.request_headers {
            None => Some(None),
            Some(h) => request_headers(d, h, keep_underscores).map(Some),
        };
        let spec = (|| {
            Some(RouteSpec {
                name: name_ok.then(|| name.value.clone())?,
                matcher: matcher?,
                group: GroupSpec {
                    servers: servers?,
                    preserve_host: r.preserve_host.as_ref().map(|p| p.value),
                    request_headers: request_headers?,
                    balance: balance?,
                    passive: passive?,
                    active: active?,
                },
            })
        })();
        match (spec, out.as_mut()) {
            (Some(r), Some(v)) => v.push(r),
            _ => out = None,
        }
    }
    out
}

fn rule(
    d: &Diag<'_>,
    r: RuleFile,
    routes: &[String],
    hasher: Option<&KeyHasher>,
    has_jwt: bool,
) -> Option<PolicyRule> {
    // A tiered rule without its own limit takes each tier's.
    let own = if r.limit.is_some() || r.tiers.is_none() {
        rule_spec(d, &r, None).map(Some)
    } else {
        Some(None)
    };
    let failure_status = match &r.failure_status {
        None => Some(ratewarden_tower::policy::DEFAULT_FAILURES.to_vec()),
        Some(list) => {
            let mut out = Some(vec![]);
            for s in list {
                if (100..600).contains(&s.value) {
                    if let Some(o) = out.as_mut() {
                        o.push((s.value as u16, s.value as u16));
                    }
                } else {
                    d.error(
                        "failure_status",
                        Some(&s.referenced),
                        format!("{} is not an HTTP status", s.value),
                    );
                    out = None;
                }
            }
            out
        }
    };
    let failure_grpc = match &r.failure_grpc_status {
        None => Some(ratewarden_tower::policy::DEFAULT_GRPC_FAILURES.to_vec()),
        Some(list) => {
            let mut out = Some(vec![]);
            for c in list {
                if (1..=16).contains(&c.value) {
                    if let Some(o) = out.as_mut() {
                        o.push(c.value as u16);
                    }
                } else {
                    d.error(
                        "failure_grpc_status",
                        Some(&c.referenced),
                        format!(
                            "{} is not a gRPC error code (1-16; 0 is OK, a success)",
                            c.value
                        ),
                    );
                    out = None;
                }
            }
            out
        }
    };
    let matcher = match &r.matcher {
        None => Some(Matcher::any()),
        Some(m) => matcher(d, m, routes),
    };
    let key = match &r.key {
        None => Some(vec![KeyPart::Identity]),
        Some(parts) => {
            let mut out = Some(vec![]);
            for p in parts {
                let part = match &p.value {
                    KeyPartFile::Plain(text) => match key_part(text, matcher.as_ref()) {
                        Ok(KeyPart::Jwt(_)) if !has_jwt => Err(format!(
                            "`{text}` needs a top-level `jwt:` section (where the token is, its keys)"
                        )),
                        other => other,
                    },
                    KeyPartFile::Hashed(h) => match (key_part(&h.hash, matcher.as_ref()), hasher) {
                        (Ok(part @ (KeyPart::Header(_) | KeyPart::Query(_) | KeyPart::Cookie(_))), Some(hasher)) => {
                            Ok(KeyPart::Hashed(Box::new(part), hasher.clone()))
                        }
                        (Ok(KeyPart::Header(_) | KeyPart::Query(_) | KeyPart::Cookie(_)), None) => Err(
                            "a hashed key part needs `key_secret:` (top level; e.g. `key_secret: ${RATEWARDEN_KEY_SECRET}`)"
                                .to_owned(),
                        ),
                        (Ok(other), _) => Err(format!(
                            "`{other}` is not a credential: hash a header:, query: or cookie: part"
                        )),
                        (Err(e), _) => Err(e),
                    },
                };
                match part {
                    Ok(k) => {
                        if let Some(o) = out.as_mut() {
                            o.push(k);
                        }
                    }
                    Err(m) => {
                        d.error("key", Some(&p.referenced), m);
                        out = None;
                    }
                }
            }
            out
        }
    };
    let tiers = opt(&r.tiers, |t| tiers(d, &r, t, matcher.as_ref(), has_jwt));
    let missing = match r.missing.as_ref().map(|m| (m.value.as_str(), m)) {
        None | Some(("identity", _)) => Some(MissingPart::Identity),
        Some(("anonymous", _)) => Some(MissingPart::Anonymous),
        Some(("skip", _)) => Some(MissingPart::Skip),
        Some(("reject", _)) => Some(MissingPart::Reject),
        Some((other, m)) => {
            let hint = match suggest(other, ["identity", "anonymous", "skip", "reject"]) {
                Some(s) => format!("; did you mean `{s}`?"),
                None => String::new(),
            };
            d.error(
                "missing",
                Some(&m.referenced),
                format!(
                    "`{other}`: a missing key part is identity, anonymous, skip or reject{hint}"
                ),
            );
            None
        }
    };
    let tiers = tiers?;
    let rule = match (own?, &tiers) {
        (Some(rule), _) => rule,
        (None, Some(t)) => {
            let first = t.values[t.default]
                .rule
                .clone()
                .or_else(|| t.values.iter().find_map(|v| v.rule.clone()));
            match first {
                Some(r) => r,
                None => {
                    d.error(
                        "tiers",
                        Some(&r.name.referenced),
                        format!("rule `{}`: every tier is unlimited; give one a limit, or remove the rule", r.name.value),
                    );
                    return None;
                }
            }
        }
        (None, None) => return None,
    };
    Some(PolicyRule {
        rule,
        matcher: matcher?,
        key: key?,
        failure_status: failure_status?,
        failure_grpc: failure_grpc?,
        missing: missing?,
        tiers: tiers.map(Box::new),
    })
}

/// `calendar:`: a period, a zone (UTC by default) and its anchors.
fn calendar(
    d: &Diag<'_>,
    c: &Sp<super::schema::CalendarFile>,
) -> Option<ratewarden::calendar::Calendar> {
    use ratewarden::calendar::{Calendar, Period};
    let f = &c.value;
    let Some(period) = Period::parse(&f.period.value) else {
        let hint = match suggest(&f.period.value, ["day", "week", "month", "year"]) {
            Some(s) => format!("; did you mean `{s}`?"),
            None => " (day, week, month or year)".to_owned(),
        };
        d.error(
            "calendar.period",
            Some(&f.period.referenced),
            format!("`{}` is not a calendar period{hint}", f.period.value),
        );
        return None;
    };
    let zone = f.timezone.as_ref().map_or("UTC", |z| z.value.as_str());
    Calendar::new(
        period,
        zone,
        f.anchor_day.as_ref().map(|a| a.value),
        f.anchor_month.as_ref().map(|a| a.value),
        f.anchor_weekday.as_ref().map(|a| a.value.as_str()),
    )
    .map_err(|e| {
        let at = match e.key {
            "timezone" => f.timezone.as_ref().map(|z| &z.referenced),
            "anchor_day" => f.anchor_day.as_ref().map(|z| &z.referenced),
            "anchor_month" => f.anchor_month.as_ref().map(|z| &z.referenced),
            "anchor_weekday" => f.anchor_weekday.as_ref().map(|z| &z.referenced),
            _ => None,
        };
        d.error(
            &format!("calendar.{}", e.key),
            Some(at.unwrap_or(&c.referenced)),
            e.message,
        );
    })
    .ok()
}

/// `tiers:`: where the value is, the default tier, and each tier
/// compiled as a rule of its own (its parameters over the rule's).
fn tiers(
    d: &Diag<'_>,
    r: &RuleFile,
    t: &Sp<super::schema::TiersFile>,
    matcher: Option<&Matcher>,
    has_jwt: bool,
) -> Option<ratewarden_tower::policy::Tiers> {
    use super::schema::TierFile;
    use ratewarden_tower::policy::{Tier, Tiers};
    let f = &t.value;
    let from = match key_part(&f.from.value, matcher) {
        Ok(KeyPart::Identity) => Err("a tier comes from a request value (header:NAME, jwt:CLAIM, query:NAME, cookie:NAME, host), not the identity".to_owned()),
        Ok(KeyPart::Jwt(_)) if !has_jwt => Err(format!(
            "`{}` needs a top-level `jwt:` section (where the token is, its keys)",
            f.from.value
        )),
        other => other,
    };
    let from = d.check("tiers.from", Some(&f.from.referenced), from);
    if f.values.is_empty() {
        d.error(
            "tiers.values",
            Some(&t.referenced),
            "`tiers.values` names no tier",
        );
        return None;
    }
    let mut values = Some(vec![]);
    for (name, tier) in &f.values {
        let compiled = match &tier.value {
            TierFile::Unlimited => Some(None),
            TierFile::Params(p) => {
                let mut over = r.clone();
                over.tiers = None;
                macro_rules! lay {
                    ($($field:ident),*) => { $( if p.$field.is_some() { over.$field = p.$field.clone(); } )* };
                }
                lay!(
                    algorithm,
                    limit,
                    window,
                    burst,
                    mode,
                    max_delay,
                    min_interval,
                    penalty,
                    cost,
                    calendar,
                    status,
                    problem_type
                );
                rule_spec(d, &over, Some(name)).map(Some)
            }
        };
        match (compiled, values.as_mut()) {
            (Some(rule), Some(v)) => v.push(Tier {
                name: name.clone(),
                rule,
            }),
            (None, _) => values = None,
            _ => {}
        }
    }
    let default = f.values.keys().position(|n| *n == f.default.value);
    if default.is_none() {
        let names: Vec<&str> = f.values.keys().map(String::as_str).collect();
        d.error(
            "tiers.default",
            Some(&f.default.referenced),
            format!(
                "`{}` is not one of the tiers ({})",
                f.default.value,
                names.join(", ")
            ),
        );
    }
    Some(Tiers {
        from: from?,
        default: default?,
        values: values?,
    })
}

/// A rule's parameters compiled: the rule's own (`tier` None), or a
/// tier's (its parameters laid over the rule's in `r`).
fn rule_spec(d: &Diag<'_>, r: &RuleFile, tier: Option<&str>) -> Option<Rule> {
    let kind = match &r.algorithm {
        None => Some(Kind::default()),
        Some(a) => match Kind::from_str(&a.value) {
            Ok(k) => Some(k),
            Err(_) => {
                let names = Kind::ALL.map(Kind::name);
                let hint = match suggest(&a.value, names) {
                    Some(s) => format!("; did you mean `{s}`?"),
                    None => format!(" ({})", names.join(", ")),
                };
                d.error(
                    "algorithm",
                    Some(&a.referenced),
                    format!("unknown algorithm `{}`{hint}", a.value),
                );
                None
            }
        },
    };
    let limit = match &r.limit {
        Some(l) => d.positive("limit", l),
        None => {
            let at = r
                .tiers
                .as_ref()
                .map_or(&r.name.referenced, |t| &t.referenced);
            d.error(
                "limit",
                Some(at),
                match tier {
                    Some(t) => format!(
                        "tier `{t}` of rule `{}` needs `limit` (the rule sets none)",
                        r.name.value
                    ),
                    None => "`limit` is required here".to_owned(),
                },
            );
            None
        }
    };
    let calendar = opt(&r.calendar, |c| calendar(d, c));
    let concurrency = kind == Some(Kind::Concurrency);
    let distribution = opt(&r.distribution, |dist| {
        distribution(&dist.value)
            .map_err(|m| d.error("distribution", Some(&dist.referenced), m))
            .ok()
    });
    let max_hold = opt(&r.max_hold, |m| {
        let hold = d.duration("max_hold", m)?;
        if hold.is_zero() {
            d.error("max_hold", Some(&m.referenced), "must be longer than zero");
            return None;
        }
        Some(hold)
    });
    let window = match (&r.window, concurrency) {
        (Some(w), false) if r.calendar.is_some() => {
            d.error(
                "window",
                Some(&w.referenced),
                "a calendar quota's window is its period: leave `window` out",
            );
            None
        }
        (None, false) if r.calendar.is_some() => Some(Duration::from_secs(86_400)),
        (Some(w), false) => d.duration("window", w).and_then(|w_| {
            if w_.is_zero() {
                d.error("window", Some(&w.referenced), "must be longer than zero");
                None
            } else {
                Some(w_)
            }
        }),
        (None, false) => {
            d.error(
                "window",
                Some(&r.name.referenced),
                "`window` is required here",
            );
            None
        }
        (Some(w), true) => {
            d.error(
                "window",
                Some(&w.referenced),
                "a concurrency rule counts requests in flight, not per window: use `max_hold` for how long a lease may be held",
            );
            None
        }
        // A concurrency rule's window is its lease length (shown by
        // explain; headers leave it out).
        (None, true) => max_hold.map(|h| h.unwrap_or(ratewarden::rule::MAX_HOLD)),
    };
    let burst = opt(&r.burst, |b| {
        d.positive("burst", b).and_then(NonZeroU64::new)
    });
    let max_delay = match (r.mode.as_ref(), &r.max_delay) {
        (Some(m), max) if m.value == "delay" => match max {
            Some(x) => d.duration("max_delay", x).map(Some),
            None => window.map(Some),
        },
        (None, None) => Some(None),
        (Some(m), None) if m.value == "reject" => Some(None),
        (Some(m), Some(x)) if m.value == "reject" => {
            d.error(
                "max_delay",
                Some(&x.referenced),
                "`max_delay` needs `mode: delay`",
            );
            None
        }
        (None, Some(x)) => {
            d.error(
                "max_delay",
                Some(&x.referenced),
                "`max_delay` needs `mode: delay`",
            );
            None
        }
        (Some(m), _) => {
            d.error(
                "mode",
                Some(&m.referenced),
                format!("`{}`: expected reject or delay", m.value),
            );
            None
        }
    };
    let min_interval = opt(&r.min_interval, |m| d.duration("min_interval", m));
    let penalty = opt(&r.penalty, |p| {
        let at = Some(&p.referenced);
        let dur = |s: &str, key: &str| d.check(key, at, parse_duration(s));
        match &p.value {
            PenaltyFile::Plain(s) => dur(s, "penalty").map(Penalty::fixed),
            PenaltyFile::Full(full) => {
                let duration = dur(&full.duration, "penalty.duration");
                let max = opt(&full.max, |m| dur(m, "penalty.max"));
                let memory = opt(&full.memory, |m| dur(m, "penalty.memory"));
                let duration = duration?;
                Some(Penalty {
                    duration,
                    multiplier: full.multiplier.unwrap_or(1),
                    max: max?.unwrap_or(duration),
                    memory: memory?.unwrap_or(Duration::ZERO),
                })
            }
        }
    });
    let counting = match r.count.as_ref() {
        None => Some(false),
        Some(c) => d.choice("count", c, &[("all", false), ("failures", true)]),
    }
    .and_then(|failures| match (failures, &r.reset_on_success) {
        (true, reset) => Some(Counting::Failures {
            reset_on_success: reset.as_ref().is_none_or(|r| r.value),
        }),
        (false, None) => Some(Counting::All),
        (false, Some(x)) => {
            d.error(
                "reset_on_success",
                Some(&x.referenced),
                "`reset_on_success` needs `count: failures`",
            );
            None
        }
    });
    let status = opt(&r.status, |s| {
        if (400..600).contains(&s.value) {
            Some(s.value as u16)
        } else {
            d.error(
                "status",
                Some(&s.referenced),
                format!(
                    "{} is not an HTTP error status (400-599; 429 and 403 are usual)",
                    s.value
                ),
            );
            None
        }
    });
    let problem_type = opt(&r.problem_type, |t| {
        let v = t.value.trim();
        let ok = !v.is_empty()
            && v.bytes().all(|b| b.is_ascii_graphic())
            && (v.starts_with("https://")
                || v.starts_with("http://")
                || v.starts_with("urn:")
                || v.starts_with("tag:")
                || v.starts_with('/'));
        if ok {
            Some(v.to_owned())
        } else {
            d.error(
                "problem_type",
                Some(&t.referenced),
                "`problem_type` must be a URI (`https://...`, `urn:...` or a path)",
            );
            None
        }
    });
    let cost = match &r.cost {
        Some(c) => d.positive("cost", c).and_then(NonZeroU64::new),
        None => Some(NonZeroU64::MIN),
    };
    let spec = RuleSpec {
        name: r.name.value.clone(),
        algorithm: kind?,
        limit: NonZeroU64::new(limit?)?,
        window: window?,
        burst: burst?,
        max_delay: max_delay?,
        min_interval: min_interval?,
        penalty: penalty?,
        counting: counting?,
        count_rejected: r.count_rejected.as_ref().is_some_and(|c| c.value),
        cost: cost?,
        shadow: r.shadow.as_ref().is_some_and(|s| s.value),
        max_hold: max_hold?,
        distribution: distribution?,
        calendar: calendar?.map(std::sync::Arc::new),
        variant: tier.map(|t| ratewarden::Variant::Tier(t.to_owned())),
        status: status?,
        problem_type: problem_type?,
    };
    // Only a rule whose every part is valid gets here, so a mistake is not
    // reported twice.
    match Rule::new(spec) {
        Ok(rule) => Some(rule),
        Err(e) => {
            let which = match tier {
                Some(t) => format!("rule `{}` tier `{t}`", r.name.value),
                None => format!("rule `{}`", r.name.value),
            };
            d.error(
                e.key(),
                Some(rule_location(r, e.key())),
                format!("{which}: {e}"),
            );
            None
        }
    }
}

/// A `match:`; `routes` are the names its `route` may take (besides
/// `default`).
/// A `key:` part as the config writes it; `matcher` (the rule's, when it is
/// valid) names the captures `path:NAME` may take.
fn key_part(text: &str, matcher: Option<&Matcher>) -> Result<KeyPart, String> {
    const PLAIN: [&str; 5] = ["identity", "method", "path", "global", "host"];
    const NAMED: [&str; 5] = ["header", "query", "cookie", "path", "jwt"];
    let all = "key parts are identity, method, path, host, global, header:NAME, \
               query:NAME, cookie:NAME, path:NAME (a capture of the rule's path_regex) and jwt:CLAIM";
    match text {
        "identity" => return Ok(KeyPart::Identity),
        "method" => return Ok(KeyPart::Method),
        "path" => return Ok(KeyPart::Path),
        "global" => return Ok(KeyPart::Global),
        "host" => return Ok(KeyPart::Host),
        _ => {}
    }
    let Some((kind, name)) = text.split_once(':') else {
        return Err(match suggest(text, PLAIN) {
            Some(s) => format!("unknown key part `{text}`; did you mean `{s}`?"),
            None => format!("`{text}`: {all}"),
        });
    };
    if name.is_empty() {
        return Err(format!("`{text}` names nothing after `{kind}:`"));
    }
    match kind {
        "header" => HeaderName::from_bytes(name.as_bytes())
            .map(KeyPart::Header)
            .map_err(|_| format!("`{text}`: bad header name")),
        "query" => Ok(KeyPart::Query(name.to_owned())),
        "cookie" => Ok(KeyPart::Cookie(name.to_owned())),
        "path" => {
            let captures: Vec<&str> = match matcher.map(|m| &m.path) {
                Some(PathMatch::Regex(re)) => re.capture_names().flatten().collect(),
                Some(_) => {
                    return Err(format!(
                        "`{text}` takes a named group of the rule's `path_regex`, and the rule has none"
                    ));
                }
                // The matcher's own error is reported.
                None => return Ok(KeyPart::Capture(name.to_owned())),
            };
            if captures.contains(&name) {
                Ok(KeyPart::Capture(name.to_owned()))
            } else if captures.is_empty() {
                Err(format!(
                    "`{text}`: the rule's `path_regex` has no named group; write `(?P<{name}>...)`"
                ))
            } else {
                Err(format!(
                    "`{text}`: the rule's `path_regex` captures {}",
                    captures
                        .iter()
                        .map(|c| format!("`path:{c}`"))
                        .collect::<Vec<_>>()
                        .join(", ")
                ))
            }
        }
        "jwt" => Ok(KeyPart::Jwt(name.to_owned())),
        other => Err(match suggest(other, NAMED) {
            Some(s) => format!("unknown key part `{text}`; did you mean `{s}:{name}`?"),
            None => format!("`{text}`: {all}"),
        }),
    }
}

fn matcher(d: &Diag<'_>, m: &Sp<MatchFile>, routes: &[String]) -> Option<Matcher> {
    let at = Some(&m.referenced);
    let m = &m.value;
    let route = match &m.route {
        None => Some(None),
        Some(r) if r.value == super::DEFAULT_ROUTE || routes.contains(&r.value) => {
            Some(Some(r.value.clone()))
        }
        Some(r) => {
            let hint = match suggest(&r.value, routes.iter().map(String::as_str)) {
                Some(s) => format!("; did you mean `{s}`?"),
                None => String::new(),
            };
            d.error(
                "route",
                Some(&r.referenced),
                format!("no route `{}`{hint}", r.value),
            );
            None
        }
    };
    let case_insensitive = m.case_insensitive.as_ref().is_some_and(|c| c.value);
    let mut methods = Some(vec![]);
    for meth in m.methods.iter().flatten() {
        let upper = meth.value.to_ascii_uppercase();
        let parsed = if is_token(&upper) {
            Method::from_bytes(upper.as_bytes()).ok()
        } else {
            None
        };
        match parsed {
            Some(x) => {
                if let Some(v) = methods.as_mut() {
                    v.push(x);
                }
            }
            None => {
                d.error(
                    "methods",
                    Some(&meth.referenced),
                    format!(
                        "`{}` is not a method (a token like GET or POST)",
                        meth.value
                    ),
                );
                methods = None;
            }
        }
    }
    let given = [&m.path, &m.path_prefix, &m.path_regex];
    if given.iter().filter(|g| g.is_some()).count() > 1 {
        d.error(
            "match",
            at,
            "use one of `path`, `path_prefix`, `path_regex`",
        );
        return None;
    }
    // A literal path condition is compared with the normalised request
    // path: one written otherwise could never match.
    let literal = |key: &str, p: &Sp<String>| -> Option<String> {
        let v = &p.value;
        if key == "path" && v == "*" {
            // `OPTIONS *` (asterisk form) is seen as the path `*`.
            return Some(v.clone());
        }
        if !v.starts_with('/') {
            d.error(
                key,
                Some(&p.referenced),
                format!("`{v}` must start with `/`: request paths always do"),
            );
            return None;
        }
        match path::normalize(v) {
            Ok(n) if n == v.as_str() => {}
            Ok(n) => {
                d.error(
                    key,
                    Some(&p.referenced),
                    format!("`{v}` can never match: rules see normalised paths; write `{n}`"),
                );
                return None;
            }
            Err(e) => {
                d.error(key, Some(&p.referenced), format!("`{v}`: {e}"));
                return None;
            }
        }
        Some(if case_insensitive {
            v.to_ascii_lowercase()
        } else {
            v.clone()
        })
    };
    let path = if let Some(p) = &m.path {
        PathMatch::Exact(literal("path", p)?)
    } else if let Some(p) = &m.path_prefix {
        PathMatch::Prefix(literal("path_prefix", p)?)
    } else if let Some(p) = &m.path_regex {
        PathMatch::Regex(linear_regex(d, "path_regex", p, case_insensitive)?)
    } else {
        if let Some(c) = &m.case_insensitive {
            d.error(
                "case_insensitive",
                Some(&c.referenced),
                "does nothing without `path`, `path_prefix` or `path_regex`",
            );
            return None;
        }
        PathMatch::Any
    };
    let hosts = m
        .hosts
        .as_ref()
        .map_or(Some(vec![]), |h| host_patterns(d, h));
    let headers = conditions(d, "headers", m.headers.as_deref());
    let query = conditions(d, "query", m.query.as_deref());
    Some(Matcher {
        methods: methods?,
        path,
        case_insensitive,
        route: route?,
        hosts: hosts?,
        headers: headers?,
        query: query?,
    })
}

/// `hosts:`: each an exact name or `*.suffix`, ASCII case-insensitive
/// (held lower case, without a trailing dot or a port).
fn host_patterns(d: &Diag<'_>, hosts: &[Sp<String>]) -> Option<Vec<HostPattern>> {
    let mut out = Some(vec![]);
    if hosts.is_empty() {
        d.error(
            "hosts",
            None,
            "an empty list matches nothing; leave `hosts` out to match any host",
        );
        return None;
    }
    for h in hosts {
        let v = h.value.trim().to_ascii_lowercase();
        let (suffix, name) = match v.strip_prefix("*.") {
            Some(rest) => (true, rest.trim_end_matches('.')),
            None => (false, v.trim_end_matches('.')),
        };
        // A name: letters, digits, `-`, `_` and dots between labels; or an
        // IPv6 literal in brackets.
        let label_ok = |l: &str| {
            !l.is_empty()
                && l.bytes()
                    .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_')
        };
        let ipv6 = !suffix
            && name.starts_with('[')
            && name.ends_with(']')
            && name[1..name.len() - 1]
                .parse::<std::net::Ipv6Addr>()
                .is_ok();
        let problem = if name.is_empty() && suffix {
            Some("`*.` alone names no domain: write `*.example.com`".to_owned())
        } else if name.is_empty() {
            Some("an empty host matches nothing".to_owned())
        } else if name.contains(':') && !ipv6 {
            Some(format!(
                "`{}`: hosts are matched without their port; write `{}`",
                h.value,
                name.split(':').next().unwrap_or("")
            ))
        } else if !ipv6 && !name.split('.').all(label_ok) {
            Some(format!(
                "`{}` is not a host name (letters, digits and `-` between dots, or `*.` before one)",
                h.value
            ))
        } else {
            None
        };
        match problem {
            Some(m) => {
                d.error("hosts", Some(&h.referenced), m);
                out = None;
            }
            None => {
                if let Some(o) = out.as_mut() {
                    o.push(if suffix {
                        HostPattern::Suffix(format!(".{name}"))
                    } else {
                        HostPattern::Exact(name.to_owned())
                    });
                }
            }
        }
    }
    out
}

/// A regex of the config (`path_regex`, a condition's `regex`): linear time
/// (the `regex` crate), its compiled size bounded so that a config cannot
/// make matching blow up; an invalid one is an error at `key`.
fn linear_regex(
    d: &Diag<'_>,
    key: &str,
    p: &Sp<String>,
    case_insensitive: bool,
) -> Option<regex::Regex> {
    match regex::RegexBuilder::new(&p.value)
        .size_limit(1 << 20)
        .case_insensitive(case_insensitive)
        .build()
    {
        Ok(re) => Some(re),
        Err(e) => {
            let first = e
                .to_string()
                .lines()
                .last()
                .unwrap_or("invalid")
                .trim()
                .to_owned();
            d.error(
                key,
                Some(&p.referenced),
                format!("invalid regex `{}`: {first}", p.value),
            );
            None
        }
    }
}

/// `jwt:`: the verifier, its JWKS file read and checked now (a bad one
/// never starts).
fn jwt_verifier(d: &Diag<'_>, j: &Sp<JwtFile>) -> Option<crate::jwt::Verifier> {
    let at = Some(&j.referenced);
    let j = &j.value;
    let from = match j.from.as_ref().map(|f| (&f.value, &f.referenced)) {
        None => crate::jwt::From::Header("authorization".into()),
        Some((f, at)) => match (&f.header, &f.cookie, &f.query) {
            (Some(h), None, None) => match HeaderName::from_bytes(h.as_bytes()) {
                Ok(n) => crate::jwt::From::Header(n.as_str().to_owned()),
                Err(_) => {
                    d.error("from", Some(at), format!("`{h}` is not a header name"));
                    return None;
                }
            },
            (None, Some(c), None) => crate::jwt::From::Cookie(c.clone()),
            (None, None, Some(q)) => crate::jwt::From::Query(q.clone()),
            _ => {
                d.error("from", Some(at), "one of `header`, `cookie`, `query`");
                return None;
            }
        },
    };
    let jwks = match &j.jwks {
        None => None,
        Some(p) => match std::fs::read_to_string(&p.value) {
            Ok(t) => Some(t),
            Err(e) => {
                d.error(
                    "jwks",
                    Some(&p.referenced),
                    format!("cannot read `{}`: {e}", p.value),
                );
                return None;
            }
        },
    };
    let leeway = match &j.leeway {
        None => Some(0),
        Some(l) => d.duration("leeway", l).map(|l| l.as_secs()),
    }?;
    let made = crate::jwt::Verifier::new(
        from,
        jwks.as_deref(),
        j.secret.as_ref().map(|s| s.value.as_bytes()),
        j.issuer.as_ref().map(|i| i.value.clone()),
        j.audiences
            .iter()
            .flatten()
            .map(|a| a.value.clone())
            .collect(),
        leeway,
    );
    if j.jwks.is_none() && j.jwks_url.is_none() && j.secret.is_none() {
        d.error(
            "jwt",
            at,
            "give `jwks` or `jwks_url` (public keys) or `secret` (HS256/384/512)",
        );
        return None;
    }
    let made = match (made, &j.jwks_url) {
        (Ok(v), Some(url)) => v.with_url(&url.value).map_err(|e| {
            d.error("jwks_url", Some(&url.referenced), e);
        }),
        (Ok(v), None) => Ok(v),
        (Err(e), _) => {
            let key = if j.jwks.is_some() { "jwks" } else { "jwt" };
            let at = j.jwks.as_ref().map(|p| &p.referenced).or(at);
            d.error(key, at, e);
            Err(())
        }
    };
    match made {
        Ok(mut v) => {
            v.required = j.required.as_ref().is_some_and(|r| r.value);
            Some(v)
        }
        Err(()) => None,
    }
}

/// `headers:` or `query:` (`key`): each a name and exactly one of
/// `exact`, `prefix`, `regex`, `present`, perhaps `invert`.
fn conditions(
    d: &Diag<'_>,
    key: &str,
    list: Option<&[Sp<ConditionFile>]>,
) -> Option<Vec<Condition>> {
    let mut out = Some(vec![]);
    for c in list.unwrap_or_default() {
        let at = Some(&c.referenced);
        let c = &c.value;
        let name = c.name.value.trim();
        let name = if key == "headers" {
            match HeaderName::from_bytes(name.as_bytes()) {
                Ok(n) => Some(n.as_str().to_owned()),
                Err(_) => {
                    d.error(
                        key,
                        Some(&c.name.referenced),
                        format!("`{name}` is not a header name"),
                    );
                    None
                }
            }
        } else if name.is_empty() {
            d.error(
                key,
                Some(&c.name.referenced),
                "a query condition needs the parameter's `name`",
            );
            None
        } else {
            Some(name.to_owned())
        };
        let given = [
            c.exact.is_some(),
            c.prefix.is_some(),
            c.regex.is_some(),
            c.present.is_some(),
        ];
        let test = match given.iter().filter(|g| **g).count() {
            1 => {
                if let Some(x) = &c.exact {
                    Some(Test::Exact(x.value.clone()))
                } else if let Some(x) = &c.prefix {
                    Some(Test::Prefix(x.value.clone()))
                } else if let Some(x) = &c.present {
                    Some(Test::Present(x.value))
                } else {
                    let x = c.regex.as_ref().expect("one given");
                    linear_regex(d, key, x, false).map(Test::Regex)
                }
            }
            n => {
                let which = if n == 0 { "needs" } else { "takes only" };
                d.error(
                    key,
                    at,
                    format!(
                        "`{}` {which} one of `exact`, `prefix`, `regex`, `present`",
                        c.name.value
                    ),
                );
                None
            }
        };
        match (name, test) {
            (Some(name), Some(test)) => {
                if let Some(o) = out.as_mut() {
                    o.push(Condition {
                        name,
                        test,
                        invert: c.invert.as_ref().is_some_and(|i| i.value),
                    });
                }
            }
            _ => out = None,
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn what_looks_like_an_address_must_be_one() {
        for yes in [
            "127.0.0.1/33",
            "10.0.0.256",
            "2001:db8::fffff",
            "10::1::2",
            "1.2.3",
        ] {
            assert!(looks_like_address(yes), "{yes}");
        }
        for no in ["user-42", "cafe", "alice.smith", "12345"] {
            assert!(!looks_like_address(no), "{no}");
        }
    }

    #[test]
    fn listeners_clash_on_one_port() {
        let a = |s: &str| s.parse::<SocketAddr>().unwrap();
        assert!(clash(a("127.0.0.1:80"), a("127.0.0.1:80")));
        assert!(clash(a("0.0.0.0:80"), a("127.0.0.1:80")));
        assert!(!clash(a("127.0.0.1:80"), a("127.0.0.2:80")));
        assert!(!clash(a("127.0.0.1:0"), a("127.0.0.1:0")));
    }
}
