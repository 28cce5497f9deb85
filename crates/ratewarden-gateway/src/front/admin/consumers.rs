//! `/v1/consumers`: consumers made, listed, changed and revoked, and each
//! one's usage (what Unkey's verify answers: each rule's limit, what is
//! left, and when it resets). Where they are kept is [`crate::consumers`].

use http::{Method, Request, Response, StatusCode};
use hyper::body::Incoming;
use ratewarden::Store;
use serde_json::json;

use super::{json_response, read_json, secs, unavailable};
use crate::answer::{Body, problem_response};
use crate::consumers::{self, Error};
use crate::gateway::{Gateway, Live};

fn error(e: Error) -> Response<Body> {
    let status = match &e {
        Error::Invalid(_) => StatusCode::BAD_REQUEST,
        Error::NotFound(_) => StatusCode::NOT_FOUND,
        Error::Conflict(_) => StatusCode::CONFLICT,
        Error::Store(_) => return unavailable(&e),
    };
    problem_response(status, &e.to_string())
}

/// `/v1/consumers` and `/v1/consumers/{name}[/usage]`.
pub(super) async fn handle(gw: &Gateway, live: &Live, req: Request<Incoming>) -> Response<Body> {
    let path = req.uri().path().to_owned();
    let rest = path
        .strip_prefix("/v1/consumers")
        .unwrap_or("")
        .trim_start_matches('/');
    let now = gw.consumers.now();
    match (req.method().clone(), rest.split_once('/')) {
        (Method::GET, None) if rest.is_empty() => {
            let all: Vec<_> = consumers::all(gw)
                .iter()
                .map(|(c, source)| consumers::to_json(c, source, now))
                .collect();
            json_response(
                StatusCode::OK,
                &json!({"consumers": all, "max": gw.consumers.max()}),
            )
        }
        (Method::POST, None) if rest.is_empty() => {
            let body = match read_json::<consumers::NewBody>(req).await {
                Ok(b) => b,
                Err(r) => return r,
            };
            let imported = body_imports(&body);
            match consumers::create(gw, body).await {
                Ok((c, key)) => {
                    tracing::info!(consumer = c.name, "consumer made by the admin API");
                    let mut v = consumers::to_json(&c, "api", now);
                    // The key, once: only its hash is kept.
                    if !imported {
                        v["key"] = json!(key);
                    }
                    json_response(StatusCode::CREATED, &v)
                }
                Err(e) => error(e),
            }
        }
        (m, None) if !rest.is_empty() => {
            let name = super::percent_decode(rest);
            match m {
                Method::GET => match consumers::named(gw, &name) {
                    Some((c, source)) => {
                        json_response(StatusCode::OK, &consumers::to_json(&c, source, now))
                    }
                    None => error(Error::NotFound(format!("no consumer named `{name}`"))),
                },
                Method::PUT => {
                    let body = match read_json::<consumers::ChangeBody>(req).await {
                        Ok(b) => b,
                        Err(r) => return r,
                    };
                    match consumers::change(gw, &name, body).await {
                        Ok(c) => {
                            tracing::info!(consumer = c.name, "consumer changed by the admin API");
                            json_response(StatusCode::OK, &consumers::to_json(&c, "api", now))
                        }
                        Err(e) => error(e),
                    }
                }
                Method::DELETE => match consumers::revoke(gw, &name).await {
                    Ok(c) => {
                        tracing::info!(consumer = c.name, "consumer revoked by the admin API");
                        json_response(StatusCode::OK, &json!({"name": c.name, "revoked": true}))
                    }
                    Err(e) => error(e),
                },
                _ => problem_response(
                    StatusCode::METHOD_NOT_ALLOWED,
                    "/v1/consumers/{name} takes GET, PUT, DELETE",
                ),
            }
        }
        (Method::GET, Some((name, "usage"))) => {
            let name = super::percent_decode(name);
            match consumers::named(gw, &name) {
                Some((c, _)) => usage(live, &c).await,
                None => error(Error::NotFound(format!("no consumer named `{name}`"))),
            }
        }
        _ => problem_response(
            StatusCode::NOT_FOUND,
            "use /v1/consumers, /v1/consumers/{name} or /v1/consumers/{name}/usage",
        ),
    }
}

fn body_imports(body: &consumers::NewBody) -> bool {
    body.imports()
}

/// Each rule keyed by the consumer alone (`key: [consumer]`, or the
/// identity `from: consumer`): its limit in the consumer's tier, what is
/// left, and when it resets, as the store holds it now.
async fn usage(live: &Live, c: &ratewarden_tower::consumers::Consumer) -> Response<Body> {
    use ratewarden_tower::policy::{IdentitySource, KeyPart};
    let policy = &live.config.policy;
    let by_consumer = matches!(policy.identity, IdentitySource::Consumer { .. });
    let mut rules = vec![];
    for r in &policy.rules {
        let keyed = match r.key.as_slice() {
            [KeyPart::Consumer] => true,
            [KeyPart::Identity] => by_consumer,
            _ => false,
        };
        if !keyed {
            continue;
        }
        let tier = r
            .tiers
            .as_ref()
            .filter(|t| t.from == KeyPart::ConsumerTier)
            .map(|t| t.values[t.pick(c.tier.as_deref())].name.clone());
        let name = r.rule.name();
        let matched = match policy.named_in_tier(name, &c.name, None, tier.as_deref()) {
            Ok(Some(m)) => m,
            Ok(None) => {
                rules.push(json!({"rule": name, "tier": tier, "unlimited": true}));
                continue;
            }
            Err(_) => continue,
        };
        let ops = matched.ops();
        let op = ops[0];
        match live.limiter.store().inspect(op).await {
            Ok(i) => rules.push(json!({
                "rule": name,
                "tier": tier,
                "limit": op.rule.limit(),
                "remaining": i.remaining,
                "charged": super::keys::charged(op.rule.limit(), &i),
                "reset_after": secs(i.reset_after),
            })),
            Err(e) => return unavailable(e),
        }
    }
    json_response(
        StatusCode::OK,
        &json!({"name": c.name, "tier": c.tier, "rules": rules}),
    )
}
