//! A decision, and how it reads over HTTP: rate-limit headers (legacy
//! `X-RateLimit-*` and draft-ietf-httpapi-ratelimit-headers-11) and the RFC 9457
//! problem body of a rejection.
//!
//! Rendering lives here, as plain strings, so the tower layer, the gateway and
//! the admin API all answer the same bytes.

use std::fmt::Write as _;
use std::time::Duration;

use crate::rule::{Reason, Rule};

/// One rule's part of a decision.
#[derive(Debug, Clone)]
pub struct RuleDecision {
    /// The rule.
    pub rule: Rule,
    /// The key it was evaluated on.
    pub key: String,
    /// Why the rule rejected; `None` when it admitted.
    pub reason: Option<Reason>,
    /// Requests of weight 1 still admissible.
    pub remaining: u64,
    /// Until the quota is whole again.
    pub reset_after: Duration,
    /// Until a request of this cost would fit; `None` when admitted, or when the
    /// cost can never fit.
    pub retry_after: Option<Duration>,
}

impl RuleDecision {
    /// Whether this rule admitted the request.
    pub fn allowed(&self) -> bool {
        self.reason.is_none()
    }
}

/// The answer to "may this request go ahead?". A rejection is a value, not an error.
#[derive(Debug, Clone)]
pub struct Decision {
    /// Whether the request is admitted (shadow rules never reject).
    pub allowed: bool,
    /// How long to hold an admitted request first (`leaky_bucket` delay mode).
    pub delay: Duration,
    /// Every rule that matched, in order.
    pub rules: Vec<RuleDecision>,
}

/// Which rate-limit headers to send (`headers: [legacy, ietf]`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct HeaderStyle {
    /// `X-RateLimit-Limit`, `-Remaining`, `-Reset`, `-Retry-After`.
    pub legacy: bool,
    /// `RateLimit-Policy` and `RateLimit`.
    pub ietf: bool,
}

impl Default for HeaderStyle {
    fn default() -> Self {
        Self {
            legacy: true,
            ietf: true,
        }
    }
}

/// Whole seconds, rounded up: a client told "0" would retry at once.
fn ceil_secs(d: Duration) -> u64 {
    d.as_secs() + u64::from(d.subsec_nanos() > 0)
}

impl Decision {
    /// Rules that can reject (shadow rules are left out of what clients see).
    fn enforced(&self) -> impl Iterator<Item = &RuleDecision> {
        self.rules.iter().filter(|r| !r.rule.is_shadow())
    }

    /// The rule whose numbers the legacy headers show: the first rejecting rule,
    /// else the one with the fewest requests left (the longer reset on a tie).
    pub fn binding(&self) -> Option<&RuleDecision> {
        if let Some(r) = self.enforced().find(|r| !r.allowed()) {
            return Some(r);
        }
        self.enforced()
            .min_by(|a, b| (a.remaining, b.reset_after).cmp(&(b.remaining, a.reset_after)))
    }

    /// Rules that rejected the request (not counting shadow rules).
    pub fn violated(&self) -> impl Iterator<Item = &RuleDecision> {
        self.enforced().filter(|r| !r.allowed())
    }

    /// `Retry-After` in whole seconds, at least 1; `None` when admitted.
    ///
    /// The longest wait among the rejecting rules, since the request needs them all.
    pub fn retry_after_secs(&self) -> Option<u64> {
        if self.allowed {
            return None;
        }
        self.violated()
            .map(|r| ceil_secs(r.retry_after.unwrap_or(r.reset_after)).max(1))
            .max()
    }

    /// The headers to add to the response, in order.
    ///
    /// ```
    /// use std::time::Duration;
    /// use ratewarden::{Decision, HeaderStyle, Rule, RuleDecision};
    /// let rule = Rule::builder("per-client").limit(50, Duration::from_secs(60)).build().unwrap();
    /// let d = Decision {
    ///     allowed: true,
    ///     delay: Duration::ZERO,
    ///     rules: vec![RuleDecision {
    ///         rule, key: "1.2.3.4".into(), reason: None, remaining: 49,
    ///         reset_after: Duration::from_secs(60), retry_after: None,
    ///     }],
    /// };
    /// let h = d.headers(HeaderStyle::default());
    /// assert_eq!(h[0], ("X-RateLimit-Limit", "50".to_string()));
    /// assert_eq!(h[3], ("RateLimit-Policy", "\"per-client\";q=50;w=60".to_string()));
    /// assert_eq!(h[4], ("RateLimit", "\"per-client\";r=49;t=60".to_string()));
    /// ```
    pub fn headers(&self, style: HeaderStyle) -> Vec<(&'static str, String)> {
        let mut out = Vec::with_capacity(6);
        let retry = self.retry_after_secs();
        if let Some(secs) = retry {
            out.push(("Retry-After", secs.to_string()));
        }
        if style.legacy
            && let Some(b) = self.binding()
        {
            out.push(("X-RateLimit-Limit", b.rule.limit().to_string()));
            out.push(("X-RateLimit-Remaining", b.remaining.to_string()));
            let reset = ceil_secs(b.reset_after).max(retry.unwrap_or(0));
            out.push(("X-RateLimit-Reset", reset.to_string()));
            if let Some(secs) = retry {
                out.push(("X-RateLimit-Retry-After", secs.to_string()));
            }
        }
        if style.ietf && self.enforced().next().is_some() {
            let mut policy = String::new();
            let mut state = String::new();
            for r in self.enforced() {
                let sep = if policy.is_empty() { "" } else { ", " };
                // Rule names are validated printable ASCII without `"` or `\`,
                // so they are valid sf-strings as they are.
                let _ = write!(
                    policy,
                    "{sep}\"{}\";q={};w={}",
                    r.rule.name(),
                    r.rule.limit(),
                    ceil_secs(r.rule.window())
                );
                let mut t = ceil_secs(r.reset_after);
                if !r.allowed() {
                    t = t.max(ceil_secs(r.retry_after.unwrap_or(r.reset_after)).max(1));
                }
                let _ = write!(
                    state,
                    "{sep}\"{}\";r={};t={}",
                    r.rule.name(),
                    r.remaining,
                    t
                );
            }
            out.push(("RateLimit-Policy", policy));
            out.push(("RateLimit", state));
        }
        out
    }

    /// The RFC 9457 problem body of a rejection (`application/problem+json`),
    /// `None` when the request was admitted.
    pub fn problem_json(&self, status: u16) -> Option<String> {
        let retry = self.retry_after_secs()?;
        let mut violated = self.violated();
        let first = violated.next()?;
        let mut names = format!("[{}", json_string(first.rule.name()));
        for r in violated {
            names.push(',');
            names.push_str(&json_string(r.rule.name()));
        }
        names.push(']');
        let detail = match first.reason {
            Some(Reason::Banned) => Some(format!(
                "banned by rule {} for exceeding its limit; {retry} s left on the ban",
                first.rule.name()
            )),
            Some(Reason::MinInterval) => Some(format!(
                "requests under rule {} must be at least {:?} apart",
                first.rule.name(),
                first.rule.spec().min_interval.unwrap_or_default()
            )),
            _ if first.rule.spec().penalty.is_some() => Some(format!(
                "limit of rule {} exceeded; banned for {retry} s",
                first.rule.name()
            )),
            _ => None,
        };
        let mut body = format!(
            "{{\"type\":\"https://iana.org/assignments/http-problem-types#quota-exceeded\",\
             \"title\":{},\"status\":{status},\"violated-policies\":{names},\"rule\":{},\
             \"retry_after\":{retry}",
            json_string(title(status)),
            json_string(first.rule.name()),
        );
        if let Some(d) = detail {
            let _ = write!(body, ",\"detail\":{}", json_string(&d));
        }
        body.push('}');
        Some(body)
    }
}

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

/// A minimal RFC 9457 problem body (`about:blank` type) for other refusals:
/// `deny:` (403), upstream failures (502/504), limiter failures (503).
///
/// ```
/// let body = ratewarden::decision::problem(403, Some("client 10.0.0.1 is denied"));
/// assert_eq!(body, r#"{"type":"about:blank","title":"Forbidden","status":403,"detail":"client 10.0.0.1 is denied"}"#);
/// ```
pub fn problem(status: u16, detail: Option<&str>) -> String {
    let mut body = format!(
        "{{\"type\":\"about:blank\",\"title\":{},\"status\":{status}",
        json_string(title(status))
    );
    if let Some(d) = detail {
        let _ = write!(body, ",\"detail\":{}", json_string(d));
    }
    body.push('}');
    body
}

/// `s` as a JSON string literal.
///
/// ```
/// assert_eq!(ratewarden::decision::json_string("a\"b\n"), r#""a\"b\n""#);
/// ```
pub fn json_string(s: &str) -> String {
    let mut out = String::with_capacity(s.len() + 2);
    out.push('"');
    for c in s.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            '\t' => out.push_str("\\t"),
            c if (c as u32) < 0x20 => {
                let _ = write!(out, "\\u{:04x}", c as u32);
            }
            c => out.push(c),
        }
    }
    out.push('"');
    out
}
