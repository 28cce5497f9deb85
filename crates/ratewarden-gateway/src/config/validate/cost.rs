//! `cost:` and `limit:` of a rule charged by its answers (tokens, money,
//! a cost the upstream names), and `refusal:`, the shape its refusals take.

use std::num::NonZeroU64;

use ratewarden::algorithm::Kind;

use super::super::cost::{
    CostSource, CostSpec, Count, Dialect, LlmCost, MONEY, Price, RefusalShape,
};
use super::super::diag::{Diag, suggest};
use super::super::schema::*;

/// Whether `cost` prices tokens: the rule's limit is then money.
pub(super) fn priced(cost: Option<&Sp<CostFile>>) -> bool {
    matches!(cost.map(|c| &c.value), Some(CostFile::From(f)) if f.price.is_some())
}

/// A rule's `limit` in its units: a whole number; with a price, an amount
/// of money counted in millionths.
pub(super) fn limit_units(d: &Diag<'_>, l: &Sp<LimitFile>, money: bool) -> Option<u64> {
    let at = Some(&l.referenced);
    match (l.value, money) {
        (LimitFile::Whole(n), false) if n >= 1 => Some(n as u64),
        (LimitFile::Whole(n), true) if n >= 1 => (n as u64).checked_mul(MONEY),
        (LimitFile::Decimal(x), true) if x > 0.0 && x.is_finite() && x < 1e12 => {
            Some((x * MONEY as f64).round() as u64)
        }
        (LimitFile::Decimal(_), false) => {
            d.error(
                "limit",
                at,
                "a limit is a whole number (an amount with decimals only with `cost.price`)",
            );
            None
        }
        (LimitFile::Whole(n), _) => {
            d.error("limit", at, format!("must be a whole number >= 1, not {n}"));
            None
        }
        (LimitFile::Decimal(x), _) => {
            d.error("limit", at, format!("must be an amount above 0, not {x}"));
            None
        }
    }
}

/// The units a request costs under `cost` (1 for a cost read from the
/// answer: reserved and corrected per request instead).
pub(super) fn per_request(d: &Diag<'_>, cost: Option<&Sp<CostFile>>) -> Option<NonZeroU64> {
    match cost.map(|c| (&c.value, c)) {
        None | Some((CostFile::From(_), _)) => Some(NonZeroU64::MIN),
        Some((CostFile::Fixed(n), c)) => {
            if *n < 1 {
                d.error(
                    "cost",
                    Some(&c.referenced),
                    format!("must be a whole number >= 1, not {n}"),
                );
                return None;
            }
            NonZeroU64::new(*n as u64)
        }
    }
}

/// `refusal:`: the shape of the rule's refusals.
pub(super) fn refusal(d: &Diag<'_>, r: Option<&Sp<String>>) -> Option<RefusalShape> {
    let Some(r) = r else {
        return Some(RefusalShape::Problem);
    };
    d.choice(
        "refusal",
        r,
        &[
            ("problem", RefusalShape::Problem),
            ("openai", RefusalShape::OpenAi),
            ("anthropic", RefusalShape::Anthropic),
        ],
    )
}

/// `cost: {from: ...}` of rule `rule` (decided by `kind`): the spec, and
/// the units reserved where no estimate is made. `Some(None)`: a cost per
/// request (a number, or none).
pub(super) fn from_answer(
    d: &Diag<'_>,
    rule: &str,
    cost: Option<&Sp<CostFile>>,
    kind: Option<Kind>,
) -> Option<Option<(CostSpec, u64)>> {
    let Some(c) = cost else { return Some(None) };
    let CostFile::From(f) = &c.value else {
        return Some(None);
    };
    let at = Some(&c.referenced);
    if kind == Some(Kind::Concurrency) {
        d.error(
            "cost",
            at,
            "a `concurrency` rule counts requests in flight: its cost cannot come from the answer",
        );
        return None;
    }
    // Keys that belong to another source.
    let llm_only: [(&str, bool); 6] = [
        ("dialect", f.dialect.is_some()),
        ("count", f.count.is_some()),
        ("default_max_output", f.default_max_output.is_some()),
        ("cap_max_output", f.cap_max_output.is_some()),
        ("include_usage", f.include_usage.is_some()),
        ("price", f.price.is_some()),
    ];
    let misplaced = |from: &str, keys: &[(&str, bool)]| misplaced(d, at, from, keys);
    let reserved = |d: &Diag<'_>| match f.reserve.as_ref().map(|r| (r.value, r)) {
        None => Some(1),
        Some((ReserveFile::Units(n), _)) if n >= 1 => Some(n as u64),
        Some((_, r)) => {
            d.error(
                "reserve",
                Some(&r.referenced),
                "the units reserved at admission: a whole number >= 1",
            );
            None
        }
    };
    let (source, reserve) = match f.from.value.as_str() {
        "header" => {
            let ok = misplaced("header", &llm_only)
                & misplaced("header", &[("pointer", f.pointer.is_some())]);
            let name = match &f.header {
                Some(h) => match http::HeaderName::from_bytes(h.value.as_bytes()) {
                    Ok(n) => Some(n.as_str().to_owned()),
                    Err(_) => {
                        d.error(
                            "header",
                            Some(&h.referenced),
                            format!("`{}` is not a header name", h.value),
                        );
                        None
                    }
                },
                None => {
                    d.error("header", at, "`from: header` names its `header:`");
                    None
                }
            };
            let reserve = reserved(d);
            (CostSource::Header(name.filter(|_| ok)?), reserve?)
        }
        "json" => {
            let ok =
                misplaced("json", &llm_only) & misplaced("json", &[("header", f.header.is_some())]);
            let pointer = match &f.pointer {
                Some(p) if p.value.starts_with('/') => Some(p.value.clone()),
                Some(p) => {
                    d.error(
                        "pointer",
                        Some(&p.referenced),
                        "a JSON pointer starts with `/` (`/usage/total_tokens`)",
                    );
                    None
                }
                None => {
                    d.error(
                        "pointer",
                        at,
                        "`from: json` names its `pointer:` (`/usage/total_tokens`)",
                    );
                    None
                }
            };
            let reserve = reserved(d);
            (CostSource::Json(pointer.filter(|_| ok)?), reserve?)
        }
        "llm" => llm(d, f, at)?,
        other => {
            let hint = suggest(other, ["llm", "header", "json"])
                .map_or(String::new(), |s| format!("; did you mean `{s}`?"));
            d.error(
                "from",
                Some(&f.from.referenced),
                format!("`{other}`: a cost is read from `llm`, `header` or `json`{hint}"),
            );
            return None;
        }
    };
    Some(Some((
        CostSpec {
            rule: rule.to_owned(),
            source,
        },
        reserve,
    )))
}

/// Says which of `keys` (each: whether it was given) belong to another
/// `from:` than `from`; whether none was given.
fn misplaced(
    d: &Diag<'_>,
    at: Option<&serde_saphyr::Location>,
    from: &str,
    keys: &[(&str, bool)],
) -> bool {
    let mut ok = true;
    for (k, given) in keys {
        if *given {
            d.error(k, at, format!("`{k}` is for another `from:` than `{from}`"));
            ok = false;
        }
    }
    ok
}

/// `from: llm`, and what it reserves without an estimate.
fn llm(
    d: &Diag<'_>,
    f: &CostFromFile,
    at: Option<&serde_saphyr::Location>,
) -> Option<(CostSource, u64)> {
    let ok = misplaced(
        d,
        at,
        "llm",
        &[
            ("header", f.header.is_some()),
            ("pointer", f.pointer.is_some()),
        ],
    );
    let dialect = match &f.dialect {
        None => Some(Dialect::Auto),
        Some(v) => d.choice("dialect", v, &Dialect::NAMES),
    };
    let reserve = match f.reserve.as_ref().map(|r| (r.value, r)) {
        None => Some(true),
        Some((ReserveFile::On(b), _)) => Some(b),
        Some((_, r)) => {
            d.error(
                "reserve",
                Some(&r.referenced),
                "`reserve:` of `from: llm` is true or false",
            );
            None
        }
    };
    let default_max_output = match &f.default_max_output {
        None => Some(1024),
        Some(n) => d.positive("default_max_output", n),
    };
    let count = match (&f.count, &f.price) {
        (Some(c), Some(_)) => {
            d.error(
                "count",
                Some(&c.referenced),
                "give `count` or `price`, not both (a price weighs each kind of token)",
            );
            None
        }
        (None, None) => Some(Count::Weights {
            input: 1.0,
            cached_input: 1.0,
            output: 1.0,
        }),
        (Some(c), None) => match &c.value {
            CountFile::Kind(k) => match k.as_str() {
                "total" => Some(Count::Weights {
                    input: 1.0,
                    cached_input: 1.0,
                    output: 1.0,
                }),
                "input" => Some(Count::Weights {
                    input: 1.0,
                    cached_input: 1.0,
                    output: 0.0,
                }),
                "output" => Some(Count::Weights {
                    input: 0.0,
                    cached_input: 0.0,
                    output: 1.0,
                }),
                other => {
                    d.error("count", Some(&c.referenced), format!("`{other}`: count `input`, `output`, `total`, or weights (`{{input: 1, output: 4, cached_input: 0.1}}`)"));
                    None
                }
            },
            CountFile::Weights(w) => {
                let (input, output) = (w.input.unwrap_or(0.0), w.output.unwrap_or(0.0));
                let cached_input = w.cached_input.unwrap_or(input);
                let all = [input, output, cached_input];
                if all.iter().any(|x| !x.is_finite() || *x < 0.0) || all.iter().all(|x| *x == 0.0) {
                    d.error(
                        "count",
                        Some(&c.referenced),
                        "weights are numbers >= 0, not all 0",
                    );
                    None
                } else {
                    Some(Count::Weights {
                        input,
                        cached_input,
                        output,
                    })
                }
            }
        },
        (None, Some(p)) => {
            let mut prices: Vec<(String, Price)> = vec![];
            let mut good = true;
            for (pattern, price) in &p.value {
                let v = price.value;
                let cached = v.cached_input.unwrap_or(v.input);
                if [v.input, v.output, cached]
                    .iter()
                    .any(|x| !x.is_finite() || *x < 0.0)
                {
                    d.error(
                        "price",
                        Some(&price.referenced),
                        format!("`{pattern}`: prices are amounts >= 0 per million tokens"),
                    );
                    good = false;
                }
                prices.push((
                    pattern.clone(),
                    Price {
                        input: v.input,
                        cached_input: cached,
                        output: v.output,
                    },
                ));
            }
            if prices.is_empty() {
                d.error(
                    "price",
                    Some(&p.referenced),
                    "a price table names at least one model pattern (`\"*\"`: any)",
                );
                good = false;
            }
            // The most specific pattern first: the longest.
            prices.sort_by(|a, b| b.0.len().cmp(&a.0.len()).then(a.0.cmp(&b.0)));
            good.then_some(Count::Price(prices))
        }
    };
    let cost = LlmCost {
        dialect: dialect?,
        count: count?,
        reserve: reserve?,
        default_max_output: default_max_output?,
        cap_max_output: f.cap_max_output.as_ref().is_some_and(|c| c.value),
        include_usage: f.include_usage.as_ref().is_none_or(|c| c.value),
    };
    if !ok {
        return None;
    }
    let fallback = cost.fallback();
    Some((CostSource::Llm(cost), fallback))
}
