//! Running the gateway: Redis across gateways and through an outage, reload,
//! the admin API, graceful shutdown.

#[path = "../../ratewarden/tests/common/mod.rs"]
mod common;
mod support;

use std::time::{Duration, Instant};

use common::RedisServer;
use support::{Upstream, gateway, gateway_file, send};

fn redis_yaml(url: &str, limit: u32, on_error: &str) -> String {
    format!(
        "store:\n  type: redis\n  url: {url}\n  timeout: 100ms\n  on_error: {on_error}\nrules:\n  - name: per-ip\n    algorithm: sliding_window_log\n    limit: {limit}\n    window: 60s\n"
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn twenty_per_minute_is_exact_across_two_gateways_on_one_redis() {
    let redis = RedisServer::start();
    let up = Upstream::start().await;
    let yaml = redis_yaml(&redis.url(), 20, "deny");
    let (a, b) = (
        gateway(&yaml, &up.url(), None).await,
        gateway(&yaml, &up.url(), None).await,
    );
    let mut tasks = vec![];
    for i in 0..100 {
        let addr = if i % 2 == 0 { a.listen() } else { b.listen() };
        tasks.push(tokio::spawn(async move {
            send(addr, "GET", "/", &[], "").await.status.as_u16()
        }));
    }
    let mut ok = 0;
    for t in tasks {
        ok += usize::from(t.await.unwrap() == 200);
    }
    assert_eq!(
        ok, 20,
        "100 concurrent requests over two gateways, one limit"
    );
    assert_eq!(up.hits(), 20);
    a.shutdown().await;
    b.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_killed_and_restarted_under_traffic() {
    let mut redis = RedisServer::start();
    let up = Upstream::start().await;
    let local = gateway(&redis_yaml(&redis.url(), 1_000, "local"), &up.url(), None).await;
    let deny = gateway(&redis_yaml(&redis.url(), 1_000, "deny"), &up.url(), None).await;
    for gw in [&local, &deny] {
        assert_eq!(send(gw.listen(), "GET", "/", &[], "").await.status, 200);
    }
    redis.kill();
    for _ in 0..20 {
        let started = Instant::now();
        let l = send(local.listen(), "GET", "/", &[], "").await;
        assert_eq!(l.status, 200, "on_error: local keeps serving");
        let d = send(deny.listen(), "GET", "/", &[], "").await;
        assert_eq!(d.status, 503, "on_error: deny says so");
        assert!(d.body.contains("rate limiter unavailable"), "{}", d.body);
        assert!(
            started.elapsed() < Duration::from_secs(2),
            "bounded by the store timeout"
        );
    }
    let admin = deny.admin.unwrap();
    // Readiness follows on_error: deny cannot answer as it should, local
    // can (and says the store is down).
    let r = send(admin, "GET", "/readyz", &[], "").await;
    assert_eq!(r.status, 503, "{}", r.body);
    assert!(r.body.contains("\"state\":\"down\""), "{}", r.body);
    let r = send(local.admin.unwrap(), "GET", "/readyz", &[], "").await;
    assert_eq!(r.status, 200, "{}", r.body);
    assert!(r.body.contains("\"on_error\":\"local\""), "{}", r.body);
    let metrics = send(admin, "GET", "/metrics", &[], "").await.body;
    let errors: u64 = metrics
        .lines()
        .filter(|l| l.starts_with("ratewarden_store_errors_total{"))
        .map(|l| l.rsplit(' ').next().unwrap().parse::<u64>().unwrap())
        .sum();
    assert!(errors >= 20, "{errors}");
    assert!(
        metrics.contains("ratewarden_store_state{state=\"down\"} 1"),
        "{metrics}"
    );
    redis.restart();
    let deadline = Instant::now() + Duration::from_secs(20);
    while send(deny.listen(), "GET", "/", &[], "").await.status != 200 {
        assert!(Instant::now() < deadline, "the gateway did not recover");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert_eq!(send(admin, "GET", "/readyz", &[], "").await.status, 200);
    // Back on Redis: the client's state, with its sliding log (the one
    // request since the restart) inside it: six fields and one entry.
    let keys = redis.state_keys();
    assert_eq!(keys.len(), 1, "{keys:?}");
    let key = keys[0].clone();
    assert_eq!(redis.cli(&["strlen", &key]), "64");
    local.shutdown().await;
    deny.shutdown().await;
}

#[tokio::test]
async fn reload_applies_a_good_config_keeps_unchanged_state_and_ignores_a_bad_one() {
    let up = Upstream::start().await;
    let dir = std::env::temp_dir().join(format!("rw-reload-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let file = dir.join("ratewarden.yaml");
    let v1 = "rules:\n  - name: kept\n    algorithm: fixed_window\n    limit: 3\n    window: 1h\n  - name: changed\n    algorithm: fixed_window\n    limit: 100\n    window: 1h\n";
    std::fs::write(&file, v1).unwrap();
    let gw = gateway_file(v1, &up.url(), None, Some(file.clone())).await;
    for _ in 0..2 {
        assert_eq!(send(gw.listen(), "GET", "/", &[], "").await.status, 200);
    }
    // Good: `changed` gets a new limit (and so fresh state); `kept` keeps its count.
    let v2 = v1.replace("limit: 100", "limit: 50");
    std::fs::write(&file, &v2).unwrap();
    let wait_reload = |want| support::wait_for_metric(gw.admin.unwrap(), want);
    wait_reload("ratewarden_config_reloads_total{result=\"success\"} 1").await;
    let r = send(gw.listen(), "GET", "/", &[], "").await;
    assert_eq!(r.status, 200);
    let h = r.header("ratelimit").unwrap();
    assert!(
        h.contains("\"kept\";r=0;") && h.contains("\"changed\";r=49;"),
        "{h}"
    );
    assert_eq!(
        send(gw.listen(), "GET", "/", &[], "").await.status,
        429,
        "kept its state across the reload"
    );
    // Bad: logged and ignored; the old config keeps running.
    std::fs::write(
        &file,
        "rules:\n  - name: x\n    limit: -1\n    window: 1s\n",
    )
    .unwrap();
    wait_reload("ratewarden_config_reloads_total{result=\"failure\"} 1").await;
    let r = send(gw.listen(), "GET", "/", &[], "").await;
    assert_eq!(r.status, 429, "still the old rules");
    gw.shutdown().await;
    std::fs::remove_dir_all(&dir).unwrap();
}

/// The file is compared with the text the gateway was started from, not
/// with whatever it holds when watching begins: a change written while the
/// gateway was starting is applied, not missed until the next change.
#[tokio::test]
async fn a_file_changed_while_starting_is_reloaded() {
    let up = Upstream::start().await;
    let dir = std::env::temp_dir().join(format!("rw-startup-change-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let file = dir.join("ratewarden.yaml");
    let v1 = "rules:\n  - name: r\n    algorithm: fixed_window\n    limit: 100\n    window: 1h\n";
    // On disk already when the gateway starts from `v1`.
    std::fs::write(&file, v1.replace("limit: 100", "limit: 1")).unwrap();
    let gw = gateway_file(v1, &up.url(), None, Some(file.clone())).await;
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let r = send(gw.listen(), "GET", "/", &[], "").await;
        if r.header("x-ratelimit-limit") == Some("1") {
            break;
        }
        assert_eq!(r.header("x-ratelimit-limit"), Some("100"));
        assert!(
            Instant::now() < deadline,
            "the changed file was never loaded"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    gw.shutdown().await;
    std::fs::remove_dir_all(&dir).unwrap();
}

#[tokio::test]
async fn the_admin_api_checks_reports_explains_and_manages_keys() {
    let up = Upstream::start().await;
    let yaml = "admin:\n  listen: 127.0.0.1:0\n  token: s3cret\nrules:\n  - name: coupon\n    match: {methods: [POST], path: /coupons}\n    algorithm: sliding_window_log\n    limit: 2\n    window: 5m\n    penalty: 10m\n    count: failures\n  - name: api\n    match: {path_prefix: /api/}\n    key: [identity, method]\n    limit: 5\n    window: 60s\n";
    let gw = gateway(yaml, &up.url(), None).await;
    let admin = gw.admin.unwrap();
    let auth = [("authorization", "Bearer s3cret")];
    // The API needs the token; probes and metrics do not (by default).
    assert_eq!(send(admin, "GET", "/v1/rules", &[], "").await.status, 401);
    assert_eq!(send(admin, "GET", "/metrics", &[], "").await.status, 200);
    assert_eq!(send(admin, "GET", "/healthz", &auth, "").await.body, "ok\n");
    let check = |body: &'static str| async move {
        send(
            admin,
            "POST",
            "/v1/check",
            &[("authorization", "Bearer s3cret")],
            body,
        )
        .await
    };
    let r = check(r#"{"rule":"coupon","key":"user-42"}"#).await;
    assert_eq!(r.status, 200);
    assert!(
        r.body.contains(r#""allowed":true"#) && r.body.contains(r#""remaining":1"#),
        "{}",
        r.body
    );
    // Two failures reported by an app in another language, then the check rejects with the ban.
    for _ in 0..2 {
        let r = send(
            admin,
            "POST",
            "/v1/report",
            &auth,
            r#"{"rule":"coupon","key":"user-42","outcome":"failure"}"#,
        )
        .await;
        assert_eq!(r.status, 200, "{}", r.body);
    }
    let r = check(r#"{"rule":"coupon","key":"user-42"}"#).await;
    assert!(
        r.body.contains(r#""allowed":false"#) && r.body.contains(r#""retry_after":600"#),
        "{}",
        r.body
    );
    let r = send(admin, "GET", "/v1/keys/coupon/user-42", &auth, "").await;
    assert!(
        r.body.contains(r#""ban_left":599."#) || r.body.contains(r#""ban_left":600"#),
        "{}",
        r.body
    );
    // The proxy sees the same ban: the identity is the peer address here,
    // so check the admin's view of the proxy's own key instead.
    let r = send(
        admin,
        "GET",
        "/v1/explain?method=POST&path=/coupons&identity=user-42",
        &auth,
        "",
    )
    .await;
    assert!(
        r.body.contains(r#""would_allow":false"#) && r.body.contains(r#""reason":"banned""#),
        "{}",
        r.body
    );
    let r = send(admin, "DELETE", "/v1/keys/coupon/user-42", &auth, "").await;
    assert!(r.body.contains(r#""cleared":true"#), "{}", r.body);
    assert!(
        check(r#"{"rule":"coupon","key":"user-42"}"#)
            .await
            .body
            .contains(r#""allowed":true"#)
    );
    // A key with more parts than the identity needs the identity (its Redis slot).
    let r = check(r#"{"rule":"api","key":"1.2.3.4:GET"}"#).await;
    assert_eq!(r.status, 400, "{}", r.body);
    let r = check(r#"{"rule":"api","key":"1.2.3.4:GET","identity":"1.2.3.4"}"#).await;
    assert!(r.body.contains(r#""allowed":true"#), "{}", r.body);
    assert_eq!(check(r#"{"rule":"nope","key":"k"}"#).await.status, 404);
    assert_eq!(check(r#"{"rule":"coupon""#).await.status, 400);
    let m = send(admin, "GET", "/metrics", &auth, "").await.body;
    for name in [
        "ratewarden_requests_total{rule=\"coupon\",decision=\"rejected\"}",
        "ratewarden_decision_duration_seconds_bucket",
        "ratewarden_store_errors_total",
        "ratewarden_config_reloads_total",
        "ratewarden_banned_keys",
        "ratewarden_upstream_duration_seconds_count",
    ] {
        assert!(m.contains(name), "{name} missing from\n{m}");
    }
    gw.shutdown().await;
}

#[tokio::test]
async fn shutdown_lets_in_flight_requests_finish() {
    let up = Upstream::start().await;
    let gw = gateway("rules: []\n", &up.url(), None).await;
    let addr = gw.listen();
    let slow = tokio::spawn(async move { send(addr, "GET", "/slow", &[], "").await });
    // In flight once the upstream has it (it holds /slow for 3 s): waited
    // for, not assumed after a fixed sleep.
    let deadline = Instant::now() + Duration::from_secs(10);
    while up.hits() == 0 {
        assert!(
            Instant::now() < deadline,
            "the request never reached the upstream"
        );
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    gw.shutdown().await;
    let r = slow.await.unwrap();
    assert_eq!(r.status, 200, "the request in flight finished");
    assert_eq!(r.body, "slow");
    assert!(
        std::net::TcpStream::connect(addr).is_err(),
        "no longer accepting"
    );
}

/// The real binary, killed if the test fails half-way.
struct Proc(std::process::Child);

impl Drop for Proc {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn signal(child: &std::process::Child, sig: &str) {
    let ok = std::process::Command::new("kill")
        .arg(format!("-{sig}"))
        .arg(child.id().to_string())
        .status()
        .unwrap()
        .success();
    assert!(ok, "kill -{sig}");
}

/// One request on a kept-alive raw connection; returns the head and body.
fn exchange(
    conn: &mut std::net::TcpStream,
    reader: &mut std::io::BufReader<std::net::TcpStream>,
    path: &str,
) -> (String, String) {
    use std::io::{BufRead, Read, Write};
    write!(conn, "GET {path} HTTP/1.1\r\nhost: test\r\n\r\n").unwrap();
    let mut head = String::new();
    loop {
        let mut line = String::new();
        assert!(
            reader.read_line(&mut line).unwrap() > 0,
            "connection closed"
        );
        if line == "\r\n" {
            break;
        }
        head.push_str(&line.to_ascii_lowercase());
    }
    let len: usize = head
        .lines()
        .find_map(|l| l.strip_prefix("content-length: "))
        .map_or(0, |v| v.trim().parse().unwrap());
    let mut body = vec![0; len];
    reader.read_exact(&mut body).unwrap();
    (head, String::from_utf8_lossy(&body).into_owned())
}

#[test]
fn sighup_reloads_the_running_binary_without_dropping_a_kept_alive_connection() {
    use std::io::BufRead;
    let dir = std::env::temp_dir().join(format!("rw-hup-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let file = dir.join("ratewarden.yaml");
    let v1 = "admin: {listen: 127.0.0.1:0}\nrules:\n  - name: r\n    algorithm: fixed_window\n    limit: 100\n    window: 1h\n";
    std::fs::write(&file, v1).unwrap();
    let mut child = std::process::Command::new(env!("CARGO_BIN_EXE_ratewarden"))
        .args([
            "serve",
            "--listen",
            "127.0.0.1:0",
            "--upstream",
            "echo",
            "-c",
        ])
        .arg(&file)
        .env("RUST_LOG", "info")
        .env("NO_COLOR", "1")
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::null())
        .spawn()
        .unwrap();
    let mut out = std::io::BufReader::new(child.stdout.take().unwrap());
    let mut proc = Proc(child);
    // `ratewarden serving listen=127.0.0.1:P admin=Some(127.0.0.1:Q)`
    let addr_after = |line: &str, key: &str| -> Option<std::net::SocketAddr> {
        let rest = &line[line.find(key)? + key.len()..];
        let end = rest.find([' ', ')']).unwrap_or(rest.len());
        rest[..end].parse().ok()
    };
    let (listen, admin) = loop {
        let mut line = String::new();
        assert!(
            out.read_line(&mut line).unwrap() > 0,
            "exited before serving"
        );
        if line.contains("ratewarden serving") {
            break (
                addr_after(&line, "listen=").unwrap(),
                addr_after(&line, "admin=").unwrap(),
            );
        }
    };
    // Keep reading the log so the pipe never fills; collect the lines.
    let (tx, rx) = std::sync::mpsc::channel::<String>();
    std::thread::spawn(move || {
        for line in out.lines().map_while(Result::ok) {
            let _ = tx.send(line);
        }
    });
    let wait_log = |want: &str| {
        let deadline = Instant::now() + Duration::from_secs(10);
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            match rx.recv_timeout(left) {
                Ok(line) if line.contains(want) => return,
                Ok(_) => {}
                Err(_) => panic!("no log line containing {want:?}"),
            }
        }
    };
    let mut conn = std::net::TcpStream::connect(listen).unwrap();
    let mut reader = std::io::BufReader::new(conn.try_clone().unwrap());
    let (head, _) = exchange(&mut conn, &mut reader, "/");
    assert!(head.contains("x-ratelimit-limit: 100"), "{head}");

    // SIGHUP with the file unchanged: only the signal can trigger this reload.
    signal(&proc.0, "HUP");
    wait_log("SIGHUP: reloading");
    wait_log("config reloaded");
    let mut admin_conn = std::net::TcpStream::connect(admin).unwrap();
    let mut admin_reader = std::io::BufReader::new(admin_conn.try_clone().unwrap());
    let (_, metrics) = exchange(&mut admin_conn, &mut admin_reader, "/metrics");
    assert!(
        metrics.contains("ratewarden_config_reloads_total{result=\"success\"} 1"),
        "{metrics}"
    );

    // A new limit, then SIGHUP: the same kept-alive connection sees it.
    std::fs::write(&file, v1.replace("limit: 100", "limit: 50")).unwrap();
    signal(&proc.0, "HUP");
    wait_log("config reloaded");
    let (head, body) = exchange(&mut conn, &mut reader, "/");
    assert!(head.contains("x-ratelimit-limit: 50"), "{head}");
    assert!(body.starts_with("ratewarden echo: GET /"), "{body}");

    // SIGTERM: a clean exit.
    signal(&proc.0, "TERM");
    let status = proc.0.wait().unwrap();
    assert!(status.success(), "{status}");
    std::fs::remove_dir_all(&dir).unwrap();
}

/// A client connection that sends nothing, or stops halfway through its
/// headers, is closed after `client_idle_timeout`; one whose request is
/// still being answered (a slow upstream) is not.
#[tokio::test]
async fn idle_client_connections_are_closed_but_slow_answers_are_not_cut() {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let up = Upstream::start().await;
    let yaml = "client_idle_timeout: 300ms\nupstream_timeout: 10s\nrules: []\n";
    let gw = gateway(yaml, &up.url(), None).await;
    let closed_within = |mut s: tokio::net::TcpStream| async move {
        let started = Instant::now();
        let mut buf = [0u8; 64];
        let n = tokio::time::timeout(Duration::from_secs(5), s.read(&mut buf))
            .await
            .expect("the gateway never closed the idle connection")
            .unwrap_or(0);
        (n, started.elapsed())
    };
    // Silent from the start.
    let silent = tokio::net::TcpStream::connect(gw.listen()).await.unwrap();
    // Stopped halfway through its headers.
    let mut partial = tokio::net::TcpStream::connect(gw.listen()).await.unwrap();
    partial
        .write_all(b"GET / HTTP/1.1\r\nHost: x\r\n")
        .await
        .unwrap();
    for s in [silent, partial] {
        let (n, took) = closed_within(s).await;
        assert_eq!(n, 0, "closed without an answer");
        assert!(took >= Duration::from_millis(250), "{took:?}");
    }
    // The upstream takes 3 s, ten idle periods: the answer still arrives.
    let mut slow = tokio::net::TcpStream::connect(gw.listen()).await.unwrap();
    slow.write_all(b"GET /slow HTTP/1.1\r\nHost: x\r\n\r\n")
        .await
        .unwrap();
    let mut got = Vec::new();
    let mut buf = [0u8; 1024];
    while !got.ends_with(b"slow") {
        let n = tokio::time::timeout(Duration::from_secs(10), slow.read(&mut buf))
            .await
            .expect("no answer")
            .unwrap();
        assert!(
            n > 0,
            "closed while answering: {}",
            String::from_utf8_lossy(&got)
        );
        got.extend_from_slice(&buf[..n]);
    }
    assert!(
        got.starts_with(b"HTTP/1.1 200"),
        "{}",
        String::from_utf8_lossy(&got)
    );
    gw.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrency_in_flight_is_exact_under_100_concurrent_requests_on_redis() {
    let redis = RedisServer::start();
    let yaml = format!(
        "identity: {{from: header, header: X-User-Id}}\nstore: {{type: redis, url: \"{}\", timeout: 1s}}\nrules:\n  - name: in-flight\n    algorithm: concurrency\n    limit: 10\n    max_hold: 1m\n",
        redis.url()
    );
    support::in_flight_is_exact(&yaml).await;
}

/// A gateway killed while its request holds a `concurrency` slot on Redis:
/// another gateway on the same Redis sees the slot taken until `max_hold`
/// has passed, then free.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lease_held_by_a_killed_gateway_lapses_after_max_hold() {
    let redis = RedisServer::start();
    let up = support::Gated::start().await;
    let yaml = format!(
        "store: {{type: redis, url: \"{}\", timeout: 1s}}\nrules:\n  - name: one-at-a-time\n    algorithm: concurrency\n    limit: 1\n    max_hold: 2s\n",
        redis.url()
    );
    let first = support::binary(&yaml, &up.url());
    let addr = first.listen;
    // A request that stays in flight: the upstream holds it.
    let sent = Instant::now();
    let held = std::thread::spawn(move || {
        let mut s = std::net::TcpStream::connect(addr).unwrap();
        std::io::Write::write_all(&mut s, b"GET / HTTP/1.1\r\nhost: a\r\n\r\n").unwrap();
        s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
        let mut buf = [0; 512];
        let _ = std::io::Read::read(&mut s, &mut buf);
    });
    let deadline = Instant::now() + Duration::from_secs(10);
    while up.arrived() < 1 {
        assert!(
            Instant::now() < deadline,
            "the request never reached the upstream"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let taken = Instant::now();
    drop(first); // SIGKILL: nothing is released
    held.join().unwrap();
    let second = support::binary(&yaml, &up.url());
    let r = send(second.listen, "GET", "/", &[], "").await;
    assert_eq!(r.status, 429, "the dead gateway's lease still counts");
    up.open();
    // The lease lapses by max_hold on Redis's clock: refused until then
    // (the lease was taken after `sent`), admitted once it has passed.
    let deadline = taken + Duration::from_secs(10);
    loop {
        let r = send(second.listen, "GET", "/", &[], "").await;
        if r.status == 200 {
            break;
        }
        assert_eq!(r.status, 429);
        assert!(Instant::now() < deadline, "never lapsed after max_hold");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert!(
        sent.elapsed() >= Duration::from_millis(1900),
        "lapsed before max_hold: {:?}",
        sent.elapsed()
    );
}

/// A leased rule (`distribution: {mode: lease}`) through two gateways on one
/// Redis: most decisions are answered from slices (the metrics say how
/// many), yet the two admit together no more than the limit in its window
/// (fixed_window: a slice ends with its window); what a gateway holds
/// unused at shutdown goes back, and the other gateway then gets it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_leased_global_rule_holds_its_limit_across_two_gateways() {
    let redis = RedisServer::start();
    let up = Upstream::start().await;
    let yaml = format!(
        "store: {{type: redis, url: \"{}\", timeout: 5s}}\nrules:\n  - name: everyone\n    key: [global]\n    algorithm: fixed_window\n    limit: 400\n    window: 1h\n    distribution: {{mode: lease, epsilon: 0.1, max_share: 0.5}}\n",
        redis.url()
    );
    let (a, b) = (
        gateway(&yaml, &up.url(), None).await,
        gateway(&yaml, &up.url(), None).await,
    );
    let mut tasks = vec![];
    for i in 0..300 {
        let addr = if i % 2 == 0 { a.listen() } else { b.listen() };
        tasks.push(tokio::spawn(async move {
            send(addr, "GET", "/", &[], "").await.status.as_u16()
        }));
    }
    for t in tasks {
        assert_eq!(t.await.unwrap(), 200, "under the limit");
    }
    let counter = |m: &str, name: &str| -> u64 {
        m.lines()
            .find_map(|l| l.strip_prefix(&format!("{name} ")))
            .unwrap_or_else(|| panic!("no {name}: {m}"))
            .parse()
            .unwrap()
    };
    let mut local = 0;
    let mut grants = 0;
    for gw in [&a, &b] {
        let m = send(gw.admin.unwrap(), "GET", "/metrics", &[], "")
            .await
            .body;
        local += counter(&m, "ratewarden_lease_local_decisions_total");
        grants += counter(&m, "ratewarden_lease_grants_total");
    }
    assert!(
        local >= 250,
        "{local} of 300 answered from slices ({grants} grants)"
    );
    assert!(grants * 5 <= 300, "{grants} grants");
    // Gateway a stops: what it held goes back. Then b alone admits
    // exactly up to the limit: 100 more, and no more.
    a.shutdown().await;
    let mut ok = 0;
    for _ in 0..150 {
        ok += usize::from(send(b.listen(), "GET", "/", &[], "").await.status == 200);
    }
    // (A Redis call past `timeout` is refused, not an outage: the timeout
    // is long enough that a loaded test machine does not make one.)
    assert_eq!(ok, 100, "400 in all, a's unused slice given back");
    assert_eq!(up.hits(), 400);
    b.shutdown().await;
}

/// The access log's buffered lines are written before the process exits,
/// on SIGTERM and on SIGINT (they were lost: the writer flushes every
/// 200 ms and the process ended first); the exit is logged as `stopped`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_access_log_is_written_out_on_sigterm_and_sigint() {
    for sig in ["TERM", "INT"] {
        let dir = support::scratch_dir("rw-access-exit");
        let log = dir.join("access.log");
        let file = dir.join("ratewarden.yaml");
        std::fs::write(
            &file,
            format!(
                "admin: {{listen: 127.0.0.1:0}}\naccess_log: {{path: {}, format: json}}\nrules:\n  - {{name: one, limit: 1, window: 1h}}\n",
                log.display()
            ),
        )
        .unwrap();
        let mut bin = support::spawn_binary(&file, "echo", &[], None);
        let mut statuses = vec![];
        for _ in 0..3 {
            statuses.push(send(bin.listen, "GET", "/", &[], "").await.status.as_u16());
        }
        assert_eq!(statuses, [200, 429, 429]);
        // At once: well within the writer's 200 ms round.
        signal(&bin.child, sig);
        let status = bin.child.wait().unwrap();
        assert!(status.success(), "SIG{sig}: {status}");
        let text = std::fs::read_to_string(&log).unwrap_or_default();
        let lines: Vec<&str> = text.lines().collect();
        assert_eq!(lines.len(), 3, "SIG{sig}: the log held {text:?}");
        assert!(lines[2].contains("\"status\":429"), "{}", lines[2]);
        bin.wait_for_line(|l| l.contains("stopped"));
    }
}

/// A known admin path with the wrong method is a 405 naming what it takes
/// (`Allow`); an unknown path is a 404.
#[tokio::test]
async fn a_known_admin_path_with_the_wrong_method_is_a_405_with_allow() {
    let gw = gateway("rules: []\n", "echo", None).await;
    let admin = gw.admin.unwrap();
    for (method, path, allow) in [
        ("GET", "/v1/check", "POST"),
        ("DELETE", "/metrics", "GET"),
        ("POST", "/v1/keys/r/k", "GET, DELETE"),
    ] {
        let r = send(admin, method, path, &[], "").await;
        assert_eq!(r.status, 405, "{method} {path}: {}", r.body);
        assert_eq!(r.header("allow"), Some(allow), "{method} {path}");
    }
    let r = send(admin, "GET", "/v1/nope", &[], "").await;
    assert_eq!(r.status, 404);
    assert!(r.header("allow").is_none());
    gw.shutdown().await;
}

/// `POST /v1/bans` bans a key in the store: listed with the other bans,
/// refused by every gateway sharing the store, lifted by `DELETE`; on the
/// memory store and on Redis, where a second gateway sees it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_manual_ban_is_kept_in_the_store_listed_and_lifted() {
    let rules = "rules:\n  - {name: login, limit: 100, window: 1h}\n";
    let ban = r#"{"rule": "login", "key": "127.0.0.1", "duration": "1h", "note": "ticket 4711"}"#;
    // Memory.
    let gw = gateway(rules, "echo", None).await;
    let admin = gw.admin.unwrap();
    assert_eq!(send(gw.listen(), "GET", "/", &[], "").await.status, 200);
    let r = send(admin, "POST", "/v1/bans", &[], ban).await;
    assert_eq!(r.status, 200, "{}", r.body);
    let refused = send(gw.listen(), "GET", "/", &[], "").await;
    assert_eq!(refused.status, 429, "banned");
    assert!(
        refused
            .header("retry-after")
            .is_some_and(|s| s.parse::<u64>().unwrap() > 3000)
    );
    let listed = send(admin, "GET", "/v1/bans", &[], "").await.body;
    assert!(listed.contains("\"key\":\"127.0.0.1\""), "{listed}");
    let r = send(admin, "DELETE", "/v1/bans/login/127.0.0.1", &[], "").await;
    assert!(r.body.contains("\"cleared\":true"), "{}", r.body);
    assert_eq!(send(gw.listen(), "GET", "/", &[], "").await.status, 200);
    // A bad duration, an unknown rule.
    let r = send(admin, "POST", "/v1/bans", &[], &ban.replace("1h", "1x")).await;
    assert_eq!(r.status, 400, "{}", r.body);
    let r = send(
        admin,
        "POST",
        "/v1/bans",
        &[],
        &ban.replace("\"login\"", "\"nope\""),
    )
    .await;
    assert_eq!(r.status, 404, "{}", r.body);
    gw.shutdown().await;

    // Redis: banned through one gateway, refused by the other.
    let redis = RedisServer::start();
    let yaml = format!("store: {{type: redis, url: '{}'}}\n{rules}", redis.url());
    let (a, b) = (
        gateway(&yaml, "echo", None).await,
        gateway(&yaml, "echo", None).await,
    );
    let r = send(a.admin.unwrap(), "POST", "/v1/bans", &[], ban).await;
    assert_eq!(r.status, 200, "{}", r.body);
    assert_eq!(
        send(b.listen(), "GET", "/", &[], "").await.status,
        429,
        "seen by the other gateway"
    );
    let k = send(b.admin.unwrap(), "GET", "/v1/keys/login/127.0.0.1", &[], "")
        .await
        .body;
    assert!(k.contains("\"ban_left\":"), "{k}");
    let r = send(
        b.admin.unwrap(),
        "DELETE",
        "/v1/bans/login/127.0.0.1",
        &[],
        "",
    )
    .await;
    assert!(r.body.contains("\"cleared\":true"), "{}", r.body);
    assert_eq!(
        send(a.listen(), "GET", "/", &[], "").await.status,
        200,
        "lifted for both"
    );
    a.shutdown().await;
    b.shutdown().await;
}

/// The refusal log's summary is written when its period ends, not by the
/// next refusal: here at SIGTERM, with no traffic after the flood. One
/// key's first refusal is one line; its three others are one summary line,
/// written once.
#[test]
fn the_refusal_summary_is_written_at_exit_without_more_traffic() {
    let bin = support::binary(
        "rules:\n  - name: r\n    algorithm: fixed_window\n    limit: 1\n    window: 1h\n",
        "echo",
    );
    let listen = bin.listen;
    let mut conn = std::net::TcpStream::connect(listen).unwrap();
    let mut reader = std::io::BufReader::new(conn.try_clone().unwrap());
    let mut statuses = vec![];
    for _ in 0..5 {
        let (head, _) = exchange(&mut conn, &mut reader, "/");
        statuses.push(head[9..12].to_owned());
    }
    assert_eq!(statuses, ["200", "429", "429", "429", "429"]);
    drop((conn, reader));
    signal(&bin.child, "TERM");
    // Written before the process ends, and once.
    bin.wait_for_line(|l| l.contains("3 more refusals under rule r"));
    bin.wait_for_line(|l| l.contains("stopped"));
    let lines = bin.lines.lock().unwrap().clone();
    let count = |want: &str| lines.iter().filter(|l| l.contains(want)).count();
    assert_eq!(count("rejected"), 1, "{lines:#?}");
    assert_eq!(count("3 more refusals under rule r"), 1, "{lines:#?}");
}

/// `ratewarden_runtime_tasks` counts the gateway's live tasks: 20 kept-alive
/// client connections raise it by at least 20, and closing them brings it
/// back (what `bench/soak.sh` samples to show no task leaks).
#[tokio::test]
async fn runtime_tasks_rise_with_connections_and_fall_when_they_close() {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let dir = support::scratch_dir("rw-tasks");
    let file = dir.join("rw.yaml");
    std::fs::write(&file, "rules:\n  - {name: r, limit: 1000, window: 1m}\n").unwrap();
    let gw = support::spawn_binary(&file, "echo", &[], Some(dir));
    let tasks = || async {
        let m = send(gw.admin, "GET", "/metrics", &[], "").await.body;
        m.lines()
            .find_map(|l| l.strip_prefix("ratewarden_runtime_tasks "))
            .unwrap_or_else(|| panic!("no ratewarden_runtime_tasks in {m}"))
            .parse::<u64>()
            .unwrap()
    };
    // Every line of the exposition is a comment, a sample or blank, each
    // from its first column (a format string's line once began with spaces).
    let m = send(gw.admin, "GET", "/metrics", &[], "").await.body;
    for line in m.lines() {
        assert!(
            line.is_empty()
                || line.starts_with("# HELP ratewarden_")
                || line.starts_with("# TYPE ratewarden_")
                || line.starts_with("ratewarden_"),
            "not a line of the text format: {line:?}"
        );
    }
    assert!(
        m.contains("\n# TYPE ratewarden_runtime_tasks gauge\nratewarden_runtime_tasks "),
        "{m}"
    );
    let before = tasks().await;
    let mut conns = vec![];
    for _ in 0..20 {
        let mut c = tokio::net::TcpStream::connect(gw.listen).await.unwrap();
        c.write_all(b"GET / HTTP/1.1\r\nhost: t\r\n\r\n")
            .await
            .unwrap();
        let mut buf = [0u8; 1024];
        let n = c.read(&mut buf).await.unwrap();
        assert!(
            buf[..n].starts_with(b"HTTP/1.1 200"),
            "{}",
            String::from_utf8_lossy(&buf[..n])
        );
        conns.push(c);
    }
    let open = tasks().await;
    assert!(
        open >= before + 20,
        "{before} tasks, then {open} with 20 connections open"
    );
    drop(conns);
    let deadline = Instant::now() + Duration::from_secs(5);
    loop {
        let now = tasks().await;
        if now <= before + 1 {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "{before} tasks before, {now} after the 20 connections closed"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}
