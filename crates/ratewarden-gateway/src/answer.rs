//! The gateway's own answers: the body type every response has, and the
//! problem responses (RFC 9457) of refusals and failures.

use bytes::Bytes;
use http::header::{self, HeaderValue};
use http::{Response, StatusCode};
use http_body_util::combinators::UnsyncBoxBody;
use http_body_util::{BodyExt, Full};
use ratewarden::Decision;
use ratewarden_tower::problem::problem;

/// The body of every response the gateway sends.
pub type Body = UnsyncBoxBody<Bytes, Box<dyn std::error::Error + Send + Sync>>;

/// `body` as the gateway's body type.
pub(crate) fn boxed(body: Full<Bytes>) -> Body {
    body.map_err(|never| match never {}).boxed_unsync()
}

/// An empty body.
pub(crate) fn empty_body() -> Body {
    boxed(Full::new(Bytes::new()))
}

/// A complete response of `content_type`.
pub(crate) fn respond(
    status: StatusCode,
    content_type: &'static str,
    body: impl Into<Bytes>,
) -> Response<Body> {
    let mut r = Response::new(boxed(Full::new(body.into())));
    *r.status_mut() = status;
    r.headers_mut()
        .insert(header::CONTENT_TYPE, HeaderValue::from_static(content_type));
    r
}

/// An RFC 9457 problem response saying `detail`.
pub(crate) fn problem_response(status: StatusCode, detail: &str) -> Response<Body> {
    problem_body(status, problem(status.as_u16(), Some(detail)))
}

/// A problem response with a body already rendered.
pub(crate) fn problem_body(status: StatusCode, body: String) -> Response<Body> {
    respond(status, "application/problem+json", body)
}

/// The response to a rejected request.
pub(crate) fn rejection(
    d: &Decision,
    status: StatusCode,
    style: ratewarden::HeaderStyle,
) -> Response<Body> {
    ratewarden_tower::rejection_response(d, status, style).map(boxed)
}

/// The built-in upstream's answer: what it received, and from whom, with
/// the decision's rate-limit headers.
pub(crate) fn echo(
    method: &http::Method,
    target: &str,
    identity: &str,
    decision: Option<&Decision>,
    style: ratewarden::HeaderStyle,
) -> Response<Body> {
    let mut r = respond(
        StatusCode::OK,
        "text/plain; charset=utf-8",
        format!("ratewarden echo: {method} {target} from {identity}\n"),
    );
    if let Some(d) = decision {
        ratewarden_tower::insert_headers(r.headers_mut(), d.header_fields(style));
    }
    r.extensions_mut()
        .insert(crate::observe::metrics::FromUpstream);
    r
}
