//! `routes:`: upstreams, their protocol, header rewriting, and the
//! routes' matching.

use std::time::Duration;

use http::{HeaderName, Uri};
use serde_saphyr::Location;

use super::super::diag::{Diag, parse_duration};
use super::super::model::*;
use super::super::schema::*;
use super::keys::matcher;

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
pub(super) fn server_protocol(
    d: &Diag<'_>,
    at: Option<&Location>,
    url: &str,
    protocol: Option<&String>,
) -> Option<super::super::Protocol> {
    use super::super::Protocol;
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

/// `routes:`: names unique (and not `default`), a match each, and servers
/// that are URLs (each https one with its TLS client).
/// `request_headers: {set: {NAME: VALUE}, remove: [NAME]}`: names that
/// parse and that the gateway does not own, values that can be sent.
pub(super) fn request_headers(
    d: &Diag<'_>,
    f: &Sp<super::super::schema::RequestHeadersFile>,
    keep_underscores: bool,
) -> Option<super::super::RequestHeaders> {
    let mut ok = true;
    let mut out = super::super::RequestHeaders::default();
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
        let why = if super::super::HOP_BY_HOP.contains(&lower) || lower == "content-length" {
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

pub(super) fn routes(
    d: &Diag<'_>,
    routes: &[RouteFile],
    upstream_tls: Option<&Sp<UpstreamTlsFile>>,
    keep_underscores: bool,
) -> Option<Vec<RouteSpec>> {
    use super::super::{Active, Balance, Passive};
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
        } else if name.value == super::super::DEFAULT_ROUTE {
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
                        super::super::tls::client_for(d, &url, upstream_tls).map(|t| (url, Some(t)))
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
