//! Routes to groups of upstream servers: round robin over three, a killed
//! server ejected with no 5xx (its requests go to the others), taken back
//! once it is up again, every server down a 502, the active check, the
//! hash balance, rules that match on a route, metrics per route and
//! server; and WebSocket tunnels (decided once, holding a `concurrency`
//! slot while open, closed when idle).

mod support;

use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use bytes::Bytes;
use http::{Request, Response, StatusCode};
use http_body_util::Full;
use hyper::body::Incoming;
use hyper::service::service_fn;
use hyper_util::rt::TokioIo;
use support::{gateway, send};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

/// An upstream that can be killed (listener and every connection gone)
/// and started again on the same port. `/healthz` answers `health`.
struct Server {
    addr: SocketAddr,
    hits: Arc<AtomicUsize>,
    health: Arc<AtomicUsize>,
    tasks: tokio::task::JoinSet<()>,
}

impl Server {
    async fn start() -> Self {
        let l = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let mut s = Self {
            addr: l.local_addr().unwrap(),
            hits: Arc::new(AtomicUsize::new(0)),
            health: Arc::new(AtomicUsize::new(200)),
            tasks: tokio::task::JoinSet::new(),
        };
        s.serve(l);
        s
    }

    fn serve(&mut self, l: tokio::net::TcpListener) {
        let (hits, health) = (self.hits.clone(), self.health.clone());
        let conns = Arc::new(std::sync::Mutex::new(tokio::task::JoinSet::new()));
        let c = conns.clone();
        self.tasks.spawn(async move {
            let _keep = c;
            loop {
                let Ok((stream, _)) = l.accept().await else {
                    continue;
                };
                let (hits, health) = (hits.clone(), health.clone());
                conns.lock().unwrap().spawn(async move {
                    let svc = service_fn(move |req: Request<Incoming>| {
                        let (hits, health) = (hits.clone(), health.clone());
                        async move {
                            let mut r = Response::new(Full::new(Bytes::from("ok")));
                            if req.uri().path() == "/healthz" {
                                *r.status_mut() =
                                    StatusCode::from_u16(health.load(Ordering::SeqCst) as u16)
                                        .unwrap();
                            } else {
                                hits.fetch_add(1, Ordering::SeqCst);
                            }
                            Ok::<_, std::convert::Infallible>(r)
                        }
                    });
                    let _ = hyper::server::conn::http1::Builder::new()
                        .serve_connection(TokioIo::new(stream), svc)
                        .await;
                });
            }
        });
    }

    fn kill(&mut self) {
        // Aborting the accept task drops the listener and the set of
        // connection tasks with it.
        self.tasks.abort_all();
    }

    async fn revive(&mut self) {
        let deadline = Instant::now() + Duration::from_secs(5);
        let l = loop {
            match tokio::net::TcpListener::bind(self.addr).await {
                Ok(l) => break l,
                Err(_) if Instant::now() < deadline => {
                    tokio::time::sleep(Duration::from_millis(20)).await
                }
                Err(e) => panic!("rebind {}: {e}", self.addr),
            }
        };
        self.serve(l);
    }

    fn hits(&self) -> usize {
        self.hits.load(Ordering::SeqCst)
    }

    fn url(&self) -> String {
        format!("http://{}", self.addr)
    }
}

fn routes_yaml(servers: &[&Server], extra: &str) -> String {
    let urls: Vec<String> = servers.iter().map(|s| s.url()).collect();
    format!(
        "routes:\n  - name: api\n    match: {{path_prefix: /api/}}\n    upstream:\n      servers: [{}]\n{extra}rules: []\n",
        urls.join(", ")
    )
}

#[tokio::test]
async fn round_robin_a_killed_server_ejected_without_a_5xx_then_taken_back() {
    let (a, mut b, c) = (
        Server::start().await,
        Server::start().await,
        Server::start().await,
    );
    let yaml = routes_yaml(
        &[&a, &b, &c],
        "      balance: round_robin\n      health: {passive: {failures: 1, eject_for: 300ms}}\n",
    );
    let default = Server::start().await;
    let gw = gateway(&yaml, &default.url(), None).await;
    for i in 0..30 {
        let r = send(gw.listen(), "GET", &format!("/api/{i}"), &[], "").await;
        assert_eq!(r.status, 200);
    }
    assert_eq!(
        (a.hits(), b.hits(), c.hits()),
        (10, 10, 10),
        "spread evenly"
    );
    // Not under /api/: the default route.
    assert_eq!(send(gw.listen(), "GET", "/else", &[], "").await.status, 200);
    assert_eq!(default.hits(), 1);

    b.kill();
    let before = (a.hits(), b.hits(), c.hits());
    for i in 0..30 {
        let r = send(gw.listen(), "GET", &format!("/api/k{i}"), &[], "").await;
        assert_eq!(r.status, 200, "request {i} after the kill");
    }
    assert_eq!(b.hits(), before.1);
    assert_eq!(a.hits() + c.hits(), before.0 + before.2 + 30);
    let metrics = send(gw.admin.unwrap(), "GET", "/metrics", &[], "")
        .await
        .body;
    let down = format!(
        "ratewarden_upstream_server_up{{route=\"api\",server=\"{}\"}} 0",
        b.addr
    );
    assert!(metrics.contains(&down), "{metrics}");
    assert!(
        metrics.contains(&format!(
            "ratewarden_upstream_requests_total{{route=\"api\",server=\"{}\",result=\"failed\"}}",
            b.addr
        )),
        "{metrics}"
    );

    // Up again: once its ejection is over, it takes requests again.
    b.revive().await;
    let deadline = Instant::now() + Duration::from_secs(10);
    while b.hits() == before.1 {
        assert!(Instant::now() < deadline, "never taken back");
        let r = send(gw.listen(), "GET", "/api/again", &[], "").await;
        assert_eq!(r.status, 200);
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    gw.shutdown().await;
}

#[tokio::test]
async fn every_server_down_is_a_502_saying_so() {
    let (mut a, mut b) = (Server::start().await, Server::start().await);
    let gw = gateway(&routes_yaml(&[&a, &b], ""), "echo", None).await;
    a.kill();
    b.kill();
    let r = send(gw.listen(), "GET", "/api/x", &[], "").await;
    assert_eq!(r.status, 502);
    assert!(r.body.contains("could not connect"), "{}", r.body);
    // The echo upstream still answers the rest.
    assert_eq!(send(gw.listen(), "GET", "/x", &[], "").await.status, 200);
    gw.shutdown().await;
}

#[tokio::test]
async fn the_active_check_takes_a_failing_server_out_and_back() {
    let (a, b) = (Server::start().await, Server::start().await);
    b.health.store(503, Ordering::SeqCst);
    let yaml = routes_yaml(
        &[&a, &b],
        "      health: {active: {path: /healthz, interval: 50ms, timeout: 1s}}\n",
    );
    let gw = gateway(&yaml, "echo", None).await;
    // Once the first checks ran, b gets nothing.
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let before = b.hits();
        for _ in 0..6 {
            send(gw.listen(), "GET", "/api/x", &[], "").await;
        }
        if b.hits() == before {
            break;
        }
        assert!(Instant::now() < deadline, "b was never taken out");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    b.health.store(200, Ordering::SeqCst);
    let before = b.hits();
    let deadline = Instant::now() + Duration::from_secs(10);
    while b.hits() == before {
        assert!(Instant::now() < deadline, "b was never taken back");
        send(gw.listen(), "GET", "/api/x", &[], "").await;
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    gw.shutdown().await;
}

#[tokio::test]
async fn hash_keeps_a_client_on_one_server_and_least_requests_spreads() {
    let (a, b, c) = (
        Server::start().await,
        Server::start().await,
        Server::start().await,
    );
    let gw = gateway(
        &routes_yaml(&[&a, &b, &c], "      balance: hash\n"),
        "echo",
        None,
    )
    .await;
    for _ in 0..12 {
        send(gw.listen(), "GET", "/api/x", &[], "").await;
    }
    let hits = [a.hits(), b.hits(), c.hits()];
    assert_eq!(hits.iter().filter(|h| **h == 12).count(), 1, "{hits:?}");
    gw.shutdown().await;
    let (a, b) = (Server::start().await, Server::start().await);
    let gw = gateway(
        &routes_yaml(&[&a, &b], "      balance: least_requests\n"),
        "echo",
        None,
    )
    .await;
    for _ in 0..10 {
        send(gw.listen(), "GET", "/api/x", &[], "").await;
    }
    // One at a time: both idle each time, so ties go in turn.
    assert_eq!((a.hits(), b.hits()), (5, 5));
    gw.shutdown().await;
}

#[tokio::test]
async fn rules_match_on_a_route_and_an_unknown_route_is_a_config_error() {
    let a = Server::start().await;
    let yaml = format!(
        "routes:\n  - name: api\n    match: {{path_prefix: /api/}}\n    upstream: {}\n\
         rules:\n  - {{name: api-only, limit: 1, window: 1h, match: {{route: api}}}}\n",
        a.url()
    );
    let gw = gateway(&yaml, "echo", None).await;
    assert_eq!(
        send(gw.listen(), "GET", "/api/1", &[], "").await.status,
        200
    );
    assert_eq!(
        send(gw.listen(), "GET", "/api/2", &[], "").await.status,
        429
    );
    assert_eq!(
        send(gw.listen(), "GET", "/other", &[], "").await.status,
        200
    );
    assert_eq!(
        send(gw.listen(), "GET", "/other", &[], "").await.status,
        200
    );
    gw.shutdown().await;
    let e = ratewarden_gateway::config::load(
        "routes:\n  - {name: api, upstream: 'http://a:1'}\nrules:\n  - {name: r, limit: 1, window: 1s, match: {route: apo}}\n",
        "t.yaml",
        &Default::default(),
    )
    .unwrap_err();
    assert!(
        e.first()
            .message
            .contains("no route `apo`; did you mean `api`?"),
        "{e}"
    );
}

/// An upstream that switches protocols on `Upgrade` and then echoes bytes.
async fn upgrading_upstream() -> SocketAddr {
    let l = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = l.local_addr().unwrap();
    tokio::spawn(async move {
        loop {
            let Ok((stream, _)) = l.accept().await else {
                continue;
            };
            tokio::spawn(async move {
                let svc = service_fn(|mut req: Request<Incoming>| async move {
                    let mut r = Response::new(Full::new(Bytes::new()));
                    if req.headers().contains_key("upgrade") {
                        let on = hyper::upgrade::on(&mut req);
                        tokio::spawn(async move {
                            let Ok(up) = on.await else { return };
                            let mut io = TokioIo::new(up);
                            let mut buf = [0u8; 1024];
                            while let Ok(n) = io.read(&mut buf).await {
                                if n == 0 || io.write_all(&buf[..n]).await.is_err() {
                                    break;
                                }
                            }
                        });
                        *r.status_mut() = StatusCode::SWITCHING_PROTOCOLS;
                        r.headers_mut()
                            .insert("upgrade", "websocket".parse().unwrap());
                        r.headers_mut()
                            .insert("connection", "upgrade".parse().unwrap());
                    }
                    Ok::<_, std::convert::Infallible>(r)
                });
                let _ = hyper::server::conn::http1::Builder::new()
                    .serve_connection(TokioIo::new(stream), svc)
                    .with_upgrades()
                    .await;
            });
        }
    });
    addr
}

/// Opens a WebSocket-style tunnel through the gateway: the status line.
async fn upgrade(gw: SocketAddr) -> (tokio::net::TcpStream, String) {
    let mut s = tokio::net::TcpStream::connect(gw).await.unwrap();
    s.write_all(
        b"GET /ws HTTP/1.1\r\nhost: a\r\nconnection: Upgrade\r\nupgrade: websocket\r\nsec-websocket-version: 13\r\n\r\n",
    )
    .await
    .unwrap();
    let mut head = Vec::new();
    let mut byte = [0u8; 1];
    while !head.ends_with(b"\r\n\r\n") {
        if s.read(&mut byte).await.unwrap() == 0 {
            break;
        }
        head.push(byte[0]);
    }
    let text = String::from_utf8_lossy(&head).into_owned();
    (s, text)
}

#[tokio::test]
async fn a_websocket_is_tunnelled_after_the_decision_and_holds_its_slot() {
    let up = upgrading_upstream().await;
    let gw = gateway(
        "client_idle_timeout: 1s\nrules:\n  - {name: one-socket, algorithm: concurrency, limit: 1}\n",
        &format!("http://{up}"),
        None,
    )
    .await;
    let (mut first, head) = upgrade(gw.listen()).await;
    assert!(head.starts_with("HTTP/1.1 101"), "{head}");
    assert!(
        head.to_ascii_lowercase().contains("upgrade: websocket"),
        "{head}"
    );
    first.write_all(b"ping").await.unwrap();
    let mut buf = [0u8; 4];
    first.read_exact(&mut buf).await.unwrap();
    assert_eq!(&buf, b"ping", "bytes go through both ways");
    // While it is open, a second one is refused: one slot.
    let (_, head) = upgrade(gw.listen()).await;
    assert!(head.starts_with("HTTP/1.1 429"), "{head}");
    // Closed: the slot is free again.
    drop(first);
    let deadline = Instant::now() + Duration::from_secs(5);
    let (mut third, head) = loop {
        let (s, head) = upgrade(gw.listen()).await;
        if head.starts_with("HTTP/1.1 101") {
            break (s, head);
        }
        assert!(Instant::now() < deadline, "{head}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    assert!(head.starts_with("HTTP/1.1 101"));
    // Idle for longer than client_idle_timeout: the gateway closes it.
    let started = Instant::now();
    let mut rest = Vec::new();
    let n = tokio::time::timeout(Duration::from_secs(10), third.read_to_end(&mut rest))
        .await
        .expect("closed within 10 s")
        .unwrap_or(0);
    assert_eq!(n, 0);
    assert!(
        started.elapsed() >= Duration::from_millis(900),
        "{:?}",
        started.elapsed()
    );
    gw.shutdown().await;
}
