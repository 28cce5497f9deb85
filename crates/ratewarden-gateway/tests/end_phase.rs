//! The end phase on every wire (issue 47): it runs once per request, when
//! the answer has ended (its last body byte, its trailers, the tunnel
//! closed, the client gone), never at the response head.
//!
//! Two facts show when it ran: the route's answer count
//! (`ratewarden_responses_total`, counted by the end phase) and a `count:
//! failures` rule (limit 1), which the end phase charges for a failed
//! answer. While a failed answer is still being relayed, its count is not
//! in the metrics and another request is admitted; once it has ended, the
//! count is there once and the next request is refused.

mod grpc_echo;
mod support;

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use http_body_util::BodyExt;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio::sync::Notify;

use support::send;

/// A hand-written HTTP/1.1 upstream whose answers end when the test says:
/// `/drip/STATUS` answers `STATUS` with a 10-byte body, 5 bytes at once
/// and the rest once [`Drip::release`]d; `/chunked/STATUS` the same,
/// chunked, with a trailer; `/upgrade` switches protocols and echoes what
/// it reads until the client closes; anything else `200 ok` at once.
struct Drip {
    addr: SocketAddr,
    release: Arc<Notify>,
}

impl Drip {
    async fn start() -> Self {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let release = Arc::new(Notify::new());
        let r = release.clone();
        tokio::spawn(async move {
            loop {
                let Ok((s, _)) = listener.accept().await else {
                    return;
                };
                tokio::spawn(Self::serve(s, r.clone()));
            }
        });
        Self { addr, release }
    }

    fn url(&self) -> String {
        format!("http://{}", self.addr)
    }

    /// Lets the answer being held send the rest of its body.
    fn release(&self) {
        self.release.notify_one();
    }

    async fn serve(mut s: TcpStream, release: Arc<Notify>) {
        let mut buf = Vec::new();
        loop {
            let head_end = loop {
                if let Some(i) = buf.windows(4).position(|w| w == b"\r\n\r\n") {
                    break i + 4;
                }
                let mut chunk = [0u8; 4096];
                match s.read(&mut chunk).await {
                    Ok(0) | Err(_) => return,
                    Ok(n) => buf.extend_from_slice(&chunk[..n]),
                }
            };
            let head = String::from_utf8_lossy(&buf[..head_end]).into_owned();
            buf.drain(..head_end);
            let path = head.split(' ').nth(1).unwrap_or("/").to_owned();
            let status = path.rsplit('/').next().unwrap_or("200").to_owned();
            let ok = if path.starts_with("/drip/") {
                let head = format!("HTTP/1.1 {status} X\r\ncontent-length: 10\r\n\r\n01234");
                s.write_all(head.as_bytes()).await.is_ok() && {
                    release.notified().await;
                    s.write_all(b"56789").await.is_ok()
                }
            } else if path.starts_with("/chunked/") {
                let head = format!(
                    "HTTP/1.1 {status} X\r\ntransfer-encoding: chunked\r\n\r\n5\r\n01234\r\n"
                );
                s.write_all(head.as_bytes()).await.is_ok() && {
                    release.notified().await;
                    s.write_all(b"5\r\n56789\r\n0\r\nx-done: yes\r\n\r\n")
                        .await
                        .is_ok()
                }
            } else if path == "/upgrade" {
                let _ = s
                    .write_all(
                        b"HTTP/1.1 101 Switching Protocols\r\nupgrade: test\r\nconnection: upgrade\r\n\r\n",
                    )
                    .await;
                let mut chunk = [0u8; 1024];
                while let Ok(n) = s.read(&mut chunk).await {
                    if n == 0 || s.write_all(&chunk[..n]).await.is_err() {
                        break;
                    }
                }
                return;
            } else {
                s.write_all(b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\nok")
                    .await
                    .is_ok()
            };
            if !ok {
                return;
            }
        }
    }
}

/// One failure (a 4xx) allowed per client, charged by the end phase.
const RULES: &str = "rules:\n  - {name: failing, limit: 1, window: 1h, key: [identity], count: failures, failure_grpc_status: [13]}\n";

/// `ratewarden_responses_total` of the default route, from the upstream,
/// for status class `class` (`2xx`, `4xx`, ...).
async fn upstream_answers(admin: SocketAddr, class: &str) -> u64 {
    let text = send(admin, "GET", "/metrics", &[], "").await.body;
    let want = format!(
        "ratewarden_responses_total{{route=\"default\",source=\"upstream\",code=\"{class}\"}} "
    );
    text.lines()
        .find_map(|l| l.strip_prefix(want.as_str()))
        .map_or(0, |n| n.trim().parse().unwrap())
}

/// Waits (10 s at most) until the upstream answer count of `class` is `n`.
async fn wait_answers(admin: SocketAddr, class: &str, n: u64) {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let got = upstream_answers(admin, class).await;
        if got == n {
            return;
        }
        assert!(Instant::now() < deadline, "{class} answers: {got}, not {n}");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

/// Reads from `s` until `want` has arrived (5 s at most); what came.
async fn read_until(s: &mut TcpStream, want: &[u8]) -> Vec<u8> {
    let mut got = Vec::new();
    let deadline = Instant::now() + Duration::from_secs(5);
    while !got.windows(want.len()).any(|w| w == want) {
        let mut chunk = [0u8; 4096];
        let n = tokio::time::timeout_at(deadline.into(), s.read(&mut chunk))
            .await
            .unwrap_or_else(|_| {
                panic!(
                    "{:?} never came: {}",
                    String::from_utf8_lossy(want),
                    String::from_utf8_lossy(&got)
                )
            })
            .unwrap();
        assert!(n > 0, "closed before {:?}", String::from_utf8_lossy(want));
        got.extend_from_slice(&chunk[..n]);
    }
    got
}

async fn gateway(upstream: &str) -> ratewarden_gateway::server::Running {
    support::gateway(RULES, upstream, None).await
}

/// A failed answer relayed on the gateway's own HTTP/1.1 path, with
/// `version` (`HTTP/1.1`; `HTTP/1.0` goes to hyper's): not ended at its
/// head, ended once at its last byte.
async fn ends_at_the_last_byte(path: &str, version: &str) {
    let up = Drip::start().await;
    let gw = gateway(&up.url()).await;
    let admin = gw.admin.unwrap();
    let mut a = TcpStream::connect(gw.listen()).await.unwrap();
    a.write_all(format!("GET {path} {version}\r\nhost: a\r\n\r\n").as_bytes())
        .await
        .unwrap();
    let first = read_until(&mut a, b"01234").await;
    assert!(
        first.starts_with(b"HTTP/1."),
        "{}",
        String::from_utf8_lossy(&first)
    );
    // The head and half the body are out: the answer has not ended.
    assert_eq!(
        upstream_answers(admin, "4xx").await,
        0,
        "counted at the head"
    );
    let meanwhile = send(gw.listen(), "GET", "/", &[], "").await;
    assert_eq!(meanwhile.status, 200, "the failure was charged at the head");
    up.release();
    read_until(&mut a, b"56789").await;
    wait_answers(admin, "4xx", 1).await;
    let after = send(gw.listen(), "GET", "/", &[], "").await;
    assert_eq!(after.status, 429, "the failure was charged at the end");
    assert_eq!(upstream_answers(admin, "4xx").await, 1, "ended once");
    gw.shutdown().await;
}

#[tokio::test]
async fn http1_a_length_body_ends_at_its_last_byte() {
    ends_at_the_last_byte("/drip/401", "HTTP/1.1").await;
}

#[tokio::test]
async fn http1_a_chunked_body_ends_at_its_trailers() {
    ends_at_the_last_byte("/chunked/401", "HTTP/1.1").await;
}

#[tokio::test]
async fn http10_on_hypers_path_ends_at_its_last_byte() {
    ends_at_the_last_byte("/drip/401", "HTTP/1.0").await;
}

/// A client that leaves mid-body: the end phase runs once, and the failed
/// answer it had begun is charged (it was a failure, whoever stopped
/// reading it).
#[tokio::test]
async fn http1_a_client_leaving_mid_body_ends_it_once() {
    let up = Drip::start().await;
    let gw = gateway(&up.url()).await;
    let admin = gw.admin.unwrap();
    let mut a = TcpStream::connect(gw.listen()).await.unwrap();
    a.write_all(b"GET /drip/401 HTTP/1.1\r\nhost: a\r\n\r\n")
        .await
        .unwrap();
    read_until(&mut a, b"01234").await;
    drop(a);
    // The gateway learns of it when it next writes.
    up.release();
    wait_answers(admin, "4xx", 1).await;
    assert_eq!(send(gw.listen(), "GET", "/", &[], "").await.status, 429);
    assert_eq!(upstream_answers(admin, "4xx").await, 1, "ended once");
    gw.shutdown().await;
}

/// An HTTP/2 client (prior knowledge, hyper's path): the body's frames
/// go by, the end phase waits for the last; one that drops the body
/// mid-stream ends it once.
#[tokio::test]
async fn http2_ends_at_the_last_frame_or_when_the_client_drops_it() {
    let up = Drip::start().await;
    let gw = gateway(&up.url()).await;
    let admin = gw.admin.unwrap();
    let io = hyper_util::rt::TokioIo::new(TcpStream::connect(gw.listen()).await.unwrap());
    let (mut h2, conn) =
        hyper::client::conn::http2::handshake::<_, _, http_body_util::Empty<Bytes>>(
            hyper_util::rt::TokioExecutor::new(),
            io,
        )
        .await
        .unwrap();
    tokio::spawn(conn);
    let get = |path: &str| {
        http::Request::get(format!("http://a{path}"))
            .body(http_body_util::Empty::new())
            .unwrap()
    };
    let resp = h2.send_request(get("/drip/401")).await.unwrap();
    assert_eq!(resp.status(), 401);
    let mut body = resp.into_body();
    let first = body.frame().await.unwrap().unwrap().into_data().unwrap();
    assert_eq!(&first[..], b"01234");
    assert_eq!(
        upstream_answers(admin, "4xx").await,
        0,
        "counted at the head"
    );
    assert_eq!(send(gw.listen(), "GET", "/", &[], "").await.status, 200);
    up.release();
    let rest = body.collect().await.unwrap().to_bytes();
    assert_eq!(&rest[..], b"56789");
    wait_answers(admin, "4xx", 1).await;
    assert_eq!(send(gw.listen(), "GET", "/", &[], "").await.status, 429);
    gw.shutdown().await;

    // Dropped mid-body (a reset stream): ended once, and charged.
    let gw = gateway(&up.url()).await;
    let admin = gw.admin.unwrap();
    let io = hyper_util::rt::TokioIo::new(TcpStream::connect(gw.listen()).await.unwrap());
    let (mut h2, conn) =
        hyper::client::conn::http2::handshake::<_, _, http_body_util::Empty<Bytes>>(
            hyper_util::rt::TokioExecutor::new(),
            io,
        )
        .await
        .unwrap();
    tokio::spawn(conn);
    let resp = h2.send_request(get("/drip/401")).await.unwrap();
    let mut body = resp.into_body();
    body.frame().await.unwrap().unwrap();
    drop(body);
    wait_answers(admin, "4xx", 1).await;
    up.release();
    assert_eq!(send(gw.listen(), "GET", "/", &[], "").await.status, 429);
    assert_eq!(upstream_answers(admin, "4xx").await, 1, "ended once");
    gw.shutdown().await;
}

/// gRPC: the outcome is in the trailers. A server stream that ends with
/// INTERNAL is charged when its trailers arrive, not at its head or its
/// first message.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn grpc_ends_at_its_trailers() {
    use tonic::codec::Codec as _;
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let server = listener.local_addr().unwrap();
    let echo = grpc_echo::Echo::default();
    grpc_echo::serve(listener, echo.clone());
    let gw = support::gateway(RULES, &format!("h2c://{server}"), None).await;
    let channel = tonic::transport::Channel::from_shared(format!("http://{}", gw.listen()))
        .unwrap()
        .connect()
        .await
        .unwrap();
    let mut grpc = tonic::client::Grpc::new(channel);
    grpc.ready().await.unwrap();
    let mut stream = grpc
        .server_streaming(
            tonic::Request::new(Bytes::from_static(&[2, 13])),
            http::uri::PathAndQuery::from_static("/echo.Echo/Server"),
            grpc_echo::Raw,
        )
        .await
        .unwrap()
        .into_inner();
    let _ = grpc_echo::Raw.encoder();
    let first = stream.message().await.unwrap().unwrap();
    assert_eq!(&first[..], &[0]);
    // Mid-stream: nothing charged yet.
    let mut client = grpc_echo::Client(grpc.clone());
    assert!(
        client.unary(b"x").await.is_ok(),
        "charged before the trailers"
    );
    echo.release.notify_one();
    assert_eq!(&stream.message().await.unwrap().unwrap()[..], &[1]);
    let ended = stream.message().await.unwrap_err();
    assert_eq!(ended.code(), tonic::Code::Internal);
    // Charged at the trailers (polled: the end phase's store call is
    // spawned as the stream ends).
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        match client.unary(b"x").await {
            Err(s) if s.code() == tonic::Code::ResourceExhausted => break,
            other => assert!(Instant::now() < deadline, "never charged: {other:?}"),
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    gw.shutdown().await;
}

/// A tunnel (an HTTP/1.1 Upgrade) is one request that ends when the tunnel
/// closes: its 101 is counted then, with the bytes the client was sent.
#[tokio::test]
async fn a_tunnel_ends_when_it_closes() {
    let up = Drip::start().await;
    let gw = gateway(&up.url()).await;
    let admin = gw.admin.unwrap();
    let mut a = TcpStream::connect(gw.listen()).await.unwrap();
    a.write_all(
        b"GET /upgrade HTTP/1.1\r\nhost: a\r\nconnection: upgrade\r\nupgrade: test\r\n\r\n",
    )
    .await
    .unwrap();
    read_until(&mut a, b"\r\n\r\n").await;
    a.write_all(b"ping").await.unwrap();
    read_until(&mut a, b"ping").await;
    assert_eq!(upstream_answers(admin, "1xx").await, 0, "ended while open");
    drop(a);
    wait_answers(admin, "1xx", 1).await;
    gw.shutdown().await;
}

/// The authz hooks end as proxied requests do: each decision counted and
/// logged (a line in the access log), the refusal too.
#[tokio::test]
async fn an_authz_decision_is_logged_and_counted() {
    let dir = support::scratch_dir("rw-end-authz");
    let log = dir.join("access.log");
    let yaml = format!(
        "authz: {{listen: 127.0.0.1:0}}\naccess_log: {{path: {}, format: json}}\nrules:\n  - {{name: one, limit: 1, window: 1h}}\n",
        log.display()
    );
    let gw = support::gateway(&yaml, "echo", None).await;
    let hook = gw.authz.unwrap();
    let asked = [
        ("x-forwarded-method", "GET"),
        ("x-forwarded-uri", "/api/x"),
        ("x-forwarded-for", "127.0.0.1"),
    ];
    assert_eq!(
        send(hook, "GET", "/authz/forward", &asked, "").await.status,
        200
    );
    assert_eq!(
        send(hook, "GET", "/authz/forward", &asked, "").await.status,
        429
    );
    let deadline = Instant::now() + Duration::from_secs(10);
    let lines = loop {
        let text = std::fs::read_to_string(&log).unwrap_or_default();
        let lines: Vec<serde_json::Value> = text
            .lines()
            .map(|l| serde_json::from_str(l).unwrap())
            .collect();
        if lines.len() >= 2 {
            break lines;
        }
        assert!(Instant::now() < deadline, "{text}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    assert_eq!(
        (lines[0]["status"].as_u64(), lines[1]["status"].as_u64()),
        (Some(200), Some(429))
    );
    assert_eq!(lines[0]["target"], "/api/x", "{}", lines[0]);
    assert_eq!(lines[1]["rule"], "one", "{}", lines[1]);
    gw.shutdown().await;
}
