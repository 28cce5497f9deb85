//! The admin API: health, readiness, metrics, and decisions for applications
//! that are not behind the gateway (`/v1/check`, `/v1/report`), plus key
//! inspection and `explain`.

use http::header::{self, HeaderValue};
use http::{Method, Request, Response, StatusCode};
use http_body_util::{BodyExt, Limited};
use hyper::body::Incoming;
use ratewarden::{Op, Store};
use serde::Deserialize;
use serde_json::{Value, json};

use crate::config::KeyPart;
use crate::gateway::{Body, Gateway, problem_response, respond};

/// Largest admin request body read.
const MAX_BODY: usize = 64 * 1024;

fn json_response(status: StatusCode, v: &Value) -> Response<Body> {
    respond(status, "application/json", v.to_string())
}

fn secs(d: std::time::Duration) -> f64 {
    d.as_secs_f64()
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct CheckBody {
    rule: String,
    key: String,
    /// The client's identity, when the rule's key has more parts than it.
    identity: Option<String>,
    #[serde(default = "one")]
    cost: u64,
}

fn one() -> u64 {
    1
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct ReportBody {
    rule: String,
    key: String,
    identity: Option<String>,
    outcome: String,
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

fn query(req: &Request<Incoming>, name: &str) -> Option<String> {
    req.uri().query()?.split('&').find_map(|pair| {
        let (k, v) = pair.split_once('=')?;
        (k == name).then(|| percent_decode(v))
    })
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

/// Handles one admin request.
pub async fn handle(gw: &Gateway, req: Request<Incoming>) -> Response<Body> {
    let live = gw.live();
    if let Some((_, Some(token))) = &live.config.admin {
        let ok = req
            .headers()
            .get(header::AUTHORIZATION)
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.strip_prefix("Bearer "))
            .is_some_and(|t| t == token);
        if !ok {
            let mut r = problem_response(
                StatusCode::UNAUTHORIZED,
                "admin requests need Authorization: Bearer <token>",
            );
            r.headers_mut()
                .insert(header::WWW_AUTHENTICATE, HeaderValue::from_static("Bearer"));
            return r;
        }
    }
    let path = req.uri().path().to_owned();
    let store = live.limiter.store();
    let find = |name: &str| live.config.rules.iter().find(|r| r.rule.name() == name);
    match (req.method().clone(), path.as_str()) {
        (Method::GET, "/healthz") => respond(StatusCode::OK, "text/plain", "ok\n"),
        (Method::GET, "/readyz") => match store.ping().await {
            Ok(()) => respond(StatusCode::OK, "text/plain", "ready\n"),
            Err(e) => respond(
                StatusCode::SERVICE_UNAVAILABLE,
                "text/plain",
                format!("store unavailable: {e}\n"),
            ),
        },
        (Method::GET, "/metrics") => respond(
            StatusCode::OK,
            "text/plain; version=0.0.4",
            gw.metrics.render(store.errors()),
        ),
        (Method::POST, "/v1/check") => {
            let body: CheckBody = match read_json(req).await {
                Ok(b) => b,
                Err(r) => return r,
            };
            let Some(rule) = find(&body.rule) else {
                return problem_response(
                    StatusCode::NOT_FOUND,
                    &format!("no rule named `{}`", body.rule),
                );
            };
            if body.cost == 0 || body.cost > u32::MAX as u64 {
                return problem_response(
                    StatusCode::BAD_REQUEST,
                    "`cost` must be between 1 and 4294967295",
                );
            }
            let group = match rule.group(&body.key, body.identity.as_deref()) {
                Ok(g) => g,
                Err(m) => return problem_response(StatusCode::BAD_REQUEST, &m),
            };
            let op = [Op::grouped(&rule.rule, &body.key, &group)];
            match live.limiter.acquire(&op, body.cost).await {
                Ok(a) => {
                    let d = &a.decision;
                    let r = &d.rules[0];
                    gw.metrics.request(
                        r.rule.name(),
                        if r.allowed() { "allowed" } else { "rejected" },
                    );
                    json_response(
                        StatusCode::OK,
                        &json!({
                            "allowed": d.allowed,
                            "rule": r.rule.name(),
                            "limit": r.rule.limit(),
                            "remaining": r.remaining,
                            "reset_after": secs(r.reset_after),
                            "retry_after": d.retry_after_secs(),
                            "reason": r.reason.map(|x| x.as_str()),
                            "delay": secs(d.delay),
                        }),
                    )
                }
                Err(e) => problem_response(
                    StatusCode::SERVICE_UNAVAILABLE,
                    &format!("store unavailable: {e}"),
                ),
            }
        }
        (Method::POST, "/v1/report") => {
            let body: ReportBody = match read_json(req).await {
                Ok(b) => b,
                Err(r) => return r,
            };
            let Some(rule) = find(&body.rule) else {
                return problem_response(
                    StatusCode::NOT_FOUND,
                    &format!("no rule named `{}`", body.rule),
                );
            };
            if !rule.rule.counts_failures() {
                return problem_response(
                    StatusCode::CONFLICT,
                    &format!("rule `{}` does not use `count: failures`", body.rule),
                );
            }
            let failure = match body.outcome.as_str() {
                "failure" => true,
                "success" => false,
                other => {
                    return problem_response(
                        StatusCode::BAD_REQUEST,
                        &format!("`outcome` is failure or success, not `{other}`"),
                    );
                }
            };
            let group = match rule.group(&body.key, body.identity.as_deref()) {
                Ok(g) => g,
                Err(m) => return problem_response(StatusCode::BAD_REQUEST, &m),
            };
            match store
                .settle(&[Op::grouped(&rule.rule, &body.key, &group)], 1, failure)
                .await
            {
                Ok(()) => json_response(
                    StatusCode::OK,
                    &json!({"rule": body.rule, "key": body.key, "outcome": body.outcome}),
                ),
                Err(e) => problem_response(
                    StatusCode::SERVICE_UNAVAILABLE,
                    &format!("store unavailable: {e}"),
                ),
            }
        }
        (Method::GET, "/v1/explain") => {
            let method = query(&req, "method").unwrap_or_else(|| "GET".into());
            let Ok(method) = Method::from_bytes(method.to_ascii_uppercase().as_bytes()) else {
                return problem_response(StatusCode::BAD_REQUEST, "bad `method`");
            };
            // The path as a rule would see it on the proxy.
            let raw = query(&req, "path").unwrap_or_else(|| "/".into());
            let path = match crate::proxy::forward::rule_path(&method, &raw) {
                Ok(p) => p.into_owned(),
                Err(e) => return e.answer(),
            };
            let identity = query(&req, "identity").unwrap_or_default();
            let mut rules = vec![];
            for r in live
                .config
                .rules
                .iter()
                .filter(|r| r.matcher.matches(&method, &path))
            {
                let key: Vec<String> = r
                    .key
                    .iter()
                    .map(|p| match p {
                        KeyPart::Identity => identity.clone(),
                        KeyPart::Method => method.to_string(),
                        KeyPart::Path => path.clone(),
                        KeyPart::Global => "global".into(),
                        KeyPart::Header(h) => {
                            query(&req, &format!("header:{h}")).unwrap_or_default()
                        }
                    })
                    .collect();
                let key = key.join(":");
                let group = r.group(&key, Some(&identity)).expect("identity given");
                let op = [Op::grouped(&r.rule, &key, &group)];
                let (peek, info) =
                    match (live.limiter.peek(&op, 1).await, store.inspect(op[0]).await) {
                        (Ok(p), Ok(i)) => (p, i),
                        (Err(e), _) | (_, Err(e)) => {
                            return problem_response(
                                StatusCode::SERVICE_UNAVAILABLE,
                                &format!("store unavailable: {e}"),
                            );
                        }
                    };
                let d = &peek.rules[0];
                rules.push(json!({
                    "rule": r.rule.name(),
                    "algorithm": r.rule.spec().algorithm.name(),
                    "limit": r.rule.limit(),
                    "window": secs(r.rule.window()),
                    "key": key,
                    "state": {"exists": info.exists, "remaining": info.remaining, "reset_after": secs(info.reset_after), "ban_left": info.ban_left.map(secs)},
                    "would_allow": d.allowed(),
                    "reason": d.reason.map(|x| x.as_str()),
                    "shadow": r.rule.is_shadow(),
                }));
            }
            let allowed = rules
                .iter()
                .all(|r| r["would_allow"] == json!(true) || r["shadow"] == json!(true));
            json_response(
                StatusCode::OK,
                &json!({"method": method.as_str(), "path": path, "identity": identity, "would_allow": allowed, "rules": rules}),
            )
        }
        (m, p) if p.starts_with("/v1/keys/") && (m == Method::GET || m == Method::DELETE) => {
            let rest = &p["/v1/keys/".len()..];
            let Some((rule_name, key)) = rest.split_once('/') else {
                return problem_response(StatusCode::NOT_FOUND, "use /v1/keys/{rule}/{key}");
            };
            let (rule_name, key) = (percent_decode(rule_name), percent_decode(key));
            let Some(rule) = find(&rule_name) else {
                return problem_response(
                    StatusCode::NOT_FOUND,
                    &format!("no rule named `{rule_name}`"),
                );
            };
            let identity = query(&req, "identity");
            let group = match rule.group(&key, identity.as_deref()) {
                Ok(g) => g,
                Err(m) => return problem_response(StatusCode::BAD_REQUEST, &m),
            };
            let op = Op::grouped(&rule.rule, &key, &group);
            if m == Method::DELETE {
                return match store.clear(op).await {
                    Ok(existed) => json_response(
                        StatusCode::OK,
                        &json!({"rule": rule_name, "key": key, "cleared": existed}),
                    ),
                    Err(e) => problem_response(
                        StatusCode::SERVICE_UNAVAILABLE,
                        &format!("store unavailable: {e}"),
                    ),
                };
            }
            match store.inspect(op).await {
                Ok(i) => json_response(
                    StatusCode::OK,
                    &json!({
                        "rule": rule_name, "key": key, "exists": i.exists,
                        "limit": rule.rule.limit(), "remaining": i.remaining,
                        "reset_after": secs(i.reset_after), "ban_left": i.ban_left.map(secs), "ban_level": i.ban_level,
                    }),
                ),
                Err(e) => problem_response(
                    StatusCode::SERVICE_UNAVAILABLE,
                    &format!("store unavailable: {e}"),
                ),
            }
        }
        _ => problem_response(StatusCode::NOT_FOUND, &format!("no admin endpoint {path}")),
    }
}
