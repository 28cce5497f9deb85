//! What a rule charged by an LLM's usage changes in the request's body
//! before it goes upstream: `include_usage` asks an OpenAI stream for its
//! usage, and `cap_max_output` lowers a request's maximum output to what
//! its budget has left, so that its real usage can never exceed its
//! reservation's output part. On both HTTP paths, on memory and on Redis.

#[path = "../../ratewarden/tests/common/mod.rs"]
mod common;
mod support;

use std::sync::atomic::Ordering;

use common::RedisServer;
use support::llm::{fake_llm, last_body, released};
use support::{send, wait_left};

const JSON: [(&str, &str); 1] = [("content-type", "application/json")];

/// An OpenAI stream that did not ask for its usage is asked for it
/// (`include_usage`, on by default), so it is charged its usage, not its
/// reservation; with `include_usage: false` the body goes as sent, no
/// usage comes, and the reservation stays charged.
#[tokio::test]
async fn include_usage_asks_an_openai_stream_for_its_usage() {
    let (seen, _tx, rx) = released();
    let up = fake_llm(seen, rx).await;
    let yaml = "rules:\n  - name: on\n    match: {path_prefix: /v1/}\n    limit: 100000\n    window: 1h\n    cost: {from: llm}\n  - name: off\n    match: {path_prefix: /off/}\n    limit: 100000\n    window: 1h\n    cost: {from: llm, include_usage: false}\n";
    let gw = support::gateway(yaml, &format!("http://{up}"), None).await;
    let admin = gw.admin.unwrap();
    let body = r#"{"model":"m","max_tokens":40,"stream":true,"messages":[]}"#;
    // The HTTP/1.1 path.
    let r = send(gw.listen(), "POST", "/v1/chat/completions", &JSON, body).await;
    assert_eq!(r.status.as_u16(), 200, "{}", r.body);
    assert!(r.body.contains(r#""completion_tokens":40"#), "{}", r.body);
    let sent = last_body(up);
    assert_eq!(sent["stream_options"]["include_usage"], true, "{sent}");
    assert_eq!(sent["messages"], serde_json::json!([]), "the rest as sent");
    wait_left(admin, "on", 100000 - 60 - 1).await;
    // hyper's path (HTTP/1.0): the edited body goes with its own length.
    let out = support::raw(
        gw.listen(),
        &format!(
            "POST /v1/chat/completions HTTP/1.0\r\nhost: x\r\ncontent-type: application/json\r\ncontent-length: {}\r\n\r\n{body}",
            body.len()
        ),
    )
    .await;
    assert!(out.starts_with("HTTP/1.0 200"), "{out}");
    assert!(out.contains(r#""completion_tokens":40"#), "{out}");
    wait_left(admin, "on", 100000 - 120 - 1).await;
    // A stream that asked already, and one that is not a stream: as sent.
    for body in [
        r#"{"max_tokens":5,"stream":true,"stream_options":{"include_usage":true}}"#,
        r#"{"max_tokens":5}"#,
    ] {
        let r = send(gw.listen(), "POST", "/v1/chat/completions", &JSON, body).await;
        assert_eq!(r.status.as_u16(), 200);
        assert_eq!(
            last_body(up),
            serde_json::from_str::<serde_json::Value>(body).unwrap()
        );
    }
    // Off: no usage, the reservation (the body's length + 40) stays.
    let r = send(gw.listen(), "POST", "/off/chat/completions", &JSON, body).await;
    assert_eq!(r.status.as_u16(), 200);
    assert!(last_body(up).get("stream_options").is_none());
    wait_left(admin, "off", 100000 - (body.len() as u64 + 40) - 1).await;
    let metrics = send(admin, "GET", "/metrics", &[], "").await.body;
    assert!(
        metrics.contains("ratewarden_llm_usage_missing_total{rule=\"off\",reason=\"no_usage\"} 1"),
        "{metrics}"
    );
    gw.shutdown().await;
}

/// `cap_max_output`: a request whose maximum output does not fit what the
/// budget has left is admitted with its maximum lowered to fit (the
/// upstream is sent the lowered one), never raised; one for which not a
/// token of output fits is refused before the upstream. Without it, the
/// same request is refused.
async fn capped(store: &str) {
    let (seen, _tx, rx) = released();
    let up = fake_llm(seen.clone(), rx).await;
    let yaml = format!(
        "{store}rules:\n  - name: tokens\n    match: {{path_prefix: /v1/}}\n    limit: 1000\n    window: 1h\n    cost: {{from: llm, cap_max_output: true}}\n  - name: plain\n    match: {{path_prefix: /plain/}}\n    limit: 1000\n    window: 1h\n    cost: {{from: llm}}\n"
    );
    let gw = support::gateway(&yaml, &format!("http://{up}"), None).await;
    let admin = gw.admin.unwrap();
    let ask = |max: u64| format!(r#"{{"model":"m","max_tokens":{max},"messages":[]}}"#);
    // 20 + 400 used of 1,000.
    for path in ["/v1/chat/completions", "/plain/chat/completions"] {
        let r = send(gw.listen(), "POST", path, &JSON, &ask(400)).await;
        assert_eq!(r.status.as_u16(), 200, "{}", r.body);
        assert_eq!(last_body(up)["max_tokens"], 400, "what fits is not changed");
    }
    wait_left(admin, "tokens", 1000 - 420 - 1).await;
    // 2,000 asked; 580 left, of which the body's length is its input.
    let body = ask(2000);
    let fits = 580 - body.len() as u64;
    let r = send(gw.listen(), "POST", "/v1/chat/completions", &JSON, &body).await;
    assert_eq!(r.status.as_u16(), 200, "{}", r.body);
    assert_eq!(last_body(up)["max_tokens"], fits, "lowered to what is left");
    assert!(
        r.body.contains(&format!(r#""completion_tokens":{fits}"#)),
        "{}",
        r.body
    );
    // It used 20 + fits: what is left is the body's length minus 20.
    let left = body.len() as u64 - 20;
    wait_left(admin, "tokens", left - 1).await;
    // `/v1/keys` lists the tokens charged per key (on Redis, every key is
    // found by a scan; on memory, keys near their limit by a sample).
    if !store.is_empty() {
        let r = send(admin, "GET", "/v1/keys?rule=tokens", &[], "").await;
        let v: serde_json::Value = serde_json::from_str(&r.body).unwrap();
        assert_eq!(v["keys"][0]["charged"], 1000 - left, "{v}");
    }
    let before = seen.load(Ordering::SeqCst);
    let r = send(gw.listen(), "POST", "/v1/chat/completions", &JSON, &body).await;
    assert_eq!(r.status.as_u16(), 429, "not a token of output fits");
    // Without `cap_max_output`: refused as asked.
    let r = send(gw.listen(), "POST", "/plain/chat/completions", &JSON, &body).await;
    assert_eq!(r.status.as_u16(), 429);
    assert_eq!(
        seen.load(Ordering::SeqCst),
        before,
        "neither reached the upstream"
    );
    gw.shutdown().await;
}

#[tokio::test]
async fn cap_max_output_lowers_the_maximum_to_what_is_left() {
    capped("").await;
}

#[tokio::test]
async fn cap_max_output_lowers_the_maximum_to_what_is_left_on_redis() {
    let redis = RedisServer::start();
    capped(&format!(
        "store: {{type: redis, url: \"{}\"}}\n",
        redis.url()
    ))
    .await;
}

/// Each dialect's maximum output is where it writes it: Anthropic's
/// `max_tokens`, Responses' `max_output_tokens`, Gemini's
/// `generationConfig.maxOutputTokens` (made when the request named none),
/// and an OpenAI request that named none gets `max_completion_tokens`.
#[tokio::test]
async fn cap_max_output_writes_each_dialects_field() {
    let (seen, _tx, rx) = released();
    let up = fake_llm(seen, rx).await;
    let yaml = "rules:\n  - name: tokens\n    limit: 300\n    window: 1h\n    cost: {from: llm, cap_max_output: true, default_max_output: 5000}\n";
    let gw = support::gateway(yaml, &format!("http://{up}"), None).await;
    for (path, body, pointer) in [
        ("/v1/messages", r#"{"max_tokens":9000}"#, "/max_tokens"),
        (
            "/v1/responses",
            r#"{"max_output_tokens":9000}"#,
            "/max_output_tokens",
        ),
        (
            "/v1/models/g:generateContent",
            r#"{"contents":[]}"#,
            "/generationConfig/maxOutputTokens",
        ),
        (
            "/v1/chat/completions",
            r#"{"n":2}"#,
            "/max_completion_tokens",
        ),
    ] {
        let r = send(gw.listen(), "POST", path, &JSON, body).await;
        assert_eq!(r.status.as_u16(), 200, "{path}: {}", r.body);
        let sent = last_body(up);
        let max = sent.pointer(pointer).and_then(serde_json::Value::as_u64);
        // Nothing is charged at this fake's answers but their usage; the
        // budget is whole for each (a 1-hour window, 300 units): each
        // choice's share of 300 less the body's length.
        let choices = if body.contains("\"n\":2") { 2 } else { 1 };
        assert!(
            max.is_some_and(|m| m >= 1 && (m * choices) as usize <= 300 - body.len()),
            "{path}: {sent}"
        );
        // Give it back for the next dialect.
        let _ = send(
            gw.admin.unwrap(),
            "DELETE",
            "/v1/keys/tokens/127.0.0.1",
            &[],
            "",
        )
        .await;
    }
    gw.shutdown().await;
}

/// `/v1/check` and `/v1/explain` take the request's body and say what
/// each rule charged by an LLM's usage reserves of it, as the proxy would
/// (its length plus its maximum output); `/v1/report` then corrects the
/// reservation to the usage. `json:` key parts read the same body.
#[tokio::test]
async fn check_and_explain_take_a_body_and_say_what_is_reserved() {
    let yaml = "rules:\n  - name: tokens\n    match: {path_prefix: /v1/}\n    key: [json:user]\n    limit: 10000\n    window: 1h\n    cost: {from: llm}\n";
    let (seen, _tx, rx) = released();
    let up = fake_llm(seen, rx).await;
    let gw = support::gateway(yaml, &format!("http://{up}"), None).await;
    let admin = gw.admin.unwrap();
    let llm_body = r#"{"model":"m","user":"ann","max_tokens":300}"#;
    let reserved = llm_body.len() as u64 + 300;
    // Explain: nothing charged; the body is the POST's.
    let r = send(
        admin,
        "POST",
        "/v1/explain?method=POST&path=/v1/chat/completions",
        &JSON,
        llm_body,
    )
    .await;
    assert_eq!(r.status.as_u16(), 200, "{}", r.body);
    let v: serde_json::Value = serde_json::from_str(&r.body).unwrap();
    assert_eq!(v["rules"][0]["reserved"], reserved, "{v}");
    assert_eq!(v["rules"][0]["key"], "ann", "{v}");
    assert_eq!(v["would_allow"], true);
    // Check: the body as a JSON value or as text, the same reservation.
    let as_value: serde_json::Value = serde_json::from_str(llm_body).unwrap();
    for body in [
        as_value.clone(),
        serde_json::Value::String(llm_body.to_owned()),
    ] {
        let check = serde_json::json!({"request": {"method": "POST", "path": "/v1/chat/completions", "body": body}});
        let r = send(admin, "POST", "/v1/check", &JSON, &check.to_string()).await;
        let v: serde_json::Value = serde_json::from_str(&r.body).unwrap();
        assert_eq!(v["allowed"], true, "{v}");
        assert_eq!(v["reserved"]["tokens"], reserved, "{v}");
        // The app reports what the call used: 20 + 100.
        let report =
            serde_json::json!({"rule": "tokens", "key": "ann", "reserved": reserved, "used": 120});
        let r = send(admin, "POST", "/v1/report", &JSON, &report.to_string()).await;
        assert_eq!(r.status.as_u16(), 200, "{}", r.body);
    }
    let r = send(admin, "GET", "/v1/keys/tokens/ann", &[], "").await;
    let v: serde_json::Value = serde_json::from_str(&r.body).unwrap();
    // What a request of weight 1 would leave.
    assert_eq!(v["remaining"], 10000 - 240 - 1, "{v}");
    assert_eq!(v["charged"], 240, "{v}");
    gw.shutdown().await;
}
