//! The request flow: the phases every proxied request goes through,
//! written once, whatever wire it came on. The HTTP/1.1 path
//! (`proxy::h1`), hyper's path (`proxy::hyper`, HTTP/2, HTTP/1.0 and what
//! the first hands over) and the WebSocket tunnel (`proxy::tunnel`) are
//! adapters: they read a request, feed it through these phases, and write
//! what the phases decide in their own framing.
//!
//! 1. the request id: [`Flow::start`]
//! 2. the path a rule sees: [`Flow::rule_path`]
//! 3. the route: [`Flow::route`]
//! 4. the request view: built by the wire ([`RequestView`]: the bytes it
//!    read, or hyper's parts), the one view every fact is read through
//! 5. admit: [`Flow::decide`], through the one admission path
//! 6. the refusal: [`Decided::Refused`], answered by [`refusal_answer`]
//!    (the HTTP/1.1 path writes the same bytes from its cache)
//! 7. upstream attempts with failover: the wire's exchange, choosing
//!    servers through [`crate::proxy::failover::Failover`]
//! 8. settle, the rate headers, release: [`Flow::settle`], then the wire
//!    writes [`Admitted::decision`]'s fields; the leases in [`Held`] go
//!    back when the answer ends
//! 9. the access log and the route's answer counts: [`Flow::finish`]

use std::borrow::Cow;
use std::net::IpAddr;

use http::Response;
use http::header::HeaderMap;
use ratewarden::{Decision, HeaderStyle, Rule};
use ratewarden_tower::admission::{Admitted, Facts, Held, Identity, Refusal};
use ratewarden_tower::insert_headers;
use ratewarden_tower::view::RequestView;

use crate::answer::{Body, problem_body};
use crate::config::Config;
use crate::gateway::{Gateway, Live};
use crate::observe::metrics::RouteCounts;
use crate::observe::request_id::RequestId;
use crate::proxy::forward::{self, Edge};
use crate::upstream::route::Group;

/// One request's passage: what the phases learnt, for the ones after.
pub(crate) struct Flow<'l> {
    gw: &'l Gateway,
    /// The configuration the request is decided under (one for all its
    /// phases, a reload meanwhile notwithstanding).
    pub(crate) live: &'l Live,
    /// Its id: the client's when valid, else a new one.
    pub(crate) rid: RequestId,
    arrival: quanta::Instant,
    /// What the access log and the metrics say of the answer.
    pub(crate) note: Note,
    counted: Counted<'l>,
}

/// Whose answer counts the request's answer.
#[derive(Clone, Copy)]
enum Counted<'l> {
    /// No route was chosen (refused before, or at the edge).
    None,
    /// The route's.
    Route(&'l RouteCounts),
    /// No route took it: the echo upstream's, under the default route.
    Echo,
}

/// What the access log says of an answer, gathered as it is made.
#[derive(Default)]
pub(crate) struct Note {
    /// The status sent.
    pub(crate) status: u16,
    /// Body bytes sent, when known.
    pub(crate) bytes: Option<u64>,
    /// The upstream answered (else the gateway did).
    pub(crate) from_upstream: bool,
    /// The client's identity, when a rule limits it.
    identity: Option<String>,
    /// The refusing rule's key.
    key: Option<String>,
    /// The refusing rule.
    rule: Option<Rule>,
}

/// What the wire knows for the access log's line.
pub(crate) struct Line<'a> {
    pub(crate) peer: IpAddr,
    pub(crate) method: &'a str,
    /// The target as the client sent it.
    pub(crate) target: &'a [u8],
    pub(crate) version: &'static str,
    pub(crate) referer: Option<&'a [u8]>,
    pub(crate) user_agent: Option<&'a [u8]>,
}

/// What admission decided.
pub(crate) enum Decided<'l> {
    /// Not to go on: answered by [`refusal_answer`].
    Refused(Refusal),
    /// To go upstream. The leases of its `concurrency` rules are held in
    /// `held` (given back when it is dropped or released).
    Admitted(Admitted<'l>, Option<Held>),
}

impl<'l> Flow<'l> {
    /// Phase 1: a request arrives under `live`, carrying `X-Request-Id`
    /// `given` (kept when valid).
    #[inline]
    pub(crate) fn start(gw: &'l Gateway, live: &'l Live, given: Option<&[u8]>) -> Self {
        let arrival = crate::observe::access::arrived();
        Self {
            gw,
            live,
            rid: RequestId::keep_or_make(given, arrival),
            arrival,
            note: Note::default(),
            counted: Counted::None,
        }
    }

    /// The gateway's metrics.
    #[inline]
    pub(crate) fn metrics(&self) -> &'l crate::observe::metrics::Metrics {
        &self.gw.metrics
    }

    /// Whether the request gets an access log line (the wire gathers what
    /// only the line needs only then).
    #[inline]
    pub(crate) fn logged(&self) -> bool {
        self.gw.access.is_some()
    }

    /// Phase 2: the path rules and routes see, from the target as sent; an
    /// edge refusal otherwise (its status noted).
    #[inline]
    pub(crate) fn rule_path<'t>(
        &mut self,
        method: &http::Method,
        target: &'t str,
    ) -> Result<Cow<'t, str>, Edge> {
        forward::rule_path(method, target).inspect_err(|e| self.note.status = e.status().as_u16())
    }

    /// Phase 3: the route `request` takes (`None`: the echo upstream's,
    /// when there are no servers).
    #[inline]
    pub(crate) fn route(&mut self, request: &RequestView<'_>) -> Option<(&'l str, &'l Group)> {
        let chosen = self.live.router.route(request);
        self.counted = match chosen {
            Some((_, g)) => Counted::Route(&g.counts),
            None => Counted::Echo,
        };
        chosen.map(|(name, g)| (name, &**g))
    }

    /// Phases 4 and 5: `request` on `route`, through the one admission
    /// path; noting who the client is and, for a refusal, the rule that
    /// refused and its key.
    pub(crate) async fn decide(
        &mut self,
        request: RequestView<'_>,
        route: Option<&str>,
    ) -> Decided<'l> {
        let claims = match self.gw.required_claims(self.live, &request) {
            Ok(c) => c,
            Err(r) => return Decided::Refused(r),
        };
        let request = request.with_claims(claims.as_ref().map(|c| c as _));
        let facts = Facts {
            request,
            identity: Identity::Resolve,
            route: Some(route.unwrap_or(crate::upstream::route::DEFAULT)),
        };
        match self.gw.admit(self.live, &facts, &self.rid).await {
            Ok(mut admitted) => {
                if self.logged() && admitted.who().limited {
                    self.note.identity = Some(admitted.who().identity.clone());
                }
                let held = Held::take(&mut admitted, &self.live.limiter);
                Decided::Admitted(admitted, held)
            }
            Err(refusal) => {
                if let (true, Refusal::Limited(d)) = (self.logged(), &refusal) {
                    self.note_refusal(d);
                    // The client's identity, apart from the refusing key;
                    // asked again only for a logged refusal.
                    self.note.identity = self
                        .live
                        .config
                        .policy
                        .identify(&facts)
                        .ok()
                        .filter(|w| w.limited)
                        .map(|w| w.identity);
                }
                Decided::Refused(refusal)
            }
        }
    }

    /// The rule that refused `d`, and its key, for the log.
    fn note_refusal(&mut self, d: &Decision) {
        if let Some(by) = d.rules.iter().find(|r| !r.allowed()) {
            self.note.key = Some(by.key.clone());
            self.note.rule = Some(by.rule.clone());
        }
    }

    /// Phase 8: settles `admitted`'s `count: failures` rules on the
    /// answer's `status` (a store error is not fatal: the store counted
    /// it).
    pub(crate) async fn settle(&self, admitted: &Admitted<'_>, status: u16) {
        self.gw.settle(self.live, admitted, status).await;
    }

    /// Phase 9: the route's answer counts, and the access log's line
    /// (`line` is asked only when there is a log).
    #[inline]
    pub(crate) fn finish<'a>(self, line: impl FnOnce() -> Line<'a>) {
        let n = &self.note;
        match self.counted {
            Counted::Route(c) => c.response(n.status, n.from_upstream),
            Counted::Echo => self
                .gw
                .metrics
                .route(crate::upstream::route::DEFAULT)
                .response(n.status, n.from_upstream),
            Counted::None => self
                .gw
                .metrics
                .route(crate::observe::metrics::NO_ROUTE)
                .response(n.status, false),
        }
        let Some(log) = &self.gw.access else { return };
        let line = line();
        let (time, duration) = crate::observe::access::since(self.arrival);
        log.log(&crate::observe::access::Record {
            time,
            peer: line.peer,
            method: line.method,
            target: line.target,
            version: line.version,
            status: n.status,
            bytes: n.bytes,
            duration,
            request_id: &self.rid,
            identity: n.identity.as_deref(),
            key: n.key.as_deref(),
            rule: n.rule.as_ref().map(Rule::name),
            tier: n.rule.as_ref().and_then(|r| {
                if r.is_override() {
                    Some("override")
                } else {
                    r.tier()
                }
            }),
            referer: line.referer,
            user_agent: line.user_agent,
        });
    }
}

/// Adds `decision`'s rate-limit headers (none when no rule matched).
pub(crate) fn add_rate_headers(
    decision: Option<&Decision>,
    headers: &mut HeaderMap,
    style: HeaderStyle,
) {
    if let Some(d) = decision {
        insert_headers(headers, d.header_fields(style));
    }
}

/// The answer to a refusal: the decision's rejection for
/// [`Refusal::Limited`], a problem body for the others.
pub(crate) fn refusal_answer(
    refusal: &Refusal,
    config: &Config,
    grpc: Option<Grpc>,
) -> Response<Body> {
    if let Some(kind) = grpc {
        return grpc_refusal(refusal, config, kind);
    }
    match refusal {
        Refusal::Limited(d) => crate::answer::rejection(d, config.status, config.headers),
        Refusal::Unauthenticated => {
            let mut r = problem_body(
                refusal.status(config.status),
                refusal.problem(config.status),
            );
            r.headers_mut().insert(
                http::header::WWW_AUTHENTICATE,
                http::HeaderValue::from_static("Bearer error=\"invalid_token\""),
            );
            r
        }
        other => problem_body(other.status(config.status), other.problem(config.status)),
    }
}

/// A gRPC request (`content-type: application/grpc[+proto|+json]`), or a
/// grpc-web one (`application/grpc-web[+proto]`, `-web-text`): refused the
/// way gRPC clients understand.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Grpc {
    /// gRPC over HTTP/2: a trailers-only answer.
    Native,
    /// grpc-web: the status as a trailer frame in the body (base64 for
    /// `-text`).
    Web {
        /// `application/grpc-web-text`.
        text: bool,
    },
}

/// What a request's `content-type` says it is.
pub(crate) fn grpc_kind(content_type: Option<&[u8]>) -> Option<Grpc> {
    let ct = content_type?;
    let ct = ct.split(|&b| b == b';').next().unwrap_or(ct);
    let ct = ct.trim_ascii();
    let lower = |p: &[u8]| ct.len() >= p.len() && ct[..p.len()].eq_ignore_ascii_case(p);
    if lower(b"application/grpc-web-text") {
        Some(Grpc::Web { text: true })
    } else if lower(b"application/grpc-web") {
        Some(Grpc::Web { text: false })
    } else if ct.eq_ignore_ascii_case(b"application/grpc") || lower(b"application/grpc+") {
        Some(Grpc::Native)
    } else {
        None
    }
}

/// gRPC status codes the gateway answers with.
const RESOURCE_EXHAUSTED: u8 = 8;
const PERMISSION_DENIED: u8 = 7;
const UNAVAILABLE: u8 = 14;
const UNAUTHENTICATED: u8 = 16;
const INVALID_ARGUMENT: u8 = 3;
const DEADLINE_EXCEEDED: u8 = 4;

/// A refusal as gRPC: HTTP 200 with `grpc-status` (8 RESOURCE_EXHAUSTED
/// for a limit, 7 PERMISSION_DENIED for `deny:`, 14 UNAVAILABLE for a
/// store failure under `on_error: deny`, 16 UNAUTHENTICATED, 3
/// INVALID_ARGUMENT), `grpc-message` naming the rule (percent-encoded as
/// gRPC requires), `Retry-After` and the rate-limit headers as metadata:
/// trailers-only for gRPC, the trailers as the body's trailer frame for
/// grpc-web.
pub(crate) fn grpc_refusal(refusal: &Refusal, config: &Config, kind: Grpc) -> Response<Body> {
    let (code, message) = match refusal {
        Refusal::Limited(d) => {
            let rule = d.violated().next().map_or("", |r| r.rule.name());
            let retry = d.retry_after_secs().unwrap_or(1);
            (
                RESOURCE_EXHAUSTED,
                format!("rate limited by rule `{rule}`; retry after {retry} s"),
            )
        }
        Refusal::Denied(_) => (PERMISSION_DENIED, "denied".to_owned()),
        Refusal::Unavailable(_) => (UNAVAILABLE, "rate limiter unavailable".to_owned()),
        Refusal::Unauthenticated => (UNAUTHENTICATED, "a valid token is required".to_owned()),
        Refusal::NoIdentity(_) | Refusal::MissingPart { .. } => (
            INVALID_ARGUMENT,
            "the request carries no rate-limit key".to_owned(),
        ),
    };
    let mut meta = HeaderMap::new();
    if let Refusal::Limited(d) = refusal {
        insert_headers(&mut meta, d.header_fields(config.headers));
    }
    grpc_status_answer(kind, code, &message, meta)
}

/// An edge refusal (see [`Edge`]) of a gRPC request, as gRPC clients
/// understand it: a body over `client_max_body_size` is 8
/// RESOURCE_EXHAUSTED (an HTTP 413 reads as UNKNOWN to them), a body or
/// head that did not come in time 4 DEADLINE_EXCEEDED, anything else 3
/// INVALID_ARGUMENT; the message says what.
fn grpc_edge(e: Edge, kind: Grpc) -> Response<Body> {
    let code = match e {
        Edge::TooLarge(_) => RESOURCE_EXHAUSTED,
        Edge::HeadTimeout | Edge::BodyTimeout => DEADLINE_EXCEEDED,
        _ => INVALID_ARGUMENT,
    };
    grpc_status_answer(kind, code, &e.detail(), HeaderMap::new())
}

/// The answer to `e` for a request of `grpc` kind (see [`grpc_kind`]):
/// in gRPC's terms for a gRPC request, else the problem body.
pub(crate) fn edge_answer(e: Edge, grpc: Option<Grpc>) -> Response<Body> {
    match grpc {
        Some(kind) => grpc_edge(e, kind),
        None => e.answer(),
    }
}

/// A gRPC status answer of `kind`: trailers-only for gRPC, the trailers as
/// the body's trailer frame for grpc-web; `meta` (the rate-limit headers)
/// as metadata.
fn grpc_status_answer(kind: Grpc, code: u8, message: &str, meta: HeaderMap) -> Response<Body> {
    let mut trailers = HeaderMap::new();
    crate::wire::grpc::put_status(&mut trailers, i32::from(code), message);
    let mut r = match kind {
        Grpc::Native => {
            let mut r = Response::new(crate::answer::empty_body());
            r.headers_mut().insert(
                http::header::CONTENT_TYPE,
                http::HeaderValue::from_static("application/grpc"),
            );
            r.headers_mut().extend(trailers);
            r
        }
        Grpc::Web { text } => {
            // The trailer frame: 0x80, a 4-byte length, `name: value\r\n`s.
            let mut block = Vec::new();
            for (k, v) in trailers.iter().chain(meta.iter()) {
                block.extend_from_slice(k.as_str().as_bytes());
                block.extend_from_slice(b": ");
                block.extend_from_slice(v.as_bytes());
                block.extend_from_slice(b"\r\n");
            }
            let mut frame = vec![0x80];
            frame.extend_from_slice(&(block.len() as u32).to_be_bytes());
            frame.extend_from_slice(&block);
            let (body, ct) = if text {
                use base64::Engine as _;
                (
                    base64::engine::general_purpose::STANDARD
                        .encode(&frame)
                        .into_bytes(),
                    "application/grpc-web-text+proto",
                )
            } else {
                (frame, "application/grpc-web+proto")
            };
            let mut r = Response::new(crate::answer::boxed(http_body_util::Full::new(
                bytes::Bytes::from(body),
            )));
            r.headers_mut().insert(
                http::header::CONTENT_TYPE,
                http::HeaderValue::from_static(ct),
            );
            r.headers_mut().extend(trailers);
            r
        }
    };
    r.headers_mut().extend(meta);
    r
}
