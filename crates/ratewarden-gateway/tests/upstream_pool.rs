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
/// 2 s, `/chunked` answers a chunked body in two writes, `/until-close`
/// answers a body that ends when it closes, `/drop-later` answers and then
/// closes the kept-alive connection 50 ms later without saying so,
/// `/vanish` closes without answering unless it is its connection's first
/// request, `/echo`
/// answers the request it read (head and body); anything else `ok` at
/// once. Counts the connections it accepted.
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

/// Reads from `s` into `buf` until `buf` holds `pattern` (or `len` bytes);
/// false at the end of the stream.
async fn read_until(s: &mut TcpStream, buf: &mut Vec<u8>, done: impl Fn(&[u8]) -> bool) -> bool {
    let mut chunk = [0u8; 4096];
    while !done(buf) {
        match s.read(&mut chunk).await {
            Ok(0) | Err(_) => return false,
            Ok(n) => buf.extend_from_slice(&chunk[..n]),
        }
    }
    true
}

fn find(buf: &[u8], pattern: &[u8]) -> Option<usize> {
    buf.windows(pattern.len()).position(|w| w == pattern)
}

async fn serve_conn(mut s: TcpStream) {
    let mut buf = Vec::new();
    for served in 0.. {
        if !read_until(&mut s, &mut buf, |b| find(b, b"\r\n\r\n").is_some()).await {
            return;
        }
        let head_end = find(&buf, b"\r\n\r\n").unwrap() + 4;
        let head = String::from_utf8_lossy(&buf[..head_end]).into_owned();
        let lower = head.to_ascii_lowercase();
        let body_end = if lower.contains("transfer-encoding: chunked") {
            if !read_until(&mut s, &mut buf, |b| {
                find(&b[head_end..], b"0\r\n\r\n").is_some()
            })
            .await
            {
                return;
            }
            head_end + find(&buf[head_end..], b"0\r\n\r\n").unwrap() + 5
        } else {
            let length: usize = lower
                .split("content-length: ")
                .nth(1)
                .and_then(|v| v.split("\r\n").next())
                .and_then(|v| v.parse().ok())
                .unwrap_or(0);
            if !read_until(&mut s, &mut buf, |b| b.len() >= head_end + length).await {
                return;
            }
            head_end + length
        };
        let body = buf[head_end..body_end].to_vec();
        buf.drain(..body_end);
        // The route: the target without its query or a `/base` prefix.
        let target = head.split(' ').nth(1).unwrap_or("/");
        let path = target.split('?').next().unwrap_or("/");
        let path = path.strip_prefix("/base").unwrap_or(path).to_owned();
        if path == "/slow" {
            tokio::time::sleep(Duration::from_secs(2)).await;
        }
        if path == "/vanish" && served > 0 {
            return;
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
            "/chunked" => {
                let first = b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n5\r\nhello\r\n";
                if s.write_all(first).await.is_err() {
                    return;
                }
                tokio::time::sleep(Duration::from_millis(20)).await;
                b"6\r\n world\r\n0\r\n\r\n".to_vec()
            }
            "/until-close" => {
                let _ = s.write_all(b"HTTP/1.1 200 OK\r\n\r\nuntil ").await;
                tokio::time::sleep(Duration::from_millis(20)).await;
                let _ = s.write_all(b"closed").await;
                return;
            }
            "/echo" => {
                let mut v = format!(
                    "HTTP/1.1 200 OK\r\ncontent-length: {}\r\n\r\n",
                    head.len() + body.len()
                )
                .into_bytes();
                v.extend_from_slice(head.as_bytes());
                v.extend_from_slice(&body);
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
        if path == "/drop-later" {
            tokio::time::sleep(Duration::from_millis(50)).await;
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
        let r = send(gw.listen(), "GET", path, &[], "").await;
        assert!(r.status.is_success(), "{path}: {}", r.status);
    }
    let head = send(gw.listen(), "HEAD", "/", &[], "").await;
    assert_eq!(head.status, 200);
    assert_eq!(send(gw.listen(), "GET", "/", &[], "").await.body, "ok");
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
            send(gw.listen(), "GET", "/close", &[], "").await.body,
            "close"
        );
        assert_eq!(send(gw.listen(), "GET", "/", &[], "").await.body, "ok");
    }
    assert!(up.conns() >= 3, "a closed connection was reused");
}

#[tokio::test]
async fn a_response_abandoned_half_read_never_leaks_into_the_next_request() {
    let up = RawUpstream::start().await;
    let gw = gateway(RULES, &format!("http://{}", up.addr), None).await;
    // A client that reads the head of a 4 MiB answer and hangs up.
    let mut c = TcpStream::connect(gw.listen()).await.unwrap();
    c.write_all(b"GET /big HTTP/1.1\r\nhost: x\r\n\r\n")
        .await
        .unwrap();
    let mut head = [0u8; 1024];
    let n = c.read(&mut head).await.unwrap();
    assert!(String::from_utf8_lossy(&head[..n]).starts_with("HTTP/1.1 200"));
    drop(c);
    for _ in 0..5 {
        let r = send(gw.listen(), "GET", "/", &[], "").await;
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
        assert_eq!(send(gw.listen(), "GET", "/", &[], "").await.status, 200);
        tokio::time::sleep(Duration::from_millis(150)).await;
    }
    // Idle past the last deadline (the timer fires while pooled), then reused.
    tokio::time::sleep(Duration::from_millis(400)).await;
    assert_eq!(send(gw.listen(), "GET", "/", &[], "").await.status, 200);
    assert_eq!(up.conns(), 1, "one kept-alive connection throughout");
    // A slow answer is cut at this request's deadline, not earlier: a 504
    // (the upstream's 200 comes after 2 s, so it was cut before), and not
    // before the 300 ms were up (a timer never fires early; no upper bound
    // on the wall clock of a busy host).
    let started = Instant::now();
    let r = send(gw.listen(), "GET", "/slow", &[], "").await;
    let took = started.elapsed();
    assert_eq!(r.status, 504, "{}", r.body);
    assert!(took >= Duration::from_millis(290), "cut early: {took:?}");
    // The timed-out connection is not reused; the next request gets a new one.
    assert_eq!(send(gw.listen(), "GET", "/", &[], "").await.status, 200);
    assert_eq!(up.conns(), 2);
    gw.shutdown().await;
}

/// Writes `raw` to the gateway in one go and reads until it closes.
async fn raw_exchange(addr: std::net::SocketAddr, raw: &[u8]) -> String {
    let mut c = TcpStream::connect(addr).await.unwrap();
    c.write_all(raw).await.unwrap();
    let mut out = Vec::new();
    tokio::time::timeout(Duration::from_secs(10), c.read_to_end(&mut out))
        .await
        .expect("the gateway closes after `connection: close`")
        .unwrap();
    String::from_utf8_lossy(&out).into_owned()
}

#[tokio::test]
async fn chunked_and_close_delimited_answers_are_relayed_whole() {
    let up = RawUpstream::start().await;
    let gw = gateway(RULES, &format!("http://{}", up.addr), None).await;
    // Through hyper's client the chunked body decodes to the whole text, and
    // the client connection stays usable after it.
    for _ in 0..3 {
        let r = send(gw.listen(), "GET", "/chunked", &[], "").await;
        assert_eq!((r.status.as_u16(), r.body.as_str()), (200, "hello world"));
        assert_eq!(r.header("x-ratelimit-limit"), Some("1000"));
    }
    // On one raw connection: chunked (kept alive), then a body that ends
    // when the upstream closes (the gateway says `connection: close` and
    // closes after it).
    let text = raw_exchange(
        gw.listen(),
        b"GET /chunked HTTP/1.1\r\nhost: x\r\n\r\nGET /until-close HTTP/1.1\r\nhost: x\r\n\r\n",
    )
    .await;
    assert!(text.contains("transfer-encoding: chunked\r\n"), "{text}");
    assert!(
        text.contains("5\r\nhello\r\n6\r\n world\r\n0\r\n\r\nHTTP/1.1 200"),
        "{text}"
    );
    assert!(text.contains("connection: close\r\n"), "{text}");
    assert!(text.ends_with("\r\n\r\nuntil closed"), "{text}");
    // The chunked exchanges left their connection in the pool; the
    // close-delimited one did not.
    assert_eq!(send(gw.listen(), "GET", "/", &[], "").await.body, "ok");
    gw.shutdown().await;
}

#[tokio::test]
async fn pipelined_requests_are_answered_in_order_and_connection_close_is_honoured() {
    let up = RawUpstream::start().await;
    let rules = format!("x_forwarded_for: append\n{RULES}");
    let gw = gateway(&rules, &format!("http://{}/base/", up.addr), None).await;
    let text = raw_exchange(
        gw.listen(),
        b"GET /echo?n=1 HTTP/1.1\r\nhost: x\r\n\r\n\
          POST /echo?n=2 HTTP/1.1\r\nhost: x\r\ncontent-length: 5\r\nkeep-alive: 5\r\nx-forwarded-for: 10.9.9.9\r\n\r\nhello\
          GET /echo?n=3 HTTP/1.1\r\nhost: x\r\nconnection: close\r\n\r\n",
    )
    .await;
    let one = text.find("GET /base/echo?n=1 HTTP/1.1").expect(&text);
    let two = text.find("POST /base/echo?n=2 HTTP/1.1").expect(&text);
    let three = text.find("GET /base/echo?n=3 HTTP/1.1").expect(&text);
    assert!(one < two && two < three, "{text}");
    let second = &text[two..three];
    assert!(
        second.contains("\r\n\r\nhello"),
        "the body follows: {second}"
    );
    assert!(
        second.contains("x-forwarded-for: 10.9.9.9, 127.0.0.1\r\n"),
        "the peer is appended to the chain: {second}"
    );
    assert!(
        !second.contains("keep-alive"),
        "hop-by-hop dropped: {second}"
    );
    assert!(
        second.contains(&format!("host: {}\r\n", up.addr)),
        "Host is the upstream's: {second}"
    );
    // Three answers, the last saying it closes (and `raw_exchange` saw the close).
    assert_eq!(text.matches("HTTP/1.1 200 OK").count(), 3, "{text}");
    assert_eq!(text.matches("connection: close\r\n").count(), 1, "{text}");
    gw.shutdown().await;
}

#[tokio::test]
async fn what_the_http1_path_does_not_take_is_served_by_hyper() {
    let up = RawUpstream::start().await;
    let gw = gateway(RULES, &format!("http://{}", up.addr), None).await;
    // HTTP/1.0.
    let text = raw_exchange(gw.listen(), b"GET /echo HTTP/1.0\r\nhost: x\r\n\r\n").await;
    assert!(
        text.starts_with("HTTP/1.0 200") || text.starts_with("HTTP/1.1 200"),
        "{text}"
    );
    assert!(text.contains("GET /echo HTTP/1.1"), "{text}");
    // A chunked request body, after a plain request on the same connection.
    let text = raw_exchange(
        gw.listen(),
        b"GET / HTTP/1.1\r\nhost: x\r\n\r\n\
          POST /echo HTTP/1.1\r\nhost: x\r\ntransfer-encoding: chunked\r\nconnection: close\r\n\r\n3\r\nabc\r\n0\r\n\r\n",
    )
    .await;
    assert!(text.contains("\r\n\r\nok"), "{text}");
    assert!(text.contains("abc"), "{text}");
    // A body larger than the path buffers: streamed through whole.
    let big = "y".repeat(200 * 1024);
    let r = send(gw.listen(), "POST", "/echo", &[], &big).await;
    assert_eq!(r.status, 200);
    assert!(r.body.ends_with(&big), "all {} bytes arrived", big.len());
    assert_eq!(r.header("x-ratelimit-limit"), Some("1000"));
    gw.shutdown().await;
}

#[tokio::test]
async fn both_paths_append_the_peer_to_every_incoming_x_forwarded_for_field() {
    let up = RawUpstream::start().await;
    let rules = format!("x_forwarded_for: append\n{RULES}");
    let gw = gateway(&rules, &format!("http://{}", up.addr), None).await;
    let fields = "x-forwarded-for: 10.0.0.1\r\nx-forwarded-for: 10.0.0.2, 10.0.0.3\r\n";
    let joined = "x-forwarded-for: 10.0.0.1, 10.0.0.2, 10.0.0.3, 127.0.0.1\r\n";
    // The HTTP/1.1 path, then hyper's (HTTP/1.0 goes there).
    for version in ["1.1", "1.0"] {
        let raw =
            format!("GET /echo HTTP/{version}\r\nhost: x\r\n{fields}connection: close\r\n\r\n");
        let text = raw_exchange(gw.listen(), raw.as_bytes()).await;
        assert!(text.contains(" 200 OK"), "HTTP/{version}: {text}");
        assert!(
            text.to_ascii_lowercase().contains(joined),
            "HTTP/{version}: one field, the chain in order, then the peer: {text}"
        );
    }
    gw.shutdown().await;
}

#[tokio::test]
async fn a_pooled_connection_the_upstream_dropped_is_replaced_without_an_error() {
    let up = RawUpstream::start().await;
    let gw = gateway(RULES, &format!("http://{}", up.addr), None).await;
    // POSTs: never sent twice, so each must find its pooled connection
    // closed before sending, not by failing on it.
    for i in 0..3 {
        let r = send(gw.listen(), "POST", "/drop-later", &[], "x").await;
        assert_eq!(
            (r.status.as_u16(), r.body.as_str()),
            (200, "ok"),
            "round {i}"
        );
        // The upstream closes the pooled connection meanwhile.
        tokio::time::sleep(Duration::from_millis(120)).await;
    }
    assert_eq!(up.conns(), 3, "each round needed a new connection");
    gw.shutdown().await;
}

#[tokio::test]
async fn a_request_the_upstream_drops_unanswered_is_repeated_only_if_idempotent() {
    let up = RawUpstream::start().await;
    let gw = gateway(RULES, &format!("http://{}", up.addr), None).await;
    assert_eq!(send(gw.listen(), "GET", "/", &[], "").await.status, 200);
    assert_eq!(up.conns(), 1);
    // The kept-alive connection takes the GET and closes without a word: the
    // GET is sent again on a new connection (where it is the first request).
    let r = send(gw.listen(), "GET", "/vanish", &[], "").await;
    assert_eq!((r.status.as_u16(), r.body.as_str()), (200, "ok"));
    assert_eq!(up.conns(), 2);
    // A POST is never sent twice: the upstream may have acted on it.
    let r = send(gw.listen(), "POST", "/vanish", &[], "x").await;
    assert_eq!(r.status, 502, "{}", r.body);
    assert_eq!(up.conns(), 2, "no second connection for a retry");
    gw.shutdown().await;
}
