//! The double click of seed 001, in axum: `POST /interview-questions` costs an
//! LLM call. What the post really wanted is an in-flight guard: a second
//! click while the user's first generation still runs is refused, and the
//! next click after it finishes passes, whatever the time (`concurrency`,
//! limit 1; a lease lapses after 5 minutes if a generation never ends). A
//! window on top bounds the budget: 10 generations per user per minute. The
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

/// The (expensive) generations: how many started, and what ends one (a
/// real one takes seconds; tests end them when they choose).
#[derive(Clone)]
struct Generations {
    started: Arc<AtomicUsize>,
    done: tokio::sync::watch::Receiver<bool>,
}

async fn generate(State(g): State<Generations>) -> StatusCode {
    g.started.fetch_add(1, Ordering::SeqCst);
    let mut done = g.done.clone();
    let _ = done.wait_for(|d| *d).await;
    StatusCode::CREATED
}

fn rules() -> [Rule; 2] {
    let one_at_a_time = Rule::builder("generating")
        .algorithm(Kind::Concurrency)
        .limit(1, Duration::from_secs(1))
        .max_hold(Duration::from_secs(300))
        .build()
        .expect("a valid rule");
    let budget = Rule::builder("per-minute")
        .algorithm(Kind::SlidingWindowLog)
        .limit(10, Duration::from_secs(60))
        .build()
        .expect("a valid rule");
    [one_at_a_time, budget]
}

fn app<S: Store>(store: S, generations: Generations) -> Router {
    let limit = RateLimitLayer::builder(store, rules(), Extension::<UserId>::new()).build();
    Router::new()
        .route("/interview-questions", post(generate))
        .route_layer(limit)
        .layer(tower::util::MapRequestLayer::new(authenticate))
        .with_state(generations)
}

#[tokio::main]
async fn main() {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:3001")
        .await
        .unwrap();
    println!("POST http://127.0.0.1:3001/interview-questions with Authorization: Bearer <user>");
    // Every generation here ends at once; a real one would take seconds.
    let (_done, ended) = tokio::sync::watch::channel(true);
    let generations = Generations {
        started: Arc::new(AtomicUsize::new(0)),
        done: ended,
    };
    axum::serve(listener, app(MemoryStore::default(), generations))
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

    /// Generations that run until `end` is called.
    fn running() -> (Generations, tokio::sync::watch::Sender<bool>) {
        let (end, done) = tokio::sync::watch::channel(false);
        let g = Generations {
            started: Arc::new(AtomicUsize::new(0)),
            done,
        };
        (g, end)
    }

    async fn click(app: &Router, user: &str) -> axum::response::Response {
        let req = Request::post("/interview-questions")
            .header("authorization", format!("Bearer {user}"))
            .body(Body::empty())
            .unwrap();
        app.clone().oneshot(req).await.unwrap()
    }

    /// Starts a click and waits until its generation has started.
    async fn start(
        app: &Router,
        g: &Generations,
        user: &str,
    ) -> tokio::task::JoinHandle<StatusCode> {
        let before = g.started.load(Ordering::SeqCst);
        let (app, user) = (app.clone(), user.to_owned());
        let t = tokio::spawn(async move { click(&app, &user).await.status() });
        while g.started.load(Ordering::SeqCst) == before {
            tokio::task::yield_now().await;
        }
        t
    }

    /// `n` concurrent clicks by one user spread over the replicas, while the
    /// first generation runs: exactly one starts; another user is
    /// unaffected; once it ends, the next click starts at once.
    async fn concurrent_clicks(apps: Vec<Router<Generations>>, n: usize, user: &str) {
        let (g, end) = running();
        let apps: Vec<Router> = apps.into_iter().map(|a| a.with_state(g.clone())).collect();
        let mut tasks = vec![];
        for i in 0..n {
            let (app, user) = (apps[i % apps.len()].clone(), user.to_owned());
            tasks.push(tokio::spawn(
                async move { click(&app, &user).await.status() },
            ));
        }
        // All but the one that started come back refused, while it runs.
        let mut refused = 0;
        while refused < n - 1 {
            tokio::task::yield_now().await;
            let (done, rest): (Vec<_>, Vec<_>) = tasks.into_iter().partition(|t| t.is_finished());
            tasks = rest;
            for t in done {
                assert_eq!(t.await.unwrap(), StatusCode::TOO_MANY_REQUESTS);
                refused += 1;
            }
        }
        while g.started.load(Ordering::SeqCst) == 0 {
            tokio::task::yield_now().await;
        }
        assert_eq!(tasks.len(), 1, "one click still running");
        assert_eq!(
            g.started.load(Ordering::SeqCst),
            1,
            "{n} clicks started one generation"
        );
        let other = start(&apps[0], &g, &format!("{user}-other")).await;
        end.send(true).unwrap();
        assert_eq!(tasks.pop().unwrap().await.unwrap(), StatusCode::CREATED);
        assert_eq!(other.await.unwrap(), StatusCode::CREATED);
        // Finished: the next click passes, with no window to wait out. The
        // slot is given back when the answer's body is dropped, by a task
        // of its own: on a busy machine that can land a moment after the
        // status did (a click sent at once was refused, on Redis under
        // CI's load), so "at once" is within 2 s, far inside the window.
        let deadline = std::time::Instant::now() + Duration::from_secs(2);
        loop {
            match click(&apps[1 % apps.len()], user).await.status() {
                StatusCode::CREATED => break,
                s => assert!(
                    std::time::Instant::now() < deadline,
                    "the slot was never given back: {s}"
                ),
            }
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    }

    fn bare<S: Store>(store: S) -> Router<Generations> {
        let limit = RateLimitLayer::builder(store, rules(), Extension::<UserId>::new()).build();
        Router::new()
            .route("/interview-questions", post(generate))
            .route_layer(limit)
            .layer(tower::util::MapRequestLayer::new(authenticate))
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
    async fn a_click_while_the_first_runs_is_refused_and_one_after_it_passes_on_memory() {
        let (g, end) = running();
        let app = app(MemoryStore::default(), g.clone());
        let first = start(&app, &g, "alice").await;
        let second = click(&app, "alice").await;
        assert_eq!(second.status(), StatusCode::TOO_MANY_REQUESTS);
        assert_eq!(
            second.headers()["retry-after"],
            "1",
            "a slot may free any moment"
        );
        assert!(
            second.headers()["ratelimit-policy"]
                .to_str()
                .unwrap()
                .contains("\"generating\";q=1,"),
            "{:?}",
            second.headers()["ratelimit-policy"]
        );
        end.send(true).unwrap();
        assert_eq!(first.await.unwrap(), StatusCode::CREATED);
        // Its response body is gone: the slot is free, though no time passed.
        assert_eq!(click(&app, "alice").await.status(), StatusCode::CREATED);
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
    async fn the_window_still_bounds_the_budget() {
        let (g, end) = running();
        end.send(true).unwrap();
        let app = app(MemoryStore::default(), g);
        for i in 0..10 {
            assert_eq!(
                click(&app, "bob").await.status(),
                StatusCode::CREATED,
                "click {i}"
            );
        }
        let over = click(&app, "bob").await;
        assert_eq!(over.status(), StatusCode::TOO_MANY_REQUESTS);
        let retry: u64 = over.headers()["retry-after"]
            .to_str()
            .unwrap()
            .parse()
            .unwrap();
        assert!((55..=60).contains(&retry), "the window's wait: {retry}");
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
    async fn double_and_twenty_clicks_start_one_generation_on_memory() {
        let store = MemoryStore::default();
        concurrent_clicks(vec![bare(store.clone())], 2, "alice").await;
        concurrent_clicks(vec![bare(store)], 20, "carol").await;
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
    async fn double_and_twenty_clicks_start_one_generation_across_replicas_on_redis() {
        let server = common::RedisServer::start();
        let replica = || {
            bare(
                RedisStore::new(RedisConfig {
                    url: Some(server.url()),
                    ..RedisConfig::default()
                })
                .unwrap(),
            )
        };
        concurrent_clicks(vec![replica(), replica()], 2, "alice").await;
        concurrent_clicks(vec![replica(), replica()], 20, "carol").await;
    }

    #[tokio::test]
    async fn an_unauthenticated_click_is_not_limited_by_default() {
        let (g, end) = running();
        end.send(true).unwrap();
        let app = app(MemoryStore::default(), g);
        for _ in 0..12 {
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
