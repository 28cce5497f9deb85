//! What both HTTP paths must do alike: what the edge refuses, the path a
//! rule sees, the target and the fields that go upstream, and the answers
//! for what went wrong. The HTTP/1.1 path works on bytes and hyper's on
//! `http` types, so each calls these with what it has; neither keeps a copy.

use std::borrow::Cow;
use std::net::IpAddr;

use http::header::{self, HeaderMap, HeaderName};
use http::{Method, Request, Response, StatusCode, Uri};
use ratewarden_tower::path::{self, PathError};

use crate::answer::{Body, problem_response};
use crate::config::UpstreamPath;

use crate::config::HOP_BY_HOP;

/// Whether `name` (any case) is a hop-by-hop header.
pub(crate) fn is_hop_by_hop(name: &[u8]) -> bool {
    HOP_BY_HOP
        .iter()
        .any(|h| name.eq_ignore_ascii_case(h.as_bytes()))
}

/// Whether a request field named `name` is left out of what goes upstream
/// and of what rules read: hop-by-hop fields, and names with `_` unless
/// `underscores_in_headers` keeps them. CGI, WSGI and Rack backends read
/// `X_Forwarded_For` as `X-Forwarded-For`, so such a field could pose as
/// one the gateway sets or reads (nginx drops them by default too).
pub(crate) fn dropped_request_field(name: &[u8], keep_underscores: bool) -> bool {
    is_hop_by_hop(name) || (!keep_underscores && name.contains(&b'_'))
}

/// Why the edge refuses a request before any rule sees it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Edge {
    /// HTTP/1.1 without a `Host` field (RFC 9112 §3.2).
    NoHost,
    /// More than one `Host` field.
    TwoHosts,
    /// A `Host` value that is not `host[:port]`.
    BadHost,
    /// HTTP/2 `:authority`, or an HTTP/1.1 absolute-form target's
    /// authority, and `Host` that disagree.
    AuthorityMismatch,
    /// A target or `:authority` with userinfo (`user@host`): never a
    /// request's own, and read as a host two ways.
    Userinfo,
    /// `CONNECT`: this is a gateway, not a forward proxy.
    Connect,
    /// `*` as the target of a method other than `OPTIONS`.
    Asterisk,
    /// A path that cannot be normalised.
    Path(PathError),
    /// A malformed (or, on hyper's path, cut short) request body.
    BadBody,
    /// The request head did not arrive within `client_header_timeout`.
    HeadTimeout,
    /// The request body did not arrive within `client_body_timeout`.
    BodyTimeout,
    /// The request body is larger than `client_max_body_size` (its bound).
    TooLarge(u64),
}

/// What `Allow` says in a 405 for `CONNECT`: every method is forwarded but it.
pub(crate) const ALLOW: &str = "GET, HEAD, POST, PUT, DELETE, PATCH, OPTIONS, TRACE";

impl Edge {
    /// The status it is answered with.
    pub fn status(self) -> StatusCode {
        match self {
            Edge::Connect => StatusCode::METHOD_NOT_ALLOWED,
            Edge::HeadTimeout | Edge::BodyTimeout => StatusCode::REQUEST_TIMEOUT,
            Edge::TooLarge(_) => StatusCode::PAYLOAD_TOO_LARGE,
            _ => StatusCode::BAD_REQUEST,
        }
    }

    /// What the problem body says.
    pub fn detail(self) -> String {
        match self {
            Edge::NoHost => "an HTTP/1.1 request needs a Host header".into(),
            Edge::TwoHosts => "the request has more than one Host header".into(),
            Edge::BadHost => "the Host header is not a valid host[:port]".into(),
            Edge::AuthorityMismatch => {
                "the target's authority (or :authority) and Host disagree".into()
            }
            Edge::Userinfo => "userinfo (`user@`) is not taken in a request's authority".into(),
            Edge::Connect => "CONNECT is not served: this is a reverse proxy".into(),
            Edge::Asterisk => "`*` is a target only for OPTIONS".into(),
            Edge::Path(e) => e.to_string(),
            Edge::BadBody => "the request body is malformed or incomplete".into(),
            Edge::HeadTimeout => "the request head did not arrive in time".into(),
            Edge::BodyTimeout => "the request body did not arrive in time".into(),
            Edge::TooLarge(max) => {
                format!("the request body is larger than client_max_body_size ({max} bytes)")
            }
        }
    }

    /// The answer: a problem body; `Allow` with a 405.
    pub fn answer(self) -> http::Response<Body> {
        let mut r = problem_response(self.status(), &self.detail());
        if self == Edge::Connect {
            r.headers_mut()
                .insert(http::header::ALLOW, http::HeaderValue::from_static(ALLOW));
        }
        r
    }
}

/// Whether `v` is a valid `Host` value: `uri-host [ ":" port ]` (RFC 3986:
/// a bracketed IPv6 literal, or a reg-name / IPv4 of unreserved,
/// percent-encoded and sub-delim characters), not empty.
pub fn valid_host(v: &[u8]) -> bool {
    let port = match v.first() {
        Some(b'[') => match v.iter().position(|&b| b == b']') {
            Some(end) => {
                let inner = &v[1..end];
                if inner.is_empty()
                    || !inner
                        .iter()
                        .all(|b| b.is_ascii_hexdigit() || matches!(b, b':' | b'.'))
                {
                    return false;
                }
                &v[end + 1..]
            }
            None => return false,
        },
        None => return false,
        // One pass over a reg-name or IPv4 address up to a `:`: this runs
        // on every request.
        Some(_) => {
            let mut i = 0;
            while i < v.len() && REG_NAME[usize::from(v[i])] {
                i += 1;
            }
            if i == 0 {
                return false;
            }
            &v[i..]
        }
    };
    match port {
        [] => true,
        [b':', digits @ ..] => digits.len() <= 5 && digits.iter().all(u8::is_ascii_digit),
        _ => false,
    }
}

/// The bytes of a reg-name or IPv4 address: unreserved, `%` (of an
/// escape) and sub-delims. A table: this runs on every request.
const REG_NAME: [bool; 256] = {
    let mut t = [false; 256];
    let mut b = 0;
    while b < 256 {
        let c = b as u8;
        t[b] = c.is_ascii_alphanumeric()
            || matches!(
                c,
                b'-' | b'.'
                    | b'_'
                    | b'~'
                    | b'%'
                    | b'!'
                    | b'$'
                    | b'&'
                    | b'\''
                    | b'('
                    | b')'
                    | b'*'
                    | b'+'
                    | b','
                    | b';'
                    | b'='
            );
        b += 1;
    }
    t
};

/// Whether `authority` (a target's, or `:authority`) names the same host
/// and port as the `Host` value `host`: names compared in any case and
/// without a trailing dot, a missing port read as the scheme's `default`.
/// One authority per request: rules, routes, the upstream's `Host` and
/// `X-Forwarded-Host` read the same one, so a request whose two disagree
/// is refused rather than read one way by a rule and another upstream.
pub fn same_authority(authority: &str, host: &[u8], default: u16) -> bool {
    fn split(v: &[u8], default: u16) -> Option<(Vec<u8>, u16)> {
        let (name, port) = match v.first() {
            Some(b'[') => {
                let end = v.iter().position(|&b| b == b']')?;
                (&v[..=end], &v[end + 1..])
            }
            _ => match v.iter().position(|&b| b == b':') {
                Some(i) => (&v[..i], &v[i..]),
                None => (v, &[][..]),
            },
        };
        let port = match port {
            [] | [b':'] => default,
            [b':', digits @ ..] => std::str::from_utf8(digits).ok()?.parse().ok()?,
            _ => return None,
        };
        let mut name = name.to_ascii_lowercase();
        while name.last() == Some(&b'.') {
            name.pop();
        }
        Some((name, port))
    }
    match (
        split(authority.as_bytes(), default),
        split(host.trim_ascii(), default),
    ) {
        (Some(a), Some(h)) => a == h,
        _ => false,
    }
}

/// The `Host` check of RFC 9112 §3.2 on an HTTP/1.1 request's `Host` values.
pub fn check_host<'a>(mut values: impl Iterator<Item = &'a [u8]>) -> Result<(), Edge> {
    match (values.next(), values.next()) {
        (None, _) => Err(Edge::NoHost),
        (Some(_), Some(_)) => Err(Edge::TwoHosts),
        (Some(v), None) if valid_host(v.trim_ascii()) => Ok(()),
        _ => Err(Edge::BadHost),
    }
}

/// The path rules see for a request with `target` (origin form, or `*`):
/// `*` for `OPTIONS *`, else the normalised path before any `?`.
pub fn rule_path<'t>(method: &Method, target: &'t str) -> Result<Cow<'t, str>, Edge> {
    if target == "*" {
        return if method == Method::OPTIONS {
            Ok(Cow::Borrowed("*"))
        } else {
            Err(Edge::Asterisk)
        };
    }
    // (A byte search: `split_once` costs more than the rest for a short path.)
    let raw = match target.bytes().position(|b| b == b'?') {
        Some(q) => &target[..q],
        None => target,
    };
    path::normalize(raw).map_err(Edge::Path)
}

/// The target sent upstream, before the upstream URL's path prefix: the
/// client's `target` as it came, or with its path normalised (see
/// [`UpstreamPath`]). Borrows `target` when it goes as it came.
pub fn upstream_target(target: &str, how: UpstreamPath) -> Result<Cow<'_, str>, Edge> {
    if how == UpstreamPath::Original || target == "*" {
        return Ok(Cow::Borrowed(target));
    }
    let (raw, query) = match target.split_once('?') {
        Some((p, q)) => (p, Some(q)),
        None => (target, None),
    };
    Ok(
        match (
            path::normalize_for_upstream(raw).map_err(Edge::Path)?,
            query,
        ) {
            (Cow::Borrowed(_), _) => Cow::Borrowed(target),
            (Cow::Owned(p), None) => Cow::Owned(p),
            (Cow::Owned(p), Some(q)) => Cow::Owned(format!("{p}?{q}")),
        },
    )
}

/// Appends the value of the `X-Forwarded-For` sent upstream: every incoming
/// field's chain in order, then the peer.
pub(crate) fn push_forwarded_for<'a>(
    out: &mut Vec<u8>,
    chain: impl IntoIterator<Item = &'a [u8]>,
    peer: IpAddr,
) {
    for hop in chain {
        out.extend_from_slice(hop);
        out.extend_from_slice(b", ");
    }
    ratewarden_tower::identity::push_ip(out, peer);
}

/// How a client connection came in: the peer, whether over TLS (and the
/// server name it asked for), and the listener's port (for
/// `X-Forwarded-Proto` and `-Port`).
#[derive(Debug, Clone)]
pub struct Client {
    /// The peer's address.
    pub peer: std::net::SocketAddr,
    /// Whether the connection is TLS (the listener's `tls:`).
    pub tls: bool,
    /// The port the client connected to.
    pub port: u16,
    /// The server name of the TLS handshake (SNI), when there was one.
    pub sni: Option<std::sync::Arc<str>>,
}

impl Client {
    /// The server name of the TLS handshake, when there was one.
    pub fn sni(&self) -> Option<&str> {
        self.sni.as_deref()
    }
}

/// The `X-Forwarded-*` fields the gateway sets on every forwarded request
/// besides `X-Forwarded-For`: the Host the client asked for, its scheme and
/// the port it connected to. What a client sent under these names is
/// replaced, never passed on (a client must not tell the app it came over
/// https), unless the peer is one of `identity.trusted_proxies`: a proxy in
/// front of the gateway knows them better, and each one it sent is kept.
pub(crate) const X_FORWARDED: [&str; 3] =
    ["x-forwarded-host", "x-forwarded-proto", "x-forwarded-port"];

/// Which of [`X_FORWARDED`] `name` is, if any (ASCII case-insensitive).
pub(crate) fn x_forwarded_index(name: &[u8]) -> Option<usize> {
    if name.len() < 16 || !name[..12].eq_ignore_ascii_case(b"x-forwarded-") {
        return None;
    }
    X_FORWARDED
        .iter()
        .position(|n| n.as_bytes().eq_ignore_ascii_case(name))
}

/// The values of [`X_FORWARDED`] for a request of `client` that asked for
/// `host` (its `Host` or `:authority`, if any): host, proto, port. The
/// caller leaves out those a trusted proxy sent itself.
pub(crate) fn x_forwarded_values<'a>(
    client: &Client,
    host: Option<&'a [u8]>,
    port: &'a mut itoa::Buffer,
) -> [Option<&'a [u8]>; 3] {
    let proto: &'static [u8] = if client.tls { b"https" } else { b"http" };
    let port = (client.port != 0).then(|| port.format(client.port).as_bytes());
    [host, Some(proto), port]
}

/// Appends this hop's RFC 7239 `Forwarded` element to `out`: `for` (the
/// peer; an IPv6 one quoted and bracketed), `host` (as asked, quoted) and
/// `proto`.
///
/// ```
/// # use ratewarden_gateway::proxy::forward::{Client, forwarded_element};
/// let c = Client { peer: "[2001:db8::1]:5000".parse().unwrap(), tls: true, port: 443, sni: None };
/// let mut out = vec![];
/// forwarded_element(&mut out, &c, Some(b"shop.example"));
/// assert_eq!(out, br#"for="[2001:db8::1]";host="shop.example";proto=https"#);
/// ```
pub fn forwarded_element(out: &mut Vec<u8>, client: &Client, host: Option<&[u8]>) {
    out.extend_from_slice(b"for=");
    match client.peer.ip() {
        std::net::IpAddr::V4(ip) => out.extend_from_slice(ip.to_string().as_bytes()),
        std::net::IpAddr::V6(ip) => {
            out.extend_from_slice(format!("\"[{ip}]\"").as_bytes());
        }
    }
    // A Host that passed the edge's check is a `host[:port]` of visible
    // characters; quoted (a port's `:` is not a token character), with
    // any `"` or `\` escaped all the same.
    if let Some(h) = host.filter(|h| !h.is_empty()) {
        out.extend_from_slice(b";host=\"");
        for &b in h {
            if b == b'"' || b == b'\\' {
                out.push(b'\\');
            }
            out.push(b);
        }
        out.push(b'"');
    }
    out.extend_from_slice(if client.tls {
        b";proto=https"
    } else {
        b";proto=http"
    });
}

/// Why the upstream gave no answer.
#[derive(Debug)]
pub enum UpstreamFailure {
    /// No response head within `upstream_timeout`.
    Timeout(std::time::Duration),
    /// Could not connect, or the exchange broke: `why` goes to the client,
    /// `error` (which may name internal addresses) only to the log.
    Broken {
        /// What the problem body says.
        why: std::borrow::Cow<'static, str>,
        /// What the log says.
        error: String,
    },
}

/// The answer when the upstream gave none: 504 or 502, logged at WARN with
/// the upstream and the reason.
pub(crate) fn upstream_failed(upstream: &str, failure: UpstreamFailure) -> http::Response<Body> {
    match failure {
        UpstreamFailure::Timeout(t) => {
            tracing::warn!(upstream, timeout = ?t, "upstream timed out: 504");
            problem_response(
                StatusCode::GATEWAY_TIMEOUT,
                &format!("the upstream did not answer within {t:?}"),
            )
        }
        UpstreamFailure::Broken { why, error } => {
            tracing::warn!(upstream, %error, "upstream failed ({why}): 502");
            problem_response(
                StatusCode::BAD_GATEWAY,
                &format!("the upstream could not be reached: {why}"),
            )
        }
    }
}

/// What a 502 says about a failed TLS handshake with the upstream: the
/// reason rustls gives (an untrusted or expired certificate, another
/// host's, a refused client certificate), which names no address.
pub(crate) fn tls_failure(e: &std::io::Error) -> std::borrow::Cow<'static, str> {
    let reason = match e.get_ref() {
        Some(inner) => inner.to_string(),
        None => e.to_string(),
    };
    format!("the TLS handshake failed: {reason}").into()
}

/// The TLS alert or error behind an exchange that broke, if TLS broke it:
/// with TLS 1.3 an upstream refuses a client certificate after the
/// handshake, and the refusal arrives with the first read.
pub(crate) fn tls_cause(
    e: &(dyn std::error::Error + 'static),
) -> Option<std::borrow::Cow<'static, str>> {
    let mut cur = Some(e);
    while let Some(err) = cur {
        if let Some(t) = err.downcast_ref::<rustls::Error>() {
            return Some(format!("the TLS handshake failed: {t}").into());
        }
        if let Some(io) = err.downcast_ref::<std::io::Error>()
            && let Some(inner) = io.get_ref()
            && let Some(t) = inner.downcast_ref::<rustls::Error>()
        {
            return Some(format!("the TLS handshake failed: {t}").into());
        }
        cur = err.source();
    }
    None
}

/// Whether an upstream answer's `Content-Length` is dropped before it goes
/// to the client: when it also has a `Transfer-Encoding`, which overrides
/// the length and must take it away (RFC 9112 §6.3).
pub(crate) fn drops_length(has_transfer_encoding: bool) -> bool {
    has_transfer_encoding
}

/// Removes the hop-by-hop headers and those `Connection` names. One pass
/// over the names present (a handful), then hashed removals of only those
/// found: this runs twice per proxied request, and upstreams commonly send
/// `Connection: keep-alive`.
pub(crate) fn strip_hop_by_hop(h: &mut HeaderMap) {
    let mut found: Vec<HeaderName> = h
        .keys()
        .filter(|k| is_hop_by_hop(k.as_str().as_bytes()))
        .cloned()
        .collect();
    if found.is_empty() {
        return;
    }
    if found.contains(&header::CONNECTION) {
        found.extend(
            h.get_all(header::CONNECTION)
                .iter()
                .filter_map(|v| v.to_str().ok())
                .flat_map(|v| v.split(','))
                .filter_map(|n| HeaderName::from_bytes(n.trim().as_bytes()).ok()),
        );
    }
    for n in found {
        h.remove(n);
    }
}

/// Points `req` at `server`: the target under its path prefix, and its
/// `Host`. A target that cannot be made a URI is answered with a 400 (the
/// `Err`).
pub(crate) fn aim<B>(
    req: &mut Request<B>,
    server: &crate::upstream::route::Server,
    target: &str,
    group: &crate::upstream::route::Group,
) -> Result<(), Box<Response<Body>>> {
    // (An HTTP/2 server's request is put in HTTP/2's form by its pool.)
    *req.version_mut() = http::Version::HTTP_11;
    *req.uri_mut() = match format!("{}{target}", server.prefix).parse::<Uri>() {
        Ok(u) => u,
        Err(_) => {
            return Err(Box::new(crate::answer::problem_response(
                StatusCode::BAD_REQUEST,
                "request target cannot be forwarded",
            )));
        }
    };
    // Under `preserve_host` the client's (set by `forwarding_fields`, an
    // HTTP/2 request's `:authority` too) stays.
    if !group.preserve_host {
        match server.pool.host() {
            Some(host) => req.headers_mut().insert(header::HOST, host.clone()),
            None => req.headers_mut().remove(header::HOST),
        };
    }
    // `request_headers` last: what it sets wins (Host included), what it
    // removes goes.
    let extra = &group.request_headers;
    for name in &extra.remove {
        req.headers_mut().remove(name);
    }
    for (name, value) in &extra.set {
        req.headers_mut().insert(name.clone(), value.clone());
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hosts_are_checked_as_rfc_9112_says() {
        for ok in [
            &b"example.com"[..],
            b"example.com:8080",
            b"127.0.0.1",
            b"[::1]:443",
            b"[2001:db8::1]",
            b"xn--bcher-kva.example",
            b"a_b.local:",
        ] {
            assert!(valid_host(ok), "{}", String::from_utf8_lossy(ok));
        }
        for bad in [
            &b""[..],
            b":80",
            b"a b",
            b"a/b",
            b"a@b",
            b"[::1",
            b"[zz]",
            b"host:port",
            b"host:123456",
            b"a:1:2",
        ] {
            assert!(!valid_host(bad), "{}", String::from_utf8_lossy(bad));
        }
        assert_eq!(check_host([].into_iter()), Err(Edge::NoHost));
        assert_eq!(
            check_host([&b"a"[..], b"a"].into_iter()),
            Err(Edge::TwoHosts)
        );
        assert_eq!(check_host([&b" a:1 "[..]].into_iter()), Ok(()));
    }

    #[test]
    fn the_rule_path_and_the_upstream_target() {
        let get = Method::GET;
        assert_eq!(rule_path(&get, "/a/../b?x=/..").unwrap(), "/b");
        assert_eq!(rule_path(&Method::OPTIONS, "*").unwrap(), "*");
        assert_eq!(rule_path(&get, "*"), Err(Edge::Asterisk));
        assert_eq!(
            rule_path(&get, "/%zz"),
            Err(Edge::Path(PathError::BadEscape))
        );
        let orig = UpstreamPath::Original;
        let norm = UpstreamPath::Normalized;
        assert_eq!(
            upstream_target("//a/./b?q=%2e", orig).unwrap(),
            "//a/./b?q=%2e"
        );
        assert_eq!(
            upstream_target("//a/./b?q=%2e", norm).unwrap(),
            "/a/b?q=%2e"
        );
        assert_eq!(upstream_target("*", norm).unwrap(), "*");
        assert_eq!(upstream_target("/%zz", orig).unwrap(), "/%zz");
    }

    #[test]
    fn one_authority_whatever_its_spelling() {
        assert!(same_authority(
            "API.example.com:80",
            b"api.example.com.",
            80
        ));
        assert!(same_authority(
            "api.example.com",
            b" api.example.com:80 ",
            80
        ));
        assert!(same_authority("[::1]", b"[::1]:443", 443));
        assert!(!same_authority("other.example", b"api.example.com", 80));
        assert!(!same_authority(
            "api.example.com:8080",
            b"api.example.com",
            80
        ));
        assert!(!same_authority("api.example.com:x", b"api.example.com", 80));
        assert!(!same_authority("[::1", b"[::1]", 80));
    }
}
