//! The RFC 9457 problem bodies a refusal is answered with: the reason
//! phrases (HTTP's, kept out of the core), the plain `about:blank`
//! problems of refusals that are not limits (403, 502, 503, 504), and a
//! limited decision's body.

use ratewarden::Decision;
use ratewarden::decision::{json_string, push_json_escaped};

/// The reason phrase used as a problem title.
pub fn title(status: u16) -> &'static str {
    match status {
        400 => "Bad Request",
        403 => "Forbidden",
        429 => "Too Many Requests",
        502 => "Bad Gateway",
        503 => "Service Unavailable",
        504 => "Gateway Timeout",
        _ => "Request Rejected",
    }
}

/// A minimal problem body (`about:blank` type) for other refusals:
/// `deny:` (403), upstream failures (502/504), limiter failures (503).
///
/// ```
/// let body = ratewarden_tower::problem::problem(403, Some("client 10.0.0.1 is denied"));
/// assert_eq!(body, r#"{"type":"about:blank","title":"Forbidden","status":403,"detail":"client 10.0.0.1 is denied"}"#);
/// ```
pub fn problem(status: u16, detail: Option<&str>) -> String {
    let mut body = String::with_capacity(128);
    body.push_str("{\"type\":\"about:blank\",\"title\":");
    body.push_str(&json_string(title(status)));
    body.push_str(",\"status\":");
    body.push_str(itoa::Buffer::new().format(status));
    if let Some(d) = detail {
        body.push_str(",\"detail\":\"");
        push_json_escaped(&mut body, d);
        body.push('"');
    }
    body.push('}');
    body
}

/// A limited decision's problem body answered with `status` (see
/// [`Decision::problem_json`]), `None` when it admitted.
pub fn problem_json(decision: &Decision, status: u16) -> Option<String> {
    decision.problem_json(status, title(status))
}

/// The body to answer a rejection with: [`problem_json`], or a plain
/// problem of `status` when the decision admitted the request.
pub fn rejection(decision: &Decision, status: u16) -> String {
    let mut body = String::new();
    push_rejection(decision, status, &mut body);
    body
}

/// [`rejection`], appended to `body` (a buffer the caller reuses: no
/// allocation once it has grown).
///
/// ```
/// # use std::time::Duration;
/// # use ratewarden::{Decision, Reason, Rule, RuleDecision};
/// # let rule = Rule::builder("api").limit(5, Duration::from_secs(10)).build().unwrap();
/// # let d = Decision { allowed: false, delay: Duration::ZERO, rules: vec![RuleDecision {
/// #     rule, key: "k".into(), reason: Some(Reason::Limit), remaining: 0,
/// #     reset_after: Duration::from_secs(2), retry_after: Some(Duration::from_millis(1500)), lease: None }] };
/// use ratewarden_tower::problem::{push_rejection, rejection};
/// let mut body = String::from("kept:");
/// push_rejection(&d, 429, &mut body);
/// assert_eq!(body, format!("kept:{}", rejection(&d, 429)));
/// assert!(body.ends_with(r#""rule":"api","retry_after":2}"#), "{body}");
/// ```
pub fn push_rejection(decision: &Decision, status: u16, body: &mut String) {
    if !decision.push_problem_json(status, title(status), body) {
        body.push_str(&problem(status, None));
    }
}
