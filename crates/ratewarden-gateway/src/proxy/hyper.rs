//! hyper's path: HTTP/2, HTTP/1.0 and whatever the HTTP/1.1 path hands
//! over. hyper parses; the edge checks, the path rules see, the target and
//! fields sent upstream and the failure answers are [`super::forward`]'s,
//! as on the HTTP/1.1 path.

use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicU8, Ordering};
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use bytes::Bytes;
use http::header::{self, HeaderMap, HeaderName, HeaderValue};
use http::request::Parts;
use http::{Method, Request, Response, StatusCode, Uri, Version};
use http_body::{Frame, SizeHint};
use http_body_util::BodyExt;
use hyper::body::Incoming;

use crate::answer::{Body, respond};
use crate::config::Upstream;
use crate::gateway::{Gateway, add_rate_headers, refusal_answer};
use crate::proxy::forward::{
    self, Edge, UpstreamFailure, check_host, drops_length, is_hop_by_hop, push_forwarded_for,
    tls_cause, tls_failure, upstream_failed,
};
use crate::upstream::{BODY_BROKE, BODY_STALLED, ClientBody, Pool, UpstreamError};
use ratewarden_tower::admission::{Facts, Held, Identity};

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

/// Removes the request fields whose names contain `_` (see
/// [`forward::dropped_request_field`]).
fn strip_underscores(h: &mut HeaderMap) {
    let found: Vec<HeaderName> = h
        .keys()
        .filter(|k| k.as_str().contains('_'))
        .cloned()
        .collect();
    for n in found {
        h.remove(n);
    }
}

/// What the edge refuses of a request hyper parsed: `CONNECT`, a missing,
/// repeated or invalid `Host` on HTTP/1.1 (a repeated or invalid one on
/// HTTP/1.0), and an HTTP/2 `:authority` that disagrees with `Host`.
pub(crate) fn edge_check(parts: &Parts) -> Result<(), Edge> {
    if parts.method == Method::CONNECT {
        return Err(Edge::Connect);
    }
    let hosts = || {
        parts
            .headers
            .get_all(header::HOST)
            .iter()
            .map(HeaderValue::as_bytes)
    };
    match parts.version {
        Version::HTTP_11 => check_host(hosts()),
        Version::HTTP_2 | Version::HTTP_3 => {
            let mut all = hosts();
            match (parts.uri.authority(), all.next(), all.next()) {
                (_, Some(_), Some(_)) => Err(Edge::TwoHosts),
                (Some(a), Some(h), None)
                    if !a.as_str().as_bytes().eq_ignore_ascii_case(h.trim_ascii()) =>
                {
                    Err(Edge::AuthorityMismatch)
                }
                _ => Ok(()),
            }
        }
        _ => match hosts().count() {
            0 => Ok(()),
            _ => check_host(hosts()),
        },
    }
}

impl Gateway {
    /// Handles one request on hyper's path.
    pub async fn handle(&self, req: Request<Incoming>, peer: SocketAddr) -> Response<Body> {
        let live = self.live();
        let (mut parts, body) = req.into_parts();
        if let Err(e) = edge_check(&parts) {
            return e.answer();
        }
        if !live.config.underscores_in_headers {
            strip_underscores(&mut parts.headers);
        }
        let target = parts.uri.path_and_query().map_or("/", |p| p.as_str());
        let path = match forward::rule_path(&parts.method, target) {
            Ok(p) => p.into_owned(),
            Err(e) => return e.answer(),
        };
        let facts = Facts {
            method: &parts.method,
            path: &path,
            headers: &parts.headers,
            peer: Some(peer.ip()),
            identity: Identity::Resolve,
        };
        let mut admitted = match self.admit(&live, &facts).await {
            Ok(a) => a,
            Err(refusal) => return refusal_answer(&refusal, &live.config),
        };
        // Leases are held until the answer's body is dropped (sent whole,
        // or the client gone).
        let held = Held::take(&mut admitted, &live.limiter);
        let mut resp = match &live.config.upstream {
            Upstream::Echo => echo(&parts, &admitted.who().identity),
            Upstream::Url(base) => {
                let pool = live.pool.as_ref().expect("a URL upstream has a pool");
                let (body, fault) = ClientBody::new(body, live.config.client_body_timeout);
                let to = Upstreamed {
                    base,
                    pool,
                    peer,
                    timeout: live.config.upstream_timeout,
                    how: live.config.upstream_path,
                };
                self.forward(Request::from_parts(parts, body), &to, &fault)
                    .await
            }
        };
        self.settle(&live, &admitted, resp.status().as_u16()).await;
        add_rate_headers(
            admitted.decision.as_ref(),
            resp.headers_mut(),
            live.config.headers,
        );
        if let Some(held) = held {
            resp = resp.map(|body| body.with_held(held));
        }
        resp
    }

    /// Forwards an admitted request to the upstream and its answer back.
    async fn forward(
        &self,
        req: Request<ClientBody>,
        to: &Upstreamed<'_>,
        fault: &AtomicU8,
    ) -> Response<Body> {
        let (mut parts, body) = req.into_parts();
        // Origin form (`/path?query`) on the upstream connection, under the
        // upstream's path prefix if it has one.
        let prefix = to.base.path().trim_end_matches('/');
        let sent = parts.uri.path_and_query().map_or("/", |p| p.as_str());
        let target = match forward::upstream_target(sent, to.how) {
            Ok(t) if prefix.is_empty() => t.parse::<Uri>(),
            Ok(t) => format!("{prefix}{t}").parse(),
            Err(e) => return e.answer(),
        };
        parts.uri = match target {
            Ok(u) => u,
            Err(_) => {
                return crate::answer::problem_response(
                    StatusCode::BAD_REQUEST,
                    "request target cannot be forwarded",
                );
            }
        };
        parts.version = Version::HTTP_11;
        strip_hop_by_hop(&mut parts.headers);
        let mut xff = Vec::new();
        push_forwarded_for(
            &mut xff,
            parts
                .headers
                .get_all(X_FORWARDED_FOR)
                .iter()
                .map(HeaderValue::as_bytes),
            to.peer.ip(),
        );
        if let Ok(v) = HeaderValue::from_bytes(&xff) {
            parts.headers.insert(X_FORWARDED_FOR, v);
        }
        if let Some(host) = to.pool.host() {
            parts.headers.insert(header::HOST, host.clone());
        }
        let started = Instant::now();
        let res = to
            .pool
            .send(Request::from_parts(parts, body), to.timeout)
            .await;
        self.metrics.upstream_time(started.elapsed());
        match (res, fault.load(Ordering::Relaxed)) {
            (Ok(resp), _) => {
                let (mut parts, body) = resp.into_parts();
                if drops_length(parts.headers.contains_key(header::TRANSFER_ENCODING)) {
                    parts.headers.remove(header::CONTENT_LENGTH);
                }
                strip_hop_by_hop(&mut parts.headers);
                Response::from_parts(parts, body.map_err(|e| Box::new(e) as _).boxed_unsync())
            }
            (Err(_), BODY_BROKE) => Edge::BadBody.answer(),
            (Err(_), BODY_STALLED) => Edge::BodyTimeout.answer(),
            (Err(UpstreamError::Timeout(t)), _) => {
                upstream_failed(to.pool.addr(), UpstreamFailure::Timeout(t))
            }
            (Err(e), _) => {
                let why = match &e {
                    UpstreamError::Connect { .. } => "could not connect".into(),
                    UpstreamError::Tls { source, .. } => tls_failure(source),
                    other => tls_cause(other)
                        .unwrap_or_else(|| "the exchange broke before an answer".into()),
                };
                let error = e.to_string();
                upstream_failed(to.pool.addr(), UpstreamFailure::Broken { why, error })
            }
        }
    }
}

/// Where and how an admitted request goes upstream.
struct Upstreamed<'a> {
    base: &'a Uri,
    pool: &'a Arc<Pool>,
    peer: SocketAddr,
    timeout: Duration,
    how: crate::config::UpstreamPath,
}

/// A response body holding a request's `concurrency` leases until its
/// last frame is handed on (before the client can have it), or it is
/// dropped.
struct Guarded {
    inner: Body,
    held: Option<Held>,
}

impl http_body::Body for Guarded {
    type Data = Bytes;
    type Error = Box<dyn std::error::Error + Send + Sync>;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, Self::Error>>> {
        let this = &mut *self;
        let polled = Pin::new(&mut this.inner).poll_frame(cx);
        if matches!(polled, Poll::Ready(None)) || this.inner.is_end_stream() {
            // The end: dropping the guard gives the leases back.
            this.held = None;
        }
        polled
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.inner.size_hint()
    }
}

/// A body that holds `held` until it is dropped.
trait WithHeld {
    fn with_held(self, held: Held) -> Body;
}

impl WithHeld for Body {
    fn with_held(self, held: Held) -> Body {
        if http_body::Body::is_end_stream(&self) {
            // Nothing to send (never polled): the request has ended.
            return self;
        }
        Guarded {
            inner: self,
            held: Some(held),
        }
        .boxed_unsync()
    }
}

/// The built-in upstream: says what it received.
fn echo(req: &Parts, identity: &str) -> Response<Body> {
    let text = format!(
        "ratewarden echo: {} {} from {identity}\n",
        req.method, req.uri
    );
    respond(StatusCode::OK, "text/plain; charset=utf-8", text)
}
