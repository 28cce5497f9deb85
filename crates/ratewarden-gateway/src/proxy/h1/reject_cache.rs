//! The last rejection written on a thread, reused while it reads the same.

use http::StatusCode;
use ratewarden::decision::whole_secs;

use super::write::{RateFields, end_answer, http_date, push_field, status_line};

/// A rejection, whole, in `out`, carrying the request's id: what
/// [`crate::answer::rejection`] answers on hyper's path, written without a
/// `HeaderMap` or a body to collect. When it would read as the thread's
/// last one (see [`LastRejection`]), that one is copied with a fresh
/// `Date` and this request's id. Returns the body's length.
pub(crate) fn write_rejection(
    out: &mut Vec<u8>,
    rate: &mut RateFields,
    d: &ratewarden::Decision,
    (status, style): (StatusCode, ratewarden::HeaderStyle),
    close: bool,
    rid: &crate::observe::request_id::RequestId,
) -> usize {
    let reused = LAST_REJECTION.with_borrow(|last| {
        if !last.renders_as(d, status, style, close) {
            return None;
        }
        out.clear();
        splice_id(out, &last.bytes, last.head_end, rid);
        out[last.date_at..last.date_at + 29].copy_from_slice(&http_date());
        Some(last.bytes.len() - last.head_end - 2)
    });
    if let Some(body) = reused {
        return body;
    }
    rate.body.clear();
    ratewarden_tower::problem::push_rejection(d, status.as_u16(), &mut rate.body);
    out.clear();
    status_line(out, status, None);
    push_field(out, b"content-type", b"application/problem+json");
    rate.render(Some(d), style);
    out.extend_from_slice(&rate.lines);
    let date_at = end_answer(out, rate.body.as_bytes(), close);
    let body = rate.body.len();
    // The id goes in per request: kept without it.
    let head_end = out.len() - body - 2;
    LAST_REJECTION.with_borrow_mut(|last| {
        last.keep(d, status, style, close, out, (date_at, head_end));
        out.clear();
        splice_id(out, &last.bytes, head_end, rid);
    });
    body
}

/// `bytes` (an answer whose head ends at `head_end`, before its blank
/// line) into `out` with an `x-request-id` field added to the head.
fn splice_id(
    out: &mut Vec<u8>,
    bytes: &[u8],
    head_end: usize,
    rid: &crate::observe::request_id::RequestId,
) {
    out.extend_from_slice(&bytes[..head_end]);
    push_field(out, b"x-request-id", rid.as_bytes());
    out.extend_from_slice(&bytes[head_end..]);
}

thread_local! {
    static LAST_REJECTION: std::cell::RefCell<LastRejection> =
        std::cell::RefCell::new(LastRejection::default());
}

/// The last rejection written on this thread and what its bytes were
/// rendered from. A client hammering a limit (on one connection or many)
/// gets the same answer until one of its numbers changes, which with whole
/// seconds is at most once a second: copying it (and its `Date`) costs
/// less than rendering it again.
#[derive(Default)]
pub(crate) struct LastRejection {
    status: Option<StatusCode>,
    style: Option<ratewarden::HeaderStyle>,
    close: bool,
    /// Per rule of the decision, everything of it the answer shows.
    rules: Vec<Shown>,
    bytes: Vec<u8>,
    /// Where the value of `Date` starts in `bytes`.
    date_at: usize,
    /// Where the head's blank line starts in `bytes`.
    head_end: usize,
}

/// What an answer shows of one rule's decision: the rule (its spec: name,
/// limit, window, penalty, minimum interval), why it rejected, and its
/// numbers in the whole seconds the headers and body use.
pub(crate) struct Shown {
    rule: ratewarden::Rule,
    reason: Option<ratewarden::Reason>,
    remaining: u64,
    reset: u64,
    retry: Option<u64>,
}

impl Shown {
    fn of(r: &ratewarden::RuleDecision) -> Self {
        Self {
            rule: r.rule.clone(),
            reason: r.reason,
            remaining: r.remaining,
            reset: whole_secs(r.reset_after),
            retry: r.retry_after.map(whole_secs),
        }
    }

    fn shows(&self, r: &ratewarden::RuleDecision) -> bool {
        self.reason == r.reason
            && self.remaining == r.remaining
            && self.reset == whole_secs(r.reset_after)
            && self.retry == r.retry_after.map(whole_secs)
            && self.rule == r.rule
    }
}

impl LastRejection {
    /// Whether `d`'s rejection reads exactly as `bytes` (but for `Date`).
    fn renders_as(
        &self,
        d: &ratewarden::Decision,
        status: StatusCode,
        style: ratewarden::HeaderStyle,
        close: bool,
    ) -> bool {
        self.status == Some(status)
            && self.style == Some(style)
            && self.close == close
            && self.rules.len() == d.rules.len()
            && self.rules.iter().zip(&d.rules).all(|(s, r)| s.shows(r))
    }

    fn keep(
        &mut self,
        d: &ratewarden::Decision,
        status: StatusCode,
        style: ratewarden::HeaderStyle,
        close: bool,
        bytes: &[u8],
        (date_at, head_end): (usize, usize),
    ) {
        self.status = Some(status);
        self.style = Some(style);
        self.close = close;
        self.rules.clear();
        self.rules.extend(d.rules.iter().map(Shown::of));
        self.bytes.clear();
        self.bytes.extend_from_slice(bytes);
        self.date_at = date_at;
        self.head_end = head_end;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rid() -> crate::observe::request_id::RequestId {
        crate::observe::request_id::RequestId::new()
    }

    #[test]
    fn a_rejection_is_reused_only_while_it_would_read_the_same() {
        use ratewarden::{Decision, HeaderStyle, Reason, Rule, RuleDecision};
        use std::time::Duration;
        let rule = |name: &str| {
            Rule::builder(name)
                .limit(5, Duration::from_secs(10))
                .build()
                .unwrap()
        };
        let rejected = |rule: &Rule, retry_ms: u64, reset_ms: u64| Decision {
            allowed: false,
            delay: Duration::ZERO,
            rules: vec![RuleDecision {
                rule: rule.clone(),
                key: "k".into(),
                reason: Some(Reason::Limit),
                remaining: 0,
                reset_after: Duration::from_millis(reset_ms),
                retry_after: Some(Duration::from_millis(retry_ms)),
                lease: None,
            }],
        };
        let how = (StatusCode::TOO_MANY_REQUESTS, HeaderStyle::default());
        // Rendered afresh (nothing kept), and through the thread's last one.
        let fresh = |d: &Decision, close: bool| {
            LAST_REJECTION.with_borrow_mut(|l| *l = LastRejection::default());
            let mut out = vec![];
            write_rejection(&mut out, &mut RateFields::default(), d, how, close, &rid());
            String::from_utf8(out).unwrap()
        };
        let written = |d: &Decision, close: bool| {
            let mut out = vec![];
            write_rejection(&mut out, &mut RateFields::default(), d, how, close, &rid());
            String::from_utf8(out).unwrap()
        };
        // The date and the request id are the only parts that may differ
        // between two renderings.
        let undated = |s: String| {
            let at = s.find("date: ").unwrap() + 6;
            let s = format!("{}{}", &s[..at], &s[at + 29..]);
            let id = s.find("x-request-id: ").unwrap() + 14;
            assert_eq!(&s[id + 36..id + 38], "\r\n", "one id per answer: {s}");
            format!("{}{}", &s[..id], &s[id + 36..])
        };
        let api = rule("api");
        let first = fresh(&rejected(&api, 1500, 2000), false);
        assert!(first.contains("retry_after\":2}"), "{first}");
        // A stale date in the kept bytes, to see it rewritten.
        let kept = LAST_REJECTION.with_borrow_mut(|l| {
            let at = l.date_at;
            l.bytes[at..at + 29].copy_from_slice(b"Thu, 01 Jan 1970 00:00:00 GMT");
            l.bytes.clone()
        });
        // Other milliseconds, the same whole seconds: the kept bytes.
        let again = written(&rejected(&api, 1200, 1700), false);
        assert_eq!(undated(again.clone()), undated(first.clone()));
        assert_eq!(LAST_REJECTION.with_borrow(|l| l.bytes.clone()), kept);
        let date = &again[again.find("date: ").unwrap() + 6..][..29];
        let age = std::time::SystemTime::now()
            .duration_since(httpdate::parse_http_date(date).unwrap())
            .unwrap_or_default();
        assert!(age < Duration::from_secs(5), "a current date: {date}");
        // Anything the answer shows changes it, exactly as rendered afresh.
        for (d, close) in [
            (rejected(&api, 2500, 2000), false),
            (rejected(&api, 1500, 3000), false),
            (rejected(&api, 1500, 2000), true),
            (rejected(&rule("other"), 1500, 2000), false),
        ] {
            written(&rejected(&api, 1500, 2000), false);
            let got = written(&d, close);
            assert_ne!(undated(got.clone()), undated(first.clone()));
            assert_eq!(undated(got), undated(fresh(&d, close)));
        }
    }
}
