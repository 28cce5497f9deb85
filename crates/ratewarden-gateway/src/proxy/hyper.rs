//! hyper's path: HTTP/2, HTTP/1.0 and whatever the HTTP/1.1 path hands over.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::{Duration, Instant};

use http::header::{self, HeaderMap, HeaderName, HeaderValue};
use http::{Request, Response, StatusCode, Uri};
use http_body_util::BodyExt;
use hyper::body::Incoming;
use ratewarden::Decision;

use crate::config::Upstream;
use crate::gateway::{Body, Gateway, Refusal, boxed, problem_response, respond};
use crate::proxy::forward::is_hop_by_hop;
use crate::upstream::{Pool, UpstreamError};

const X_FORWARDED_FOR: HeaderName = HeaderName::from_static("x-forwarded-for");

/// Removes the hop-by-hop headers and those `Connection` names. One pass
/// over the names present (a handful), then hashed removals of only those
/// found: this runs twice per proxied request, and upstreams commonly send
/// `Connection: keep-alive`.
fn strip_hop_by_hop(h: &mut HeaderMap) {
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

/// A request the limiter let through: its decision (`None` when no rule
impl Gateway {
    /// Handles one proxied request.
    pub async fn handle(&self, req: Request<Incoming>, peer: SocketAddr) -> Response<Body> {
        let live = self.live();
        let admitted = match self
            .admit(
                &live,
                req.method(),
                req.uri().path(),
                req.headers(),
                peer.ip(),
            )
            .await
        {
            Ok(a) => a,
            Err(Refusal::Limited(d)) => {
                return rejection(&d, live.config.status, live.config.headers);
            }
            Err(Refusal::Answer(answer)) => return answer,
        };
        let mut resp = match &live.config.upstream {
            Upstream::Echo => echo(&req, &admitted.identity),
            Upstream::Url(base) => {
                let pool = live.pool.as_ref().expect("a URL upstream has a pool");
                self.forward(req, base, pool, peer, live.config.upstream_timeout)
                    .await
            }
        };
        self.settle(&live, &admitted, resp.status().as_u16()).await;
        admitted.add_headers(resp.headers_mut(), live.config.headers);
        resp
    }

    /// Forwards an admitted request to the upstream and its answer back.
    async fn forward(
        &self,
        req: Request<Incoming>,
        base: &Uri,
        pool: &Arc<Pool>,
        peer: SocketAddr,
        timeout: Duration,
    ) -> Response<Body> {
        if base.scheme_str() == Some("https") {
            return problem_response(
                StatusCode::BAD_GATEWAY,
                "https upstreams are not supported by this build",
            );
        }
        let (mut parts, body) = req.into_parts();
        // Origin form (`/path?query`) on the upstream connection, under the
        // upstream's path prefix if it has one.
        let prefix = base.path().trim_end_matches('/');
        let target: Result<Uri, _> = match parts.uri.path_and_query() {
            Some(pq) if prefix.is_empty() => Ok(Uri::from(pq.clone())),
            pq => format!("{prefix}{}", pq.map_or("/", |p| p.as_str())).parse(),
        };
        parts.uri = match target {
            Ok(u) => u,
            Err(_) => {
                return problem_response(
                    StatusCode::BAD_REQUEST,
                    "request target cannot be forwarded",
                );
            }
        };
        parts.version = http::Version::HTTP_11;
        strip_hop_by_hop(&mut parts.headers);
        // X-Forwarded-For: one field, every incoming field's chain in order,
        // then the peer (as the HTTP/1.1 path writes it).
        let mut xff = Vec::new();
        for prev in parts.headers.get_all(X_FORWARDED_FOR) {
            xff.extend_from_slice(prev.as_bytes());
            xff.extend_from_slice(b", ");
        }
        xff.extend_from_slice(ratewarden_tower::identity::ip_text(peer.ip()).as_bytes());
        if let Ok(v) = HeaderValue::from_bytes(&xff) {
            parts.headers.insert(X_FORWARDED_FOR, v);
        }
        if let Some(host) = pool.host() {
            parts.headers.insert(header::HOST, host.clone());
        }
        let started = Instant::now();
        let res = pool.send(Request::from_parts(parts, body), timeout).await;
        self.metrics.upstream_time(started.elapsed());
        match res {
            Ok(resp) => {
                let (mut parts, body) = resp.into_parts();
                strip_hop_by_hop(&mut parts.headers);
                Response::from_parts(parts, body.map_err(|e| Box::new(e) as _).boxed_unsync())
            }
            Err(UpstreamError::Timeout(_)) => problem_response(
                StatusCode::GATEWAY_TIMEOUT,
                &format!("the upstream did not answer within {timeout:?}"),
            ),
            Err(e) => {
                tracing::warn!(error = %e, "upstream failed");
                problem_response(StatusCode::BAD_GATEWAY, "the upstream could not be reached")
            }
        }
    }
}

/// The response to a rejected request.
pub fn rejection(
    d: &Decision,
    status: StatusCode,
    style: ratewarden::HeaderStyle,
) -> Response<Body> {
    ratewarden_tower::rejection_response(d, status, style).map(boxed)
}

/// The built-in upstream: says what it received.
fn echo<B>(req: &Request<B>, identity: &str) -> Response<Body> {
    let text = format!(
        "ratewarden echo: {} {} from {identity}\n",
        req.method(),
        req.uri()
    );
    respond(StatusCode::OK, "text/plain; charset=utf-8", text)
}
