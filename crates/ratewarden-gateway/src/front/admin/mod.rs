//! The admin API: health, readiness, metrics, and decisions for applications
//! that are not behind the gateway (`/v1/check`, `/v1/report`), plus key
//! inspection and `explain`. Every decision here goes through the one
//! admission path the proxy uses ([`ratewarden_tower::admission`]), so
//! `explain` and `check` answer what the proxy would.

use http::header::{self, HeaderValue};
use http::{Method, Request, Response, StatusCode};
use http_body_util::{BodyExt, Limited};
use hyper::body::Incoming;
use ratewarden::Store;
use ratewarden_tower::admission::NamedError;
use serde::Deserialize;
use serde_json::{Value, json};

use crate::answer::{Body, problem_response, respond};
use crate::gateway::Gateway;

mod consumers;
mod decide;
mod guard;
mod keys;

use decide::{CheckBody, GivenBody, ReportBody, check, explain, report};
use guard::{cross_site, misdirected, same_secret};
use keys::{BanBody, ban, bans, change_error, keys, lift, list_overrides, rules, top_keys};

/// Largest admin request body read.
const MAX_BODY: usize = 64 * 1024;

fn json_response(status: StatusCode, v: &Value) -> Response<Body> {
    respond(status, "application/json", v.to_string())
}

fn secs(d: std::time::Duration) -> f64 {
    d.as_secs_f64()
}

async fn read_json<T: for<'de> Deserialize<'de>>(
    req: Request<Incoming>,
) -> Result<T, Response<Body>> {
    let bytes = read_bytes(req).await?;
    serde_json::from_slice(&bytes)
        .map_err(|e| problem_response(StatusCode::BAD_REQUEST, &format!("invalid JSON body: {e}")))
}

/// A request's body, up to [`MAX_BODY`].
async fn read_bytes(req: Request<Incoming>) -> Result<bytes::Bytes, Response<Body>> {
    Ok(Limited::new(req.into_body(), MAX_BODY)
        .collect()
        .await
        .map_err(|_| {
            problem_response(
                StatusCode::PAYLOAD_TOO_LARGE,
                "body larger than 64 KiB or unreadable",
            )
        })?
        .to_bytes())
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

/// A store error as the admin API answers it: 503, the error saying
/// itself what it is ("store unavailable: ...", "store answer late: ...").
fn unavailable(e: impl std::fmt::Display) -> Response<Body> {
    problem_response(StatusCode::SERVICE_UNAVAILABLE, &e.to_string())
}

fn named_error(e: NamedError) -> Response<Body> {
    match e {
        NamedError::NoRule(_) => problem_response(StatusCode::NOT_FOUND, &e.to_string()),
        NamedError::Group(m) => problem_response(StatusCode::BAD_REQUEST, &m),
    }
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
        (Method::GET, "/metrics") => {
            // OpenMetrics (with exemplars) when the scraper asks for it, as
            // Prometheus does.
            let openmetrics = req.headers().get_all(http::header::ACCEPT).iter().any(|v| {
                v.as_bytes()
                    .windows(28)
                    .any(|w| w == b"application/openmetrics-text")
            });
            let text = {
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
                "# HELP ratewarden_store_gateways Gateways sharing the store: the most announced at once within the last 10 minutes, as this one read them (each takes its share of a limit during an outage).\n# TYPE ratewarden_store_gateways gauge\nratewarden_store_gateways {}\n",
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
                text.push_str(&format!(
                "# HELP ratewarden_refusals_cached_total Requests refused from the refusals kept (no store call): each its key's refusal by the shared store, still in force.\n\
                 # TYPE ratewarden_refusals_cached_total counter\nratewarden_refusals_cached_total {}\n",
                store.refusals().map_or(0, |r| r.hits())
            ));
                let (grants, local) = store.leases();
                text.push_str(&format!(
                "# HELP ratewarden_lease_grants_total Slices of leased rules granted by the store to this gateway.\n\
                 # TYPE ratewarden_lease_grants_total counter\nratewarden_lease_grants_total {grants}\n\
                 # HELP ratewarden_lease_local_decisions_total Decisions answered from leased slices, without a store call.\n\
                 # TYPE ratewarden_lease_local_decisions_total counter\nratewarden_lease_local_decisions_total {local}\n"
            ));
                // Tasks alive in the runtime this listener runs on (the
                // gateway's one runtime): connections, calls, timers. Flat
                // under steady load; a count that only grows is a leak.
                let tasks = tokio::runtime::Handle::try_current()
                    .map_or(0, |h| h.metrics().num_alive_tasks());
                text.push_str(&format!(
                "# HELP ratewarden_runtime_tasks Tasks alive in the gateway's runtime: connections, store calls, timers.\n\
                 # TYPE ratewarden_runtime_tasks gauge\nratewarden_runtime_tasks {tasks}\n"
            ));
                live.router.render(&mut text);
                text
            };
            if openmetrics {
                respond(
                    StatusCode::OK,
                    "application/openmetrics-text; version=1.0.0; charset=utf-8",
                    gw.metrics.openmetrics(&text),
                )
            } else {
                respond(StatusCode::OK, "text/plain; version=0.0.4", text)
            }
        }
        (Method::POST, "/v1/check") => match read_json::<CheckBody>(req).await {
            Ok(body) => check(gw, &live, body).await,
            Err(r) => r,
        },
        (Method::POST, "/v1/report") => match read_json::<ReportBody>(req).await {
            Ok(body) => report(&live, body).await,
            Err(r) => r,
        },
        (Method::GET, "/v1/explain") => {
            explain(gw, &live, &query(&req), GivenBody::default()).await
        }
        (Method::POST, "/v1/explain") => {
            let q = query(&req);
            match read_bytes(req).await {
                Ok(body) => explain(gw, &live, &q, GivenBody::of_bytes(&body)).await,
                Err(r) => r,
            }
        }
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
        (_, p) if p == "/v1/consumers" || p.starts_with("/v1/consumers/") => {
            consumers::handle(gw, &live, req).await
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

/// The methods an admin path takes (its `Allow`), if it is one.
fn allowed_methods(path: &str) -> Option<&'static str> {
    Some(match path {
        "/healthz" | "/readyz" | "/metrics" | "/v1/rules" | "/ui" | "/ui/app.js" | "/v1/keys" => {
            "GET"
        }
        "/v1/explain" => "GET, POST",
        "/v1/bans" => "GET, POST",
        "/v1/overrides" => "GET",
        "/v1/consumers" => "GET, POST",
        p if p.starts_with("/v1/overrides/") => "GET, PUT, DELETE",
        p if p.starts_with("/v1/bans/") => "DELETE",
        "/v1/check" | "/v1/report" => "POST",
        p if p.starts_with("/v1/keys/") => "GET, DELETE",
        _ => return None,
    })
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
