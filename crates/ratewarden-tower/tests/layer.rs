//! The layer in a real stack: with tower-http's trace and a timeout layer,
//! over HTTP/2, with a failing store, with a custom failure classifier.

use std::convert::Infallible;
use std::net::SocketAddr;
use std::time::Duration;

use axum::Router;
use axum::body::Body;
use axum::http::{Request, StatusCode, Version};
use axum::routing::get;
use http_body_util::{BodyExt, Empty};
use ratewarden::algorithm::Kind;
use ratewarden::{Fallback, MemoryStore, OnError, RedisConfig, RedisStore, Rule};
use ratewarden_tower::key::{Header, PeerAddr, PeerIp};
use ratewarden_tower::{MissingKey, RateLimitLayer};
use tower::{ServiceBuilder, ServiceExt};

fn two_per_minute() -> Rule {
    Rule::builder("two")
        .algorithm(Kind::FixedWindow)
        .limit(2, Duration::from_secs(60))
        .build()
        .unwrap()
}

#[tokio::test]
async fn composes_with_trace_and_timeout_layers() {
    let svc = ServiceBuilder::new()
        .layer(tower_http::trace::TraceLayer::new_for_http())
        .layer(tower::timeout::TimeoutLayer::new(Duration::from_secs(5)))
        .layer(
            RateLimitLayer::builder(
                MemoryStore::default(),
                [two_per_minute()],
                Header::new("x-key"),
            )
            .build(),
        )
        .service_fn(|_req: Request<Body>| async {
            Ok::<_, Infallible>(axum::http::Response::new(Body::from("hi")))
        });
    let call = |key: &str| {
        let svc = svc.clone();
        let req = Request::get("/")
            .header("x-key", key)
            .body(Body::empty())
            .unwrap();
        async move { svc.oneshot(req).await.unwrap() }
    };
    let first = call("a").await;
    assert_eq!(first.status(), StatusCode::OK);
    assert_eq!(first.headers()["x-ratelimit-remaining"], "1");
    assert_eq!(first.into_body().collect().await.unwrap().to_bytes(), "hi");
    assert_eq!(call("a").await.status(), StatusCode::OK);
    let third = call("a").await;
    assert_eq!(third.status(), StatusCode::TOO_MANY_REQUESTS);
    assert!(third.headers().contains_key("retry-after"));
    assert_eq!(call("b").await.status(), StatusCode::OK);
}

#[tokio::test]
async fn limits_an_http2_service_keyed_by_peer_address() {
    let limit = RateLimitLayer::builder(
        MemoryStore::default(),
        [two_per_minute()],
        PeerIp::default(),
    )
    .build();
    let app = Router::new()
        .route("/", get(|| async { "ok" }))
        .route_layer(limit)
        .layer(tower::util::MapRequestLayer::new(
            |mut req: Request<Body>| {
                // What a server hands the app: the peer address, here via axum's ConnectInfo.
                let peer = req
                    .extensions()
                    .get::<axum::extract::ConnectInfo<SocketAddr>>()
                    .map(|c| c.0);
                if let Some(p) = peer {
                    req.extensions_mut().insert(PeerAddr(p));
                }
                req
            },
        ));
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let server = tokio::spawn(async move {
        axum::serve(
            listener,
            app.into_make_service_with_connect_info::<SocketAddr>(),
        )
        .with_graceful_shutdown(async {
            let _ = stopped.await;
        })
        .await
        .unwrap();
    });
    let client = hyper_util::client::legacy::Client::builder(hyper_util::rt::TokioExecutor::new())
        .http2_only(true)
        .build_http::<Empty<bytes::Bytes>>();
    let mut statuses = vec![];
    for _ in 0..3 {
        let resp = client
            .get(format!("http://{addr}/").parse().unwrap())
            .await
            .unwrap();
        assert_eq!(resp.version(), Version::HTTP_2);
        statuses.push(resp.status());
        if resp.status() == StatusCode::TOO_MANY_REQUESTS {
            assert_eq!(resp.headers()["content-type"], "application/problem+json");
            assert!(
                resp.headers()["ratelimit"]
                    .to_str()
                    .unwrap()
                    .starts_with("\"two\";r=0;t=")
            );
        }
    }
    assert_eq!(
        statuses,
        [
            StatusCode::OK,
            StatusCode::OK,
            StatusCode::TOO_MANY_REQUESTS
        ]
    );
    stop.send(()).unwrap();
    tokio::time::timeout(Duration::from_secs(5), server)
        .await
        .unwrap()
        .unwrap();
}

/// A Redis nobody listens on: every decision fails fast.
fn dead_redis() -> RedisStore {
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    RedisStore::new(RedisConfig {
        url: Some(format!("redis://127.0.0.1:{port}/0")),
        timeout: Duration::from_millis(50),
        ..RedisConfig::default()
    })
    .unwrap()
}

#[tokio::test]
async fn a_failing_store_follows_on_error() {
    for (policy, expect) in [
        (OnError::Deny, StatusCode::SERVICE_UNAVAILABLE),
        (OnError::Allow, StatusCode::OK),
        (OnError::Local, StatusCode::OK),
    ] {
        let store = Fallback::new(dead_redis(), policy, MemoryStore::default());
        let app = Router::new()
            .route("/", get(|| async { "ok" }))
            .route_layer(
                RateLimitLayer::builder(store, [two_per_minute()], Header::new("x-key")).build(),
            );
        let req = Request::get("/")
            .header("x-key", "k")
            .body(Body::empty())
            .unwrap();
        let resp = app.oneshot(req).await.unwrap();
        assert_eq!(resp.status(), expect, "{policy:?}");
        if policy == OnError::Deny {
            assert_eq!(resp.headers()["content-type"], "application/problem+json");
            let body = resp.into_body().collect().await.unwrap().to_bytes();
            assert!(String::from_utf8_lossy(&body).contains("rate limiter unavailable"));
        }
    }
}

#[tokio::test]
async fn a_custom_classifier_decides_what_a_failure_is() {
    // Login: a 401 is a failed attempt; 3 per minute, then rejected.
    let rule = Rule::builder("login")
        .algorithm(Kind::SlidingWindowLog)
        .limit(3, Duration::from_secs(60))
        .count_failures(true)
        .build()
        .unwrap();
    let layer = RateLimitLayer::builder(MemoryStore::default(), [rule], Header::new("x-user"))
        .classify(|s| (s == StatusCode::UNAUTHORIZED).then_some(true))
        .on_missing_key(MissingKey::Reject)
        .build();
    let app = Router::new()
        .route("/login", get(|| async { StatusCode::UNAUTHORIZED }))
        .route("/teapot", get(|| async { StatusCode::IM_A_TEAPOT }))
        .route_layer(layer);
    let get = |path: &str| {
        let req = Request::get(path)
            .header("x-user", "mallory")
            .body(Body::empty())
            .unwrap();
        app.clone().oneshot(req)
    };
    // 418s are not failures under this classifier: never counted.
    for _ in 0..5 {
        assert_eq!(
            get("/teapot").await.unwrap().status(),
            StatusCode::IM_A_TEAPOT
        );
    }
    for _ in 0..3 {
        assert_eq!(
            get("/login").await.unwrap().status(),
            StatusCode::UNAUTHORIZED
        );
    }
    assert_eq!(
        get("/login").await.unwrap().status(),
        StatusCode::TOO_MANY_REQUESTS
    );
    let no_key = Request::get("/login").body(Body::empty()).unwrap();
    assert_eq!(
        app.clone().oneshot(no_key).await.unwrap().status(),
        StatusCode::BAD_REQUEST
    );
}

/// A service that settles what its answer cost after the response (issue
/// 47): the layer reserves at admission (10 units, or the request's
/// `Reserve`), and when the body has ended replaces the reservation by
/// the `Cost` the service set, a stream's at its end.
#[tokio::test]
async fn a_service_settles_what_its_answer_cost_after_the_response() {
    use ratewarden_tower::{Cost, Reserve};
    let tokens = Rule::builder("tokens")
        .algorithm(Kind::FixedWindow)
        .limit(100, Duration::from_secs(60))
        .build()
        .unwrap();
    let svc = ServiceBuilder::new()
        .layer(
            RateLimitLayer::builder(MemoryStore::default(), [tokens], Header::new("x-key"))
                .charged_by_answer("tokens", 10)
                .build(),
        )
        .service_fn(|req: Request<Body>| async move {
            // The cost the caller asks for, known at once or (`x-later`)
            // only once the body is on its way.
            let n: u64 = req.headers()["x-cost"].to_str().unwrap().parse().unwrap();
            let cost = if req.headers().contains_key("x-later") {
                let c = Cost::new();
                let set = c.clone();
                tokio::spawn(async move { set.set(n) });
                tokio::task::yield_now().await;
                c
            } else {
                Cost::known(n)
            };
            let mut resp = axum::http::Response::new(Body::from("answer"));
            resp.extensions_mut().insert(cost);
            Ok::<_, Infallible>(resp)
        });
    let call = |cost: u64, reserve: Option<u64>, later: bool| {
        let svc = svc.clone();
        let mut req = Request::get("/")
            .header("x-key", "k")
            .header("x-cost", cost.to_string());
        if later {
            req = req.header("x-later", "1");
        }
        let mut req = req.body(Body::empty()).unwrap();
        if let Some(r) = reserve {
            req.extensions_mut().insert(Reserve(r));
        }
        async move {
            let resp = svc.oneshot(req).await.unwrap();
            let (status, left) = (
                resp.status(),
                resp.headers()["x-ratelimit-remaining"]
                    .to_str()
                    .unwrap()
                    .to_owned(),
            );
            resp.into_body().collect().await.unwrap();
            // The settle is spawned as the body ends.
            tokio::task::yield_now().await;
            tokio::time::sleep(Duration::from_millis(20)).await;
            (status, left)
        }
    };
    // 10 reserved (90 left), the answer cost 42.
    assert_eq!(call(42, None, false).await, (StatusCode::OK, "90".into()));
    // 42 used: 10 reserved leaves 48; it cost 5 (47 used).
    assert_eq!(call(5, None, true).await, (StatusCode::OK, "48".into()));
    // The request's own estimate: 50 reserved of 53 left.
    assert_eq!(
        call(50, Some(50), false).await,
        (StatusCode::OK, "3".into())
    );
    // 97 used: 10 do not fit.
    assert_eq!(call(1, None, false).await.0, StatusCode::TOO_MANY_REQUESTS);
}
