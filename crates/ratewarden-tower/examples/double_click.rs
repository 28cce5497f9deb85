//! The double click of seed 001, in axum: `POST /interview-questions` costs an
//! LLM call, so one user may start at most one generation per 5 seconds. The
//! user id comes from a request extension an authentication layer put there.
//!
//! ```sh
//! cargo run -p ratewarden-tower --example double_click
//! curl -i -X POST -H 'authorization: Bearer alice' localhost:3001/interview-questions
//! ```

use std::fmt;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use axum::Router;
use axum::extract::State;
use axum::http::{Request, StatusCode};
use axum::routing::post;
use ratewarden::algorithm::Kind;
use ratewarden::{MemoryStore, Rule, Store};
use ratewarden_tower::RateLimitLayer;
use ratewarden_tower::key::Extension;

/// The authenticated user, as an auth layer resolves it.
#[derive(Clone, Debug)]
struct UserId(String);

impl fmt::Display for UserId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

/// A stand-in for real authentication: `Authorization: Bearer <user>`.
fn authenticate<B>(mut req: Request<B>) -> Request<B> {
    let user = req
        .headers()
        .get("authorization")
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.strip_prefix("Bearer "))
        .map(|u| UserId(u.to_owned()));
    if let Some(user) = user {
        req.extensions_mut().insert(user);
    }
    req
}

/// Counts the (expensive) generations actually started.
async fn generate(State(calls): State<Arc<AtomicUsize>>) -> StatusCode {
    calls.fetch_add(1, Ordering::SeqCst);
    StatusCode::CREATED
}

fn app<S: Store>(store: S, calls: Arc<AtomicUsize>) -> Router {
    let once_per_5s = Rule::builder("interview-questions")
        .algorithm(Kind::SlidingWindowLog)
        .limit(1, Duration::from_secs(5))
        .build()
        .expect("a valid rule");
    let limit = RateLimitLayer::builder(store, [once_per_5s], Extension::<UserId>::new()).build();
    Router::new()
        .route("/interview-questions", post(generate))
        .route_layer(limit)
        .layer(tower::util::MapRequestLayer::new(authenticate))
        .with_state(calls)
}

#[tokio::main]
async fn main() {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:3001")
        .await
        .unwrap();
    println!("POST http://127.0.0.1:3001/interview-questions with Authorization: Bearer <user>");
    let calls = Arc::new(AtomicUsize::new(0));
    axum::serve(listener, app(MemoryStore::default(), calls))
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
    use ratewarden::{RedisConfig, RedisStore};
    use tower::ServiceExt;

    async fn click(app: &Router, user: &str) -> StatusCode {
        let req = Request::post("/interview-questions")
            .header("authorization", format!("Bearer {user}"))
            .body(Body::empty())
            .unwrap();
        app.clone().oneshot(req).await.unwrap().status()
    }

    /// `n` concurrent clicks by alice spread over the replicas: exactly one
    /// reaches the handler; bob is unaffected.
    async fn concurrent_clicks(apps: Vec<Router>, calls: &AtomicUsize, n: usize, user: &str) {
        let before = calls.load(Ordering::SeqCst);
        let mut tasks = vec![];
        for i in 0..n {
            let app = apps[i % apps.len()].clone();
            let user = user.to_owned();
            tasks.push(tokio::spawn(async move { click(&app, &user).await }));
        }
        let mut created = 0;
        for t in tasks {
            let s = t.await.unwrap();
            assert!(
                s == StatusCode::CREATED || s == StatusCode::TOO_MANY_REQUESTS,
                "{s}"
            );
            created += usize::from(s == StatusCode::CREATED);
        }
        assert_eq!(created, 1, "{n} clicks");
        assert_eq!(
            calls.load(Ordering::SeqCst) - before,
            1,
            "the handler ran once for {n} clicks"
        );
        assert_eq!(
            click(&apps[0], &format!("{user}-other")).await,
            StatusCode::CREATED
        );
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
    async fn double_and_twenty_clicks_reach_the_handler_once_on_memory() {
        let calls = Arc::new(AtomicUsize::new(0));
        let app = app(MemoryStore::default(), calls.clone());
        concurrent_clicks(vec![app.clone()], &calls, 2, "alice").await;
        concurrent_clicks(vec![app], &calls, 20, "carol").await;
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
    async fn double_and_twenty_clicks_reach_the_handler_once_across_replicas_on_redis() {
        let server = common::RedisServer::start();
        let calls = Arc::new(AtomicUsize::new(0));
        let replica = || {
            let store = RedisStore::new(RedisConfig {
                url: Some(server.url()),
                ..RedisConfig::default()
            })
            .unwrap();
            app(store, calls.clone())
        };
        let apps = vec![replica(), replica()];
        concurrent_clicks(apps.clone(), &calls, 2, "alice").await;
        concurrent_clicks(apps, &calls, 20, "carol").await;
    }

    #[tokio::test]
    async fn an_unauthenticated_click_is_not_limited_by_default() {
        let calls = Arc::new(AtomicUsize::new(0));
        let app = app(MemoryStore::default(), calls.clone());
        for _ in 0..3 {
            let req = Request::post("/interview-questions")
                .body(Body::empty())
                .unwrap();
            assert_eq!(
                app.clone().oneshot(req).await.unwrap().status(),
                StatusCode::CREATED
            );
        }
    }
}
