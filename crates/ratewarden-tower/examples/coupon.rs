//! The coupon endpoint of seed 000, in axum: 10 wrong codes per 5 minutes per
//! user, then a 10-minute freeze; a right code forgives (clears the count,
//! not an active freeze).
//!
//! ```sh
//! cargo run -p ratewarden-tower --example coupon
//! curl -i -X POST -H 'x-user-id: 42' -d WRONG localhost:3000/coupons     # 400, counted
//! curl -i -X POST -H 'x-user-id: 42' -d WELCOME-2026 localhost:3000/coupons  # 200, forgiven
//! ```

use std::time::Duration;

use axum::Router;
use axum::http::StatusCode;
use axum::routing::post;
use ratewarden::algorithm::Kind;
use ratewarden::{MemoryStore, Penalty, Rule, Store};
use ratewarden_tower::RateLimitLayer;
use ratewarden_tower::key::Header;

/// 10 wrong codes per 5 minutes, then 10 minutes frozen; only failures count.
fn coupon_rule() -> Rule {
    Rule::builder("coupon")
        .algorithm(Kind::SlidingWindowLog)
        .limit(10, Duration::from_secs(300))
        .penalty(Penalty::fixed(Duration::from_secs(600)))
        .count_failures(true)
        .build()
        .expect("a valid rule")
}

async fn redeem(code: String) -> StatusCode {
    if code.trim() == "WELCOME-2026" {
        StatusCode::OK
    } else {
        StatusCode::BAD_REQUEST
    }
}

/// The app, over any store: the memory store in one process, Redis across replicas.
fn app<S: Store>(store: S) -> Router {
    let limit = RateLimitLayer::builder(store, [coupon_rule()], Header::new("x-user-id")).build();
    Router::new()
        .route("/coupons", post(redeem))
        .route_layer(limit)
}

#[tokio::main]
async fn main() {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:3000")
        .await
        .unwrap();
    println!("POST http://127.0.0.1:3000/coupons with header x-user-id and a code in the body");
    axum::serve(listener, app(MemoryStore::default()))
        .await
        .unwrap();
}

#[cfg(test)]
#[path = "../../ratewarden/tests/common/mod.rs"]
mod common;

#[cfg(test)]
mod tests {
    use super::*;
    use axum::body::Body;
    use axum::http::Request;
    use ratewarden::clock::{Clock, ManualClock};
    use ratewarden::{RedisConfig, RedisStore};
    use std::sync::Arc;
    use tower::ServiceExt;

    fn now() -> u64 {
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .as_micros() as u64
    }

    async fn post(app: &Router, user: &str, code: &str) -> (StatusCode, Option<String>) {
        let req = Request::post("/coupons")
            .header("x-user-id", user)
            .body(Body::from(code.to_owned()))
            .unwrap();
        let resp = app.clone().oneshot(req).await.unwrap();
        let retry = resp
            .headers()
            .get("retry-after")
            .map(|v| v.to_str().unwrap().to_owned());
        (resp.status(), retry)
    }

    /// The whole story on a manual clock; `apps` are replicas sharing a store.
    async fn freeze_and_forgive(apps: &[Router], clock: &ManualClock) {
        let app = |i: usize| &apps[i % apps.len()];
        // A right code midway resets the count.
        for i in 0..9 {
            assert_eq!(post(app(i), "42", "NOPE").await.0, StatusCode::BAD_REQUEST);
        }
        assert_eq!(post(app(1), "42", "WELCOME-2026").await.0, StatusCode::OK);
        // Ten wrong codes are answered by the handler (400)...
        for i in 0..10 {
            clock.advance(Duration::from_secs(1));
            assert_eq!(
                post(app(i), "42", "NOPE").await.0,
                StatusCode::BAD_REQUEST,
                "wrong code {i}"
            );
        }
        // ...the 11th is frozen for 10 minutes.
        let (status, retry) = post(app(0), "42", "NOPE").await;
        assert_eq!(status, StatusCode::TOO_MANY_REQUESTS);
        assert_eq!(retry.as_deref(), Some("600"));
        // Another user is unaffected.
        assert_eq!(post(app(1), "7", "WELCOME-2026").await.0, StatusCode::OK);
        // A right code during the freeze does not lift it.
        clock.advance(Duration::from_secs(300));
        let (status, retry) = post(app(1), "42", "WELCOME-2026").await;
        assert_eq!(status, StatusCode::TOO_MANY_REQUESTS);
        assert_eq!(retry.as_deref(), Some("300"));
        // After the freeze, a right code goes through.
        clock.advance(Duration::from_secs(300));
        assert_eq!(post(app(0), "42", "WELCOME-2026").await.0, StatusCode::OK);
    }

    #[tokio::test]
    async fn coupon_freeze_and_forgiveness_on_the_memory_store() {
        let clock = ManualClock::new(now());
        let store = MemoryStore::builder().clock(clock.clone()).build();
        freeze_and_forgive(&[app(store)], &clock).await;
    }

    #[tokio::test]
    async fn coupon_freeze_and_forgiveness_across_two_replicas_on_redis() {
        let server = common::RedisServer::start();
        let clock = ManualClock::new(now());
        let replica = || {
            app(RedisStore::new(RedisConfig {
                url: Some(server.url()),
                local_clock: Some(Arc::new(clock.clone()) as Arc<dyn Clock>),
                ..RedisConfig::default()
            })
            .unwrap())
        };
        freeze_and_forgive(&[replica(), replica()], &clock).await;
    }

    #[tokio::test]
    async fn the_rejection_is_the_problem_body_with_headers() {
        let clock = ManualClock::new(now());
        let app = app(MemoryStore::builder().clock(clock).build());
        for _ in 0..10 {
            post(&app, "u", "NOPE").await;
        }
        let req = Request::post("/coupons")
            .header("x-user-id", "u")
            .body(Body::from("NOPE"))
            .unwrap();
        let resp = app.oneshot(req).await.unwrap();
        assert_eq!(resp.headers()["content-type"], "application/problem+json");
        assert_eq!(resp.headers()["x-ratelimit-remaining"], "0");
        assert_eq!(resp.headers()["ratelimit"], "\"coupon\";r=0;t=600");
        let body = axum::body::to_bytes(resp.into_body(), 4096).await.unwrap();
        let body = String::from_utf8(body.to_vec()).unwrap();
        assert!(body.contains(r#""violated-policies":["coupon"]"#), "{body}");
        assert!(body.contains(r#""retry_after":600"#), "{body}");
    }
}
