//! What a rule keys on and what it matches: key parts, matchers, hosts,
//! conditions, and the linear-time regexes they may use.

use http::{HeaderName, Method};
use ratewarden_tower::path;

use super::super::diag::{Diag, suggest};
use super::super::model::*;
use super::super::schema::*;

/// A `key:` part as the config writes it; `matcher` (the rule's, when it is
/// valid) names the captures `path:NAME` may take.
pub(super) fn key_part(text: &str, matcher: Option<&Matcher>) -> Result<KeyPart, String> {
    use ratewarden_tower::policy::KeyPartError;
    let part = text.parse::<KeyPart>().map_err(|e| match &e {
        KeyPartError::Unknown(t) => match suggest(t, KeyPartError::PLAIN) {
            Some(s) => format!("unknown key part `{t}`; did you mean `{s}`?"),
            None => e.to_string(),
        },
        KeyPartError::UnknownKind(kind, name) => match suggest(kind, KeyPartError::NAMED) {
            Some(s) => format!("unknown key part `{text}`; did you mean `{s}:{name}`?"),
            None => e.to_string(),
        },
        _ => e.to_string(),
    })?;
    // `path:NAME` names a capture of the rule's own `path_regex`.
    let KeyPart::Capture(name) = &part else {
        return Ok(part);
    };
    let captures: Vec<&str> = match matcher.map(|m| &m.path) {
        Some(PathMatch::Regex(re)) => re.capture_names().flatten().collect(),
        Some(_) => {
            return Err(format!(
                "`{text}` takes a named group of the rule's `path_regex`, and the rule has none"
            ));
        }
        // The matcher's own error is reported.
        None => return Ok(part),
    };
    if captures.contains(&name.as_str()) {
        Ok(part)
    } else if captures.is_empty() {
        Err(format!(
            "`{text}`: the rule's `path_regex` has no named group; write `(?P<{name}>...)`"
        ))
    } else {
        Err(format!(
            "`{text}`: the rule's `path_regex` captures {}",
            captures
                .iter()
                .map(|c| format!("`path:{c}`"))
                .collect::<Vec<_>>()
                .join(", ")
        ))
    }
}

/// A `match:`; `routes` are the names its `route` may take (besides
/// `default`).
pub(super) fn matcher(d: &Diag<'_>, m: &Sp<MatchFile>, routes: &[String]) -> Option<Matcher> {
    let at = Some(&m.referenced);
    let m = &m.value;
    let route = match &m.route {
        None => Some(None),
        Some(r) if r.value == super::super::DEFAULT_ROUTE || routes.contains(&r.value) => {
            Some(Some(r.value.clone()))
        }
        Some(r) => {
            let hint = match suggest(&r.value, routes.iter().map(String::as_str)) {
                Some(s) => format!("; did you mean `{s}`?"),
                None => String::new(),
            };
            d.error(
                "route",
                Some(&r.referenced),
                format!("no route `{}`{hint}", r.value),
            );
            None
        }
    };
    let case_insensitive = m.case_insensitive.as_ref().is_some_and(|c| c.value);
    let mut methods = Some(vec![]);
    for meth in m.methods.iter().flatten() {
        let upper = meth.value.to_ascii_uppercase();
        let parsed = if is_token(&upper) {
            Method::from_bytes(upper.as_bytes()).ok()
        } else {
            None
        };
        match parsed {
            Some(x) => {
                if let Some(v) = methods.as_mut() {
                    v.push(x);
                }
            }
            None => {
                d.error(
                    "methods",
                    Some(&meth.referenced),
                    format!(
                        "`{}` is not a method (a token like GET or POST)",
                        meth.value
                    ),
                );
                methods = None;
            }
        }
    }
    let given = [&m.path, &m.path_prefix, &m.path_regex];
    if given.iter().filter(|g| g.is_some()).count() > 1 {
        d.error(
            "match",
            at,
            "use one of `path`, `path_prefix`, `path_regex`",
        );
        return None;
    }
    // A literal path condition is compared with the normalised request
    // path: one written otherwise could never match.
    let literal = |key: &str, p: &Sp<String>| -> Option<String> {
        let v = &p.value;
        if key == "path" && v == "*" {
            // `OPTIONS *` (asterisk form) is seen as the path `*`.
            return Some(v.clone());
        }
        if !v.starts_with('/') {
            d.error(
                key,
                Some(&p.referenced),
                format!("`{v}` must start with `/`: request paths always do"),
            );
            return None;
        }
        match path::normalize(v) {
            Ok(n) if n == v.as_str() => {}
            Ok(n) => {
                d.error(
                    key,
                    Some(&p.referenced),
                    format!("`{v}` can never match: rules see normalised paths; write `{n}`"),
                );
                return None;
            }
            Err(e) => {
                d.error(key, Some(&p.referenced), format!("`{v}`: {e}"));
                return None;
            }
        }
        Some(if case_insensitive {
            v.to_ascii_lowercase()
        } else {
            v.clone()
        })
    };
    let path = if let Some(p) = &m.path {
        PathMatch::Exact(literal("path", p)?)
    } else if let Some(p) = &m.path_prefix {
        PathMatch::Prefix(literal("path_prefix", p)?)
    } else if let Some(p) = &m.path_regex {
        PathMatch::Regex(linear_regex(d, "path_regex", p, case_insensitive)?)
    } else {
        if let Some(c) = &m.case_insensitive {
            d.error(
                "case_insensitive",
                Some(&c.referenced),
                "does nothing without `path`, `path_prefix` or `path_regex`",
            );
            return None;
        }
        PathMatch::Any
    };
    let hosts = m
        .hosts
        .as_ref()
        .map_or(Some(vec![]), |h| host_patterns(d, h));
    let headers = conditions(d, "headers", m.headers.as_deref());
    let query = conditions(d, "query", m.query.as_deref());
    let json = conditions(d, "json", m.json.as_deref());
    Some(Matcher {
        methods: methods?,
        path,
        case_insensitive,
        route: route?,
        hosts: hosts?,
        headers: headers?,
        query: query?,
        json: json?,
    })
}

/// `hosts:`: each an exact name or `*.suffix`, ASCII case-insensitive
/// (held lower case, without a trailing dot or a port).
pub(super) fn host_patterns(d: &Diag<'_>, hosts: &[Sp<String>]) -> Option<Vec<HostPattern>> {
    let mut out = Some(vec![]);
    if hosts.is_empty() {
        d.error(
            "hosts",
            None,
            "an empty list matches nothing; leave `hosts` out to match any host",
        );
        return None;
    }
    for h in hosts {
        let v = h.value.trim().to_ascii_lowercase();
        let (suffix, name) = match v.strip_prefix("*.") {
            Some(rest) => (true, rest.trim_end_matches('.')),
            None => (false, v.trim_end_matches('.')),
        };
        // A name: letters, digits, `-`, `_` and dots between labels; or an
        // IPv6 literal in brackets.
        let label_ok = |l: &str| {
            !l.is_empty()
                && l.bytes()
                    .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_')
        };
        let ipv6 = !suffix
            && name.starts_with('[')
            && name.ends_with(']')
            && name[1..name.len() - 1]
                .parse::<std::net::Ipv6Addr>()
                .is_ok();
        let problem = if name.is_empty() && suffix {
            Some("`*.` alone names no domain: write `*.example.com`".to_owned())
        } else if name.is_empty() {
            Some("an empty host matches nothing".to_owned())
        } else if name.contains(':') && !ipv6 {
            Some(format!(
                "`{}`: hosts are matched without their port; write `{}`",
                h.value,
                name.split(':').next().unwrap_or("")
            ))
        } else if !ipv6 && !name.split('.').all(label_ok) {
            Some(format!(
                "`{}` is not a host name (letters, digits and `-` between dots, or `*.` before one)",
                h.value
            ))
        } else {
            None
        };
        match problem {
            Some(m) => {
                d.error("hosts", Some(&h.referenced), m);
                out = None;
            }
            None => {
                if let Some(o) = out.as_mut() {
                    o.push(if suffix {
                        HostPattern::Suffix(format!(".{name}"))
                    } else {
                        HostPattern::Exact(name.to_owned())
                    });
                }
            }
        }
    }
    out
}

/// A regex of the config (`path_regex`, a condition's `regex`): linear time
/// (the `regex` crate), its compiled size bounded so that a config cannot
/// make matching blow up; an invalid one is an error at `key`.
pub(super) fn linear_regex(
    d: &Diag<'_>,
    key: &str,
    p: &Sp<String>,
    case_insensitive: bool,
) -> Option<regex::Regex> {
    match regex::RegexBuilder::new(&p.value)
        .size_limit(1 << 20)
        .case_insensitive(case_insensitive)
        .build()
    {
        Ok(re) => Some(re),
        Err(e) => {
            let first = e
                .to_string()
                .lines()
                .last()
                .unwrap_or("invalid")
                .trim()
                .to_owned();
            d.error(
                key,
                Some(&p.referenced),
                format!("invalid regex `{}`: {first}", p.value),
            );
            None
        }
    }
}

/// `headers:` or `query:` (`key`): each a name and exactly one of
/// `exact`, `prefix`, `regex`, `present`, perhaps `invert`.
pub(super) fn conditions(
    d: &Diag<'_>,
    key: &str,
    list: Option<&[Sp<ConditionFile>]>,
) -> Option<Vec<Condition>> {
    let mut out = Some(vec![]);
    for c in list.unwrap_or_default() {
        let at = Some(&c.referenced);
        let c = &c.value;
        let name = c.name.value.trim();
        let name = if key == "headers" {
            match HeaderName::from_bytes(name.as_bytes()) {
                Ok(n) => Some(n.as_str().to_owned()),
                Err(_) => {
                    d.error(
                        key,
                        Some(&c.name.referenced),
                        format!("`{name}` is not a header name"),
                    );
                    None
                }
            }
        } else if name.is_empty() {
            d.error(
                key,
                Some(&c.name.referenced),
                if key == "json" {
                    "a json condition needs the field's `name` (`model`, `metadata.user_id`)"
                } else {
                    "a query condition needs the parameter's `name`"
                },
            );
            None
        } else {
            Some(name.to_owned())
        };
        let given = [
            c.exact.is_some(),
            c.prefix.is_some(),
            c.regex.is_some(),
            c.present.is_some(),
        ];
        let test = match given.iter().filter(|g| **g).count() {
            1 => {
                if let Some(x) = &c.exact {
                    Some(Test::Exact(x.value.clone()))
                } else if let Some(x) = &c.prefix {
                    Some(Test::Prefix(x.value.clone()))
                } else if let Some(x) = &c.present {
                    Some(Test::Present(x.value))
                } else {
                    let x = c.regex.as_ref().expect("one given");
                    linear_regex(d, key, x, false).map(Test::Regex)
                }
            }
            n => {
                let which = if n == 0 { "needs" } else { "takes only" };
                d.error(
                    key,
                    at,
                    format!(
                        "`{}` {which} one of `exact`, `prefix`, `regex`, `present`",
                        c.name.value
                    ),
                );
                None
            }
        };
        match (name, test) {
            (Some(name), Some(test)) => {
                if let Some(o) = out.as_mut() {
                    o.push(Condition {
                        name,
                        test,
                        invert: c.invert.as_ref().is_some_and(|i| i.value),
                    });
                }
            }
            _ => out = None,
        }
    }
    out
}

/// Whether `m` is a method token (RFC 9110 §9.1: a `tchar` sequence).
pub(super) fn is_token(m: &str) -> bool {
    !m.is_empty()
        && m.bytes()
            .all(|b| b.is_ascii_alphanumeric() || b"!#$%&'*+-.^_`|~".contains(&b))
}
