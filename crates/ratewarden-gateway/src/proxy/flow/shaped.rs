//! Refusals in the shapes LLM SDKs understand (`refusal: openai |
//! anthropic`): the vendor's error object and rate-limit headers, so that
//! `openai.RateLimitError` and `anthropic.RateLimitError` carry our
//! message, and the SDKs' retries wait what `retry-after` says. The
//! standard rate-limit headers are sent too.

use std::time::Duration;

use http::{HeaderValue, Response, StatusCode};
use ratewarden::{Decision, HeaderStyle, RuleDecision};

use crate::answer::{Body, respond};
use crate::config::Config;
use crate::config::cost::RefusalShape;

/// The shape `config` gives rule `name`'s refusals, when not a problem.
fn shape_for(config: &Config, name: &str) -> Option<RefusalShape> {
    config
        .refusals
        .iter()
        .find(|(n, _)| n == name)
        .map(|(_, s)| *s)
}

/// The shape `config` gives the refusal `d` (its refusing rule's), and
/// that rule's part of it; `None`: a problem body.
pub(crate) fn shape_of<'d>(
    d: &'d Decision,
    config: &Config,
) -> Option<(RefusalShape, &'d RuleDecision)> {
    if config.refusals.is_empty() {
        return None;
    }
    let by = d.rules.iter().find(|r| !r.allowed())?;
    shape_for(config, by.rule.name()).map(|s| (s, by))
}

/// The vendor's token headers for `by` in `shape`: its limit, what is left
/// of it, and when it resets.
fn vendor_fields(shape: RefusalShape, by: &RuleDecision) -> [(&'static str, String); 3] {
    let (limit, remaining) = (by.rule.limit().to_string(), by.remaining.to_string());
    match shape {
        RefusalShape::Anthropic => [
            ("anthropic-ratelimit-tokens-limit", limit),
            ("anthropic-ratelimit-tokens-remaining", remaining),
            ("anthropic-ratelimit-tokens-reset", reset_at(by.reset_after)),
        ],
        _ => [
            ("x-ratelimit-limit-tokens", limit),
            ("x-ratelimit-remaining-tokens", remaining),
            ("x-ratelimit-reset-tokens", openai_duration(by.reset_after)),
        ],
    }
}

/// The refusal `d` in `shape`, refused by `by`, answered with `status`.
pub(crate) fn shaped(
    d: &Decision,
    by: &RuleDecision,
    shape: RefusalShape,
    status: StatusCode,
    style: HeaderStyle,
) -> Response<Body> {
    let wait = by.retry_after.unwrap_or(by.reset_after);
    let message = format!(
        "Rate limit reached for tokens under rule `{}`: limit {}, remaining {}. Please try again in {}.",
        by.rule.name(),
        by.rule.limit(),
        by.remaining,
        openai_duration(wait)
    );
    let body = match shape {
        RefusalShape::Anthropic => serde_json::json!({
            "type": "error",
            "error": {"type": "rate_limit_error", "message": message},
        }),
        _ => serde_json::json!({
            "error": {
                "message": message,
                "type": "tokens",
                "param": null,
                "code": "rate_limit_exceeded",
            }
        }),
    };
    let mut r = respond(status, "application/json", body.to_string());
    ratewarden_tower::insert_headers(r.headers_mut(), d.header_fields(style));
    let secs = ratewarden::decision::whole_secs(wait).max(1);
    let retry_ms = (shape != RefusalShape::Anthropic)
        .then(|| ("retry-after-ms", wait.as_millis().max(1).to_string()));
    let fields = [("retry-after", secs.to_string())]
        .into_iter()
        .chain(retry_ms)
        .chain(vendor_fields(shape, by));
    for (name, value) in fields {
        if let Ok(v) = HeaderValue::from_str(&value) {
            r.headers_mut().insert(name, v);
        }
    }
    r
}

/// The vendor's rate-limit headers an admitted answer carries for the
/// first rule of `d` with a shape (the tokens left after the reservation);
/// none when no rule of `d` has one.
pub(crate) fn admitted_fields(d: &Decision, config: &Config) -> Vec<(&'static str, String)> {
    if config.refusals.is_empty() {
        return vec![];
    }
    d.rules
        .iter()
        .find_map(|r| shape_for(config, r.rule.name()).map(|s| vendor_fields(s, r).to_vec()))
        .unwrap_or_default()
}

/// OpenAI's form of a duration: `20ms` under a second, else `1h2m3s`,
/// `6m0s`, `2s` (whole seconds, rounded up).
pub(crate) fn openai_duration(d: Duration) -> String {
    if d < Duration::from_secs(1) {
        return format!("{}ms", d.as_millis().max(1));
    }
    let s = ratewarden::decision::whole_secs(d);
    let (h, m, s) = (s / 3600, s / 60 % 60, s % 60);
    match (h, m) {
        (0, 0) => format!("{s}s"),
        (0, m) => format!("{m}m{s}s"),
        (h, m) => format!("{h}h{m}m{s}s"),
    }
}

/// When a wait of `d` from now ends, in RFC 3339 (UTC, whole seconds).
fn reset_at(d: Duration) -> String {
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap_or_default();
    let at = (now + d).as_secs().min(253_402_300_799);
    jiff::Timestamp::from_second(at as i64)
        .map(|t| t.to_string())
        .unwrap_or_default()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn durations_in_openais_form() {
        assert_eq!(openai_duration(Duration::from_millis(20)), "20ms");
        assert_eq!(openai_duration(Duration::from_secs(2)), "2s");
        assert_eq!(openai_duration(Duration::from_millis(1500)), "2s");
        assert_eq!(openai_duration(Duration::from_secs(360)), "6m0s");
        assert_eq!(openai_duration(Duration::from_secs(3723)), "1h2m3s");
    }

    #[test]
    fn a_reset_is_an_rfc3339_instant() {
        let s = reset_at(Duration::from_secs(60));
        assert!(s.ends_with('Z') && s.len() == 20, "{s}");
    }
}
