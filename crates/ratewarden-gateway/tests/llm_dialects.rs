//! A rule charged by an LLM's usage, through the gateway, in the dialects
//! and faults `llm_tokens.rs` does not cover: OpenAI Responses and Gemini,
//! JSON and streamed; `n` choices; a 5xx before any output; an upstream
//! cut mid-stream; a client that leaves mid-stream. Against the fake of
//! `support::llm` (usage: 20 input tokens, 5 of them cached, and the
//! request's maximum output times its choices).

mod support;

use std::sync::atomic::Ordering;
use std::time::Duration;

use support::llm::{fake_llm, released};
use support::{send, wait_left};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

const JSON: [(&str, &str); 1] = [("content-type", "application/json")];
const YAML: &str =
    "rules:\n  - name: tokens\n    limit: 100000\n    window: 1h\n    cost: {from: llm}\n";

/// Responses and Gemini answers, JSON and streamed, are each charged
/// their usage (20 + the maximum), and counted under their dialect.
#[tokio::test]
async fn responses_and_gemini_are_charged_their_usage() {
    let (seen, _tx, rx) = released();
    let up = fake_llm(seen, rx).await;
    let gw = support::gateway(YAML, &format!("http://{up}"), None).await;
    let admin = gw.admin.unwrap();
    let mut used = 0;
    for (path, body, max) in [
        (
            "/v1/responses",
            r#"{"model":"m","max_output_tokens":30}"#,
            30,
        ),
        (
            "/v1/responses",
            r#"{"model":"m","max_output_tokens":40,"stream":true}"#,
            40,
        ),
        (
            "/v1beta/models/gemini-x:generateContent",
            r#"{"contents":[],"generationConfig":{"maxOutputTokens":50}}"#,
            50,
        ),
        (
            "/v1beta/models/gemini-x:streamGenerateContent?alt=sse",
            r#"{"contents":[],"generationConfig":{"maxOutputTokens":60}}"#,
            60,
        ),
    ] {
        let r = send(gw.listen(), "POST", path, &JSON, body).await;
        assert_eq!(r.status.as_u16(), 200, "{path}: {}", r.body);
        used += 20 + max;
        wait_left(admin, "tokens", 100000 - used - 1).await;
    }
    let metrics = send(admin, "GET", "/metrics", &[], "").await.body;
    for (dialect, kind, n) in [
        ("openai_responses", "output", 70),
        ("openai_responses", "cached_input", 10),
        ("gemini", "output", 110),
        ("gemini", "input", 30),
    ] {
        let line = format!(
            "ratewarden_llm_tokens_total{{rule=\"tokens\",dialect=\"{dialect}\",kind=\"{kind}\"}} {n}"
        );
        assert!(metrics.contains(&line), "no {line}:\n{metrics}");
    }
    gw.shutdown().await;
}

/// `n` choices: each may write the maximum, so the reservation is the
/// body's length plus the maximum times `n`; one that does not fit is
/// refused before the upstream, and what a call used is charged.
#[tokio::test]
async fn n_choices_are_reserved_and_charged_each() {
    let (seen, _tx, rx) = released();
    let up = fake_llm(seen.clone(), rx).await;
    let three = r#"{"model":"m","max_tokens":50,"n":3}"#;
    let four = r#"{"model":"m","max_tokens":50,"n":4}"#;
    // Exactly what three choices reserve.
    let limit = three.len() as u64 + 150;
    let yaml = format!(
        "rules:\n  - name: tokens\n    limit: {limit}\n    window: 1h\n    cost: {{from: llm}}\n"
    );
    let gw = support::gateway(&yaml, &format!("http://{up}"), None).await;
    let r = send(gw.listen(), "POST", "/v1/chat/completions", &JSON, four).await;
    assert_eq!(r.status.as_u16(), 429, "four choices do not fit");
    assert_eq!(seen.load(Ordering::SeqCst), 0);
    let r = send(gw.listen(), "POST", "/v1/chat/completions", &JSON, three).await;
    assert_eq!(r.status.as_u16(), 200, "{}", r.body);
    assert!(r.body.contains(r#""completion_tokens":150"#), "{}", r.body);
    wait_left(gw.admin.unwrap(), "tokens", limit - 170 - 1).await;
    gw.shutdown().await;
}

/// A 5xx before any output gives the reservation back; an upstream cut
/// mid-stream, after its first event, keeps it (no usage came), and so
/// does a client that leaves mid-stream; both are counted as usage
/// missing.
#[tokio::test]
async fn failures_refund_and_cut_streams_keep_the_reservation() {
    let (seen, _tx, rx) = released();
    let up = fake_llm(seen, rx).await;
    let gw = support::gateway(YAML, &format!("http://{up}"), None).await;
    let admin = gw.admin.unwrap();
    let body = r#"{"model":"m","max_tokens":100,"stream":true}"#;
    let reserved = body.len() as u64 + 100;
    // 503 with no body: refunded.
    let r = send(
        gw.listen(),
        "POST",
        "/fail/v1/chat/completions",
        &JSON,
        body,
    )
    .await;
    assert_eq!(r.status.as_u16(), 503);
    wait_left(admin, "tokens", 100000 - 1).await;
    // Cut after the first event: the client sees it, the reservation stays.
    let out = support::raw(
        gw.listen(),
        &format!(
            "POST /cut/v1/chat/completions HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\ncontent-length: {}\r\nconnection: close\r\n\r\n{body}",
            body.len()
        ),
    )
    .await;
    assert!(out.contains("chat.completion.chunk"), "{out}");
    wait_left(admin, "tokens", 100000 - reserved - 1).await;
    // A client that reads the first event and leaves.
    let mut c = tokio::net::TcpStream::connect(gw.listen()).await.unwrap();
    let req = format!(
        "POST /hold/v1/chat/completions HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\ncontent-length: {}\r\n\r\n{body}",
        body.len()
    );
    c.write_all(req.as_bytes()).await.unwrap();
    let mut got = Vec::new();
    let mut buf = [0u8; 4096];
    while !String::from_utf8_lossy(&got).contains("chat.completion.chunk") {
        let n = tokio::time::timeout(Duration::from_secs(10), c.read(&mut buf))
            .await
            .expect("the first event")
            .unwrap();
        assert!(n > 0, "closed before the first event");
        got.extend_from_slice(&buf[..n]);
    }
    drop(c);
    wait_left(admin, "tokens", 100000 - 2 * reserved - 1).await;
    support::wait_for_metric(
        admin,
        "ratewarden_llm_usage_missing_total{rule=\"tokens\",reason=\"no_usage\"} 2",
    )
    .await;
    gw.shutdown().await;
}
