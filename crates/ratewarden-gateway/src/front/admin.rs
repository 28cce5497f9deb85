//! The admin API: health, readiness, metrics, and decisions for applications
//! that are not behind the gateway (`/v1/check`, `/v1/report`), plus key
//! inspection and `explain`. Every decision here goes through the one
//! admission path the proxy uses ([`ratewarden_tower::admission`]), so
//! `explain` and `check` answer what the proxy would.

use std::collections::HashMap;

use http::header::{self, HeaderMap, HeaderName, HeaderValue};
use http::{Method, Request, Response, StatusCode};
use http_body_util::{BodyExt, Limited};
use hyper::body::Incoming;
use ratewarden::store::Shared;
use ratewarden::{Decision, Mode, Op, Store};
use ratewarden_tower::admission::{Facts, Identity, Matched, NamedError, Refusal};
use ratewarden_tower::view::{Fields, RequestView};
use serde::Deserialize;
use serde_json::{Value, json};

use crate::answer::{Body, problem_response, respond};
use crate::gateway::{Gateway, Live};
use crate::proxy::forward::rule_path;

/// Largest admin request body read.
const MAX_BODY: usize = 64 * 1024;

fn json_response(status: StatusCode, v: &Value) -> Response<Body> {
    respond(status, "application/json", v.to_string())
}

fn secs(d: std::time::Duration) -> f64 {
    d.as_secs_f64()
}

/// `POST /v1/bans`: a ban an operator sets.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct BanBody {
    rule: String,
    key: String,
    /// The client's identity, when the rule's key has more parts than it.
    identity: Option<String>,
    /// How long: `10m`, `1h`, `7d`.
    duration: String,
    /// Why, for the log.
    note: Option<String>,
}

/// `POST /v1/check`: a named rule on a key, or a whole request as the proxy
/// would see it.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct CheckBody {
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
struct RequestFacts {
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
}

fn one() -> u64 {
    1
}
fn get() -> String {
    "GET".into()
}
fn root() -> String {
    "/".into()
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct ReportBody {
    rule: String,
    key: String,
    identity: Option<String>,
    /// `failure` or `success`: settles a `count: failures` rule.
    outcome: Option<String>,
    /// A `concurrency` lease `/v1/check` gave: released.
    lease: Option<u64>,
    #[serde(default = "one")]
    cost: u64,
}

async fn read_json<T: for<'de> Deserialize<'de>>(
    req: Request<Incoming>,
) -> Result<T, Response<Body>> {
    let bytes = Limited::new(req.into_body(), MAX_BODY)
        .collect()
        .await
        .map_err(|_| {
            problem_response(
                StatusCode::PAYLOAD_TOO_LARGE,
                "body larger than 64 KiB or unreadable",
            )
        })?
        .to_bytes();
    serde_json::from_slice(&bytes)
        .map_err(|e| problem_response(StatusCode::BAD_REQUEST, &format!("invalid JSON body: {e}")))
}

/// The query's parameters, percent-decoded.
fn query(req: &Request<Incoming>) -> Vec<(String, String)> {
    req.uri()
        .query()
        .unwrap_or("")
        .split('&')
        .filter_map(|pair| {
            let (k, v) = pair.split_once('=')?;
            Some((percent_decode(k), percent_decode(v)))
        })
        .collect()
}

fn param<'q>(q: &'q [(String, String)], name: &str) -> Option<&'q str> {
    q.iter().find(|(k, _)| k == name).map(|(_, v)| v.as_str())
}

fn percent_decode(s: &str) -> String {
    let bytes = s.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        match bytes[i] {
            b'%' if i + 2 < bytes.len() => {
                match u8::from_str_radix(
                    std::str::from_utf8(&bytes[i + 1..i + 3]).unwrap_or("zz"),
                    16,
                ) {
                    Ok(b) => {
                        out.push(b);
                        i += 3;
                        continue;
                    }
                    Err(_) => out.push(b'%'),
                }
            }
            b'+' => out.push(b' '),
            b => out.push(b),
        }
        i += 1;
    }
    String::from_utf8_lossy(&out).into_owned()
}

/// Header fields given as pairs, the invalid ones left out (as a proxied
/// request would not carry them).
/// A request an admin caller describes (`/v1/check`, `/v1/explain`), held
/// so that [`Described::view`] gives the one request view of it, as the
/// proxy would build it.
struct Described {
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
struct Extras<'a> {
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

/// `/readyz`: ready when requests are answered as `on_error` says. A
/// store that is down leaves a gateway under `local` or `allow` ready (it
/// still answers every request: taking every gateway out of service at
/// once for one Redis blip would defeat `on_error: local`); under `deny`
/// it is not. A store that answers with errors a retry will not mend is
/// never ready. The body says which, as JSON.
async fn readyz(store: &crate::store::AnyStore) -> Response<Body> {
    // Ask the store now: the last decision's outcome may be old, and a
    // gateway with no traffic must still find out. The ping tells the
    // store's health (`Fallback::ping`), which says whether it is ready.
    let _ = store.ping().await;
    let (ready, health, error) = store.health();
    let body = serde_json::json!({
        "ready": ready,
        "store": {
            "state": health.as_str(),
            "on_error": store.on_error(),
            "gateways": store.instances(),
            "error": error,
        }
    });
    respond(
        if ready {
            StatusCode::OK
        } else {
            StatusCode::SERVICE_UNAVAILABLE
        },
        "application/json",
        format!("{body}\n"),
    )
}

fn unavailable(e: impl std::fmt::Display) -> Response<Body> {
    problem_response(
        StatusCode::SERVICE_UNAVAILABLE,
        &format!("store unavailable: {e}"),
    )
}

fn named_error(e: NamedError) -> Response<Body> {
    match e {
        NamedError::NoRule(_) => problem_response(StatusCode::NOT_FOUND, &e.to_string()),
        NamedError::Group(m) => problem_response(StatusCode::BAD_REQUEST, &m),
    }
}

/// A decision as JSON: the request's verdict, each rule's part, and the
/// rate-limit headers the proxy would send with it.
fn decision_json(d: &Decision, live: &Live) -> Value {
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
            })
        })
        .collect();
    let headers: serde_json::Map<String, Value> = d
        .headers(live.config.headers)
        .into_iter()
        .map(|(k, v)| (k.to_owned(), Value::String(v)))
        .collect();
    json!({
        "allowed": d.allowed,
        "status": (!d.allowed).then(|| d.status(live.config.status.as_u16())),
        "retry_after": d.retry_after_secs(),
        "delay": secs(d.delay),
        "rules": rules,
        "headers": headers,
    })
}

/// Handles one admin request.
pub(crate) async fn handle(gw: &Gateway, req: Request<Incoming>) -> Response<Body> {
    let live = gw.live();
    // Probes and Prometheus need no secret unless `admin.token_for_probes`.
    let probe = req.method() == Method::GET
        && matches!(req.uri().path(), "/healthz" | "/readyz" | "/metrics");
    let exempt = probe && !live.config.admin_token_for_probes;
    // Before anything else, the token included: a name rebound to this
    // listener's address is refused whatever it carries. The probes are
    // answered under any name, as they are without a token (a scraper
    // often asks by a service's name; they change nothing and show no key).
    if !exempt && let Some(r) = misdirected(&req, &live.config.admin_hosts) {
        return r;
    }
    if let Some((_, Some(token))) = &live.config.admin
        && !exempt
    {
        // The token as a bearer token, or as the password of Basic
        // credentials: what a browser sends for `/ui` and its requests.
        let given = req
            .headers()
            .get(header::AUTHORIZATION)
            .and_then(|v| v.to_str().ok());
        let ok = given.is_some_and(|v| {
            v.strip_prefix("Bearer ")
                .is_some_and(|t| same_secret(t.as_bytes(), token.as_bytes()))
                || crate::front::ui::basic_password(v)
                    .is_some_and(|p| same_secret(p.as_bytes(), token.as_bytes()))
        });
        if !ok {
            let page = req.uri().path() == "/ui" || req.uri().path().starts_with("/ui/");
            let mut r = problem_response(
                StatusCode::UNAUTHORIZED,
                "admin requests need Authorization: Bearer <token> (or the token as a Basic password)",
            );
            // A browser asks for Basic credentials, and only for the page.
            r.headers_mut().insert(
                header::WWW_AUTHENTICATE,
                HeaderValue::from_static(if page {
                    "Basic realm=\"ratewarden admin\", charset=\"UTF-8\""
                } else {
                    "Bearer"
                }),
            );
            return r;
        }
    }
    if let Some(r) = cross_site(&req) {
        return r;
    }
    let path = req.uri().path().to_owned();
    let store = live.limiter.store();
    match (req.method().clone(), path.as_str()) {
        (Method::GET, "/healthz") => respond(StatusCode::OK, "text/plain", "ok\n"),
        (Method::GET, "/readyz") => readyz(store).await,
        (Method::GET, "/metrics") => respond(StatusCode::OK, "text/plain; version=0.0.4", {
            let mut text = gw.metrics.render(&store.errors(), gw.access_dropped());
            let (_, health, _) = store.health();
            text.push_str("# HELP ratewarden_store_state The store's state: up, down (an outage: decisions follow on_error) or broken (errors a retry will not mend).\n# TYPE ratewarden_store_state gauge\n");
            for h in [
                ratewarden::Health::Up,
                ratewarden::Health::Down,
                ratewarden::Health::Broken,
            ] {
                let on = u8::from(h == health);
                text.push_str(&format!(
                    "ratewarden_store_state{{state=\"{}\"}} {on}\n",
                    h.as_str()
                ));
            }
            text.push_str(&format!(
                "# HELP ratewarden_store_gateways Gateways announced in the shared store lately, as this one last read (each takes its share of a limit during an outage).\n# TYPE ratewarden_store_gateways gauge\nratewarden_store_gateways {}\n",
                store.instances()
            ));
            let memory = store.memory();
            text.push_str(&format!(
                "# HELP ratewarden_memory_keys States the in-process store holds (the memory store, or Redis's local fallback), at most store.max_keys.\n\
                 # TYPE ratewarden_memory_keys gauge\nratewarden_memory_keys {}\n\
                 # HELP ratewarden_memory_full_total New keys refused because every state of their shard was a ban or a key at its limit (never evicted for another key).\n\
                 # TYPE ratewarden_memory_full_total counter\nratewarden_memory_full_total {}\n",
                memory.len(),
                memory.full_refusals()
            ));
            let (grants, local) = store.leases();
            text.push_str(&format!(
                "# HELP ratewarden_lease_grants_total Slices of leased rules granted by the store to this gateway.\n\
                 # TYPE ratewarden_lease_grants_total counter\nratewarden_lease_grants_total {grants}\n\
                 # HELP ratewarden_lease_local_decisions_total Decisions answered from leased slices, without a store call.\n\
                 # TYPE ratewarden_lease_local_decisions_total counter\nratewarden_lease_local_decisions_total {local}\n"
            ));
            live.router.render(&mut text);
            text
        }),
        (Method::POST, "/v1/check") => match read_json::<CheckBody>(req).await {
            Ok(body) => check(gw, &live, body).await,
            Err(r) => r,
        },
        (Method::POST, "/v1/report") => match read_json::<ReportBody>(req).await {
            Ok(body) => report(&live, body).await,
            Err(r) => r,
        },
        (Method::GET, "/v1/explain") => explain(gw, &live, &query(&req)).await,
        (Method::GET, "/v1/rules") => rules(gw, &live),
        (Method::GET, "/ui") => page(crate::front::ui::page(&live), "text/html; charset=utf-8"),
        (Method::GET, "/ui/app.js") => page(
            crate::front::ui::SCRIPT.to_owned(),
            "text/javascript; charset=utf-8",
        ),
        (Method::GET, "/v1/bans") => bans(gw, &live, &query(&req)).await,
        (Method::POST, "/v1/bans") => match read_json::<BanBody>(req).await {
            Ok(body) => ban(gw, &live, body).await,
            Err(r) => r,
        },
        (Method::DELETE, p) if p.starts_with("/v1/bans/") => {
            let rest = &p["/v1/bans/".len()..];
            let Some((rule, key)) = rest.split_once('/') else {
                return problem_response(StatusCode::NOT_FOUND, "use /v1/bans/{rule}/{key}");
            };
            let (rule, key) = (percent_decode(rule), percent_decode(key));
            let q = query(&req);
            lift(gw, &live, &rule, &key, param(&q, "identity")).await
        }
        (Method::GET, "/v1/overrides") => list_overrides(gw, &query(&req)),
        (m, p)
            if p.starts_with("/v1/overrides/")
                && matches!(m, Method::GET | Method::PUT | Method::DELETE) =>
        {
            let rest = &p["/v1/overrides/".len()..];
            let Some((rule, key)) = rest.split_once('/') else {
                return problem_response(StatusCode::NOT_FOUND, "use /v1/overrides/{rule}/{key}");
            };
            let (rule, key) = (percent_decode(rule), percent_decode(key));
            let Some(r) = live.config.policy.rule(&rule) else {
                return named_error(NamedError::NoRule(rule));
            };
            // The key as the proxy makes it (a hashed part hashed).
            let key = live.config.policy.given_key(r, &key);
            let now = gw.overrides.now();
            match m {
                Method::PUT => {
                    let body = match read_json::<crate::overrides::Body>(req).await {
                        Ok(b) => b,
                        Err(r) => return r,
                    };
                    let o = match crate::overrides::from_body(body, now) {
                        Ok(o) => o,
                        Err(m) => return problem_response(StatusCode::BAD_REQUEST, &m),
                    };
                    let shown = crate::overrides::to_json(&rule, &key, &o, now);
                    match crate::overrides::set(gw, &rule, &key, o).await {
                        Ok(()) => {
                            tracing::info!(rule, key, "override set by the admin API");
                            json_response(StatusCode::OK, &shown)
                        }
                        Err(e) => change_error(e),
                    }
                }
                Method::DELETE => match crate::overrides::remove(gw, &rule, &key).await {
                    Ok(removed) => {
                        if removed {
                            tracing::info!(rule, key, "override removed by the admin API");
                        }
                        json_response(
                            StatusCode::OK,
                            &json!({"rule": rule, "key": key, "removed": removed}),
                        )
                    }
                    Err(e) => change_error(e),
                },
                _ => match gw.overrides.lookup(&rule, &key) {
                    Some(o) => json_response(
                        StatusCode::OK,
                        &crate::overrides::to_json(&rule, &key, &o, now),
                    ),
                    None => problem_response(
                        StatusCode::NOT_FOUND,
                        &format!("no override of `{rule}` for that key"),
                    ),
                },
            }
        }
        (Method::GET, "/v1/keys") => top_keys(gw, &live, &query(&req)).await,
        (m, p) if p.starts_with("/v1/keys/") && (m == Method::GET || m == Method::DELETE) => {
            let rest = &p["/v1/keys/".len()..];
            let Some((rule, key)) = rest.split_once('/') else {
                return problem_response(StatusCode::NOT_FOUND, "use /v1/keys/{rule}/{key}");
            };
            let (rule, key) = (percent_decode(rule), percent_decode(key));
            let q = query(&req);
            keys(&live, m, &rule, &key, param(&q, "identity")).await
        }
        (_, p) => match allowed_methods(p) {
            // A known path, the wrong method: 405 with what it takes.
            Some(allow) => {
                let mut r = problem_response(
                    StatusCode::METHOD_NOT_ALLOWED,
                    &format!("{path} takes {allow}"),
                );
                if let Ok(v) = http::HeaderValue::from_str(allow) {
                    r.headers_mut().insert(http::header::ALLOW, v);
                }
                r
            }
            None => problem_response(StatusCode::NOT_FOUND, &format!("no admin endpoint {path}")),
        },
    }
}

/// `GET /v1/overrides[?rule=R]`: the overrides in force.
fn list_overrides(gw: &Gateway, q: &[(String, String)]) -> Response<Body> {
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
fn change_error(e: crate::overrides::ChangeError) -> Response<Body> {
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

/// The methods an admin path takes (its `Allow`), if it is one.
fn allowed_methods(path: &str) -> Option<&'static str> {
    Some(match path {
        "/healthz" | "/readyz" | "/metrics" | "/v1/explain" | "/v1/rules" | "/ui"
        | "/ui/app.js" | "/v1/keys" => "GET",
        "/v1/bans" => "GET, POST",
        "/v1/overrides" => "GET",
        p if p.starts_with("/v1/overrides/") => "GET, PUT, DELETE",
        p if p.starts_with("/v1/bans/") => "DELETE",
        "/v1/check" | "/v1/report" => "POST",
        p if p.starts_with("/v1/keys/") => "GET, DELETE",
        _ => return None,
    })
}

async fn check(gw: &Gateway, live: &Live, body: CheckBody) -> Response<Body> {
    if body.cost == 0 || body.cost > u64::from(u32::MAX) {
        return problem_response(
            StatusCode::BAD_REQUEST,
            "`cost` must be between 1 and 4294967295",
        );
    }
    let policy = &live.config.policy;
    let matched: Matched<'_>;
    let described;
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
            let claims = r.jwt.as_deref().and_then(|t| gw.verify_token(live, t));
            let request = described
                .view()
                .with_claims(claims.as_ref().map(|c| c as _));
            let facts = Facts {
                request,
                identity: match &r.identity {
                    Some(id) => Identity::Given(Some(id)),
                    None => Identity::Resolve,
                },
                route: Some(live.router.route_name(&request)),
            };
            let who = match policy.identify(&facts) {
                Ok(w) => w,
                Err(refusal) => return refused(gw, live, refusal),
            };
            matched = match policy.matching(&facts, who) {
                Ok(m) => m,
                Err(refusal) => return refused(gw, live, refusal),
            };
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
    match matched.decide(&live.limiter, body.cost, Mode::Apply).await {
        Ok(a) => match &a.decision {
            Some(d) => {
                gw.record(live, d, None);
                json_response(StatusCode::OK, &check_json(d, live, body.rule.is_some()))
            }
            None => json_response(
                StatusCode::OK,
                &json!({"allowed": true, "rules": [], "headers": {}}),
            ),
        },
        Err(Refusal::Limited(d)) => {
            gw.record(live, &d, None);
            json_response(StatusCode::OK, &check_json(&d, live, body.rule.is_some()))
        }
        Err(refusal) => refused(gw, live, refusal),
    }
}

/// A check's answer: the decision, and for a named rule its numbers at the
/// top (the spec's `allowed`, `limit`, `remaining`, `reset_after`,
/// `retry_after`).
fn check_json(d: &Decision, live: &Live, named: bool) -> Value {
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
fn refused(gw: &Gateway, live: &Live, refusal: Refusal) -> Response<Body> {
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

async fn report(live: &Live, body: ReportBody) -> Response<Body> {
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
        _ => problem_response(
            StatusCode::BAD_REQUEST,
            "give either `outcome` (count: failures) or `lease` (concurrency)",
        ),
    }
}

async fn explain(gw: &Gateway, live: &Live, q: &[(String, String)]) -> Response<Body> {
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
    let claims = param(q, "jwt").and_then(|t| gw.verify_token(live, t));
    let request = described
        .view()
        .with_claims(claims.as_ref().map(|c| c as _));
    let (method, path) = (&described.method, &described.path);
    let given = param(q, "identity");
    let facts = Facts {
        request,
        identity: match given {
            Some(id) => Identity::Given(Some(id)),
            None => Identity::Resolve,
        },
        route: Some(live.router.route_name(&request)),
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
            _ => "unavailable",
        });
        v["detail"] = json!(problem_detail(&refusal.problem(live.config.status)));
        v["rules"] = json!([]);
        json_response(StatusCode::OK, &v)
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
    let described: Vec<(ratewarden::Rule, String)> = matched
        .keys()
        .map(|(_, rule, k)| (rule.clone(), k.to_owned()))
        .collect();
    let decision = match matched.decide(&live.limiter, 1, Mode::Peek).await {
        Ok(a) => a.decision,
        Err(Refusal::Limited(d)) => Some(d),
        Err(Refusal::Unavailable(e)) => return unavailable(e),
        Err(_) => None,
    };
    let mut rules = vec![];
    for (i, (rule, key)) in described.into_iter().enumerate() {
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
        }));
    }
    let mut v = head(&identity, decision.as_ref().is_none_or(|d| d.allowed));
    v["limited"] = json!(limited);
    v["rules"] = json!(rules);
    if let Some(d) = &decision {
        v["headers"] = decision_json(d, live)["headers"].clone();
    }
    json_response(StatusCode::OK, &v)
}

/// The `detail` of a problem body (RFC 9457), for answers that show it.
fn problem_detail(body: &str) -> Option<String> {
    let v: Value = serde_json::from_str(body).ok()?;
    v.get("detail")?.as_str().map(str::to_owned)
}

/// Most entries a listing returns.
const MAX_LISTED: usize = 1000;

/// `limit=` of a listing: 1 to [`MAX_LISTED`], 100 by default.
/// A bad one is answered with a 400 (the `Err`).
fn listing_limit(q: &[(String, String)]) -> Result<usize, Box<Response<Body>>> {
    match param(q, "limit") {
        None => Ok(100),
        Some(v) => match v.parse::<usize>() {
            Ok(n) if (1..=MAX_LISTED).contains(&n) => Ok(n),
            _ => Err(Box::new(problem_response(
                StatusCode::BAD_REQUEST,
                &format!("`limit` is 1 to {MAX_LISTED}"),
            ))),
        },
    }
}

/// `GET /v1/rules`: the rules loaded, with their parameters and the
/// fingerprint that names their state.
/// A request that would change something (not `GET`/`HEAD`) sent by a
/// browser on behalf of another site: refused (403). A browser sends the
/// admin token it was given for `/ui` (Basic) with any request to the
/// admin listener, and with no token any page can reach a loopback admin
/// API: a form on another site (or on the proxied site, another port of the
/// same host) could charge keys or clear bans. Browsers say where a request
/// comes from (`Sec-Fetch-Site`, `Origin`); clients that are not browsers
/// (curl, Prometheus, scripts) send neither and are not affected.
fn cross_site(req: &Request<Incoming>) -> Option<Response<Body>> {
    if matches!(*req.method(), Method::GET | Method::HEAD) {
        return None;
    }
    let h = req.headers();
    let site_ok = match h.get("sec-fetch-site").map(HeaderValue::as_bytes) {
        None | Some(b"same-origin" | b"none") => true,
        Some(_) => false,
    };
    let origin_ok = match (h.get(header::ORIGIN), h.get(header::HOST)) {
        (None, _) => true,
        (Some(o), Some(host)) => {
            let (o, host) = (o.as_bytes(), host.as_bytes());
            [b"http://".as_slice(), b"https://"]
                .iter()
                .any(|scheme| o.strip_prefix(*scheme) == Some(host))
        }
        (Some(_), None) => false,
    };
    if site_ok && origin_ok {
        return None;
    }
    Some(problem_response(
        StatusCode::FORBIDDEN,
        "a browser request from another site to the admin API is refused",
    ))
}

/// Whether `given` is `secret`, in a time that depends on their lengths
/// only: every byte is compared, with no exit at the first that differs,
/// so the answer's timing says nothing of how much of a guess was right.
fn same_secret(given: &[u8], secret: &[u8]) -> bool {
    given.len() == secret.len()
        && given
            .iter()
            .zip(secret)
            .fold(0u8, |diff, (a, b)| diff | (a ^ b))
            == 0
}

/// A request for a `Host` the admin listener is not reached by: 421. DNS
/// rebinding points a name the attacker owns at the listener's address,
/// and a browser then sends that name as `Host` and `Origin` alike (so the
/// cross-site check cannot tell): the names answered are `localhost`
/// (`*.localhost` too, which browsers resolve to loopback themselves) and
/// `admin.hosts`; any address is answered, since a rebinding needs a name.
/// A request without `Host` (HTTP/1.0, a script) is answered: browsers
/// always send one. HTTP/2's `:authority` is read where there is no
/// `Host`.
fn misdirected(req: &Request<Incoming>, hosts: &[String]) -> Option<Response<Body>> {
    let raw = match req.headers().get(header::HOST) {
        Some(h) => h.to_str().unwrap_or("\u{fffd}"),
        None => req.uri().authority()?.as_str(),
    };
    let host = raw.trim();
    // The name without its port: `[v6]:port`, `name:port`.
    let name = match host.strip_prefix('[') {
        Some(rest) => rest.split_once(']').map_or(rest, |(a, _)| a),
        None => host.rsplit_once(':').map_or(host, |(h, _)| h),
    };
    let name = name.trim_end_matches('.').to_ascii_lowercase();
    let answered = name.parse::<std::net::IpAddr>().is_ok()
        || name == "localhost"
        || name.ends_with(".localhost")
        || hosts.contains(&name);
    if answered {
        return None;
    }
    // (DEBUG: a page can send these as fast as it likes.)
    tracing::debug!(
        host = %host.escape_debug(),
        "admin request for a host it is not reached by refused (421): add it to admin.hosts if it is yours"
    );
    Some(problem_response(
        StatusCode::MISDIRECTED_REQUEST,
        "the admin API answers only its own address, localhost and admin.hosts",
    ))
}

/// A page of `/ui`: not cached, not framed, its own script only.
fn page(body: String, content_type: &'static str) -> Response<Body> {
    let mut r = respond(StatusCode::OK, content_type, body);
    let h = r.headers_mut();
    h.insert(header::CACHE_CONTROL, HeaderValue::from_static("no-store"));
    h.insert(
        header::CONTENT_SECURITY_POLICY,
        HeaderValue::from_static(crate::front::ui::CSP),
    );
    h.insert(header::X_FRAME_OPTIONS, HeaderValue::from_static("DENY"));
    h.insert(
        header::X_CONTENT_TYPE_OPTIONS,
        HeaderValue::from_static("nosniff"),
    );
    r
}

fn rules(gw: &Gateway, live: &Live) -> Response<Body> {
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
            })
        })
        .collect();
    json_response(StatusCode::OK, &json!({ "rules": rules }))
}

/// Names one listing's `SCAN` examines on each Redis server, at most.
const SCAN_BUDGET: usize = 10_000;

/// Store reads a listing keeps in flight.
const INSPECTING: usize = 64;

/// A key a listing found, with its state now.
struct Found {
    key: String,
    info: ratewarden::KeyInfo,
    /// The parameters it counts under: the rule's own, a tier's, or its
    /// override's.
    rule: ratewarden::Rule,
}

/// The parameter sets of `pr` a key may count under: its own, each
/// limited tier's (one state each), and the overrides set now.
fn variants(live: &Live, pr: &ratewarden_tower::policy::PolicyRule) -> Vec<ratewarden::Rule> {
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
fn applied(rule: &ratewarden::Rule) -> Option<&str> {
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
async fn existing(
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
async fn inspect_all(
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
async fn bans(gw: &Gateway, live: &Live, q: &[(String, String)]) -> Response<Body> {
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
async fn top_keys(gw: &Gateway, live: &Live, q: &[(String, String)]) -> Response<Body> {
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
    let mut rows: Vec<(f64, Found)> = found
        .into_iter()
        .map(|f| {
            // `remaining` is what the next request would leave: one more
            // is left before it when it would be admitted.
            let limit_of = f.rule.limit();
            let left = f.info.remaining + u64::from(f.info.admits);
            let used = limit_of.saturating_sub(left);
            (used as f64 / limit_of as f64, f)
        })
        .collect();
    rows.sort_by(|a, b| b.0.total_cmp(&a.0));
    rows.truncate(limit);
    let keys: Vec<Value> = rows
        .into_iter()
        .map(|(share, f)| {
            json!({
                "key": f.key, "used": (share * 1000.0).round() / 1000.0,
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
async fn ban(gw: &Gateway, live: &Live, body: BanBody) -> Response<Body> {
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
async fn lift(
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

async fn keys(
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
                "reset_after": secs(i.reset_after), "ban_left": i.ban_left.map(secs), "ban_level": i.ban_level,
            }),
        ),
        Err(e) => unavailable(e),
    }
}
