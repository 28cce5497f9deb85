//! Who may drive the admin API: its token, compared in constant time, and
//! the requests refused before any route (cross-site ones, a Host that is
//! none of `admin.hosts`).

use crate::answer::{Body, problem_response};
use http::header::{self, HeaderValue};
use http::{Method, Request, Response, StatusCode};
use hyper::body::Incoming;

/// `GET /v1/rules`: the rules loaded, with their parameters and the
/// fingerprint that names their state.
/// A request that would change something (not `GET`/`HEAD`) sent by a
/// browser on behalf of another site: refused (403). A browser sends the
/// admin token it was given for `/ui` (Basic) with any request to the
/// admin listener, and with no token any page can reach a loopback admin
/// API: a form on another site (or on the proxied site, another port of the
/// same host) could charge keys or clear bans. Browsers say where a request
/// comes from (`Sec-Fetch-Site`, `Origin`); clients that are not browsers
/// (curl, Prometheus, scripts) send neither and are not affected.
pub(super) fn cross_site(req: &Request<Incoming>) -> Option<Response<Body>> {
    if matches!(*req.method(), Method::GET | Method::HEAD) {
        return None;
    }
    let h = req.headers();
    let site_ok = match h.get("sec-fetch-site").map(HeaderValue::as_bytes) {
        None | Some(b"same-origin" | b"none") => true,
        Some(_) => false,
    };
    let origin_ok = match (h.get(header::ORIGIN), h.get(header::HOST)) {
        (None, _) => true,
        (Some(o), Some(host)) => {
            let (o, host) = (o.as_bytes(), host.as_bytes());
            [b"http://".as_slice(), b"https://"]
                .iter()
                .any(|scheme| o.strip_prefix(*scheme) == Some(host))
        }
        (Some(_), None) => false,
    };
    if site_ok && origin_ok {
        return None;
    }
    Some(problem_response(
        StatusCode::FORBIDDEN,
        "a browser request from another site to the admin API is refused",
    ))
}

/// Whether `given` is `secret`, in a time that depends on their lengths
/// only: every byte is compared, with no exit at the first that differs,
/// so the answer's timing says nothing of how much of a guess was right.
pub(super) fn same_secret(given: &[u8], secret: &[u8]) -> bool {
    given.len() == secret.len()
        && given
            .iter()
            .zip(secret)
            .fold(0u8, |diff, (a, b)| diff | (a ^ b))
            == 0
}

/// A request for a `Host` the admin listener is not reached by: 421. DNS
/// rebinding points a name the attacker owns at the listener's address,
/// and a browser then sends that name as `Host` and `Origin` alike (so the
/// cross-site check cannot tell): the names answered are `localhost`
/// (`*.localhost` too, which browsers resolve to loopback themselves) and
/// `admin.hosts`; any address is answered, since a rebinding needs a name.
/// A request without `Host` (HTTP/1.0, a script) is answered: browsers
/// always send one. HTTP/2's `:authority` is read where there is no
/// `Host`.
pub(super) fn misdirected(req: &Request<Incoming>, hosts: &[String]) -> Option<Response<Body>> {
    let raw = match req.headers().get(header::HOST) {
        Some(h) => h.to_str().unwrap_or("\u{fffd}"),
        None => req.uri().authority()?.as_str(),
    };
    let host = raw.trim();
    // The name without its port: `[v6]:port`, `name:port`.
    let name = match host.strip_prefix('[') {
        Some(rest) => rest.split_once(']').map_or(rest, |(a, _)| a),
        None => host.rsplit_once(':').map_or(host, |(h, _)| h),
    };
    let name = name.trim_end_matches('.').to_ascii_lowercase();
    let answered = name.parse::<std::net::IpAddr>().is_ok()
        || name == "localhost"
        || name.ends_with(".localhost")
        || hosts.contains(&name);
    if answered {
        return None;
    }
    // (DEBUG: a page can send these as fast as it likes.)
    tracing::debug!(
        host = %host.escape_debug(),
        "admin request for a host it is not reached by refused (421): add it to admin.hosts if it is yours"
    );
    Some(problem_response(
        StatusCode::MISDIRECTED_REQUEST,
        "the admin API answers only its own address, localhost and admin.hosts",
    ))
}
