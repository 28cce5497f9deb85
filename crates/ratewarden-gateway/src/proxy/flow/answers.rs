//! The gateway's own answers to a request the flow does not forward: a
//! refusal (as HTTP, or as gRPC for a gRPC request), an edge's refusal,
//! and the rate-limit headers on an answer.

use http::Response;
use http::header::HeaderMap;
use ratewarden::{Decision, HeaderStyle};
use ratewarden_tower::admission::Refusal;
use ratewarden_tower::insert_headers;

use crate::answer::{Body, problem_body};
use crate::config::Config;
use crate::proxy::forward::Edge;

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
        Refusal::Limited(d) => match super::shaped::shape_of(d, config) {
            Some((shape, by)) => super::shaped::shaped(
                d,
                by,
                shape,
                Refusal::limited_status(d, config.status),
                config.headers,
            ),
            None => crate::answer::rejection(d, config.status, config.headers),
        },
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
        Refusal::NoConsumer => {
            let mut r = problem_body(
                refusal.status(config.status),
                refusal.problem(config.status),
            );
            r.headers_mut()
                .insert(http::header::WWW_AUTHENTICATE, api_key_challenge(config));
            r
        }
        other => problem_body(other.status(config.status), other.problem(config.status)),
    }
}

/// The `WWW-Authenticate` of a request without a valid API key: a Bearer
/// challenge where the key is a bearer token, else one naming where the
/// key goes (`ApiKey header="X-Api-Key"`, `ApiKey query="api_key"`).
fn api_key_challenge(config: &Config) -> http::HeaderValue {
    use crate::config::ApiKeyFrom;
    let text = match config.consumers.as_ref().map(|c| &c.from) {
        Some(ApiKeyFrom::Header(h)) => format!("ApiKey header=\"{h}\""),
        Some(ApiKeyFrom::Query(q)) => format!("ApiKey query=\"{q}\""),
        _ => "Bearer error=\"invalid_token\"".to_owned(),
    };
    http::HeaderValue::from_str(&text).unwrap_or_else(|_| http::HeaderValue::from_static("ApiKey"))
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
        Refusal::NoConsumer => (UNAUTHENTICATED, "a valid API key is required".to_owned()),
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
