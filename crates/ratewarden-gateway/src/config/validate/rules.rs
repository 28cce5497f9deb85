//! `rules:`: each rule's algorithm, limit and modifiers, its tiers and
//! its calendar.

use std::num::NonZeroU64;
use std::str::FromStr;
use std::time::Duration;

use ratewarden::algorithm::Kind;
use ratewarden::{Counting, Penalty, Rule, RuleSpec};
use serde_saphyr::Location;

use super::super::diag::{Diag, parse_duration, suggest};
use super::super::model::*;
use super::super::schema::*;
use super::keys::{key_part, matcher};
use super::opt;

/// `distribution: {mode: lease, epsilon, max_share}` (rules and Envoy
/// limits alike): epsilon 0.01 and max_share 0.25 unless given. Their
/// ranges are the rule's to check (`Rule::new`), as every parameter's.
pub(crate) fn distribution(f: &DistributionFile) -> Result<ratewarden::Distribution, String> {
    if f.mode != "lease" {
        return Err(format!(
            "unknown `distribution.mode` `{}`: the one mode is `lease`",
            f.mode
        ));
    }
    Ok(ratewarden::Distribution::lease(
        f.epsilon.unwrap_or(0.01),
        f.max_share.unwrap_or(0.25),
    ))
}

/// Where a rule's key is written (for errors the rule builder finds).
pub(super) fn rule_location<'r>(r: &'r RuleFile, key: &str) -> &'r Location {
    let at = match key {
        "window" => r.window.as_ref().map(|w| &w.referenced),
        "limit" => r.limit.as_ref().map(|l| &l.referenced),
        "calendar" => r.calendar.as_ref().map(|c| &c.referenced),
        "status" => r.status.as_ref().map(|c| &c.referenced),
        "burst" => r.burst.as_ref().map(|b| &b.referenced),
        "mode" => r.mode.as_ref().map(|m| &m.referenced),
        "max_delay" => r.max_delay.as_ref().map(|m| &m.referenced),
        "min_interval" => r.min_interval.as_ref().map(|m| &m.referenced),
        "penalty" => r.penalty.as_ref().map(|p| &p.referenced),
        "cost" => r.cost.as_ref().map(|c| &c.referenced),
        "max_hold" => r.max_hold.as_ref().map(|m| &m.referenced),
        "distribution" => r.distribution.as_ref().map(|m| &m.referenced),
        "count" => r.count.as_ref().map(|c| &c.referenced),
        "count_rejected" => r.count_rejected.as_ref().map(|c| &c.referenced),
        _ => None,
    };
    at.unwrap_or(&r.name.referenced)
}

/// A rule, compiled: its policy rule, its cost read from the answer (if
/// any), and the shape of its refusals.
pub(super) struct Compiled {
    pub(super) rule: PolicyRule,
    pub(super) cost: Option<super::super::cost::CostSpec>,
    pub(super) refusal: super::super::cost::RefusalShape,
    /// `jwt_required: true`.
    pub(super) jwt_required: bool,
}

pub(super) fn rule(
    d: &Diag<'_>,
    r: RuleFile,
    routes: &[String],
    hasher: Option<&KeyHasher>,
    has: super::Sections,
) -> Option<Compiled> {
    let has_jwt = has.jwt;
    // A tiered rule without its own limit takes each tier's.
    let own = if r.limit.is_some() || r.tiers.is_none() {
        rule_spec(d, &r, None).map(Some)
    } else {
        Some(None)
    };
    let failure_status = match &r.failure_status {
        None => Some(ratewarden_tower::policy::DEFAULT_FAILURES.to_vec()),
        Some(list) => {
            let mut out = Some(vec![]);
            for s in list {
                if (100..600).contains(&s.value) {
                    if let Some(o) = out.as_mut() {
                        o.push((s.value as u16, s.value as u16));
                    }
                } else {
                    d.error(
                        "failure_status",
                        Some(&s.referenced),
                        format!("{} is not an HTTP status", s.value),
                    );
                    out = None;
                }
            }
            out
        }
    };
    let failure_grpc = match &r.failure_grpc_status {
        None => Some(ratewarden_tower::policy::DEFAULT_GRPC_FAILURES.to_vec()),
        Some(list) => {
            let mut out = Some(vec![]);
            for c in list {
                if (1..=16).contains(&c.value) {
                    if let Some(o) = out.as_mut() {
                        o.push(c.value as u16);
                    }
                } else {
                    d.error(
                        "failure_grpc_status",
                        Some(&c.referenced),
                        format!(
                            "{} is not a gRPC error code (1-16; 0 is OK, a success)",
                            c.value
                        ),
                    );
                    out = None;
                }
            }
            out
        }
    };
    let matcher = match &r.matcher {
        None => Some(Matcher::any()),
        Some(m) => matcher(d, m, routes),
    };
    let key = match &r.key {
        None => Some(vec![KeyPart::Identity]),
        Some(parts) => {
            let mut out = Some(vec![]);
            for p in parts {
                let part = match &p.value {
                    KeyPartFile::Plain(text) => match key_part(text, matcher.as_ref()) {
                        Ok(KeyPart::Jwt(_)) if !has_jwt => Err(format!(
                            "`{text}` needs a top-level `jwt:` section (where the token is, its keys)"
                        )),
                        Ok(KeyPart::Consumer | KeyPart::ConsumerTier) if !has.consumers => Err(format!(
                            "`{text}` needs a top-level `consumers:` section (where the API key is)"
                        )),
                        other => other,
                    },
                    KeyPartFile::Hashed(h) => match (key_part(&h.hash, matcher.as_ref()), hasher) {
                        (Ok(part @ (KeyPart::Header(_) | KeyPart::Query(_) | KeyPart::Cookie(_))), Some(hasher)) => {
                            Ok(KeyPart::Hashed(Box::new(part), hasher.clone()))
                        }
                        (Ok(KeyPart::Header(_) | KeyPart::Query(_) | KeyPart::Cookie(_)), None) => Err(
                            "a hashed key part needs `key_secret:` (top level; e.g. `key_secret: ${RATEWARDEN_KEY_SECRET}`)"
                                .to_owned(),
                        ),
                        (Ok(other), _) => Err(format!(
                            "`{other}` is not a credential: hash a header:, query: or cookie: part"
                        )),
                        (Err(e), _) => Err(e),
                    },
                };
                match part {
                    Ok(k) => {
                        if let Some(o) = out.as_mut() {
                            o.push(k);
                        }
                    }
                    Err(m) => {
                        d.error("key", Some(&p.referenced), m);
                        out = None;
                    }
                }
            }
            out
        }
    };
    let tiers = opt(&r.tiers, |t| tiers(d, &r, t, matcher.as_ref(), has));
    let missing = match r.missing.as_ref().map(|m| (m.value.as_str(), m)) {
        None | Some(("identity", _)) => Some(MissingPart::Identity),
        Some(("anonymous", _)) => Some(MissingPart::Anonymous),
        Some(("skip", _)) => Some(MissingPart::Skip),
        Some(("reject", _)) => Some(MissingPart::Reject),
        Some((other, m)) => {
            let hint = match suggest(other, ["identity", "anonymous", "skip", "reject"]) {
                Some(s) => format!("; did you mean `{s}`?"),
                None => String::new(),
            };
            d.error(
                "missing",
                Some(&m.referenced),
                format!(
                    "`{other}`: a missing key part is identity, anonymous, skip or reject{hint}"
                ),
            );
            None
        }
    };
    let tiers = tiers?;
    let rule = match (own?, &tiers) {
        (Some(rule), _) => rule,
        (None, Some(t)) => {
            let first = t.values[t.default]
                .rule
                .clone()
                .or_else(|| t.values.iter().find_map(|v| v.rule.clone()));
            match first {
                Some(r) => r,
                None => {
                    d.error(
                        "tiers",
                        Some(&r.name.referenced),
                        format!("rule `{}`: every tier is unlimited; give one a limit, or remove the rule", r.name.value),
                    );
                    return None;
                }
            }
        }
        (None, None) => return None,
    };
    let from_answer = super::cost::from_answer(
        d,
        &r.name.value,
        r.cost.as_ref(),
        Some(rule.spec().algorithm),
    );
    let refusal = super::cost::refusal(d, r.refusal.as_ref());
    let jwt_required = match &r.jwt_required {
        Some(j) if j.value && !has_jwt => {
            d.error(
                "jwt_required",
                Some(&j.referenced),
                "`jwt_required` needs a `jwt:` section: the tokens are verified with its keys",
            );
            None
        }
        j => Some(j.as_ref().is_some_and(|j| j.value)),
    };
    let (cost, by_answer) = match from_answer? {
        Some((spec, reserve)) => (
            Some(spec),
            Some(ratewarden_tower::policy::ByAnswer { reserve }),
        ),
        None => (None, None),
    };
    Some(Compiled {
        rule: PolicyRule {
            rule,
            matcher: matcher?,
            key: key?,
            failure_status: failure_status?,
            failure_grpc: failure_grpc?,
            missing: missing?,
            tiers: tiers.map(Box::new),
            by_answer,
        },
        cost,
        refusal: refusal?,
        jwt_required: jwt_required?,
    })
}

/// `calendar:`: a period, a zone (UTC by default) and its anchors.
pub(super) fn calendar(
    d: &Diag<'_>,
    c: &Sp<super::super::schema::CalendarFile>,
) -> Option<ratewarden::calendar::Calendar> {
    use ratewarden::calendar::{Calendar, Period};
    let f = &c.value;
    let Some(period) = Period::parse(&f.period.value) else {
        let hint = match suggest(&f.period.value, ["day", "week", "month", "year"]) {
            Some(s) => format!("; did you mean `{s}`?"),
            None => " (day, week, month or year)".to_owned(),
        };
        d.error(
            "calendar.period",
            Some(&f.period.referenced),
            format!("`{}` is not a calendar period{hint}", f.period.value),
        );
        return None;
    };
    let zone = f.timezone.as_ref().map_or("UTC", |z| z.value.as_str());
    Calendar::new(
        period,
        zone,
        f.anchor_day.as_ref().map(|a| a.value),
        f.anchor_month.as_ref().map(|a| a.value),
        f.anchor_weekday.as_ref().map(|a| a.value.as_str()),
    )
    .map_err(|e| {
        let at = match e.key {
            "timezone" => f.timezone.as_ref().map(|z| &z.referenced),
            "anchor_day" => f.anchor_day.as_ref().map(|z| &z.referenced),
            "anchor_month" => f.anchor_month.as_ref().map(|z| &z.referenced),
            "anchor_weekday" => f.anchor_weekday.as_ref().map(|z| &z.referenced),
            _ => None,
        };
        d.error(
            &format!("calendar.{}", e.key),
            Some(at.unwrap_or(&c.referenced)),
            e.message,
        );
    })
    .ok()
}

/// `tiers:`: where the value is, the default tier, and each tier
/// compiled as a rule of its own (its parameters over the rule's).
pub(super) fn tiers(
    d: &Diag<'_>,
    r: &RuleFile,
    t: &Sp<super::super::schema::TiersFile>,
    matcher: Option<&Matcher>,
    has: super::Sections,
) -> Option<ratewarden_tower::policy::Tiers> {
    use super::super::schema::TierFile;
    use ratewarden_tower::policy::{Tier, Tiers};
    let f = &t.value;
    let from = match key_part(&f.from.value, matcher) {
        Ok(KeyPart::Identity) => Err("a tier comes from a request value (header:NAME, jwt:CLAIM, query:NAME, cookie:NAME, host), not the identity".to_owned()),
        Ok(KeyPart::Jwt(_)) if !has.jwt => Err(format!(
            "`{}` needs a top-level `jwt:` section (where the token is, its keys)",
            f.from.value
        )),
        // `from: consumer`: the consumer's tier.
        Ok(KeyPart::Consumer | KeyPart::ConsumerTier) if !has.consumers => Err(format!(
            "`{}` needs a top-level `consumers:` section (where the API key is)",
            f.from.value
        )),
        Ok(KeyPart::Consumer) => Ok(KeyPart::ConsumerTier),
        other => other,
    };
    let from = d.check("tiers.from", Some(&f.from.referenced), from);
    if f.values.is_empty() {
        d.error(
            "tiers.values",
            Some(&t.referenced),
            "`tiers.values` names no tier",
        );
        return None;
    }
    let mut values = Some(vec![]);
    for (name, tier) in &f.values {
        let compiled = match &tier.value {
            TierFile::Unlimited => Some(None),
            TierFile::Params(p) => {
                if let Some(c) = &p.cost
                    && matches!(c.value, CostFile::From(_))
                {
                    d.error(
                        "cost",
                        Some(&c.referenced),
                        "a tier's `cost` is a number: where an answer's cost is read is the rule's",
                    );
                }
                let mut over = r.clone();
                over.tiers = None;
                macro_rules! lay {
                    ($($field:ident),*) => { $( if p.$field.is_some() { over.$field = p.$field.clone(); } )* };
                }
                lay!(
                    algorithm,
                    limit,
                    window,
                    burst,
                    mode,
                    max_delay,
                    min_interval,
                    penalty,
                    cost,
                    calendar,
                    status,
                    problem_type
                );
                rule_spec(d, &over, Some(name)).map(Some)
            }
        };
        match (compiled, values.as_mut()) {
            (Some(rule), Some(v)) => v.push(Tier {
                name: name.clone(),
                rule,
            }),
            (None, _) => values = None,
            _ => {}
        }
    }
    let default = match &f.default {
        None => {
            d.error(
                "tiers.default",
                Some(&t.referenced),
                "`tiers` needs a `default`: the tier of a request whose value names none (or has none)",
            );
            None
        }
        Some(default) => {
            let at = f.values.keys().position(|n| *n == default.value);
            if at.is_none() {
                let names: Vec<&str> = f.values.keys().map(String::as_str).collect();
                d.error(
                    "tiers.default",
                    Some(&default.referenced),
                    format!(
                        "`{}` is not one of the tiers ({})",
                        default.value,
                        names.join(", ")
                    ),
                );
            }
            at
        }
    };
    Some(Tiers {
        from: from?,
        default: default?,
        values: values?,
    })
}

/// A rule's parameters compiled: the rule's own (`tier` None), or a
/// tier's (its parameters laid over the rule's in `r`).
pub(super) fn rule_spec(d: &Diag<'_>, r: &RuleFile, tier: Option<&str>) -> Option<Rule> {
    let kind = match &r.algorithm {
        None => Some(Kind::default()),
        Some(a) => match Kind::from_str(&a.value) {
            Ok(k) => Some(k),
            Err(_) => {
                let names = Kind::ALL.map(Kind::name);
                let hint = match suggest(&a.value, names) {
                    Some(s) => format!("; did you mean `{s}`?"),
                    None => format!(" ({})", names.join(", ")),
                };
                d.error(
                    "algorithm",
                    Some(&a.referenced),
                    format!("unknown algorithm `{}`{hint}", a.value),
                );
                None
            }
        },
    };
    let limit = match &r.limit {
        Some(l) => super::cost::limit_units(d, l, super::cost::priced(r.cost.as_ref())),
        None => {
            let at = r
                .tiers
                .as_ref()
                .map_or(&r.name.referenced, |t| &t.referenced);
            d.error(
                "limit",
                Some(at),
                match tier {
                    Some(t) => format!(
                        "tier `{t}` of rule `{}` needs `limit` (the rule sets none)",
                        r.name.value
                    ),
                    None => "`limit` is required here".to_owned(),
                },
            );
            None
        }
    };
    let calendar = opt(&r.calendar, |c| calendar(d, c));
    let concurrency = kind == Some(Kind::Concurrency);
    let distribution = opt(&r.distribution, |dist| {
        distribution(&dist.value)
            .map_err(|m| d.error("distribution", Some(&dist.referenced), m))
            .ok()
    });
    let max_hold = opt(&r.max_hold, |m| {
        let hold = d.duration("max_hold", m)?;
        if hold.is_zero() {
            d.error("max_hold", Some(&m.referenced), "must be longer than zero");
            return None;
        }
        Some(hold)
    });
    let window = match (&r.window, concurrency) {
        (Some(w), false) if r.calendar.is_some() => {
            d.error(
                "window",
                Some(&w.referenced),
                "a calendar quota's window is its period: leave `window` out",
            );
            None
        }
        (None, false) if r.calendar.is_some() => Some(Duration::from_secs(86_400)),
        (Some(w), false) => d.duration("window", w).and_then(|w_| {
            if w_.is_zero() {
                d.error("window", Some(&w.referenced), "must be longer than zero");
                None
            } else {
                Some(w_)
            }
        }),
        (None, false) => {
            d.error(
                "window",
                Some(&r.name.referenced),
                "`window` is required here",
            );
            None
        }
        (Some(w), true) => {
            d.error(
                "window",
                Some(&w.referenced),
                "a concurrency rule counts requests in flight, not per window: use `max_hold` for how long a lease may be held",
            );
            None
        }
        // A concurrency rule's window is its lease length (shown by
        // explain; headers leave it out).
        (None, true) => max_hold.map(|h| h.unwrap_or(ratewarden::rule::MAX_HOLD)),
    };
    let burst = opt(&r.burst, |b| {
        d.positive("burst", b).and_then(NonZeroU64::new)
    });
    let max_delay = match (r.mode.as_ref(), &r.max_delay) {
        (Some(m), max) if m.value == "delay" => match max {
            Some(x) => d.duration("max_delay", x).map(Some),
            None => window.map(Some),
        },
        (None, None) => Some(None),
        (Some(m), None) if m.value == "reject" => Some(None),
        (Some(m), Some(x)) if m.value == "reject" => {
            d.error(
                "max_delay",
                Some(&x.referenced),
                "`max_delay` needs `mode: delay`",
            );
            None
        }
        (None, Some(x)) => {
            d.error(
                "max_delay",
                Some(&x.referenced),
                "`max_delay` needs `mode: delay`",
            );
            None
        }
        (Some(m), _) => {
            d.error(
                "mode",
                Some(&m.referenced),
                format!("`{}`: expected reject or delay", m.value),
            );
            None
        }
    };
    let min_interval = opt(&r.min_interval, |m| d.duration("min_interval", m));
    let penalty = opt(&r.penalty, |p| {
        let at = Some(&p.referenced);
        let dur = |s: &str, key: &str| d.check(key, at, parse_duration(s));
        match &p.value {
            PenaltyFile::Plain(s) => dur(s, "penalty").map(Penalty::fixed),
            PenaltyFile::Full(full) => {
                let duration = dur(&full.duration, "penalty.duration");
                let max = opt(&full.max, |m| dur(m, "penalty.max"));
                let memory = opt(&full.memory, |m| dur(m, "penalty.memory"));
                let duration = duration?;
                Some(Penalty {
                    duration,
                    multiplier: full.multiplier.unwrap_or(1),
                    max: max?.unwrap_or(duration),
                    memory: memory?.unwrap_or(Duration::ZERO),
                })
            }
        }
    });
    let counting = match r.count.as_ref() {
        None => Some(false),
        Some(c) => d.choice("count", c, &[("all", false), ("failures", true)]),
    }
    .and_then(|failures| match (failures, &r.reset_on_success) {
        (true, reset) => Some(Counting::Failures {
            reset_on_success: reset.as_ref().is_none_or(|r| r.value),
        }),
        (false, None) => Some(Counting::All),
        (false, Some(x)) => {
            d.error(
                "reset_on_success",
                Some(&x.referenced),
                "`reset_on_success` needs `count: failures`",
            );
            None
        }
    });
    let status = opt(&r.status, |s| {
        if (400..600).contains(&s.value) {
            Some(s.value as u16)
        } else {
            d.error(
                "status",
                Some(&s.referenced),
                format!(
                    "{} is not an HTTP error status (400-599; 429 and 403 are usual)",
                    s.value
                ),
            );
            None
        }
    });
    let problem_type = opt(&r.problem_type, |t| {
        let v = t.value.trim();
        let ok = !v.is_empty()
            && v.bytes().all(|b| b.is_ascii_graphic())
            && (v.starts_with("https://")
                || v.starts_with("http://")
                || v.starts_with("urn:")
                || v.starts_with("tag:")
                || v.starts_with('/'));
        if ok {
            Some(v.to_owned())
        } else {
            d.error(
                "problem_type",
                Some(&t.referenced),
                "`problem_type` must be a URI (`https://...`, `urn:...` or a path)",
            );
            None
        }
    });
    let cost = super::cost::per_request(d, r.cost.as_ref());
    let spec = RuleSpec {
        name: r.name.value.clone(),
        algorithm: kind?,
        limit: NonZeroU64::new(limit?)?,
        window: window?,
        burst: burst?,
        max_delay: max_delay?,
        min_interval: min_interval?,
        penalty: penalty?,
        counting: counting?,
        count_rejected: r.count_rejected.as_ref().is_some_and(|c| c.value),
        cost: cost?,
        shadow: r.shadow.as_ref().is_some_and(|s| s.value),
        max_hold: max_hold?,
        distribution: distribution?,
        calendar: calendar?.map(std::sync::Arc::new),
        variant: tier.map(|t| ratewarden::Variant::Tier(t.to_owned())),
        status: status?,
        problem_type: problem_type?,
    };
    // Only a rule whose every part is valid gets here, so a mistake is not
    // reported twice.
    match Rule::new(spec) {
        Ok(rule) => Some(rule),
        Err(e) => {
            let which = match tier {
                Some(t) => format!("rule `{}` tier `{t}`", r.name.value),
                None => format!("rule `{}`", r.name.value),
            };
            d.error(
                e.key(),
                Some(rule_location(r, e.key())),
                format!("{which}: {e}"),
            );
            None
        }
    }
}
