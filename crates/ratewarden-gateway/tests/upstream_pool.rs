//! The gateway's kept-alive connections to the upstream, seen from a
//! hand-written upstream that counts its connections.

mod support;

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

use support::{gateway, send};

const RULES: &str = "rules:\n  - name: open\n    limit: 1000\n    window: 1s\n";

/// An HTTP/1.1 upstream written by hand: `/close` answers and closes,
/// `/big` answers 4 MiB, `/empty` answers 204, `/slow` answers `ok` after
/// 2 s, anything else `ok` at once. Counts the connections it accepted.
struct RawUpstream {
    addr: std::net::SocketAddr,
    conns: Arc<AtomicUsize>,
    task: tokio::task::JoinHandle<()>,
}

impl Drop for RawUpstream {
    fn drop(&mut self) {
        self.task.abort();
    }
}

async fn serve_conn(mut s: TcpStream) {
    let mut buf = Vec::new();
    loop {
        let mut chunk = [0u8; 4096];
        let head_end = loop {
            if let Some(i) = buf.windows(4).position(|w| w == b"\r\n\r\n") {
                break i + 4;
            }
            match s.read(&mut chunk).await {
                Ok(0) | Err(_) => return,
                Ok(n) => buf.extend_from_slice(&chunk[..n]),
            }
        };
        let head = String::from_utf8_lossy(&buf[..head_end]).into_owned();
        buf.drain(..head_end);
        let path = head.split(' ').nth(1).unwrap_or("/").to_owned();
        if path == "/slow" {
            tokio::time::sleep(Duration::from_secs(2)).await;
        }
        let out: Vec<u8> = match path.as_str() {
            "/close" => {
                b"HTTP/1.1 200 OK\r\ncontent-length: 5\r\nconnection: close\r\n\r\nclose".to_vec()
            }
            "/empty" => b"HTTP/1.1 204 No Content\r\n\r\n".to_vec(),
            "/big" => {
                let mut v = b"HTTP/1.1 200 OK\r\ncontent-length: 4194304\r\n\r\n".to_vec();
                v.resize(v.len() + 4 * 1024 * 1024, b'x');
                v
            }
            _ if head.starts_with("HEAD ") => {
                b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\n".to_vec()
            }
            _ => b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\nok".to_vec(),
        };
        if s.write_all(&out).await.is_err() || path == "/close" {
            return;
        }
    }
}

impl RawUpstream {
    async fn start() -> Self {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let conns = Arc::new(AtomicUsize::new(0));
        let c = conns.clone();
        let task = tokio::spawn(async move {
            while let Ok((s, _)) = listener.accept().await {
                c.fetch_add(1, Ordering::SeqCst);
                tokio::spawn(serve_conn(s));
            }
        });
        Self { addr, conns, task }
    }

    fn conns(&self) -> usize {
        self.conns.load(Ordering::SeqCst)
    }
}

#[tokio::test]
async fn one_kept_alive_connection_carries_sequential_requests_including_empty_bodies() {
    let up = RawUpstream::start().await;
    let gw = gateway(RULES, &format!("http://{}", up.addr), None).await;
    for i in 0..20 {
        let path = if i % 5 == 4 { "/empty" } else { "/" };
        let r = send(gw.listen, "GET", path, &[], "").await;
        assert!(r.status.is_success(), "{path}: {}", r.status);
    }
    let head = send(gw.listen, "HEAD", "/", &[], "").await;
    assert_eq!(head.status, 200);
    assert_eq!(send(gw.listen, "GET", "/", &[], "").await.body, "ok");
    assert_eq!(
        up.conns(),
        1,
        "every request on the one kept-alive connection"
    );
}

#[tokio::test]
async fn a_connection_the_upstream_closes_is_not_used_again() {
    let up = RawUpstream::start().await;
    let gw = gateway(RULES, &format!("http://{}", up.addr), None).await;
    for _ in 0..3 {
        assert_eq!(
            send(gw.listen, "GET", "/close", &[], "").await.body,
            "close"
        );
        assert_eq!(send(gw.listen, "GET", "/", &[], "").await.body, "ok");
    }
    assert!(up.conns() >= 3, "a closed connection was reused");
}

#[tokio::test]
async fn a_response_abandoned_half_read_never_leaks_into_the_next_request() {
    let up = RawUpstream::start().await;
    let gw = gateway(RULES, &format!("http://{}", up.addr), None).await;
    // A client that reads the head of a 4 MiB answer and hangs up.
    let mut c = TcpStream::connect(gw.listen).await.unwrap();
    c.write_all(b"GET /big HTTP/1.1\r\nhost: x\r\n\r\n")
        .await
        .unwrap();
    let mut head = [0u8; 1024];
    let n = c.read(&mut head).await.unwrap();
    assert!(String::from_utf8_lossy(&head[..n]).starts_with("HTTP/1.1 200"));
    drop(c);
    for _ in 0..5 {
        let r = send(gw.listen, "GET", "/", &[], "").await;
        assert_eq!((r.status.as_u16(), r.body.as_str()), (200, "ok"));
    }
    assert!(up.conns() >= 2, "the half-read connection was reused");
}

/// A connection's timer is reused from request to request: each request
/// gets its own full `upstream_timeout`, whatever the connection carried
/// before, including after sitting idle past an earlier deadline.
#[tokio::test]
async fn each_request_on_a_kept_alive_connection_gets_its_own_deadline() {
    let up = RawUpstream::start().await;
    let gw = gateway(
        &format!("upstream_timeout: 300ms\n{RULES}"),
        &format!("http://{}", up.addr),
        None,
    )
    .await;
    // Spread over twice the timeout on one connection: a deadline left from
    // an earlier request would cut a later one short.
    for _ in 0..4 {
        assert_eq!(send(gw.listen, "GET", "/", &[], "").await.status, 200);
        tokio::time::sleep(Duration::from_millis(150)).await;
    }
    // Idle past the last deadline (the timer fires while pooled), then reused.
    tokio::time::sleep(Duration::from_millis(400)).await;
    assert_eq!(send(gw.listen, "GET", "/", &[], "").await.status, 200);
    assert_eq!(up.conns(), 1, "one kept-alive connection throughout");
    // A slow answer is cut at this request's deadline, not earlier.
    let started = Instant::now();
    let r = send(gw.listen, "GET", "/slow", &[], "").await;
    let took = started.elapsed();
    assert_eq!(r.status, 504, "{}", r.body);
    assert!(
        took >= Duration::from_millis(290) && took < Duration::from_millis(1900),
        "{took:?}"
    );
    // The timed-out connection is not reused; the next request gets a new one.
    assert_eq!(send(gw.listen, "GET", "/", &[], "").await.status, 200);
    assert_eq!(up.conns(), 2);
    gw.shutdown().await;
}
