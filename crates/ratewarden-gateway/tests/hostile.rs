//! The edge, tried as a hostile client would: the real `ratewarden` binary
//! over raw sockets, in front of a recording upstream. Each test asserts
//! what the client got, what the upstream received, and that
//! `ratewarden_requests_total` counted exactly what was forwarded.

mod support;

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use support::{Binary as Gateway, binary as gateway};

/// A request as the upstream received it.
#[derive(Debug, Clone)]
struct Seen {
    method: String,
    target: String,
    headers: Vec<(String, String)>,
    body: Vec<u8>,
}

impl Seen {
    fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(n, _)| n.eq_ignore_ascii_case(name))
            .map(|(_, v)| v.as_str())
    }
}

type Answer = Arc<dyn Fn(&Seen) -> (Vec<u8>, bool) + Send + Sync>;

/// An upstream that records every request it parses and answers with
/// `answer` (bytes, and whether to close after them).
struct Recorder {
    addr: SocketAddr,
    seen: Arc<Mutex<Vec<Seen>>>,
}

impl Recorder {
    fn start(answer: Answer) -> Self {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = listener.local_addr().unwrap();
        let seen = Arc::new(Mutex::new(vec![]));
        let s = seen.clone();
        std::thread::spawn(move || {
            for conn in listener.incoming() {
                let Ok(conn) = conn else { return };
                let (s, answer) = (s.clone(), answer.clone());
                std::thread::spawn(move || serve(conn, &s, &answer));
            }
        });
        Self { addr, seen }
    }

    fn ok() -> Self {
        Self::start(Arc::new(|_| {
            (
                b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\nok".to_vec(),
                false,
            )
        }))
    }

    fn seen(&self) -> Vec<Seen> {
        self.seen.lock().unwrap().clone()
    }

    fn url(&self) -> String {
        format!("http://{}", self.addr)
    }
}

fn serve(mut conn: TcpStream, seen: &Mutex<Vec<Seen>>, answer: &Answer) {
    let mut buf = Vec::new();
    let mut chunk = [0; 8192];
    loop {
        let mut headers = [httparse::EMPTY_HEADER; 64];
        let mut req = httparse::Request::new(&mut headers);
        let head = match req.parse(&buf) {
            Ok(httparse::Status::Complete(n)) => Some(n),
            Ok(httparse::Status::Partial) => None,
            Err(_) => return,
        };
        if let Some(n) = head {
            let mut s = Seen {
                method: req.method.unwrap_or("").to_owned(),
                target: req.path.unwrap_or("").to_owned(),
                headers: req
                    .headers
                    .iter()
                    .map(|h| {
                        (
                            h.name.to_owned(),
                            String::from_utf8_lossy(h.value).into_owned(),
                        )
                    })
                    .collect(),
                body: vec![],
            };
            let chunked = s
                .header("transfer-encoding")
                .is_some_and(|v| v.eq_ignore_ascii_case("chunked"));
            let len: usize = s
                .header("content-length")
                .map_or(0, |v| v.trim().parse().unwrap_or(0));
            let mut rest = buf.split_off(n);
            if chunked {
                // Good enough for what the gateway sends: whole chunks.
                loop {
                    if let Some(end) = find(&rest, b"0\r\n\r\n") {
                        let mut raw = &rest[..end];
                        while let Some(line) = find(raw, b"\r\n") {
                            let size = usize::from_str_radix(
                                std::str::from_utf8(&raw[..line]).unwrap().trim(),
                                16,
                            )
                            .unwrap();
                            s.body.extend_from_slice(&raw[line + 2..line + 2 + size]);
                            raw = &raw[line + 4 + size..];
                        }
                        buf = rest.split_off(end + 5);
                        break;
                    }
                    match conn.read(&mut chunk) {
                        Ok(0) | Err(_) => return,
                        Ok(k) => rest.extend_from_slice(&chunk[..k]),
                    }
                }
            } else {
                while rest.len() < len {
                    match conn.read(&mut chunk) {
                        Ok(0) | Err(_) => return,
                        Ok(k) => rest.extend_from_slice(&chunk[..k]),
                    }
                }
                buf = rest.split_off(len);
                s.body = rest;
            }
            let (bytes, close) = answer(&s);
            seen.lock().unwrap().push(s);
            if conn.write_all(&bytes).is_err() || close {
                return;
            }
            continue;
        }
        match conn.read(&mut chunk) {
            Ok(0) | Err(_) => return,
            Ok(k) => buf.extend_from_slice(&chunk[..k]),
        }
    }
}

fn find(hay: &[u8], needle: &[u8]) -> Option<usize> {
    hay.windows(needle.len()).position(|w| w == needle)
}

/// Writes `bytes` on a new connection and reads until the gateway closes
/// it or `quiet` passes without a byte.
fn raw(addr: SocketAddr, bytes: &[u8], quiet: Duration) -> String {
    let mut s = TcpStream::connect(addr).unwrap();
    s.write_all(bytes).unwrap();
    read_all(&mut s, quiet)
}

fn read_all(s: &mut TcpStream, quiet: Duration) -> String {
    s.set_read_timeout(Some(quiet)).unwrap();
    let mut got = vec![];
    let mut buf = [0; 8192];
    loop {
        match s.read(&mut buf) {
            Ok(0) | Err(_) => break,
            Ok(n) => got.extend_from_slice(&buf[..n]),
        }
    }
    String::from_utf8_lossy(&got).into_owned()
}

/// The status codes of every answer in `text`, in order.
fn statuses(text: &str) -> Vec<u16> {
    text.match_indices("HTTP/1.1 ")
        .filter_map(|(i, _)| text[i + 9..i + 12].parse().ok())
        .collect()
}

/// `ratewarden_requests_total{rule, decision}`.
fn counted(gw: &Gateway, rule: &str, decision: &str) -> u64 {
    let text = raw(
        gw.admin,
        b"GET /metrics HTTP/1.1\r\nhost: localhost\r\nconnection: close\r\n\r\n",
        Duration::from_secs(2),
    );
    let want = format!("ratewarden_requests_total{{rule=\"{rule}\",decision=\"{decision}\"}} ");
    text.lines()
        .find_map(|l| l.strip_prefix(&want))
        .map_or(0, |n| n.trim().parse().unwrap())
}

const Q: Duration = Duration::from_millis(300);

#[test]
fn equivalent_paths_fall_under_the_rule_they_are_equivalent_to() {
    let up = Recorder::ok();
    let gw = gateway(
        "rules:\n  - name: limited\n    match: {path_prefix: /limited/}\n    algorithm: fixed_window\n    limit: 1\n    window: 1h\n",
        &up.url(),
    );
    let get = |target: &str| {
        raw(
            gw.listen,
            format!("GET {target} HTTP/1.1\r\nhost: a\r\nconnection: close\r\n\r\n").as_bytes(),
            Q,
        )
    };
    assert_eq!(statuses(&get("/limited/b")), [200]);
    for same in [
        "/%6cimited/b",
        "/%6Cimited/b",
        "/./limited/b",
        "/x/../limited/b",
        "//limited/b",
        "/limited;v=1/b",
        "/limited%2Fb",
    ] {
        assert_eq!(statuses(&get(same)), [429], "{same}");
    }
    // HTTP/1.0 goes to hyper's path: the same path rules.
    let old = raw(gw.listen, b"GET /%6cimited/b HTTP/1.0\r\n\r\n", Q);
    assert!(
        old.starts_with("HTTP/1.0 429") || old.starts_with("HTTP/1.1 429"),
        "{old}"
    );
    // And h2c.
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let h2 = rt.block_on(async {
        let client =
            hyper_util::client::legacy::Client::builder(hyper_util::rt::TokioExecutor::new())
                .http2_only(true)
                .build_http::<http_body_util::Full<bytes::Bytes>>();
        let uri = format!("http://{}/%6cimited/../limited/b", gw.listen);
        client.get(uri.parse().unwrap()).await.unwrap().status()
    });
    assert_eq!(h2, 429);
    // Unnormalisable paths are refused, not forwarded.
    for bad in ["/../etc/passwd", "/a%00b", "/a%zz"] {
        assert_eq!(statuses(&get(bad)), [400], "{bad}");
    }
    let seen = up.seen();
    assert_eq!(
        seen.len(),
        1,
        "only the first reached the upstream: {seen:?}"
    );
    assert_eq!(counted(&gw, "limited", "allowed"), 1);
    assert_eq!(counted(&gw, "limited", "rejected"), 9);
}

#[test]
fn the_upstream_gets_the_original_target_unless_told_to_normalise() {
    let up = Recorder::ok();
    let gw = gateway("rules: []\n", &up.url());
    raw(
        gw.listen,
        b"GET //a/./b%7e?q=%2e HTTP/1.1\r\nhost: a\r\nconnection: close\r\n\r\n",
        Q,
    );
    let gw2 = gateway("upstream_path: normalized\nrules: []\n", &up.url());
    raw(
        gw2.listen,
        b"GET //a/./b%7e?q=%2e HTTP/1.1\r\nhost: a\r\nconnection: close\r\n\r\n",
        Q,
    );
    let targets: Vec<String> = up.seen().into_iter().map(|s| s.target).collect();
    assert_eq!(targets, ["//a/./b%7e?q=%2e", "/a/b~?q=%2e"]);
}

#[test]
fn a_close_delimited_answer_never_carries_the_content_length_it_came_with() {
    let up = Recorder::start(Arc::new(|_| {
        (
            b"HTTP/1.1 200 OK\r\ntransfer-encoding: gzip\r\ncontent-length: 5\r\n\r\nhelloEXTRA"
                .to_vec(),
            true,
        )
    }));
    let gw = gateway("rules: []\n", &up.url());
    for request in [
        &b"GET / HTTP/1.1\r\nhost: a\r\n\r\n"[..],
        b"GET / HTTP/1.0\r\n\r\n",
    ] {
        let got = raw(gw.listen, request, Q);
        let (head, body) = got.split_once("\r\n\r\n").unwrap();
        let head = head.to_ascii_lowercase();
        assert!(!head.contains("content-length"), "{got}");
        assert!(!head.contains("transfer-encoding: gzip"), "{got}");
        assert_eq!(body, "helloEXTRA", "{got}");
    }
}

#[test]
fn host_must_be_there_once_and_valid_on_http_1_1() {
    let up = Recorder::ok();
    let gw = gateway(
        "rules:\n  - name: all\n    limit: 1000000\n    window: 1s\n",
        &up.url(),
    );
    for bad in [
        &b"GET / HTTP/1.1\r\n\r\n"[..],
        b"GET / HTTP/1.1\r\nhost: a\r\nhost: b\r\n\r\n",
        b"GET / HTTP/1.1\r\nhost: a b\r\n\r\n",
        b"GET / HTTP/1.1\r\nhost: a/b\r\n\r\n",
        b"GET / HTTP/1.1\r\nhost: \r\n\r\n",
    ] {
        let got = raw(gw.listen, bad, Q);
        assert_eq!(statuses(&got), [400], "{}", String::from_utf8_lossy(bad));
        assert!(got.contains("application/problem+json"), "{got}");
    }
    // HTTP/1.0 may leave it out.
    let ok = raw(gw.listen, b"GET / HTTP/1.0\r\n\r\n", Q);
    assert!(ok.contains(" 200 "), "{ok}");
    assert_eq!(up.seen().len(), 1);
    assert_eq!(counted(&gw, "all", "allowed"), 1);
}

#[test]
fn connect_is_405_and_options_star_is_path_star() {
    let up = Recorder::ok();
    let gw = gateway(
        "rules:\n  - name: star\n    match: {methods: [OPTIONS], path: '*'}\n    algorithm: fixed_window\n    limit: 1\n    window: 1h\n",
        &up.url(),
    );
    let got = raw(
        gw.listen,
        b"CONNECT example.com:443 HTTP/1.1\r\nhost: example.com:443\r\n\r\n",
        Q,
    );
    assert_eq!(statuses(&got), [405], "{got}");
    assert!(got.to_ascii_lowercase().contains("allow: get"), "{got}");
    let star = b"OPTIONS * HTTP/1.1\r\nhost: a\r\n\r\nOPTIONS * HTTP/1.1\r\nhost: a\r\n\r\nGET * HTTP/1.1\r\nhost: a\r\n\r\n";
    assert_eq!(statuses(&raw(gw.listen, star, Q)), [200, 429, 400]);
    let seen = up.seen();
    assert_eq!(seen.len(), 1, "{seen:?}");
    assert_eq!(
        (seen[0].method.as_str(), seen[0].target.as_str()),
        ("OPTIONS", "*")
    );
    assert_eq!(counted(&gw, "star", "allowed"), 1);
    assert_eq!(counted(&gw, "star", "rejected"), 1);
}

#[test]
fn chunked_bodies_are_checked_whole_before_anything_is_forwarded() {
    let up = Recorder::ok();
    let gw = gateway(
        "rules:\n  - name: all\n    limit: 1000000\n    window: 1s\n",
        &up.url(),
    );
    let bad = b"POST /x HTTP/1.1\r\nhost: a\r\ntransfer-encoding: chunked\r\n\r\n5\r\nhello\r\nZZ\r\nworld\r\n0\r\n\r\n";
    let got = raw(gw.listen, bad, Q);
    assert_eq!(statuses(&got), [400], "{got}");
    assert!(up.seen().is_empty(), "none of it reached the upstream");
    let good = b"POST /x HTTP/1.1\r\nhost: a\r\ntransfer-encoding: chunked\r\n\r\n5;x=1\r\nhello\r\n6\r\n world\r\n0\r\nx-trailer: 1\r\n\r\n";
    assert_eq!(statuses(&raw(gw.listen, good, Q)), [200]);
    let seen = up.seen();
    assert_eq!(seen.len(), 1);
    assert_eq!(seen[0].body, b"hello world");
    assert_eq!(seen[0].header("content-length"), Some("11"));
    assert_eq!(seen[0].header("transfer-encoding"), None);
    assert_eq!(counted(&gw, "all", "allowed"), 1);
}

#[test]
fn header_names_with_underscores_are_dropped_unless_kept() {
    let up = Recorder::ok();
    let spoof = b"GET / HTTP/1.1\r\nhost: a\r\nx_forwarded_for: 6.6.6.6\r\nx_user: 7\r\nconnection: close\r\n\r\n";
    let gw = gateway("rules: []\n", &up.url());
    raw(gw.listen, spoof, Q);
    let kept = gateway("underscores_in_headers: true\nrules: []\n", &up.url());
    raw(kept.listen, spoof, Q);
    let seen = up.seen();
    assert_eq!(seen.len(), 2);
    assert_eq!(seen[0].header("x_forwarded_for"), None);
    assert_eq!(seen[0].header("x_user"), None);
    assert_eq!(seen[1].header("x_user"), Some("7"));
    // The gateway's own X-Forwarded-For names the peer only.
    assert_eq!(seen[0].header("x-forwarded-for"), Some("127.0.0.1"));
}

#[test]
fn a_trickled_head_or_body_is_answered_408() {
    let up = Recorder::ok();
    let gw = gateway(
        "client_header_timeout: 400ms\nclient_body_timeout: 400ms\nrules:\n  - name: all\n    limit: 1000000\n    window: 1s\n",
        &up.url(),
    );
    let mut s = TcpStream::connect(gw.listen).unwrap();
    let started = Instant::now();
    let mut cut = false;
    // One byte every 100 ms: each read is progress, the head as a whole is not.
    for b in b"GET / HTTP/1.1\r\nhost: a\r\nx-slow: aaaaaaaaaaaaaaaaaaaaaaaaaaaaaa\r\n" {
        if s.write_all(&[*b]).is_err() {
            cut = true;
            break;
        }
        std::thread::sleep(Duration::from_millis(100));
        if started.elapsed() > Duration::from_secs(3) {
            break;
        }
    }
    let got = read_all(&mut s, Duration::from_secs(2));
    assert!(cut || got.starts_with("HTTP/1.1 408"), "{got}");
    assert!(got.starts_with("HTTP/1.1 408"), "{got}");
    assert!(started.elapsed() < Duration::from_secs(3));
    let mut s = TcpStream::connect(gw.listen).unwrap();
    s.write_all(b"POST / HTTP/1.1\r\nhost: a\r\ncontent-length: 10\r\n\r\n12345")
        .unwrap();
    let got = read_all(&mut s, Duration::from_secs(2));
    assert!(got.starts_with("HTTP/1.1 408"), "{got}");
    assert!(up.seen().is_empty());
    assert_eq!(counted(&gw, "all", "allowed"), 0);
}

/// The request-smuggling classes that held before: each still holds. The
/// rule counts every request the gateway forwards, which must equal what
/// the upstream received.
#[test]
fn smuggling_attempts_reach_the_upstream_as_one_request_or_not_at_all() {
    let up = Recorder::ok();
    let gw = gateway(
        "rules:\n  - name: all\n    limit: 1000000\n    window: 1s\n",
        &up.url(),
    );
    let cases: [(&str, &[u8], &[u16]); 8] = [
        (
            "CL.TE",
            b"POST / HTTP/1.1\r\nhost: a\r\ncontent-length: 6\r\ntransfer-encoding: chunked\r\n\r\n0\r\n\r\nGPOST / HTTP/1.1\r\nhost: a\r\n\r\n",
            &[200],
        ),
        (
            "TE.CL",
            b"POST / HTTP/1.1\r\nhost: a\r\ntransfer-encoding: chunked\r\ncontent-length: 3\r\n\r\n8\r\nSMUGGLED\r\n0\r\n\r\n",
            &[200],
        ),
        (
            "duplicate CL",
            b"POST / HTTP/1.1\r\nhost: a\r\ncontent-length: 3\r\ncontent-length: 30\r\n\r\nabc",
            &[400],
        ),
        (
            "obs-fold",
            b"GET / HTTP/1.1\r\nhost: a\r\nx-a: 1\r\n  transfer-encoding: chunked\r\n\r\n",
            &[400],
        ),
        ("bare CR", b"GET / HTTP/1.1\rhost: a\r\n\r\n", &[400]),
        ("NUL", b"GET / HTTP/1.1\r\nhost: a\r\nx-a: b\0c\r\n\r\n", &[400]),
        (
            "TE obfuscated",
            b"POST / HTTP/1.1\r\nhost: a\r\ntransfer-encoding: xchunked\r\ncontent-length: 1\r\n\r\nZ",
            &[400],
        ),
        (
            "pipelined, each decided",
            b"GET /a HTTP/1.1\r\nhost: a\r\ncontent-length: 0\r\n\r\nGET /b HTTP/1.1\r\nhost: a\r\nconnection: close\r\n\r\n",
            &[200, 200],
        ),
    ];
    let mut forwarded = 0;
    for (name, bytes, want) in cases {
        let before = up.seen().len();
        let got = raw(gw.listen, bytes, Q);
        assert_eq!(statuses(&got), want, "{name}: {got}");
        let seen = up.seen();
        let new = &seen[before..];
        assert_eq!(
            new.len(),
            want.iter().filter(|s| **s == 200).count(),
            "{name}: {new:?}"
        );
        forwarded += new.len();
        for s in new {
            assert!(
                !s.method.contains("GPOST") && !s.target.contains("GPOST"),
                "{name}"
            );
            if name == "TE.CL" {
                assert_eq!(s.body, b"SMUGGLED", "{name}");
            }
        }
    }
    let targets: Vec<String> = up.seen().iter().map(|s| s.target.clone()).collect();
    assert_eq!(targets, ["/", "/", "/a", "/b"]);
    assert_eq!(counted(&gw, "all", "allowed") as usize, forwarded);
}

/// An upstream answering with bytes past its body (a poisoned answer) must
/// not have them read as the answer to the next request.
#[test]
fn bytes_an_upstream_sends_past_its_answer_never_reach_another_request() {
    let n = Arc::new(Mutex::new(0));
    let up = Recorder::start(Arc::new(move |_| {
        let mut n = n.lock().unwrap();
        *n += 1;
        if *n == 1 {
            (
                b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\nokHTTP/1.1 200 OK\r\ncontent-length: 6\r\n\r\nPOISON".to_vec(),
                false,
            )
        } else {
            (
                b"HTTP/1.1 200 OK\r\ncontent-length: 5\r\n\r\nclean".to_vec(),
                false,
            )
        }
    }));
    let gw = gateway("rules: []\n", &up.url());
    let first = raw(
        gw.listen,
        b"GET /1 HTTP/1.1\r\nhost: a\r\nconnection: close\r\n\r\n",
        Q,
    );
    assert!(first.ends_with("\r\n\r\nok"), "{first}");
    for i in 2..5 {
        let next = raw(
            gw.listen,
            format!("GET /{i} HTTP/1.1\r\nhost: a\r\nconnection: close\r\n\r\n").as_bytes(),
            Q,
        );
        assert!(!next.contains("POISON"), "{next}");
        assert!(next.ends_with("clean"), "{next}");
    }
}
