//! # ratewarden-tower
//!
//! Rate limiting as a [tower] layer, for axum, tonic and hyper services: the
//! Rust answer to DRF throttles and Spring `@LimitRequestPerTime` aspects.
//!
//! ```no_run
//! use std::time::Duration;
//! use ratewarden::{MemoryStore, Rule, algorithm::Kind};
//! use ratewarden_tower::{RateLimitLayer, key::Header};
//!
//! let rule = Rule::builder("api")
//!     .algorithm(Kind::Gcra)
//!     .limit(100, Duration::from_secs(60))
//!     .build()
//!     .unwrap();
//! let layer = RateLimitLayer::builder(MemoryStore::default(), [rule], Header::new("x-api-key")).build();
//! // axum: Router::new().route("/api", get(handler)).route_layer(layer)
//! ```
//!
//! The layer decides in `call` (a keyed decision needs the request), over any
//! [`Store`]: one key per request, every rule of the layer applied at once,
//! all-or-nothing. Rejections are the gateway's, byte for byte: status 429,
//! `Retry-After`, the configured rate-limit headers and the RFC 9457 problem
//! body, all rendered by `ratewarden::Decision`. Admitted responses carry the
//! headers too. Rules with `count: failures` are settled from the response:
//! a failure is charged, a success clears the key's history.
//!
//! [tower]: https://docs.rs/tower

pub mod admission;
pub mod consumers;
pub mod identity;
pub mod key;
pub mod overrides;
pub mod path;
pub mod policy;
pub mod problem;
pub mod settle;
pub mod view;

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use bytes::Bytes;
use http::{HeaderMap, HeaderName, HeaderValue, Request, Response, StatusCode, header};
use http_body::{Frame, SizeHint};
use http_body_util::{Either, Full};
use ratewarden::{Decision, HeaderField, HeaderStyle, Limiter, Mode, Rule, Store};

use admission::{Facts, Held, Identity, Refusal};
pub use key::KeyExtractor;
pub use policy::Missing;
use policy::Policy;
use problem::problem;

/// The response body: the inner service's (holding the request's
/// `concurrency` leases until it is dropped), or the layer's own problem
/// body.
pub type Body<B> = Either<Guarded<B>, Full<Bytes>>;

/// An inner service's response body, holding the request's `concurrency`
/// leases (if any) until it ends or is dropped: given back as its last
/// frame is handed on (before the client can have it, so a client that
/// sends its next request at once finds its slot free), or when it is
/// abandoned.
pub struct Guarded<B> {
    inner: B,
    held: Option<Held>,
    /// Run once when the body has ended or is dropped: the settling of
    /// the rules charged by what the answer cost.
    ended: Option<Box<dyn FnOnce() + Send + Sync>>,
}

impl<B: std::fmt::Debug> std::fmt::Debug for Guarded<B> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Guarded")
            .field("inner", &self.inner)
            .field("held", &self.held)
            .field("settles", &self.ended.is_some())
            .finish()
    }
}

impl<B> Guarded<B> {
    /// `inner`, holding `held` until its last frame is handed on or it is
    /// dropped (the gateway's hyper path uses it too).
    pub fn new(inner: B, held: Option<Held>) -> Self {
        Self {
            inner,
            held,
            ended: None,
        }
    }

    /// Calls `f` once when the body has ended or is dropped.
    fn then(mut self, f: impl FnOnce() + Send + Sync + 'static) -> Self {
        self.ended = Some(Box::new(f));
        self
    }

    fn end(&mut self) {
        self.held = None;
        if let Some(f) = self.ended.take() {
            f();
        }
    }
}

impl<B> Drop for Guarded<B> {
    fn drop(&mut self) {
        self.end();
    }
}

/// What an answer cost, in the units of the layer's rules charged by their
/// answers ([`RateLimitLayerBuilder::charged_by_answer`]): the service puts
/// one in its response's extensions, set before the response or later
/// (a stream that knows its cost at its end keeps a clone and sets it
/// then). The layer replaces the request's reservation by it when the
/// response body has ended: the difference is charged, or given back. A
/// cost never set leaves the reservation charged.
///
/// ```
/// let cost = ratewarden_tower::Cost::new();
/// let kept = cost.clone();
/// kept.set(1200);
/// assert_eq!(cost.get(), Some(1200));
/// assert_eq!(ratewarden_tower::Cost::new().get(), None);
/// ```
#[derive(Debug, Clone)]
pub struct Cost(Arc<std::sync::atomic::AtomicU64>);

impl Default for Cost {
    fn default() -> Self {
        Self::new()
    }
}

impl Cost {
    /// Not yet known.
    pub fn new() -> Self {
        Self(Arc::new(std::sync::atomic::AtomicU64::new(u64::MAX)))
    }

    /// Known now: `units`.
    pub fn known(units: u64) -> Self {
        let c = Self::new();
        c.set(units);
        c
    }

    /// The answer cost `units`.
    pub fn set(&self, units: u64) {
        self.0.store(
            units.min(u64::MAX - 1),
            std::sync::atomic::Ordering::Release,
        );
    }

    /// What it was set to, if it was.
    pub fn get(&self) -> Option<u64> {
        let v = self.0.load(std::sync::atomic::Ordering::Acquire);
        (v != u64::MAX).then_some(v)
    }
}

/// What a request is estimated to cost the layer's rules charged by their
/// answers, reserved at admission: put in the request's extensions (by a
/// layer in front, or the caller). Without one, each rule reserves what
/// [`RateLimitLayerBuilder::charged_by_answer`] said.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Reserve(pub u64);

impl<B: http_body::Body + Unpin> http_body::Body for Guarded<B> {
    type Data = B::Data;
    type Error = B::Error;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<B::Data>, B::Error>>> {
        let this = &mut *self;
        let polled = Pin::new(&mut this.inner).poll_frame(cx);
        if matches!(polled, Poll::Ready(None)) || this.inner.is_end_stream() {
            // The end: the leases go back, what the answer cost is settled.
            this.end();
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

/// Decides whether a response counts as a failure for `count: failures`
/// rules: `Some(true)` charges it, `Some(false)` is a success (clears the
/// history with `reset_on_success`), `None` leaves the key alone.
pub type Classifier = Arc<dyn Fn(StatusCode) -> Option<bool> + Send + Sync>;

/// The spec's `failure_status` default: 400–499 except 429 are failures,
/// every other status is a success.
pub fn default_classifier(status: StatusCode) -> Option<bool> {
    Some(status.is_client_error() && status != StatusCode::TOO_MANY_REQUESTS)
}

/// What to do with a request the key extractor finds no key in: the one
/// [`Missing`] policy the gateway uses too (`Skip` by default here).
pub type MissingKey = Missing;

struct Shared<S, K> {
    /// Shared with the guards that release `concurrency` leases.
    limiter: Arc<Limiter<S>>,
    policy: Policy,
    key: K,
    headers: HeaderStyle,
    status: StatusCode,
    /// `None`: each rule's `failure_status` (the spec's default).
    classify: Option<Classifier>,
}

/// Builds a [`RateLimitLayer`].
pub struct RateLimitLayerBuilder<S, K> {
    shared: Shared<S, K>,
}

impl<S, K> std::fmt::Debug for RateLimitLayerBuilder<S, K> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RateLimitLayerBuilder")
            .finish_non_exhaustive()
    }
}

impl<S, K> RateLimitLayerBuilder<S, K> {
    /// Which rate-limit headers to send (default: legacy and IETF).
    pub fn headers(mut self, style: HeaderStyle) -> Self {
        self.shared.headers = style;
        self
    }
    /// The status of a rejection (default 429).
    pub fn status(mut self, status: StatusCode) -> Self {
        self.shared.status = status;
        self
    }
    /// How responses settle `count: failures` rules (default
    /// [`default_classifier`], the spec's `failure_status`).
    pub fn classify(
        mut self,
        f: impl Fn(StatusCode) -> Option<bool> + Send + Sync + 'static,
    ) -> Self {
        self.shared.classify = Some(Arc::new(f));
        self
    }
    /// Charges rule `rule` by what each answer cost ([`Cost`]) rather
    /// than per request: `reserve` units are reserved at admission (or the
    /// request's [`Reserve`]) and corrected when the response body ends.
    /// A name that is none of the layer's rules changes nothing.
    pub fn charged_by_answer(mut self, rule: &str, reserve: u64) -> Self {
        if let Some(r) = self
            .shared
            .policy
            .rules
            .iter_mut()
            .find(|r| r.rule.name() == rule)
        {
            r.by_answer = Some(policy::ByAnswer {
                reserve: reserve.max(1),
            });
        }
        self
    }
    /// What to do when the extractor finds no key (default [`Missing::Skip`]).
    pub fn on_missing_key(mut self, missing: Missing) -> Self {
        self.shared.policy.identity = policy::IdentitySource::Given { missing };
        self
    }
    /// The layer.
    pub fn build(self) -> RateLimitLayer<S, K> {
        RateLimitLayer {
            shared: Arc::new(self.shared),
        }
    }
}

/// A tower layer that rate-limits requests. Cheap to clone.
pub struct RateLimitLayer<S, K> {
    shared: Arc<Shared<S, K>>,
}

impl<S, K> std::fmt::Debug for RateLimitLayer<S, K> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RateLimitLayer").finish_non_exhaustive()
    }
}

impl<S, K> Clone for RateLimitLayer<S, K> {
    fn clone(&self) -> Self {
        Self {
            shared: self.shared.clone(),
        }
    }
}

impl<S: Store, K: KeyExtractor> RateLimitLayer<S, K> {
    /// `rules` over `store`, keyed by `key`. Every rule applies to every
    /// request the layer sees; name them per route (`"coupon"`,
    /// `"interview-questions"`) as Spring's annotation `prefix` does.
    pub fn builder(
        store: S,
        rules: impl IntoIterator<Item = Rule>,
        key: K,
    ) -> RateLimitLayerBuilder<S, K> {
        RateLimitLayerBuilder {
            shared: Shared {
                limiter: Arc::new(Limiter::new(store)),
                policy: Policy::given(rules, Missing::Skip),
                key,
                headers: HeaderStyle::default(),
                status: StatusCode::TOO_MANY_REQUESTS,
                classify: None,
            },
        }
    }
}

impl<S, K, I> tower_layer::Layer<I> for RateLimitLayer<S, K> {
    type Service = RateLimit<S, K, I>;
    fn layer(&self, inner: I) -> Self::Service {
        RateLimit {
            shared: self.shared.clone(),
            inner,
        }
    }
}

/// The service [`RateLimitLayer`] wraps around `inner`.
pub struct RateLimit<S, K, I> {
    shared: Arc<Shared<S, K>>,
    inner: I,
}

impl<S, K, I> std::fmt::Debug for RateLimit<S, K, I> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RateLimit").finish_non_exhaustive()
    }
}

impl<S, K, I: Clone> Clone for RateLimit<S, K, I> {
    fn clone(&self) -> Self {
        Self {
            shared: self.shared.clone(),
            inner: self.inner.clone(),
        }
    }
}

type BoxedResponse<B, E> = Pin<Box<dyn Future<Output = Result<Response<Body<B>>, E>> + Send>>;

/// The response future of [`RateLimit`]: decide, maybe wait (leaky bucket
/// delay mode), call the inner service, settle `count: failures` rules.
pub struct ResponseFuture<B, E> {
    fut: BoxedResponse<B, E>,
}

impl<B, E> std::fmt::Debug for ResponseFuture<B, E> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ResponseFuture").finish_non_exhaustive()
    }
}

impl<B, E> Future for ResponseFuture<B, E> {
    type Output = Result<Response<Body<B>>, E>;
    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        self.fut.as_mut().poll(cx)
    }
}

const X_RATELIMIT_LIMIT: HeaderName = HeaderName::from_static("x-ratelimit-limit");
const X_RATELIMIT_REMAINING: HeaderName = HeaderName::from_static("x-ratelimit-remaining");
const X_RATELIMIT_RESET: HeaderName = HeaderName::from_static("x-ratelimit-reset");
const X_RATELIMIT_RETRY_AFTER: HeaderName = HeaderName::from_static("x-ratelimit-retry-after");
const RATELIMIT_POLICY: HeaderName = HeaderName::from_static("ratelimit-policy");
const RATELIMIT: HeaderName = HeaderName::from_static("ratelimit");

/// The names [`Decision::headers`] renders, as constants: a name given as a
/// `&str` would be parsed and copied into a new buffer on every response.
fn header_name(name: &'static str) -> Option<HeaderName> {
    Some(match name {
        "retry-after" => header::RETRY_AFTER,
        "x-ratelimit-limit" => X_RATELIMIT_LIMIT,
        "x-ratelimit-remaining" => X_RATELIMIT_REMAINING,
        "x-ratelimit-reset" => X_RATELIMIT_RESET,
        "x-ratelimit-retry-after" => X_RATELIMIT_RETRY_AFTER,
        "ratelimit-policy" => RATELIMIT_POLICY,
        "ratelimit" => RATELIMIT,
        other => return HeaderName::from_bytes(other.as_bytes()).ok(),
    })
}

/// Sets the headers a decision renders ([`Decision::header_fields`]) on
/// `headers`, replacing any of the same name. Numbers below 1024 (most
/// `Retry-After`s, small limits and counts) are ready-made values, shared
/// and never allocated; structured fields move into the map uncopied.
///
/// ```
/// use ratewarden::HeaderField::{Number, Text};
/// use ratewarden_tower::insert_headers;
/// let mut h = http::HeaderMap::new();
/// insert_headers(&mut h, vec![
///     ("x-ratelimit-limit", Number(20)),
///     ("retry-after", Number(86_400)),
///     ("ratelimit", Text("\"api\";r=0;t=3".to_owned())),
/// ]);
/// assert_eq!(h["x-ratelimit-limit"], "20");
/// assert_eq!(h["retry-after"], "86400");
/// assert_eq!(h["ratelimit"], "\"api\";r=0;t=3");
/// ```
pub fn insert_headers(headers: &mut HeaderMap, fields: Vec<(&'static str, HeaderField)>) {
    for (name, field) in fields {
        let Some(name) = header_name(name) else {
            continue;
        };
        let value = match field {
            HeaderField::Number(n) => number_value(n),
            HeaderField::Text(t) => match HeaderValue::try_from(t) {
                Ok(v) => v,
                Err(_) => continue,
            },
        };
        headers.insert(name, value);
    }
}

/// How many small numbers have a ready-made header value.
const READY_NUMBERS: usize = 1024;

/// `n` as a header value: one of the ready-made values below
/// [`READY_NUMBERS`], else formatted. The ready-made ones are slices of one
/// string built on first use and kept for the life of the process (about
/// 3 KiB): cloning and dropping them touches no allocator and no shared
/// counter, which matters on a path every limited response takes.
fn number_value(n: u64) -> HeaderValue {
    static READY: std::sync::LazyLock<Vec<HeaderValue>> = std::sync::LazyLock::new(|| {
        let mut text = String::new();
        let mut ends = Vec::with_capacity(READY_NUMBERS);
        for i in 0..READY_NUMBERS {
            text.push_str(&i.to_string());
            ends.push(text.len());
        }
        let text: &'static str = Box::leak(text.into_boxed_str());
        let mut start = 0;
        ends.into_iter()
            .map(|end| {
                let v = HeaderValue::from_static(&text[start..end]);
                start = end;
                v
            })
            .collect()
    });
    match usize::try_from(n).ok().and_then(|i| READY.get(i)) {
        Some(v) => v.clone(),
        None => HeaderValue::from(n),
    }
}

fn problem_response<B>(status: StatusCode, body: String) -> Response<Body<B>> {
    problem_full(status, body).map(Either::Right)
}

fn problem_full(status: StatusCode, body: String) -> Response<Full<Bytes>> {
    let mut resp = Response::new(Full::new(Bytes::from(body)));
    *resp.status_mut() = status;
    resp.headers_mut().insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("application/problem+json"),
    );
    resp
}

/// The response for a rejected decision: status, headers, problem body.
pub fn rejection<B>(
    decision: &Decision,
    status: StatusCode,
    style: HeaderStyle,
) -> Response<Body<B>> {
    rejection_response(decision, status, style).map(Either::Right)
}

/// [`rejection`] with its body as it is, for servers with a body type of
/// their own (the gateway boxes it).
pub fn rejection_response(
    decision: &Decision,
    status: StatusCode,
    style: HeaderStyle,
) -> Response<Full<Bytes>> {
    let status = admission::Refusal::limited_status(decision, status);
    let body = problem::rejection(decision, status.as_u16());
    let mut resp = problem_full(status, body);
    // Room for the seven rate-limit headers: no regrowth.
    resp.headers_mut().reserve(7);
    insert_headers(resp.headers_mut(), decision.header_fields(style));
    resp
}

/// The peer's address, as a server put it in the request's extensions.
fn peer_ip(parts: &http::request::Parts) -> Option<std::net::IpAddr> {
    parts
        .extensions
        .get::<key::PeerAddr>()
        .map(|p| p.0.ip())
        .or_else(|| {
            parts
                .extensions
                .get::<std::net::SocketAddr>()
                .map(|a| a.ip())
        })
}

impl<S, K, I, ReqB, ResB> tower_service::Service<Request<ReqB>> for RateLimit<S, K, I>
where
    S: Store,
    K: KeyExtractor,
    I: tower_service::Service<Request<ReqB>, Response = Response<ResB>> + Clone + Send + 'static,
    I::Future: Send,
    ReqB: Send + 'static,
    ResB: Send + 'static,
{
    type Response = Response<Body<ResB>>;
    type Error = I::Error;
    type Future = ResponseFuture<ResB, I::Error>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, req: Request<ReqB>) -> Self::Future {
        let shared = self.shared.clone();
        // The clone that was driven to readiness is the one to call.
        let clone = self.inner.clone();
        let mut inner = std::mem::replace(&mut self.inner, clone);
        let fut = async move {
            let (parts, body) = req.into_parts();
            let given = shared.key.extract(&parts);
            // Rules see the normalised path, as the gateway's do.
            let path = match path::normalize(parts.uri.path()) {
                Ok(p) => p.into_owned(),
                Err(e) => {
                    let body = problem(400, Some(&e.to_string()));
                    return Ok(problem_response(StatusCode::BAD_REQUEST, body));
                }
            };
            let reserve = parts.extensions.get::<Reserve>().map(|r| r.0);
            let reserve_of = move |_: &policy::PolicyRule| reserve;
            let facts = Facts {
                request: view::RequestView {
                    method: &parts.method,
                    path: &path,
                    target: parts.uri.path_and_query().map_or("/", |p| p.as_str()),
                    authority: parts.uri.authority().map(|a| a.as_str()),
                    fields: view::Fields::Map(&parts.headers),
                    peer: peer_ip(&parts),
                    sni: None,
                    claims: None,
                    body: None,
                    consumer: None,
                },
                route: None,
                identity: Identity::Given(given.as_deref()),
                reserve: Some(&reserve_of),
            };
            let mut admitted = match shared
                .policy
                .admit(&shared.limiter, &facts, 1, Mode::Apply)
                .await
            {
                Ok(a) => a,
                Err(Refusal::Limited(d)) => {
                    return Ok(rejection(&d, shared.status, shared.headers));
                }
                // Denied, no key under `Reject`, or the store down under
                // `on_error: deny`: say why, never a bare 500.
                Err(refusal) => {
                    let status = refusal.status(shared.status);
                    return Ok(problem_response(status, refusal.problem(shared.status)));
                }
            };
            let decision = admitted.decision.take();
            if let Some(d) = &decision
                && !d.delay.is_zero()
            {
                tokio::time::sleep(d.delay).await;
            }
            // Leases are held from here: given back when the response body
            // is dropped, or this future (the client went away).
            let held = admitted.hold(&shared.limiter);
            let req = Request::from_parts(parts, body);
            let resp = inner.call(req).await?;
            // A settle that fails (store down) loses one count; the
            // response the handler produced still goes out.
            let _ = admitted
                .settle(&shared.limiter, resp.status(), shared.classify.as_deref())
                .await;
            // Rules charged by the answer: settled when its body has ended,
            // by the cost the service put in the response (if it did).
            let charged = admitted
                .settlement(&shared.limiter)
                .filter(|s| s.owed().iter().any(|o| o.reserved.is_some()));
            let cost = resp.extensions().get::<Cost>().cloned();
            let mut resp = resp.map(|b| {
                let guarded = Guarded::new(b, held);
                Either::Left(match charged {
                    Some(s) => guarded.then(move || {
                        let cost = match cost.and_then(|c| c.get()) {
                            Some(n) => admission::AnswerCost::Known(n),
                            None => admission::AnswerCost::Unknown,
                        };
                        if let Ok(rt) = tokio::runtime::Handle::try_current() {
                            rt.spawn(async move {
                                let _ = s.settle_with(|o| o.on_cost(cost)).await;
                            });
                        }
                    }),
                    None => guarded,
                })
            });
            if let Some(d) = &decision {
                insert_headers(resp.headers_mut(), d.header_fields(shared.headers));
            }
            Ok(resp)
        };
        ResponseFuture { fut: Box::pin(fut) }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn numbers_render_the_same_on_both_sides_of_the_ready_made_range() {
        for n in [
            0,
            1,
            9,
            10,
            99,
            100,
            1022,
            1023,
            1024,
            1025,
            86_400,
            u64::MAX,
        ] {
            assert_eq!(number_value(n).to_str().unwrap(), n.to_string(), "{n}");
        }
        assert_eq!(
            (0..READY_NUMBERS as u64)
                .filter(|&n| number_value(n).to_str().unwrap() != n.to_string())
                .count(),
            0
        );
    }
}
