//! Decisions for applications not behind the gateway: `/v1/check`,
//! `/v1/report` and `/v1/explain`, each on the one admission path.

use super::{json_response, named_error, param, secs, unavailable};
use crate::answer::{Body, problem_response};
use crate::gateway::{Gateway, Live};
use crate::proxy::flow::Reservations;
use crate::proxy::forward::rule_path;
use http::header::{HeaderMap, HeaderName, HeaderValue};
use http::{Method, Response, StatusCode};
use ratewarden::{Decision, Mode, Op, Store};
use ratewarden_tower::admission::{Facts, Identity, Matched, Refusal};
use ratewarden_tower::policy::PolicyRule;
use ratewarden_tower::view::{Fields, RequestView};
use serde::Deserialize;
use serde_json::{Value, json};
use std::collections::HashMap;

/// `POST /v1/check`: a named rule on a key, or a whole request as the proxy
/// would see it.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct CheckBody {
    rule: Option<String>,
    key: Option<String>,
    /// The client's identity, when the rule's key has more parts than it.
    identity: Option<String>,
    request: Option<RequestFacts>,
    #[serde(default = "one")]
    cost: u64,
}

/// A request described to `/v1/check`: decided for every rule it matches,
/// all-or-nothing, as the proxy decides it.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RequestFacts {
    #[serde(default = "get")]
    method: String,
    #[serde(default = "root")]
    path: String,
    /// The identity; without it, the one `peer` and `headers` give.
    identity: Option<String>,
    peer: Option<std::net::IpAddr>,
    #[serde(default)]
    headers: HashMap<String, String>,
    /// The host asked for (as `Host`).
    host: Option<String>,
    /// The query string (without `?`), when `path` has none.
    query: Option<String>,
    /// Cookies by name (as one `Cookie` header).
    #[serde(default)]
    cookies: HashMap<String, String>,
    /// A token, verified as the proxy verifies a request's (`jwt:`).
    jwt: Option<String>,
    /// The request's body: JSON, or its text as a string (`json:` key
    /// parts read it; a rule charged by an LLM's usage reserves from it).
    body: Option<Value>,
}

/// A request body an admin caller describes: its JSON, when it is an
/// object, and its length in bytes, as the proxy reads a body.
#[derive(Default)]
pub(super) struct GivenBody {
    json: Option<Value>,
    len: usize,
}

impl GivenBody {
    pub(super) fn of_bytes(b: &[u8]) -> Self {
        Self {
            json: crate::proxy::flow::llm::body_json(b),
            len: b.len(),
        }
    }

    /// A body given inside JSON: a string is its text; anything else is
    /// JSON, as serialized.
    fn of_value(v: &Value) -> Self {
        match v {
            Value::String(text) => Self::of_bytes(text.as_bytes()),
            v => Self::of_bytes(&serde_json::to_vec(v).unwrap_or_default()),
        }
    }
}

/// What the matched rules charged by an LLM's usage reserve (by rule), for
/// the answer.
fn reserved_of(policy: &ratewarden_tower::policy::Policy, matched: &Matched<'_>) -> Value {
    let by_rule: serde_json::Map<String, Value> = policy
        .rules
        .iter()
        .filter_map(|r| Some((r.rule.name().to_owned(), json!(matched.reserved(r)?))))
        .collect();
    Value::Object(by_rule)
}

pub(super) fn one() -> u64 {
    1
}
pub(super) fn get() -> String {
    "GET".into()
}
pub(super) fn root() -> String {
    "/".into()
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct ReportBody {
    rule: String,
    key: String,
    identity: Option<String>,
    /// `failure` or `success`: settles a `count: failures` rule.
    outcome: Option<String>,
    /// A `concurrency` lease `/v1/check` gave: released.
    lease: Option<u64>,
    #[serde(default = "one")]
    cost: u64,
    /// What a `/v1/check` reserved (its `cost`), and what the answer then
    /// used: the difference charged or given back (an LLM call's tokens,
    /// for an app that checks before and reports after).
    reserved: Option<u64>,
    used: Option<u64>,
}

/// Header fields given as pairs, the invalid ones left out (as a proxied
/// request would not carry them).
/// A request an admin caller describes (`/v1/check`, `/v1/explain`), held
/// so that [`Described::view`] gives the one request view of it, as the
/// proxy would build it.
pub(super) struct Described {
    method: Method,
    /// The target as given (a query included).
    target: String,
    /// The path as a rule would see it on the proxy.
    path: String,
    headers: HeaderMap,
    peer: Option<std::net::IpAddr>,
}

/// What a caller says of the request besides its method and path.
#[derive(Default)]
pub(super) struct Extras<'a> {
    /// The query string, when the path has none.
    query: Option<&'a str>,
    /// The host (as `Host`).
    host: Option<&'a str>,
    /// Cookies, as one `Cookie` header.
    cookies: Vec<(&'a str, &'a str)>,
}

impl Described {
    /// A bad method or path is answered (the `Err`).
    fn new<'a>(
        method: &str,
        target: &str,
        headers: impl IntoIterator<Item = (&'a str, &'a str)>,
        extras: Extras<'_>,
        peer: Option<std::net::IpAddr>,
    ) -> Result<Self, Box<Response<Body>>> {
        let target = match extras.query {
            Some(q) if !target.contains('?') => format!("{target}?{}", q.trim_start_matches('?')),
            _ => target.to_owned(),
        };
        let Ok(method) = Method::from_bytes(method.to_ascii_uppercase().as_bytes()) else {
            return Err(Box::new(problem_response(
                StatusCode::BAD_REQUEST,
                "bad `method`",
            )));
        };
        let path = match rule_path(&method, &target) {
            Ok(p) => p.into_owned(),
            Err(e) => return Err(Box::new(e.answer())),
        };
        let cookie = extras
            .cookies
            .iter()
            .map(|(k, v)| format!("{k}={v}"))
            .collect::<Vec<_>>()
            .join("; ");
        let extra: Vec<(&str, &str)> = extras
            .host
            .map(|h| ("host", h))
            .into_iter()
            .chain((!cookie.is_empty()).then_some(("cookie", cookie.as_str())))
            .collect();
        let given: Vec<(&str, &str)> = headers.into_iter().collect();
        let mut map = HeaderMap::new();
        for &(k, v) in given.iter().chain(&extra) {
            if let (Ok(n), Ok(v)) = (
                HeaderName::from_bytes(k.as_bytes()),
                HeaderValue::from_str(v),
            ) {
                map.append(n, v);
            }
        }
        Ok(Self {
            method,
            target,
            path,
            headers: map,
            peer,
        })
    }

    fn view(&self) -> RequestView<'_> {
        RequestView {
            target: &self.target,
            fields: Fields::Map(&self.headers),
            peer: self.peer,
            ..RequestView::bare(&self.method, &self.path)
        }
    }
}

/// A decision as JSON: the request's verdict, each rule's part, and the
/// rate-limit headers the proxy would send with it.
pub(super) fn decision_json(d: &Decision, live: &Live) -> Value {
    let rules: Vec<Value> = d
        .rules
        .iter()
        .map(|r| {
            json!({
                "rule": r.rule.name(),
                "key": r.key,
                "allowed": r.allowed(),
                "shadow": r.rule.is_shadow(),
                "limit": r.rule.limit(),
                "remaining": r.remaining,
                "reset_after": secs(r.reset_after),
                "retry_after": r.retry_after.map(secs),
                "reason": r.reason.map(|x| x.as_str()),
                "lease": r.lease,
                "tier": r.rule.tier(),
                "override": r.rule.is_override(),
                // What settles it: an app's middleware reports a
                // `count: failures` rule's outcome from its answer's status.
                "count": if r.rule.counts_failures() { "failures" } else { "all" },
                "failure_status": r.rule.counts_failures().then(|| {
                    live.config
                        .policy
                        .rule(r.rule.name())
                        .map(|p| p.failure_status.clone())
                        .unwrap_or_default()
                }),
            })
        })
        .collect();
    let headers: serde_json::Map<String, Value> = d
        .headers(live.config.headers)
        .into_iter()
        .map(|(k, v)| (k.to_owned(), Value::String(v)))
        .collect();
    let status = d.status(live.config.status.as_u16());
    // A refusal's problem body, as the proxy writes it: an app's
    // middleware answers with it.
    let problem = (!d.allowed)
        .then(|| {
            let title = StatusCode::from_u16(status)
                .ok()
                .and_then(|s| s.canonical_reason())
                .unwrap_or("Too Many Requests");
            d.problem_json(status, title)
        })
        .flatten()
        .and_then(|b| serde_json::from_str::<Value>(&b).ok());
    json!({
        "allowed": d.allowed,
        "status": (!d.allowed).then_some(status),
        "retry_after": d.retry_after_secs(),
        "delay": secs(d.delay),
        "rules": rules,
        "headers": headers,
        "problem": problem,
    })
}

pub(super) async fn check(gw: &Gateway, live: &Live, body: CheckBody) -> Response<Body> {
    if body.cost == 0 || body.cost > u64::from(u32::MAX) {
        return problem_response(
            StatusCode::BAD_REQUEST,
            "`cost` must be between 1 and 4294967295",
        );
    }
    let policy = &live.config.policy;
    let matched: Matched<'_>;
    let described;
    let mut reserved = Value::Null;
    match (&body.request, &body.rule, &body.key) {
        (Some(r), None, None) => {
            let headers = r.headers.iter().map(|(k, v)| (k.as_str(), v.as_str()));
            let extras = Extras {
                query: r.query.as_deref(),
                host: r.host.as_deref(),
                cookies: r
                    .cookies
                    .iter()
                    .map(|(k, v)| (k.as_str(), v.as_str()))
                    .collect(),
            };
            described = match Described::new(&r.method, &r.path, headers, extras, r.peer) {
                Ok(d) => d,
                Err(answer) => return *answer,
            };
            let claims = r
                .jwt
                .as_deref()
                .and_then(|t| gw.verify_token(live, t, &described.view()));
            let given = r.body.as_ref().map(GivenBody::of_value).unwrap_or_default();
            let fields = given.json.as_ref().map(crate::jwt::BodyFields);
            // The consumer its API key names, as the proxy finds it.
            let consumer = match gw.consumer(live, &described.view()) {
                Ok(c) => c,
                Err(refusal) => return refused(gw, live, refusal),
            };
            let request = described
                .view()
                .with_claims(claims.as_ref().map(|c| c as _))
                .with_consumer(consumer.as_deref())
                .with_body(fields.as_ref().map(|f| f as _));
            let reservations = Reservations::new(
                &live.config.costs,
                given.json.as_ref(),
                &described.path,
                given.len,
            );
            let reserve = |r: &PolicyRule| reservations.of(r);
            let facts = Facts {
                request,
                identity: match &r.identity {
                    Some(id) => Identity::Given(Some(id)),
                    None => Identity::Resolve,
                },
                route: Some(live.router.route_name(&request)),
                reserve: Some(&reserve),
            };
            let who = match policy.identify(&facts) {
                Ok(w) => w,
                Err(refusal) => return refused(gw, live, refusal),
            };
            matched = match policy.matching(&facts, who) {
                Ok(m) => m,
                Err(refusal) => return refused(gw, live, refusal),
            };
            reserved = reserved_of(policy, &matched);
        }
        (None, Some(rule), Some(key)) => {
            matched = match policy.named(rule, key, body.identity.as_deref()) {
                Ok(m) => m,
                Err(e) => return named_error(e),
            };
        }
        _ => {
            return problem_response(
                StatusCode::BAD_REQUEST,
                "give either `rule` and `key`, or `request`",
            );
        }
    }
    let answer = |mut v: Value| {
        // What each rule charged by an LLM's usage reserved: what
        // `/v1/report`'s `reserved` then says.
        if reserved.as_object().is_some_and(|r| !r.is_empty()) {
            v["reserved"] = reserved.clone();
        }
        json_response(StatusCode::OK, &v)
    };
    match matched.decide(&live.limiter, body.cost, Mode::Apply).await {
        Ok(a) => match &a.decision {
            Some(d) => {
                gw.record(live, d, None);
                answer(check_json(d, live, body.rule.is_some()))
            }
            None => answer(json!({"allowed": true, "rules": [], "headers": {}})),
        },
        Err(Refusal::Limited(d)) => {
            gw.record(live, &d, None);
            answer(check_json(&d, live, body.rule.is_some()))
        }
        Err(refusal) => refused(gw, live, refusal),
    }
}

/// A check's answer: the decision, and for a named rule its numbers at the
/// top (the spec's `allowed`, `limit`, `remaining`, `reset_after`,
/// `retry_after`).
pub(super) fn check_json(d: &Decision, live: &Live, named: bool) -> Value {
    let mut v = decision_json(d, live);
    if named && let Some(r) = d.rules.first() {
        let top = json!({
            "rule": r.rule.name(),
            "limit": r.rule.limit(),
            "remaining": r.remaining,
            "reset_after": secs(r.reset_after),
            "reason": r.reason.map(|x| x.as_str()),
            "lease": r.lease,
        });
        if let (Value::Object(v), Value::Object(top)) = (&mut v, top) {
            v.extend(top);
        }
    }
    v
}

/// A refusal other than a limit, as `/v1/check` answers it: the verdict a
/// proxied request would get (403 denied, 400 no identity), or 503.
pub(super) fn refused(gw: &Gateway, live: &Live, refusal: Refusal) -> Response<Body> {
    match refusal {
        Refusal::Limited(d) => {
            gw.record(live, &d, None);
            json_response(StatusCode::OK, &decision_json(&d, live))
        }
        Refusal::Unavailable(e) => unavailable(e),
        other => json_response(
            StatusCode::OK,
            &json!({
                "allowed": false,
                "status": other.status(live.config.status).as_u16(),
                "problem": serde_json::from_str::<Value>(&other.problem(live.config.status)).unwrap_or(Value::Null),
                "rules": [],
                "headers": {},
            }),
        ),
    }
}

pub(super) async fn report(live: &Live, body: ReportBody) -> Response<Body> {
    let policy = &live.config.policy;
    let matched = match policy.named(&body.rule, &body.key, body.identity.as_deref()) {
        Ok(m) => m,
        Err(e) => return named_error(e),
    };
    let ops = matched.ops();
    let op: Op<'_> = ops[0];
    match (&body.outcome, body.lease) {
        (Some(outcome), None) => {
            if !op.rule.counts_failures() {
                return problem_response(
                    StatusCode::CONFLICT,
                    &format!("rule `{}` does not use `count: failures`", body.rule),
                );
            }
            let how = match outcome.as_str() {
                "failure" => ratewarden::Settle::Failure(1),
                "success" => ratewarden::Settle::Success,
                other => {
                    return problem_response(
                        StatusCode::BAD_REQUEST,
                        &format!("`outcome` is failure or success, not `{other}`"),
                    );
                }
            };
            match live.limiter.settle(&[op], how).await {
                Ok(()) => json_response(
                    StatusCode::OK,
                    &json!({"rule": body.rule, "key": op.key, "outcome": outcome}),
                ),
                Err(e) => unavailable(e),
            }
        }
        (None, Some(lease)) => {
            if !op.rule.spec().algorithm.holds_leases() {
                return problem_response(
                    StatusCode::CONFLICT,
                    &format!("rule `{}` is not a concurrency rule", body.rule),
                );
            }
            let cost = op.rule.cost(body.cost);
            match live.limiter.store().release(&[(op, lease, cost)]).await {
                Ok(()) => json_response(
                    StatusCode::OK,
                    &json!({"rule": body.rule, "key": op.key, "released": lease}),
                ),
                Err(e) => unavailable(e),
            }
        }
        (None, None) if body.reserved.is_some() && body.used.is_some() => {
            let (reserved, used) = (body.reserved.unwrap_or(0), body.used.unwrap_or(0));
            if op.rule.spec().algorithm.holds_leases() {
                return problem_response(
                    StatusCode::CONFLICT,
                    &format!("rule `{}` counts requests in flight, not a cost", body.rule),
                );
            }
            let how = if used >= reserved {
                ratewarden::Settle::Charge(used - reserved)
            } else {
                ratewarden::Settle::Refund(reserved - used)
            };
            let settled = if used == reserved {
                Ok(())
            } else {
                live.limiter.settle(&[op], how).await
            };
            match settled {
                Ok(()) => json_response(
                    StatusCode::OK,
                    &json!({
                        "rule": body.rule,
                        "key": op.key,
                        "charged": used.saturating_sub(reserved),
                        "refunded": reserved.saturating_sub(used),
                    }),
                ),
                Err(e) => unavailable(e),
            }
        }
        _ => problem_response(
            StatusCode::BAD_REQUEST,
            "give `outcome` (count: failures), `lease` (concurrency), or `reserved` and `used` (a cost known after the answer)",
        ),
    }
}

/// `/v1/explain`: what the proxy would decide of the request the query
/// describes, nothing recorded; `given` is its body (`POST`).
pub(super) async fn explain(
    gw: &Gateway,
    live: &Live,
    q: &[(String, String)],
    given: GivenBody,
) -> Response<Body> {
    let policy = &live.config.policy;
    let headers = q
        .iter()
        .filter_map(|(k, v)| Some((k.strip_prefix("header:")?, v.as_str())));
    let peer = param(q, "peer").and_then(|p| p.parse().ok());
    let extras = Extras {
        query: param(q, "query"),
        host: param(q, "host"),
        cookies: q
            .iter()
            .filter_map(|(k, v)| Some((k.strip_prefix("cookie:")?, v.as_str())))
            .collect(),
    };
    let described = match Described::new(
        param(q, "method").unwrap_or("GET"),
        param(q, "path").unwrap_or("/"),
        headers,
        extras,
        peer,
    ) {
        Ok(d) => d,
        Err(answer) => return *answer,
    };
    // `jwt=TOKEN`: verified as the proxy verifies a request's token.
    let claims = param(q, "jwt").and_then(|t| gw.verify_token(live, t, &described.view()));
    let fields = given.json.as_ref().map(crate::jwt::BodyFields);
    // The consumer the described request's API key names (never the key
    // in the answer: its name).
    let consumer = gw.consumer(live, &described.view());
    let request = described
        .view()
        .with_claims(claims.as_ref().map(|c| c as _))
        .with_consumer(consumer.as_ref().ok().and_then(|c| c.as_deref()))
        .with_body(fields.as_ref().map(|f| f as _));
    let (method, path) = (&described.method, &described.path);
    let reservations = Reservations::new(&live.config.costs, given.json.as_ref(), path, given.len);
    let reserve = |r: &PolicyRule| reservations.of(r);
    let given = param(q, "identity");
    let facts = Facts {
        request,
        identity: match given {
            Some(id) => Identity::Given(Some(id)),
            None => Identity::Resolve,
        },
        route: Some(live.router.route_name(&request)),
        reserve: Some(&reserve),
    };
    let head = |identity: &str, would: bool| json!({"method": method.as_str(), "path": path, "identity": identity, "would_allow": would});
    // Refused before any rule decides: why, and with which status.
    let refused = |identity: &str, refusal: Refusal| {
        let mut v = head(identity, false);
        v["status"] = json!(refusal.status(live.config.status).as_u16());
        v["refused"] = json!(match &refusal {
            Refusal::Denied(_) => "denied",
            Refusal::NoIdentity(_) => "no_identity",
            Refusal::MissingPart { .. } => "missing_part",
            Refusal::NoConsumer => "no_consumer",
            Refusal::Unauthenticated => "unauthenticated",
            _ => "unavailable",
        });
        v["detail"] = json!(problem_detail(&refusal.problem(live.config.status)));
        v["rules"] = json!([]);
        json_response(StatusCode::OK, &v)
    };
    let consumer = match &consumer {
        Ok(c) => c,
        Err(_) => {
            return refused(given.unwrap_or(""), Refusal::NoConsumer);
        }
    };
    let who = match policy.identify(&facts) {
        Ok(w) => w,
        Err(refusal) => return refused(given.unwrap_or(""), refusal),
    };
    let limited = who.limited;
    let identity = who.identity.clone();
    let matched = match policy.matching(&facts, who) {
        Ok(m) => m,
        Err(refusal) => return refused(&identity, refusal),
    };
    // Each key's state as the store holds it.
    let mut states = vec![];
    for op in matched.ops() {
        match live.limiter.store().inspect(op).await {
            Ok(i) => states.push(json!({
                "exists": i.exists, "remaining": i.remaining,
                "reset_after": secs(i.reset_after), "ban_left": i.ban_left.map(secs),
            })),
            Err(e) => return unavailable(e),
        }
    }
    let described: Vec<(ratewarden::Rule, String, Option<u64>)> = matched
        .keys()
        .map(|(r, rule, k)| (rule.clone(), k.to_owned(), matched.reserved(r)))
        .collect();
    let decision = match matched.decide(&live.limiter, 1, Mode::Peek).await {
        Ok(a) => a.decision,
        Err(Refusal::Limited(d)) => Some(d),
        Err(Refusal::Unavailable(e)) => return unavailable(e),
        Err(_) => None,
    };
    let mut rules = vec![];
    for (i, (rule, key, reserved)) in described.into_iter().enumerate() {
        let r = decision.as_ref().map(|d| &d.rules[i]);
        // Which parameters applied: an override, a tier, or the rule's.
        let applied = if rule.is_override() {
            "override"
        } else if rule.tier().is_some() {
            "tier"
        } else {
            "rule"
        };
        rules.push(json!({
            "rule": rule.name(),
            "algorithm": rule.spec().algorithm.name(),
            "limit": rule.limit(),
            "window": (rule.calendar().is_none()).then(|| secs(rule.window())),
            "calendar": rule.calendar().map(|c| format!("{} {}", c.period_kind().name(), c.zone())),
            "applied": applied,
            "tier": rule.tier(),
            "status": rule.spec().status.unwrap_or(live.config.status.as_u16()),
            "key": key,
            "state": states[i],
            "would_allow": r.is_none_or(|r| r.allowed()),
            "reason": r.and_then(|r| r.reason.map(|x| x.as_str())),
            "shadow": r.is_some_and(|r| r.rule.is_shadow()),
            "reserved": reserved,
        }));
    }
    let mut v = head(&identity, decision.as_ref().is_none_or(|d| d.allowed));
    v["limited"] = json!(limited);
    if let Some(c) = &consumer {
        v["consumer"] = json!({"name": c.name, "tier": c.tier});
    }
    v["rules"] = json!(rules);
    if let Some(d) = &decision {
        v["headers"] = decision_json(d, live)["headers"].clone();
    }
    json_response(StatusCode::OK, &v)
}

/// The `detail` of a problem body (RFC 9457), for answers that show it.
pub(super) fn problem_detail(body: &str) -> Option<String> {
    let v: Value = serde_json::from_str(body).ok()?;
    v.get("detail")?.as_str().map(str::to_owned)
}
