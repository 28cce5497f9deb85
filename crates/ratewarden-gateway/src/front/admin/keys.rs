//! Keys and what is held on them: `/v1/rules`, bans (listed, set,
//! lifted), the hottest keys, one key's state, and the overrides' listing.

use super::{MAX_LISTED, json_response, listing_limit, named_error, param, secs, unavailable};
use crate::answer::{Body, problem_response};
use crate::gateway::{Gateway, Live};
use http::{Method, Response, StatusCode};
use ratewarden::store::Shared;
use ratewarden::{Op, Store};
use serde::Deserialize;
use serde_json::{Value, json};

/// `POST /v1/bans`: a ban an operator sets.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct BanBody {
    rule: String,
    key: String,
    /// The client's identity, when the rule's key has more parts than it.
    identity: Option<String>,
    /// How long: `10m`, `1h`, `7d`.
    duration: String,
    /// Why, for the log.
    note: Option<String>,
}

/// `GET /v1/overrides[?rule=R]`: the overrides in force.
pub(super) fn list_overrides(gw: &Gateway, q: &[(String, String)]) -> Response<Body> {
    let now = gw.overrides.now();
    let list: Vec<Value> = gw
        .overrides
        .list(param(q, "rule"))
        .iter()
        .map(|(r, k, o)| crate::overrides::to_json(r, k, o, now))
        .collect();
    json_response(
        StatusCode::OK,
        &json!({"count": list.len(), "max": gw.overrides.max(), "overrides": list}),
    )
}

/// A change of overrides refused, or not stored.
pub(super) fn change_error(e: crate::overrides::ChangeError) -> Response<Body> {
    use ratewarden_tower::overrides::SetError;
    match e {
        crate::overrides::ChangeError::Set(SetError::Full(_)) => {
            problem_response(StatusCode::CONFLICT, &e.to_string())
        }
        crate::overrides::ChangeError::Set(SetError::Invalid(_)) => {
            problem_response(StatusCode::BAD_REQUEST, &e.to_string())
        }
        crate::overrides::ChangeError::Store(s) => unavailable(s),
    }
}

pub(super) fn rules(gw: &Gateway, live: &Live) -> Response<Body> {
    let banner = crate::gateway::banner(&live.config);
    let rules: Vec<Value> = live
        .config
        .policy
        .rules
        .iter()
        .zip(&banner.rules)
        .map(|(r, line)| {
            let s = r.rule.spec();
            json!({
                "name": s.name,
                "id": format!("{:016x}", r.rule.id()),
                "algorithm": s.algorithm.to_string(),
                "limit": s.limit.get(),
                "window": (!s.algorithm.holds_leases()).then(|| secs(s.window)),
                "burst": s.burst.map(|b| b.get()),
                "max_hold": s.max_hold.map(secs),
                "min_interval": s.min_interval.map(secs),
                "penalty": s.penalty.map(|p| json!({
                    "duration": secs(p.duration), "multiplier": p.multiplier,
                    "max": secs(p.max), "memory": secs(p.memory),
                })),
                "count": if r.rule.counts_failures() { "failures" } else { "all" },
                "count_rejected": s.count_rejected,
                "cost": s.cost,
                "shadow": s.shadow,
                "summary": line,
                "status": s.status.unwrap_or(live.config.status.as_u16()),
                "calendar": s.calendar.as_ref().map(|c| json!({"period": c.period_kind().name(), "timezone": c.zone()})),
                "tiers": r.tiers.as_ref().map(|t| json!({
                    "from": t.from.to_string(),
                    "default": t.values[t.default].name,
                    "values": t.values.iter().map(|v| json!({
                        "name": v.name,
                        "unlimited": v.rule.is_none(),
                        "limit": v.rule.as_ref().map(|r| r.limit()),
                        "window": v.rule.as_ref().map(|r| secs(r.window())),
                        "algorithm": v.rule.as_ref().map(|r| r.spec().algorithm.to_string()),
                    })).collect::<Vec<_>>(),
                })),
                "decisions": gw.metrics.decisions(&s.name),
                "charged_by": charged_by(live, &s.name),
            })
        })
        .collect();
    json_response(StatusCode::OK, &json!({ "rules": rules }))
}

/// The units a key was charged in its window so far (the tokens of a rule
/// charged by an LLM's usage), under `limit`: `remaining` is what the next
/// request would leave, so one more is left before it when it would be
/// admitted.
pub(super) fn charged(limit: u64, i: &ratewarden::store::KeyInfo) -> u64 {
    limit.saturating_sub(i.remaining + u64::from(i.admits))
}

/// Where a rule charged by its answer reads the cost, and in which units
/// it counts (`tokens`; `money`, in millionths of the currency, under a
/// price table; `units`); `null` for a rule charged at admission.
fn charged_by(live: &Live, rule: &str) -> Value {
    use crate::config::cost::{CostSource, Count};
    let Some(spec) = live.config.costs.iter().find(|c| c.rule == rule) else {
        return Value::Null;
    };
    match &spec.source {
        CostSource::Llm(l) => json!({
            "from": "llm",
            "dialect": l.dialect.name(),
            "units": if matches!(l.count, Count::Price(_)) { "money" } else { "tokens" },
            "cap_max_output": l.cap_max_output,
            "include_usage": l.include_usage,
        }),
        CostSource::Header(h) => json!({"from": "header", "header": h, "units": "units"}),
        CostSource::Json(p) => json!({"from": "json", "pointer": p, "units": "units"}),
    }
}

/// Names one listing's `SCAN` examines on each Redis server, at most.
pub(super) const SCAN_BUDGET: usize = 10_000;

/// Store reads a listing keeps in flight.
pub(super) const INSPECTING: usize = 64;

/// A key a listing found, with its state now.
pub(super) struct Found {
    key: String,
    info: ratewarden::KeyInfo,
    /// The parameters it counts under: the rule's own, a tier's, or its
    /// override's.
    rule: ratewarden::Rule,
}

/// The parameter sets of `pr` a key may count under: its own, each
/// limited tier's (one state each), and the overrides set now.
pub(super) fn variants(
    live: &Live,
    pr: &ratewarden_tower::policy::PolicyRule,
) -> Vec<ratewarden::Rule> {
    let mut out = vec![pr.rule.clone()];
    for t in pr.tiers.iter().flat_map(|t| &t.values) {
        if let Some(r) = &t.rule
            && !out.iter().any(|o| o.id() == r.id())
        {
            out.push(r.clone());
        }
    }
    if let Some(o) = &live.config.policy.overrides {
        for (_, key, _) in o.list(Some(pr.rule.name())) {
            if let Some(ratewarden_tower::overrides::Applied::Limited(r)) = o.get(&pr.rule, &key)
                && !out.iter().any(|x| x.id() == r.id())
            {
                out.push(r);
            }
        }
    }
    out
}

/// What a listing says of the parameters a key counts under.
pub(super) fn applied(rule: &ratewarden::Rule) -> Option<&str> {
    if rule.is_override() {
        Some("override")
    } else {
        rule.tier()
    }
}

/// The keys of `pr` that exist now, with their state: on Redis, those a
/// bounded `SCAN` finds (`complete` says whether it went through every
/// server), and those this gateway saw at or near their limit lately
/// (sampled: the memory store keeps hashes, not names, so on it these are
/// all there is).
pub(super) async fn existing(
    gw: &Gateway,
    live: &Live,
    pr: &ratewarden_tower::policy::PolicyRule,
) -> Result<(Vec<Found>, bool), ratewarden::StoreError> {
    let store = live.limiter.store();
    // Keys seen near or over the limit, and keys banned by the rule (a
    // banned key is listed under its rule, as `/v1/bans` lists it).
    let banned = gw
        .metrics
        .bans(usize::MAX)
        .into_iter()
        .filter(|(rule, _, _)| rule == pr.rule.name())
        .map(|(_, key, _)| key);
    let mut candidates: Vec<(String, String)> = gw
        .metrics
        .hot_keys(pr.rule.name())
        .into_iter()
        .chain(banned)
        .map(|key| (pr.group_of_key(&key), key))
        .collect();
    let mut complete = true;
    let rules = variants(live, pr);
    if store.is_shared() {
        for rule in &rules {
            let scanned = store.scan(rule, SCAN_BUDGET).await?;
            complete &= scanned.complete;
            let known: std::collections::HashSet<(String, String)> =
                candidates.iter().cloned().collect();
            candidates.extend(scanned.keys.into_iter().filter(|k| !known.contains(k)));
        }
    }
    let mut found = vec![];
    // A key may come twice (sighted and scanned, under two spellings of its
    // group): listed once per parameter set.
    let mut listed = std::collections::HashSet::new();
    for rule in &rules {
        let ops: Vec<Op<'_>> = candidates
            .iter()
            .map(|(group, key)| Op::grouped(rule, key, group))
            .collect();
        for ((_, key), info) in candidates.iter().zip(inspect_all(store, &ops).await) {
            let info = info?;
            if info.exists && listed.insert((rule.id(), key.as_str())) {
                found.push(Found {
                    key: key.clone(),
                    info,
                    rule: rule.clone(),
                });
            }
        }
    }
    Ok((found, complete))
}

/// Each op's state read from the store, [`INSPECTING`] at a time.
pub(super) async fn inspect_all(
    store: &crate::store::AnyStore,
    ops: &[Op<'_>],
) -> Vec<Result<ratewarden::KeyInfo, ratewarden::StoreError>> {
    let mut out = Vec::with_capacity(ops.len());
    for chunk in ops.chunks(INSPECTING) {
        out.extend(futures_util::future::join_all(chunk.iter().map(|op| store.inspect(*op))).await);
    }
    out
}

/// `GET /v1/bans?limit=`: active bans, the longest first: those this
/// gateway imposed or saw, and on Redis those a bounded `SCAN` of each
/// rule with a `penalty` finds.
pub(super) async fn bans(gw: &Gateway, live: &Live, q: &[(String, String)]) -> Response<Body> {
    let limit = match listing_limit(q) {
        Ok(n) => n,
        Err(r) => return *r,
    };
    // The bans this gateway imposed or saw, each confirmed by the store
    // now: a ban cleared (`DELETE /v1/keys/...`, here or on another
    // gateway sharing the store) is no longer listed, nor remembered.
    let mut bans = Vec::new();
    let tracked = gw.metrics.bans(MAX_LISTED);
    let store = live.limiter.store();
    // Those whose rule is still loaded, with its key's group.
    let mut known = Vec::with_capacity(tracked.len());
    for (rule, key, _) in &tracked {
        match live
            .config
            .policy
            .rules
            .iter()
            .find(|r| r.rule.name() == rule)
        {
            Some(pr) => known.push((pr, key, pr.group_of_key(key))),
            None => gw.metrics.unban(rule, key),
        }
    }
    let ops: Vec<Op<'_>> = known
        .iter()
        .map(|(pr, key, group)| Op::grouped(&pr.rule, key, group))
        .collect();
    for ((pr, key, _), info) in known.iter().zip(inspect_all(store, &ops).await) {
        match info {
            Ok(i) if i.ban_left.is_some_and(|l| !l.is_zero()) => {
                bans.push((
                    pr.rule.name().to_owned(),
                    (*key).clone(),
                    i.ban_left.unwrap_or_default(),
                ));
            }
            Err(e) => return unavailable(e),
            // Cleared or lapsed.
            Ok(_) => gw.metrics.unban(pr.rule.name(), key),
        }
    }
    let mut complete = true;
    if live.limiter.store().is_shared() {
        for pr in live
            .config
            .policy
            .rules
            .iter()
            .filter(|r| r.rule.spec().penalty.is_some())
        {
            let (found, whole) = match existing(gw, live, pr).await {
                Ok(f) => f,
                Err(e) => return unavailable(e),
            };
            complete &= whole;
            for f in found {
                let Some(left) = f.info.ban_left.filter(|l| !l.is_zero()) else {
                    continue;
                };
                match bans
                    .iter_mut()
                    .find(|(r, k, _)| r == pr.rule.name() && *k == f.key)
                {
                    // The store's word is the current one.
                    Some(b) => b.2 = left,
                    None => bans.push((pr.rule.name().to_owned(), f.key, left)),
                }
            }
        }
    }
    bans.sort_by_key(|b| std::cmp::Reverse(b.2));
    bans.truncate(limit);
    let bans: Vec<Value> = bans
        .into_iter()
        .map(|(rule, key, left)| json!({"rule": rule, "key": key, "ban_left": secs(left)}))
        .collect();
    json_response(
        StatusCode::OK,
        &json!({ "bans": bans, "complete": complete }),
    )
}

/// `GET /v1/keys?rule=&limit=`: the keys of `rule` using the most of
/// their limit now, each read from the store now (see [`existing`] for
/// where the candidates come from and how they are bounded).
pub(super) async fn top_keys(gw: &Gateway, live: &Live, q: &[(String, String)]) -> Response<Body> {
    let limit = match listing_limit(q) {
        Ok(n) => n,
        Err(r) => return *r,
    };
    let Some(rule) = param(q, "rule") else {
        return problem_response(StatusCode::BAD_REQUEST, "`rule` is required");
    };
    let Some(pr) = live
        .config
        .policy
        .rules
        .iter()
        .find(|r| r.rule.name() == rule)
    else {
        return problem_response(StatusCode::NOT_FOUND, &format!("no rule `{rule}`"));
    };
    let (found, complete) = match existing(gw, live, pr).await {
        Ok(f) => f,
        Err(e) => return unavailable(e),
    };
    let mut rows: Vec<(f64, u64, Found)> = found
        .into_iter()
        .map(|f| {
            let used = charged(f.rule.limit(), &f.info);
            (used as f64 / f.rule.limit() as f64, used, f)
        })
        .collect();
    rows.sort_by(|a, b| b.0.total_cmp(&a.0));
    rows.truncate(limit);
    let keys: Vec<Value> = rows
        .into_iter()
        .map(|(share, charged, f)| {
            json!({
                "key": f.key, "used": (share * 1000.0).round() / 1000.0, "charged": charged,
                "remaining": f.info.remaining, "limit": f.rule.limit(),
                "tier": applied(&f.rule),
                "reset_after": secs(f.info.reset_after), "ban_left": f.info.ban_left.map(secs),
            })
        })
        .collect();
    json_response(
        StatusCode::OK,
        &json!({ "rule": rule, "keys": keys, "complete": complete }),
    )
}

/// `POST /v1/bans`: bans a rule's key in the store (every gateway sharing
/// it refuses the key), for `duration` at least, its count kept; listed by
/// `/v1/bans` with the others, lifted by `DELETE /v1/bans/{rule}/{key}`.
pub(super) async fn ban(gw: &Gateway, live: &Live, body: BanBody) -> Response<Body> {
    let duration = match crate::config::parse_duration(&body.duration) {
        Ok(d) if !d.is_zero() => d,
        Ok(_) => return problem_response(StatusCode::BAD_REQUEST, "`duration` must not be 0"),
        Err(e) => return problem_response(StatusCode::BAD_REQUEST, &format!("`duration`: {e}")),
    };
    let matched = match live
        .config
        .policy
        .named(&body.rule, &body.key, body.identity.as_deref())
    {
        Ok(m) => m,
        Err(e) => return named_error(e),
    };
    let ops = matched.ops();
    let op = ops[0];
    if let Err(e) = live.limiter.store().ban(op, duration).await {
        return unavailable(e);
    }
    gw.metrics
        .banned(&body.rule, op.key, std::time::Instant::now() + duration);
    tracing::info!(
        rule = body.rule,
        key = op.key,
        duration = ?duration,
        note = body.note.as_deref().unwrap_or(""),
        "banned by the admin API"
    );
    json_response(
        StatusCode::OK,
        &json!({"rule": body.rule, "key": op.key, "ban_left": secs(duration), "note": body.note}),
    )
}

/// `DELETE /v1/bans/{rule}/{key}`: lifts a ban, and forgets the key's
/// count with it: `DELETE /v1/keys/...`, and the ban no longer listed.
pub(super) async fn lift(
    gw: &Gateway,
    live: &Live,
    rule: &str,
    key: &str,
    identity: Option<&str>,
) -> Response<Body> {
    let r = keys(live, Method::DELETE, rule, key, identity).await;
    if r.status() == StatusCode::OK {
        gw.metrics.unban(rule, key);
        tracing::info!(rule, key, "ban lifted by the admin API");
    }
    r
}

pub(super) async fn keys(
    live: &Live,
    method: Method,
    rule: &str,
    key: &str,
    identity: Option<&str>,
) -> Response<Body> {
    let matched = match live.config.policy.named(rule, key, identity) {
        Ok(m) => m,
        Err(e) => return named_error(e),
    };
    let ops = matched.ops();
    let op = ops[0];
    let store = live.limiter.store();
    if method == Method::DELETE {
        return match store.clear(op).await {
            Ok(existed) => json_response(
                StatusCode::OK,
                &json!({"rule": rule, "key": op.key, "cleared": existed}),
            ),
            Err(e) => unavailable(e),
        };
    }
    match store.inspect(op).await {
        Ok(i) => json_response(
            StatusCode::OK,
            &json!({
                "rule": rule, "key": op.key, "exists": i.exists,
                "limit": op.rule.limit(), "remaining": i.remaining,
                "charged": charged(op.rule.limit(), &i),
                "reset_after": secs(i.reset_after), "ban_left": i.ban_left.map(secs), "ban_level": i.ban_level,
            }),
        ),
        Err(e) => unavailable(e),
    }
}
