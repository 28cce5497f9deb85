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
    /// The `concurrency` lease the admitted request holds (release it when
    /// the request ends).
    pub lease: Option<u64>,
}

impl RuleDecision {
    /// Whether this rule admitted the request.
    pub fn allowed(&self) -> bool {
        self.reason.is_none()
    }

    /// How metrics count this rule's part: `allowed`, `rejected`, or
    /// `shadow_rejected` (a shadow rule that would have rejected: the
    /// request was not rejected for it).
    ///
    /// ```
    /// # use std::time::Duration;
    /// # use ratewarden::{Reason, Rule, RuleDecision};
    /// let rule = Rule::builder("r").limit(1, Duration::from_secs(1)).shadow(true).build().unwrap();
    /// let d = RuleDecision { rule, key: "k".into(), reason: Some(Reason::Limit), remaining: 0,
    ///     reset_after: Duration::ZERO, retry_after: None, lease: None };
    /// assert_eq!(d.label(), "shadow_rejected");
    /// ```
    pub fn label(&self) -> &'static str {
        match (self.allowed(), self.rule.is_shadow()) {
            (true, _) => "allowed",
            (false, true) => "shadow_rejected",
            (false, false) => "rejected",
        }
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

/// Whole seconds, rounded up: a client told "0" would retry at once. Every
/// number of seconds in a decision's headers and problem body is rounded so;
/// two decisions whose durations round alike answer alike.
pub fn whole_secs(d: Duration) -> u64 {
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

    /// The status to refuse with: the first refusing rule's `status`, else
    /// `default`.
    ///
    /// ```
    /// # use std::time::Duration;
    /// # use ratewarden::{Decision, Reason, Rule, RuleDecision};
    /// let rule = Rule::builder("monthly").limit(5, Duration::from_secs(10)).status(403).build().unwrap();
    /// let d = Decision { allowed: false, delay: Duration::ZERO, rules: vec![RuleDecision {
    ///     rule, key: "k".into(), reason: Some(Reason::Limit), remaining: 0,
    ///     reset_after: Duration::from_secs(2), retry_after: Some(Duration::from_secs(2)), lease: None }] };
    /// assert_eq!(d.status(429), 403);
    /// ```
    pub fn status(&self, default: u16) -> u16 {
        self.violated()
            .next()
            .and_then(|r| r.rule.spec().status)
            .unwrap_or(default)
    }

    /// `Retry-After` in whole seconds, at least 1; `None` when admitted.
    ///
    /// The longest wait among the rejecting rules, since the request needs them all.
    pub fn retry_after_secs(&self) -> Option<u64> {
        if self.allowed {
            return None;
        }
        self.violated()
            .map(|r| whole_secs(r.retry_after.unwrap_or(r.reset_after)).max(1))
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
    ///         reset_after: Duration::from_secs(60), retry_after: None, lease: None,
    ///     }],
    /// };
    /// let h = d.headers(HeaderStyle::default());
    /// assert_eq!(h[0], ("x-ratelimit-limit", "50".to_string()));
    /// assert_eq!(h[3], ("ratelimit-policy", "\"per-client\";q=50;w=60".to_string()));
    /// assert_eq!(h[4], ("ratelimit", "\"per-client\";r=49;t=60".to_string()));
    /// ```
    pub fn headers(&self, style: HeaderStyle) -> Vec<(&'static str, String)> {
        self.header_fields(style)
            .into_iter()
            .map(|(name, value)| (name, value.into_string()))
            .collect()
    }

    /// The headers of [`headers`](Self::headers), numbers left as numbers:
    /// an HTTP layer can render those without formatting or allocating
    /// (ratewarden-tower keeps the small ones ready-made).
    ///
    /// ```
    /// # use std::time::Duration;
    /// # use ratewarden::{Decision, HeaderField, HeaderStyle, Rule, RuleDecision};
    /// # let rule = Rule::builder("per-client").limit(50, Duration::from_secs(60)).build().unwrap();
    /// # let d = Decision { allowed: true, delay: Duration::ZERO, rules: vec![RuleDecision {
    /// #     rule, key: "1.2.3.4".into(), reason: None, remaining: 49,
    /// #     reset_after: Duration::from_secs(60), retry_after: None, lease: None }] };
    /// let h = d.header_fields(HeaderStyle::default());
    /// assert_eq!(h[1], ("x-ratelimit-remaining", HeaderField::Number(49)));
    /// assert_eq!(h[4].1.to_string(), "\"per-client\";r=49;t=60");
    /// ```
    pub fn header_fields(&self, style: HeaderStyle) -> Vec<(&'static str, HeaderField)> {
        let mut out = Vec::with_capacity(7);
        self.visit_header_fields(style, &mut String::new(), |name, value| {
            out.push((name, value.into_owned()));
        });
        out
    }

    /// The fields of [`header_fields`](Self::header_fields), handed to
    /// `field` one by one; text values are written into `scratch` (cleared
    /// first) and lent. With a `scratch` kept from response to response this
    /// allocates nothing, which an HTTP/1 writer can use.
    ///
    /// ```
    /// # use std::time::Duration;
    /// # use ratewarden::{Decision, FieldRef, HeaderStyle, Rule, RuleDecision};
    /// # let rule = Rule::builder("api").limit(5, Duration::from_secs(10)).build().unwrap();
    /// # let d = Decision { allowed: true, delay: Duration::ZERO, rules: vec![RuleDecision {
    /// #     rule, key: "k".into(), reason: None, remaining: 4,
    /// #     reset_after: Duration::from_secs(2), retry_after: None, lease: None }] };
    /// let mut lines = String::new();
    /// d.visit_header_fields(HeaderStyle::default(), &mut String::new(), |name, value| {
    ///     lines.push_str(&format!("{name}: {value}\n"));
    /// });
    /// assert!(lines.ends_with("ratelimit: \"api\";r=4;t=2\n"), "{lines}");
    /// ```
    pub fn visit_header_fields(
        &self,
        style: HeaderStyle,
        scratch: &mut String,
        mut field: impl FnMut(&'static str, FieldRef<'_>),
    ) {
        use FieldRef::Number;
        // Built with `push_str` and our own integer writer rather than
        // `format!`: this runs on every limited response.
        let retry = self.retry_after_secs();
        if let Some(secs) = retry {
            field("retry-after", Number(secs));
        }
        if style.legacy
            && let Some(b) = self.binding()
        {
            field("x-ratelimit-limit", Number(b.rule.limit()));
            field("x-ratelimit-remaining", Number(b.remaining));
            let reset = whole_secs(b.reset_after).max(retry.unwrap_or(0));
            field("x-ratelimit-reset", Number(reset));
            if let Some(secs) = retry {
                field("x-ratelimit-retry-after", Number(secs));
            }
        }
        if style.ietf && self.enforced().next().is_some() {
            scratch.clear();
            for r in self.enforced() {
                if !scratch.is_empty() {
                    scratch.push_str(", ");
                }
                // Rule names are validated printable ASCII without `"` or `\`,
                // so they are valid sf-strings as they are.
                scratch.push('"');
                scratch.push_str(r.rule.name());
                scratch.push_str("\";q=");
                push_u64(scratch, r.rule.limit());
                // A concurrency quota is slots in flight, not requests per
                // window: it has no `w`.
                // Nor has a calendar quota: its period's length varies.
                if !r.rule.spec().algorithm.holds_leases() && r.rule.calendar().is_none() {
                    scratch.push_str(";w=");
                    push_u64(scratch, whole_secs(r.rule.window()));
                }
                // The tier in force (a parameter clients ignore unless
                // they know it), or that an override is.
                if let Some(t) = r.rule.tier() {
                    scratch.push_str(";tier=\"");
                    scratch.push_str(t);
                    scratch.push('"');
                } else if r.rule.is_override() {
                    scratch.push_str(";override");
                }
            }
            field("ratelimit-policy", FieldRef::Text(scratch));
            scratch.clear();
            for r in self.enforced() {
                if !scratch.is_empty() {
                    scratch.push_str(", ");
                }
                let mut t = whole_secs(r.reset_after);
                if !r.allowed() {
                    t = t.max(whole_secs(r.retry_after.unwrap_or(r.reset_after)).max(1));
                }
                scratch.push('"');
                scratch.push_str(r.rule.name());
                scratch.push_str("\";r=");
                push_u64(scratch, r.remaining);
                scratch.push_str(";t=");
                push_u64(scratch, t);
            }
            field("ratelimit", FieldRef::Text(scratch));
        }
    }

    /// The RFC 9457 problem body of a rejection (`application/problem+json`)
    /// answered with `status`, titled `title` (the status's reason phrase:
    /// the front end's to choose, the core knows no HTTP); `None` when the
    /// request was admitted.
    ///
    /// ```
    /// # use std::time::Duration;
    /// # use ratewarden::{Decision, Reason, Rule, RuleDecision};
    /// # let rule = Rule::builder("api").limit(5, Duration::from_secs(10)).build().unwrap();
    /// # let d = Decision { allowed: false, delay: Duration::ZERO, rules: vec![RuleDecision {
    /// #     rule, key: "k".into(), reason: Some(Reason::Limit), remaining: 0,
    /// #     reset_after: Duration::from_secs(2), retry_after: Some(Duration::from_millis(1500)), lease: None }] };
    /// let body = d.problem_json(429, "Too Many Requests").unwrap();
    /// assert!(body.contains(r#""title":"Too Many Requests","status":429,"#), "{body}");
    /// assert!(body.ends_with(r#""rule":"api","retry_after":2}"#), "{body}");
    /// ```
    pub fn problem_json(&self, status: u16, title: &str) -> Option<String> {
        let mut body = String::with_capacity(256);
        self.push_problem_json(status, title, &mut body)
            .then_some(body)
    }

    /// Appends [`problem_json`](Self::problem_json) to `body` (a buffer the
    /// caller reuses: no allocation once it has grown); false (and nothing
    /// appended) when the request was admitted.
    pub fn push_problem_json(&self, status: u16, title: &str, body: &mut String) -> bool {
        let (Some(retry), Some(first)) = (self.retry_after_secs(), self.violated().next()) else {
            return false;
        };
        match &first.rule.spec().problem_type {
            Some(t) => {
                body.push_str("{\"type\":");
                push_json_string(body, t);
                body.push_str(",\"title\":");
            }
            None => body.push_str(
                "{\"type\":\"https://iana.org/assignments/http-problem-types#quota-exceeded\",\"title\":",
            ),
        }
        push_json_string(body, title);
        body.push_str(",\"status\":");
        push_u64(body, u64::from(status));
        body.push_str(",\"violated-policies\":[");
        for (i, r) in self.violated().enumerate() {
            if i > 0 {
                body.push(',');
            }
            push_json_string(body, r.rule.name());
        }
        body.push_str("],\"rule\":");
        push_json_string(body, first.rule.name());
        if let Some(t) = first.rule.tier() {
            body.push_str(",\"tier\":");
            push_json_string(body, t);
        } else if first.rule.is_override() {
            body.push_str(",\"override\":true");
        }
        body.push_str(",\"retry_after\":");
        push_u64(body, retry);
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
            Some(Reason::Full) => Some(format!(
                "the limiter holds as many keys as it may, each banned or at its limit, so rule {} \
                 cannot count a new one; retry in {retry} s",
                first.rule.name()
            )),
            _ if first.rule.spec().penalty.is_some() => Some(format!(
                "limit of rule {} exceeded; banned for {retry} s",
                first.rule.name()
            )),
            _ => None,
        };
        if let Some(d) = detail {
            body.push_str(",\"detail\":");
            push_json_string(body, &d);
        }
        body.push('}');
        true
    }
}

/// The value of one rate-limit header.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum HeaderField {
    /// A count or a number of seconds (`X-RateLimit-*`, `Retry-After`).
    Number(u64),
    /// A structured field (`RateLimit-Policy`, `RateLimit`).
    Text(String),
}

/// The value of one rate-limit header, lent (see
/// [`Decision::visit_header_fields`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FieldRef<'a> {
    /// A count or a number of seconds.
    Number(u64),
    /// A structured field: always a valid header value (visible ASCII),
    /// since it is made of rule and tier names, which
    /// [`Rule::new`](crate::Rule) takes only as printable ASCII without
    /// quotes or backslashes, and of numbers.
    Text(&'a str),
}

impl FieldRef<'_> {
    /// An owned copy.
    pub fn into_owned(self) -> HeaderField {
        match self {
            Self::Number(n) => HeaderField::Number(n),
            Self::Text(t) => HeaderField::Text(t.to_owned()),
        }
    }
}

impl std::fmt::Display for FieldRef<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::Number(n) => write!(f, "{n}"),
            Self::Text(t) => f.write_str(t),
        }
    }
}

impl HeaderField {
    /// The value as header text.
    pub fn into_string(self) -> String {
        match self {
            Self::Number(n) => number(n),
            Self::Text(t) => t,
        }
    }
}

impl std::fmt::Display for HeaderField {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::Number(n) => write!(f, "{n}"),
            Self::Text(t) => f.write_str(t),
        }
    }
}

/// `n` in decimal.
fn number(n: u64) -> String {
    let mut s = String::with_capacity(20);
    push_u64(&mut s, n);
    s
}

/// Appends `n` in decimal, without the formatting machinery.
fn push_u64(out: &mut String, n: u64) {
    out.push_str(itoa::Buffer::new().format(n));
}

/// `s` as a JSON string literal.
///
/// ```
/// assert_eq!(ratewarden::decision::json_string("a\"b\n"), r#""a\"b\n""#);
/// ```
pub fn json_string(s: &str) -> String {
    let mut out = String::with_capacity(s.len() + 2);
    push_json_string(&mut out, s);
    out
}

/// Appends `s` as a JSON string literal.
fn push_json_string(out: &mut String, s: &str) {
    out.push('"');
    push_json_escaped(out, s);
    out.push('"');
}

/// Appends `s` as the inside of a JSON string: quotes, backslashes and
/// control characters (DEL too) escaped. The one JSON escaper of the
/// project (the gateway's access log uses it for values that need it).
///
/// ```
/// let mut out = String::new();
/// ratewarden::decision::push_json_escaped(&mut out, "a\"b\u{7f}");
/// assert_eq!(out, r#"a\"b\u007f"#);
/// ```
pub fn push_json_escaped(out: &mut String, s: &str) {
    // Rule names and titles almost never need escaping: copy them whole.
    if !s
        .bytes()
        .any(|b| b == b'"' || b == b'\\' || b < 0x20 || b == 0x7f)
    {
        out.push_str(s);
        return;
    }
    for c in s.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            '\t' => out.push_str("\\t"),
            c if (c as u32) < 0x20 || c == '\u{7f}' => {
                let _ = write!(out, "\\u{:04x}", c as u32);
            }
            c => out.push(c),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn json_strings_are_escaped_only_where_needed() {
        let json = |s: &str| {
            let mut out = String::new();
            push_json_string(&mut out, s);
            out
        };
        assert_eq!(json("per-client"), "\"per-client\"");
        assert_eq!(json("é ü"), "\"é ü\"");
        assert_eq!(json("a\"b\\c\nd\u{1}"), "\"a\\\"b\\\\c\\nd\\u0001\"");
    }

    #[test]
    fn push_u64_writes_every_digit_count() {
        for n in [0, 7, 10, 99, 1_000_000, u64::MAX] {
            assert_eq!(number(n), n.to_string());
        }
    }
}
