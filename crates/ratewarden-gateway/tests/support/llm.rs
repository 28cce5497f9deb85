//! A fake LLM API upstream, OpenAI- and Anthropic-compatible, for the
//! tests of rules charged by an LLM's usage.

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

use serde_json::Value;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

/// The last request body each fake (by its address) was sent.
static LAST: Mutex<Option<HashMap<SocketAddr, Vec<u8>>>> = Mutex::new(None);

/// The last request body the fake at `addr` was sent, as JSON.
pub fn last_body(addr: SocketAddr) -> Value {
    let last = LAST.lock().unwrap();
    let body = last
        .as_ref()
        .and_then(|m| m.get(&addr))
        .cloned()
        .unwrap_or_default();
    serde_json::from_slice(&body).unwrap_or(Value::Null)
}

/// The fake upstream: reads a request with its body, counts it in `seen`,
/// waits until `go` is true, and answers in the dialect its path names,
/// streamed when the body says `"stream": true`, with a usage of 20 input
/// tokens (5 of them cached) and the request's maximum output (an OpenAI
/// stream's only when `stream_options.include_usage` asks, as OpenAI's).
/// The last body each fake was sent: [`last_body`].
pub async fn fake_llm(
    seen: Arc<AtomicUsize>,
    go: tokio::sync::watch::Receiver<bool>,
) -> SocketAddr {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move {
        loop {
            let Ok((mut s, _)) = listener.accept().await else {
                return;
            };
            let (seen, mut go) = (seen.clone(), go.clone());
            tokio::spawn(async move {
                let mut buf = Vec::new();
                let (head, body) = loop {
                    if let Some(i) = buf.windows(4).position(|w| w == b"\r\n\r\n") {
                        let head = String::from_utf8_lossy(&buf[..i]).to_ascii_lowercase();
                        let len: usize = head
                            .lines()
                            .find_map(|l| l.strip_prefix("content-length:"))
                            .map_or(0, |v| v.trim().parse().unwrap());
                        if buf.len() >= i + 4 + len {
                            break (head, buf[i + 4..i + 4 + len].to_vec());
                        }
                    }
                    let mut chunk = [0u8; 4096];
                    match s.read(&mut chunk).await {
                        Ok(0) | Err(_) => return,
                        Ok(n) => buf.extend_from_slice(&chunk[..n]),
                    }
                };
                seen.fetch_add(1, Ordering::SeqCst);
                LAST.lock()
                    .unwrap()
                    .get_or_insert_default()
                    .insert(addr, body.clone());
                let _ = go.wait_for(|g| *g).await;
                let req: Value = serde_json::from_slice(&body).unwrap_or(Value::Null);
                let max = req["max_completion_tokens"]
                    .as_u64()
                    .or(req["max_tokens"].as_u64())
                    .unwrap_or(10);
                let usage = req["stream_options"]["include_usage"] == Value::Bool(true);
                let stream = req["stream"].as_bool().unwrap_or(false);
                let anthropic = head.starts_with("post /v1/messages");
                let (ctype, out) = if head.starts_with("post /v1/plain") {
                    ("text/plain", "no usage here".to_owned())
                } else {
                    answer(anthropic, stream, max, usage)
                };
                let answer = format!(
                    "HTTP/1.1 200 OK\r\ncontent-type: {ctype}\r\ncontent-length: {}\r\nconnection: close\r\n\r\n{out}",
                    out.len()
                );
                let _ = s.write_all(answer.as_bytes()).await;
            });
        }
    });
    addr
}

/// The fake's answer, complete enough for the vendors' SDKs to parse: 20
/// input tokens (5 of them cached) and `max` output tokens.
pub fn answer(
    anthropic: bool,
    stream: bool,
    max: u64,
    usage_asked: bool,
) -> (&'static str, String) {
    let usage = format!(
        r#"{{"prompt_tokens":20,"completion_tokens":{max},"total_tokens":{},"prompt_tokens_details":{{"cached_tokens":5}}}}"#,
        20 + max
    );
    let chunk = |choices: &str, usage: &str| {
        format!(
            "data: {{\"id\":\"c1\",\"object\":\"chat.completion.chunk\",\"created\":1,\"model\":\"gpt-4o-mini\",\"choices\":{choices},\"usage\":{usage}}}\n\n"
        )
    };
    let message = |content: &str, stop: &str, out: u64| {
        format!(
            r#"{{"id":"msg_1","type":"message","role":"assistant","model":"claude-x","content":{content},"stop_reason":{stop},"stop_sequence":null,"usage":{{"input_tokens":15,"cache_read_input_tokens":5,"cache_creation_input_tokens":0,"output_tokens":{out}}}}}"#
        )
    };
    match (anthropic, stream) {
        (false, false) => (
            "application/json",
            format!(
                r#"{{"id":"c1","object":"chat.completion","created":1,"model":"gpt-4o-mini","choices":[{{"index":0,"message":{{"role":"assistant","content":"ok"}},"finish_reason":"stop"}}],"usage":{usage}}}"#
            ),
        ),
        (false, true) => (
            "text/event-stream",
            chunk(
                r#"[{"index":0,"delta":{"role":"assistant","content":"ok"},"finish_reason":null}]"#,
                "null",
            ) + &chunk(r#"[{"index":0,"delta":{},"finish_reason":"stop"}]"#, "null")
                + &if usage_asked {
                    chunk("[]", &usage)
                } else {
                    String::new()
                }
                + "data: [DONE]\n\n",
        ),
        (true, false) => (
            "application/json",
            message(r#"[{"type":"text","text":"ok"}]"#, r#""end_turn""#, max),
        ),
        (true, true) => {
            let events = [
                ("message_start", format!(r#"{{"type":"message_start","message":{}}}"#, message("[]", "null", 1))),
                ("content_block_start", r#"{"type":"content_block_start","index":0,"content_block":{"type":"text","text":""}}"#.to_owned()),
                ("content_block_delta", r#"{"type":"content_block_delta","index":0,"delta":{"type":"text_delta","text":"ok"}}"#.to_owned()),
                ("content_block_stop", r#"{"type":"content_block_stop","index":0}"#.to_owned()),
                ("message_delta", format!(r#"{{"type":"message_delta","delta":{{"stop_reason":"end_turn","stop_sequence":null}},"usage":{{"output_tokens":{max}}}}}"#)),
                ("message_stop", r#"{"type":"message_stop"}"#.to_owned()),
            ];
            let body = events
                .iter()
                .map(|(e, d)| format!("event: {e}\ndata: {d}\n\n"))
                .collect();
            ("text/event-stream", body)
        }
    }
}

pub fn released() -> (
    Arc<AtomicUsize>,
    tokio::sync::watch::Sender<bool>,
    tokio::sync::watch::Receiver<bool>,
) {
    let (tx, rx) = tokio::sync::watch::channel(true);
    (Arc::new(AtomicUsize::new(0)), tx, rx)
}
