//! From the file as written to a [`Config`]: every value checked, every
//! error recorded with the key and place at fault, and validation carried
//! on past an error so that one run reports them all. One validator serves
//! `serve`, `validate` and reload, so what one accepts the others do.

use std::net::SocketAddr;
use std::time::Duration;

use http::StatusCode;
use ratewarden::HeaderStyle;

use super::diag::{Diag, parse_duration, suggest};
use super::model::*;
use super::schema::*;

mod consumers;
mod cost;
mod identity;
mod jwt;
mod keys;
mod listeners;
mod rls;
mod routes;
mod rules;
mod store;
mod tracing;

pub(crate) use consumers::valid_name as consumer_name;
pub(crate) use rules::distribution;

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
/// The top-level sections a part of the config may need.
#[derive(Debug, Clone, Copy)]
struct Sections {
    /// `jwt:` (for `jwt:CLAIM` parts, `from: jwt`, `jwt_required`).
    jwt: bool,
    /// `consumers:` (for `consumer` parts, `from: consumer`).
    consumers: bool,
}

fn opt<S, T>(v: &Option<S>, f: impl FnOnce(&S) -> Option<T>) -> Option<Option<T>> {
    match v {
        None => Some(None),
        Some(v) => f(v).map(Some),
    }
}

pub(crate) fn validate(mut f: File, d: &Diag<'_>, o: &Overrides) -> Option<Config> {
    let has_rls = f.rls.is_some();
    let rls = match f.rls.take() {
        None => Some(None),
        Some(r) => rls::rls_spec(d, r).map(Some),
    };
    let listen = match (&o.listen, &f.listen) {
        (Some(l), _) => listeners::flag_addr(d, "--listen", "listen", l).map(Some),
        // No proxy listener: a gateway for the proxies' hooks alone.
        (None, Some(Some(l))) if l.value == "off" => {
            if f.authz.is_none() && !has_rls {
                d.error(
                    "listen",
                    Some(&l.referenced),
                    "`listen: off` leaves nothing to serve: it is for a gateway of `authz:` or `rls:` alone",
                );
                None
            } else {
                Some(None)
            }
        }
        (None, Some(Some(l))) => listeners::socket_addr(d, "listen", l).map(Some),
        // Written, but empty: not read as the default, which it is not.
        (None, Some(None)) => {
            d.error(
                "listen",
                None,
                "`listen` is empty (null): give an address (`127.0.0.1:8080`), or `off` for no proxy listener",
            );
            None
        }
        (None, None) => Some(Some(SocketAddr::from(([127, 0, 0, 1], 8080)))),
    };
    let workers = match (o.workers, &f.workers) {
        (Some(n), _) => Some(n.max(1)),
        (None, Some(w)) => d.positive("workers", w).map(|n| n as usize),
        (None, None) => Some(std::thread::available_parallelism().map_or(1, |n| n.get())),
    };
    let upstream = match (&o.upstream, &f.upstream) {
        (Some(u), _) => match routes::parse_upstream(u) {
            Ok(up) => Some(up),
            Err(m) => {
                d.error_in("--upstream", "upstream", m);
                None
            }
        },
        (None, Some(u)) => d.check(
            "upstream",
            Some(&u.referenced),
            routes::parse_upstream(&u.value),
        ),
        // The echo upstream only when written: a file that names no
        // server (an emptied file, one half written) would otherwise serve
        // every request from the echo. Said last, when nothing else is
        // wrong (see the end). (A gateway for the proxies' hooks, `authz:`
        // or `rls:`, answers them without an upstream.)
        (None, None)
            if f.routes.is_empty()
                && f.authz.is_none()
                && rls.as_ref().is_some_and(Option::is_none) =>
        {
            None
        }
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
        Some(a) => listeners::admin(d, a, o, listen.flatten()).map(Some),
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
        Some(h) => routes::request_headers(d, h, keep_underscores),
    };
    let routes = routes::routes(d, &f.routes, f.upstream_tls.as_ref(), keep_underscores);
    let route_names: Vec<String> = f.routes.iter().map(|r| r.name.value.clone()).collect();
    let log = listeners::log_spec(d, f.log.as_ref());
    let access_log = opt(&f.access_log, |a| listeners::access_spec(d, a));
    let trace = tracing::trace_spec(d, f.tracing.as_ref(), &|name| std::env::var(name).ok());
    let admin_token_for_probes = f
        .admin
        .as_ref()
        .and_then(|a| a.token_for_probes.as_ref())
        .is_some_and(|t| t.value);
    let admin_hosts = listeners::admin_hosts(
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
        Some(s) => store::store_spec(d, s, &mut tls_files),
    };
    let has = Sections {
        jwt: f.jwt.is_some(),
        consumers: f.consumers.is_some(),
    };
    let identity = identity::identity(d, f.identity, has);
    let by_header = matches!(
        identity,
        Some(IdentitySource::Header { .. } | IdentitySource::Claim { .. })
    );
    let allow = identity::patterns(d, "allow", &f.allow, by_header);
    let deny = identity::patterns(d, "deny", &f.deny, by_header);
    let authz = match &f.authz {
        None => Some(None),
        Some(a) => listeners::socket_addr(d, "authz.listen", &a.value.listen).map(Some),
    };
    if let (Some(Some(a)), Some(Some(l)), Some(f)) = (authz, listen, &f.authz)
        && listeners::clash(a, l)
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
    // A directory that exists and can be written: a gateway that could not
    // keep its overrides would lose them at its next restart, unsaid.
    let state_dir = match &f.state_dir {
        None => Some(None),
        Some(dir) => {
            let path = std::path::PathBuf::from(&dir.value);
            let probe = path.join(".ratewarden-write-test");
            match std::fs::write(&probe, b"") {
                Ok(()) => {
                    let _ = std::fs::remove_file(&probe);
                    Some(Some(path))
                }
                Err(e) => {
                    d.error(
                        "state_dir",
                        Some(&dir.referenced),
                        format!("`{}` cannot be written: {e}", dir.value),
                    );
                    None
                }
            }
        }
    };
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
        Some(list) => listeners::header_style(d, "headers", list),
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
    let mut costs = vec![];
    let mut refusals = vec![];
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
            // The rules are checked as with a good one: a secret too short
            // is one error, not one more per hashed key part.
            Err(crate::tls::key_hasher(k.value.as_bytes()))
        }
        Some(k) => Ok(Some(crate::tls::key_hasher(k.value.as_bytes()))),
    };
    let (hasher, secret_ok) = match hasher {
        Ok(h) => (h, true),
        Err(h) => (Some(h), false),
    };
    rules_ok &= secret_ok;
    let consumers = match &f.consumers {
        None => Some(None),
        Some(c) => consumers::consumers(d, c, hasher.as_ref()).map(Some),
    };
    // `Some(None)`: no `jwt:`; `None`: a bad one (its errors recorded).
    let jwt = match f.jwt.as_ref().map(|j| jwt::jwt_verifier(d, j)) {
        None => Some(None),
        Some(Some(v)) => Some(Some(v)),
        Some(None) => None,
    };
    let mut token_rules = vec![];
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
        match rules::rule(d, r, &route_names, hasher.as_ref(), has) {
            Some(c) => {
                if let Some(spec) = c.cost {
                    costs.push(std::sync::Arc::new(spec));
                }
                if c.refusal != super::cost::RefusalShape::Problem {
                    refusals.push((c.rule.rule.name().to_owned(), c.refusal));
                }
                if c.jwt_required {
                    token_rules.push(c.rule.rule.name().to_owned());
                }
                rules.push(c.rule);
            }
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
    if upstream.is_none() && o.upstream.is_none() && f.upstream.is_none() && d.is_clean() {
        d.error(
            "upstream",
            None,
            "no `upstream`: name the server requests go to (`upstream: http://127.0.0.1:9000`), or write `upstream: echo` for the built-in echo upstream",
        );
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
        tracing: trace?,
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
        costs,
        refusals,
        token_rules,
        jwt: jwt?,
        overrides_max: overrides_max?,
        state_dir: state_dir?,
        authz: authz?,
        consumers: consumers?,
    })
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
            assert!(identity::looks_like_address(yes), "{yes}");
        }
        for no in ["user-42", "cafe", "alice.smith", "12345"] {
            assert!(!identity::looks_like_address(no), "{no}");
        }
    }

    #[test]
    fn listeners_clash_on_one_port() {
        let a = |s: &str| s.parse::<SocketAddr>().unwrap();
        assert!(listeners::clash(a("127.0.0.1:80"), a("127.0.0.1:80")));
        assert!(listeners::clash(a("0.0.0.0:80"), a("127.0.0.1:80")));
        assert!(!listeners::clash(a("127.0.0.1:80"), a("127.0.0.2:80")));
        assert!(!listeners::clash(a("127.0.0.1:0"), a("127.0.0.1:0")));
    }
}
