//! Rules charged by an LLM's usage (`cost: {from: llm}`), against a fake
//! OpenAI- and Anthropic-compatible upstream (`support::llm`): the usage is
//! read from the answer, JSON or streamed, the reservation made at
//! admission (the body's length as the input bound, plus the maximum
//! output) is replaced by it, and concurrent requests never take more than
//! the budget.

#[path = "../../ratewarden/tests/common/mod.rs"]
mod common;
mod support;

use std::sync::Arc;
use std::sync::atomic::Ordering;

use serde_json::Value;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

use common::RedisServer;
use support::llm::{fake_llm, released};
use support::{send, wait_left};

/// Each dialect, JSON and streamed: the answer's usage is what is charged
/// (20 input + the maximum output), whatever was reserved.
#[tokio::test]
async fn each_dialect_is_charged_its_usage_json_and_streamed() {
    let (seen, _tx, rx) = released();
    let up = fake_llm(seen, rx).await;
    let yaml =
        "rules:\n  - name: tokens\n    limit: 100000\n    window: 1h\n    cost: {from: llm}\n";
    let gw = support::gateway(yaml, &format!("http://{up}"), None).await;
    let admin = gw.admin.unwrap();
    let json = [("content-type", "application/json")];
    let mut used: u64 = 0;
    for (path, stream, max) in [
        ("/v1/chat/completions", false, 30),
        ("/v1/chat/completions", true, 40),
        ("/v1/messages", false, 50),
        ("/v1/messages", true, 60),
    ] {
        let body = format!(
            r#"{{"model":"m","max_tokens":{max},"stream":{stream},"messages":[{{"role":"user","content":"hi"}}]}}"#
        );
        let r = send(gw.listen(), "POST", path, &json, &body).await;
        assert_eq!(r.status.as_u16(), 200, "{path} {stream}: {}", r.body);
        used += 20 + max;
        wait_left(admin, "tokens", 100000 - used - 1).await;
    }
    // Counted by rule, dialect and kind: 15 uncached and 5 cached in each.
    let metrics = send(admin, "GET", "/metrics", &[], "").await.body;
    for (dialect, kind, n) in [
        ("openai", "input", 30),
        ("openai", "cached_input", 10),
        ("openai", "output", 70),
        ("anthropic", "input", 30),
        ("anthropic", "cached_input", 10),
        ("anthropic", "output", 110),
    ] {
        let line = format!(
            "ratewarden_llm_tokens_total{{rule=\"tokens\",dialect=\"{dialect}\",kind=\"{kind}\"}} {n}"
        );
        assert!(metrics.contains(&line), "no {line}:\n{metrics}");
    }
    // An answer with no usage: its reservation (the body's length plus
    // the maximum output, 100) stays charged, and is counted.
    let body = r#"{"max_tokens":100}"#;
    let r = send(gw.listen(), "POST", "/v1/plain", &json, body).await;
    assert_eq!(r.status.as_u16(), 200);
    used += body.len() as u64 + 100;
    wait_left(admin, "tokens", 100000 - used - 1).await;
    let metrics = send(admin, "GET", "/metrics", &[], "").await.body;
    assert!(
        metrics
            .contains("ratewarden_llm_usage_missing_total{rule=\"tokens\",reason=\"not_json\"} 1"),
        "{metrics}"
    );
    gw.shutdown().await;
}

/// The exactness under concurrency: 40 streamed requests at once, each
/// asking up to 400 tokens of output, against a budget of 5,000, through
/// `gateways` (alternately). Each is reserved its body's length plus 400
/// before it reaches the upstream, so only as many as the budget holds
/// are let through; the rest are refused there, and what is charged at
/// the end (each request's real usage) never exceeds the budget.
async fn forty_streams(store: &str) {
    let (seen, go, rx) = released();
    go.send(false).unwrap();
    let up = fake_llm(seen.clone(), rx).await;
    let yaml = format!(
        "{store}rules:\n  - name: tokens\n    limit: 5000\n    window: 1h\n    cost: {{from: llm}}\n"
    );
    let gateways = if store.is_empty() {
        vec![support::gateway(&yaml, &format!("http://{up}"), None).await]
    } else {
        vec![
            support::gateway(&yaml, &format!("http://{up}"), None).await,
            support::gateway(&yaml, &format!("http://{up}"), None).await,
        ]
    };
    let body = r#"{"model":"gpt-4o-mini","max_tokens":400,"stream":true,"messages":[{"role":"user","content":"write"}]}"#;
    let reserved = body.len() as u64 + 400;
    let calls: Vec<_> = (0..40)
        .map(|i| {
            let listen = gateways[i % gateways.len()].listen();
            tokio::spawn(async move {
                send(
                    listen,
                    "POST",
                    "/v1/chat/completions",
                    &[("content-type", "application/json")],
                    body,
                )
                .await
                .status
                .as_u16()
            })
        })
        .collect();
    // The admitted ones reach the upstream and wait there.
    let admitted_most = (5000 / reserved) as usize;
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    while seen.load(Ordering::SeqCst) < admitted_most {
        assert!(
            std::time::Instant::now() < deadline,
            "{} reached the upstream",
            seen.load(Ordering::SeqCst)
        );
        tokio::time::sleep(std::time::Duration::from_millis(5)).await;
    }
    go.send(true).unwrap();
    let mut ok = 0;
    for c in calls {
        match c.await.unwrap() {
            200 => ok += 1,
            429 => {}
            other => panic!("status {other}"),
        }
    }
    assert_eq!(ok, admitted_most, "admitted: as many reservations as fit");
    assert_eq!(
        seen.load(Ordering::SeqCst),
        admitted_most,
        "no refused request reached the upstream"
    );
    // Each admitted stream used 20 + 400; charged exactly that.
    let charged = ok as u64 * 420;
    assert!(charged <= 5000, "charged {charged}");
    wait_left(gateways[0].admin.unwrap(), "tokens", 5000 - charged - 1).await;
    for gw in gateways {
        gw.shutdown().await;
    }
}

#[tokio::test]
async fn forty_concurrent_streams_never_take_more_than_the_budget() {
    forty_streams("").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn forty_concurrent_streams_through_two_gateways_on_redis() {
    let redis = RedisServer::start();
    forty_streams(&format!(
        "store: {{type: redis, url: \"{}\"}}\n",
        redis.url()
    ))
    .await;
}

/// A body that is not JSON is reserved the default maximum output; a
/// budget that cannot hold a request's reservation refuses it before the
/// upstream.
#[tokio::test]
async fn a_reservation_that_does_not_fit_is_refused_before_the_upstream() {
    let (seen, _tx, rx) = released();
    let up = fake_llm(seen.clone(), rx).await;
    let yaml = "rules:\n  - name: tokens\n    limit: 1000\n    window: 1h\n    cost: {from: llm, default_max_output: 2000}\n";
    let gw = support::gateway(yaml, &format!("http://{up}"), None).await;
    let json = [("content-type", "application/json")];
    // No maximum named: 2,000 reserved, more than the budget.
    let r = send(
        gw.listen(),
        "POST",
        "/v1/chat/completions",
        &json,
        r#"{"messages":[]}"#,
    )
    .await;
    assert_eq!(r.status.as_u16(), 429);
    assert_eq!(seen.load(Ordering::SeqCst), 0);
    // A maximum that fits.
    let r = send(
        gw.listen(),
        "POST",
        "/v1/chat/completions",
        &json,
        r#"{"messages":[],"max_tokens":100}"#,
    )
    .await;
    assert_eq!(r.status.as_u16(), 200);
    assert_eq!(seen.load(Ordering::SeqCst), 1);
    gw.shutdown().await;
}

/// `refusal: openai | anthropic`: the vendor's error object and rate-limit
/// headers, on both HTTP paths (the HTTP/1.1 path's cached refusal bytes
/// are a problem body's: a shaped rule's refusals are made apart).
#[tokio::test]
async fn refusals_take_the_vendors_shapes() {
    let (seen, _tx, rx) = released();
    let up = fake_llm(seen, rx).await;
    let yaml = "rules:\n  - name: chat\n    match: {path_prefix: /v1/chat/}\n    limit: 100\n    window: 1m\n    cost: {from: llm}\n    refusal: openai\n  - name: msgs\n    match: {path_prefix: /v1/messages}\n    limit: 100\n    window: 1m\n    cost: {from: llm}\n    refusal: anthropic\n";
    let gw = support::gateway(yaml, &format!("http://{up}"), None).await;
    let json = [("content-type", "application/json")];
    let big = r#"{"max_tokens":500,"messages":[]}"#;
    let r = send(gw.listen(), "POST", "/v1/chat/completions", &json, big).await;
    assert_eq!(r.status.as_u16(), 429);
    let v: Value = serde_json::from_str(&r.body).unwrap();
    assert_eq!(v["error"]["code"], "rate_limit_exceeded", "{v}");
    assert_eq!(v["error"]["type"], "tokens");
    assert!(v["error"]["param"].is_null());
    assert!(
        v["error"]["message"].as_str().unwrap().contains("`chat`"),
        "{v}"
    );
    let h = |n: &str| r.headers.get(n).map(|v| v.to_str().unwrap().to_owned());
    assert_eq!(h("x-ratelimit-limit-tokens").as_deref(), Some("100"));
    assert_eq!(h("x-ratelimit-remaining-tokens").as_deref(), Some("100"));
    assert!(h("x-ratelimit-reset-tokens").is_some());
    assert!(h("retry-after").is_some() && h("retry-after-ms").is_some());
    assert_eq!(h("content-type").as_deref(), Some("application/json"));
    let r = send(gw.listen(), "POST", "/v1/messages", &json, big).await;
    assert_eq!(r.status.as_u16(), 429);
    let v: Value = serde_json::from_str(&r.body).unwrap();
    assert_eq!(v["type"], "error");
    assert_eq!(v["error"]["type"], "rate_limit_error", "{v}");
    let h = |n: &str| r.headers.get(n).map(|v| v.to_str().unwrap().to_owned());
    assert_eq!(
        h("anthropic-ratelimit-tokens-limit").as_deref(),
        Some("100")
    );
    assert!(
        h("anthropic-ratelimit-tokens-reset")
            .unwrap()
            .ends_with('Z')
    );
    assert!(h("retry-after").is_some());
    // An admitted answer carries them too: the tokens left after its
    // reservation (its body's length plus 5).
    let small = r#"{"max_tokens":5,"messages":[]}"#;
    let r = send(gw.listen(), "POST", "/v1/chat/completions", &json, small).await;
    assert_eq!(r.status.as_u16(), 200);
    let left = (100 - small.len() - 5).to_string();
    assert_eq!(
        r.headers
            .get("x-ratelimit-remaining-tokens")
            .map(|v| v.to_str().unwrap()),
        Some(left.as_str())
    );
    assert_eq!(
        r.headers
            .get("x-ratelimit-limit-tokens")
            .map(|v| v.to_str().unwrap()),
        Some("100")
    );
    // HTTP/1.0: hyper's path (no body: the default maximum output
    // reserved, 1,024, over the budget), the same shape.
    let out = support::binary_free_http10(gw.listen(), "/v1/chat/x").await;
    assert!(out.contains(" 429 "), "{out}");
    assert!(out.contains("rate_limit_exceeded"), "{out}");
    assert!(out.contains("x-ratelimit-limit-tokens: 100"), "{out}");
    gw.shutdown().await;
}

/// The Python with the vendors' SDKs (`./test` makes one in
/// `target/sdk-venv` and names it in `RATEWARDEN_SDK_PYTHON`).
fn sdk_python() -> String {
    std::env::var("RATEWARDEN_SDK_PYTHON").unwrap_or_else(|_| {
        panic!(
            "this test needs a Python with the `openai` and `anthropic` packages: run ./test \
             (it makes target/sdk-venv), or `python3 -m venv v && v/bin/pip install openai anthropic` \
             and set RATEWARDEN_SDK_PYTHON=v/bin/python"
        )
    })
}

/// The real SDKs from PyPI, pointed at the gateway: a call and a streamed
/// call in each, each charged exactly its usage (the OpenAI stream asked
/// for its usage by the gateway: `include_usage`); past the budget, each
/// SDK's `RateLimitError`, carrying our message; and each SDK's own retry
/// waiting what `retry-after` said, then admitted.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_openai_and_anthropic_sdks_are_charged_their_usage() {
    let python = sdk_python();
    let (seen, _tx, rx) = released();
    let up = fake_llm(seen, rx).await;
    let yaml = "rules:\n  - name: chat\n    match: {path_prefix: /v1/chat/}\n    limit: 1000\n    window: 1h\n    cost: {from: llm}\n    refusal: openai\n  - name: msgs\n    match: {path_prefix: /v1/messages}\n    limit: 1000\n    window: 1h\n    cost: {from: llm}\n    refusal: anthropic\n  - name: retried-chat\n    match: {path_prefix: /r/v1/chat/}\n    algorithm: token_bucket\n    limit: 400\n    window: 2s\n    cost: {from: llm}\n    refusal: openai\n  - name: retried-msgs\n    match: {path_prefix: /r/v1/messages}\n    algorithm: token_bucket\n    limit: 400\n    window: 2s\n    cost: {from: llm}\n    refusal: anthropic\n";
    let gw = support::gateway(yaml, &format!("http://{up}"), None).await;
    let script = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/sdk/llm_sdks.py");
    let base = format!("http://{}", gw.listen());
    let out = tokio::process::Command::new(&python)
        .args([script, &base])
        .output()
        .await
        .unwrap_or_else(|e| panic!("{python}: {e}"));
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{stdout}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let line = |name: &str| -> Vec<String> {
        stdout
            .lines()
            .find_map(|l| l.strip_prefix(&format!("{name} ")))
            .unwrap_or_else(|| panic!("no {name}: {stdout}"))
            .split(' ')
            .map(str::to_owned)
            .collect()
    };
    // What each SDK read of the usage: 20 in, the maximum out.
    assert_eq!(line("openai"), ["50", "ok"]);
    assert_eq!(line("openai-stream"), ["60"]);
    assert_eq!(line("anthropic"), ["70", "ok"]);
    assert_eq!(line("anthropic-stream"), ["80"]);
    // What the gateway charged: the same.
    let admin = gw.admin.unwrap();
    wait_left(admin, "chat", 1000 - 110 - 1).await;
    wait_left(admin, "msgs", 1000 - 150 - 1).await;
    let refused = line("openai-refused");
    assert_eq!(refused[..2], ["429", "rate_limit_exceeded"], "{stdout}");
    assert!(stdout.contains("under rule `chat`"), "{stdout}");
    let refused = line("anthropic-refused");
    assert_eq!(refused[..2], ["429", "rate_limit_error"], "{stdout}");
    assert!(stdout.contains("under rule `msgs`"), "{stdout}");
    // Each SDK's one retry, after the wait `retry-after-ms` said (about
    // 1.5 s), was admitted: its second call took at least that long.
    for sdk in ["openai", "anthropic"] {
        let took: f64 = line(&format!("{sdk}-retried"))[0].parse().unwrap();
        assert!((1.2..6.0).contains(&took), "{sdk}: {took} s\n{stdout}");
    }
    gw.shutdown().await;
}

/// Streams pass through as they come: an upstream that sends an event
/// every 200 ms, relayed under a rule that reads the stream's usage; the
/// client sees each event within 50 ms of the upstream sending it (nothing
/// is held back to read the usage), and the usage in the last is charged.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn streamed_events_reach_the_client_as_they_are_sent() {
    use std::time::{Duration, Instant};
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let up = listener.local_addr().unwrap();
    let sent: Arc<std::sync::Mutex<Vec<Instant>>> = Arc::default();
    {
        let sent = sent.clone();
        tokio::spawn(async move {
            let (mut s, _) = listener.accept().await.unwrap();
            let mut buf = vec![0u8; 8192];
            let mut got = Vec::new();
            while !got.windows(4).any(|w| w == b"\r\n\r\n") {
                let n = s.read(&mut buf).await.unwrap();
                got.extend_from_slice(&buf[..n]);
            }
            s.write_all(b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ntransfer-encoding: chunked\r\n\r\n")
                .await
                .unwrap();
            for i in 0..5 {
                let usage = if i == 4 {
                    r#"{"prompt_tokens":3,"completion_tokens":5}"#
                } else {
                    "null"
                };
                let event = format!("data: {{\"choices\":[],\"usage\":{usage}}}\n\n");
                let chunk = format!("{:x}\r\n{event}\r\n", event.len());
                sent.lock().unwrap().push(Instant::now());
                s.write_all(chunk.as_bytes()).await.unwrap();
                tokio::time::sleep(Duration::from_millis(200)).await;
            }
            s.write_all(b"0\r\n\r\n").await.unwrap();
        });
    }
    let yaml =
        "rules:\n  - name: tokens\n    limit: 100000\n    window: 1h\n    cost: {from: llm}\n";
    let gw = support::gateway(yaml, &format!("http://{up}"), None).await;
    let mut c = tokio::net::TcpStream::connect(gw.listen()).await.unwrap();
    let body = r#"{"max_tokens":10,"stream":true}"#;
    c.write_all(
        format!(
            "POST /v1/chat/completions HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\ncontent-length: {}\r\nconnection: close\r\n\r\n{body}",
            body.len()
        )
        .as_bytes(),
    )
    .await
    .unwrap();
    let mut seen = Vec::new();
    let mut all = Vec::new();
    let mut buf = vec![0u8; 8192];
    loop {
        let n = tokio::time::timeout(Duration::from_secs(10), c.read(&mut buf))
            .await
            .expect("the stream within 10 s")
            .unwrap();
        if n == 0 {
            break;
        }
        all.extend_from_slice(&buf[..n]);
        let events = all.windows(5).filter(|w| w == b"data:").count();
        while seen.len() < events {
            seen.push(Instant::now());
        }
    }
    let sent = sent.lock().unwrap().clone();
    assert_eq!(seen.len(), 5, "{}", String::from_utf8_lossy(&all));
    for (i, (s, r)) in sent.iter().zip(&seen).enumerate() {
        let late = r.saturating_duration_since(*s);
        assert!(
            late < Duration::from_millis(50),
            "event {i} reached the client {late:?} after it was sent"
        );
    }
    wait_left(gw.admin.unwrap(), "tokens", 100000 - 8 - 1).await;
    gw.shutdown().await;
}

/// A money budget: prices per million tokens, a limit in currency (counted
/// in millionths, so decimals are exact), by calendar month in Seoul, on
/// the manual clock: charged what each answer's tokens cost at its model's
/// price, refused when the month's money is spent, fresh at the local
/// month's start.
#[tokio::test]
async fn a_monthly_money_budget_in_a_time_zone() {
    use ratewarden::clock::ManualClock;
    // 2027-01-31T14:59:00Z: 23:59 in Seoul, a minute before February.
    let clock = ManualClock::new(1_801_407_540_000_000);
    let (seen, _tx, rx) = released();
    let up = fake_llm(seen.clone(), rx).await;
    // gpt-4o-mini (the fake's model): 20 input tokens (5 cached) at 1000
    // and 500 per million, 100 output at 2000: 15,000 + 2,500 + 200,000
    // millionths = 0.2175 a call; the budget, 0.50 a month.
    let yaml = "rules:\n  - name: spend\n    algorithm: fixed_window\n    limit: 0.50\n    calendar: {period: month, timezone: Asia/Seoul}\n    cost:\n      from: llm\n      price: {\"gpt-4o*\": {input: 1000, cached_input: 500, output: 2000}, \"*\": {input: 9000, output: 9000}}\n";
    let gw = support::gateway(yaml, &format!("http://{up}"), Some(clock.clone())).await;
    let admin = gw.admin.unwrap();
    let json = [("content-type", "application/json")];
    let body = r#"{"model":"gpt-4o-mini","max_tokens":100}"#;
    // Reserved: (the body's length at the dearer input price) + 100 x 2000.
    assert_eq!(
        send(gw.listen(), "POST", "/v1/chat/completions", &json, body)
            .await
            .status
            .as_u16(),
        200
    );
    wait_left(admin, "spend", 500_000 - 217_500 - 1).await;
    assert_eq!(
        send(gw.listen(), "POST", "/v1/chat/completions", &json, body)
            .await
            .status
            .as_u16(),
        200
    );
    wait_left(admin, "spend", 500_000 - 435_000 - 1).await;
    // 0.065 left: a third call's reservation does not fit.
    assert_eq!(
        send(gw.listen(), "POST", "/v1/chat/completions", &json, body)
            .await
            .status
            .as_u16(),
        429
    );
    assert_eq!(seen.load(Ordering::SeqCst), 2);
    // February in Seoul: the month's money again.
    clock.advance(std::time::Duration::from_secs(60));
    assert_eq!(
        send(gw.listen(), "POST", "/v1/chat/completions", &json, body)
            .await
            .status
            .as_u16(),
        200
    );
    wait_left(admin, "spend", 500_000 - 217_500 - 1).await;
    gw.shutdown().await;
}

/// hyper's path (HTTP/1.0 here; HTTP/2 alike) reads the body whole before
/// the decision when a rule reserves from it: the reservation is the
/// body's length plus its `max_tokens`, not the default (which would not
/// fit), and the upstream gets the body as sent.
#[tokio::test]
async fn hypers_path_reads_the_body_to_reserve() {
    let (seen, _tx, rx) = released();
    let up = fake_llm(seen.clone(), rx).await;
    let yaml = "rules:\n  - name: tokens\n    limit: 200\n    window: 1h\n    cost: {from: llm, default_max_output: 5000}\n";
    let gw = support::gateway(yaml, &format!("http://{up}"), None).await;
    let body = r#"{"model":"m","max_tokens":50}"#;
    let out = support::raw(
        gw.listen(),
        &format!(
            "POST /v1/chat/completions HTTP/1.0\r\nhost: x\r\ncontent-type: application/json\r\ncontent-length: {}\r\n\r\n{body}",
            body.len()
        ),
    )
    .await;
    assert!(out.starts_with("HTTP/1.0 200"), "{out}");
    // The upstream read max_tokens from the body it was sent: 20 + 50.
    assert!(out.contains(r#""completion_tokens":50"#), "{out}");
    wait_left(gw.admin.unwrap(), "tokens", 200 - 70 - 1).await;
    assert_eq!(seen.load(Ordering::SeqCst), 1);
    // The HTTP/1.1 path, a chunked body in two pieces: joined for the
    // reservation (the default, 5,000, would not fit).
    let (a, b) = body.split_at(10);
    let out = support::raw(
        gw.listen(),
        &format!(
            "POST /v1/chat/completions HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\ntransfer-encoding: chunked\r\nconnection: close\r\n\r\n{:x}\r\n{a}\r\n{:x}\r\n{b}\r\n0\r\n\r\n",
            a.len(),
            b.len()
        ),
    )
    .await;
    assert!(out.starts_with("HTTP/1.1 200"), "{out}");
    assert_eq!(seen.load(Ordering::SeqCst), 2);
    gw.shutdown().await;
}

/// The access log's JSON line of an LLM call: the model, the tokens in
/// and out, what was reserved and what charged.
#[tokio::test]
async fn the_access_log_says_what_an_llm_call_used_and_was_charged() {
    let (seen, _tx, rx) = released();
    let up = fake_llm(seen, rx).await;
    let dir = support::scratch_dir("rw-llm-log");
    let log = dir.join("access.log");
    let yaml = format!(
        "access_log: {{path: {}, format: json}}\nrules:\n  - name: tokens\n    limit: 100000\n    window: 1h\n    cost: {{from: llm}}\n",
        log.display()
    );
    let gw = support::gateway(&yaml, &format!("http://{up}"), None).await;
    let body = r#"{"model":"gpt-4o-mini","max_tokens":30}"#;
    let r = send(
        gw.listen(),
        "POST",
        "/v1/chat/completions",
        &[("content-type", "application/json")],
        body,
    )
    .await;
    assert_eq!(r.status.as_u16(), 200);
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    let line: Value = loop {
        let text = std::fs::read_to_string(&log).unwrap_or_default();
        if let Some(l) = text.lines().next() {
            break serde_json::from_str(l).unwrap();
        }
        assert!(std::time::Instant::now() < deadline, "no line");
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    };
    assert_eq!(line["model"], "gpt-4o-mini", "{line}");
    assert_eq!(line["tokens_in"], 20);
    assert_eq!(line["tokens_out"], 30);
    assert_eq!(line["reserved"], body.len() as u64 + 30);
    assert_eq!(line["charged"], 50);
    gw.shutdown().await;
}

/// The JSON request body as a request fact: `json:FIELD` key parts (a
/// user in the body, nested fields), tiers chosen by one (per model), and
/// `json:` match conditions; a body that is not JSON is a missing part and
/// matches no condition on a field.
#[tokio::test]
async fn json_body_fields_key_rules_and_choose_tiers() {
    let yaml = "rules:\n  - name: per-user\n    match: {path_prefix: /u/}\n    key: ['json:metadata.user_id']\n    missing: reject\n    limit: 1\n    window: 1h\n  - name: per-model\n    match: {path_prefix: /m/}\n    key: [identity]\n    window: 1h\n    tiers:\n      from: json:model\n      default: small\n      values:\n        big: {limit: 1}\n        small: {limit: 3}\n  - name: gpt4-only\n    match:\n      path_prefix: /g/\n      json: [{name: model, prefix: gpt-4}]\n    limit: 1\n    window: 1h\n";
    let gw = support::gateway(yaml, "echo", None).await;
    let json = [("content-type", "application/json")];
    let listen = gw.listen();
    let post = |path: &'static str, body: &'static str| async move {
        send(listen, "POST", path, &json, body)
            .await
            .status
            .as_u16()
    };
    assert_eq!(post("/u/a", r#"{"metadata":{"user_id":"ann"}}"#).await, 200);
    assert_eq!(post("/u/a", r#"{"metadata":{"user_id":"ann"}}"#).await, 429);
    assert_eq!(post("/u/a", r#"{"metadata":{"user_id":"bob"}}"#).await, 200);
    // A number is a field too; a body that is not JSON misses the part.
    assert_eq!(post("/u/a", r#"{"metadata":{"user_id":7}}"#).await, 200);
    assert_eq!(post("/u/a", "user_id=ann").await, 400);
    // Tiers by model: `big` once, anything else three times.
    assert_eq!(post("/m/x", r#"{"model":"big"}"#).await, 200);
    assert_eq!(post("/m/x", r#"{"model":"big"}"#).await, 429);
    for _ in 0..3 {
        assert_eq!(post("/m/x", r#"{"model":"other"}"#).await, 200);
    }
    assert_eq!(post("/m/x", r#"{"model":"other"}"#).await, 429);
    // A `json:` match condition: only gpt-4 requests are limited.
    assert_eq!(post("/g/x", r#"{"model":"gpt-4o"}"#).await, 200);
    assert_eq!(post("/g/x", r#"{"model":"gpt-4.1"}"#).await, 429);
    assert_eq!(post("/g/x", r#"{"model":"claude-x"}"#).await, 200);
    assert_eq!(post("/g/x", r#"{"model":"claude-x"}"#).await, 200);
    assert_eq!(post("/g/x", "not json").await, 200);
    gw.shutdown().await;
}
