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
                // (The head was lowercased: so is the path.)
                let path = head.split(' ').nth(1).unwrap_or("/").to_owned();
                let choices = req["n"]
                    .as_u64()
                    .or(req["generationConfig"]["candidateCount"].as_u64())
                    .unwrap_or(1);
                let max = req["max_completion_tokens"]
                    .as_u64()
                    .or(req["max_tokens"].as_u64())
                    .or(req["max_output_tokens"].as_u64())
                    .or(req["generationConfig"]["maxOutputTokens"].as_u64())
                    .unwrap_or(10)
                    * choices;
                let usage = req["stream_options"]["include_usage"] == Value::Bool(true);
                let stream = req["stream"].as_bool().unwrap_or(false)
                    || path.contains(":streamgeneratecontent");
                let anthropic = path.starts_with("/v1/messages");
                // Faults: a 503 before any output; a stream cut after its
                // first event; a stream that repeats its first event, never ending.
                if path.starts_with("/fail/") {
                    let _ = s
                        .write_all(b"HTTP/1.1 503 Service Unavailable\r\ncontent-length: 0\r\nconnection: close\r\n\r\n")
                        .await;
                    return;
                }
                let (ctype, out) = if path.starts_with("/v1/plain") {
                    ("text/plain", "no usage here".to_owned())
                } else if path.ends_with("/responses") {
                    responses_answer(stream, max)
                } else if path.contains(":generatecontent")
                    || path.contains(":streamgeneratecontent")
                {
                    gemini_answer(stream, max)
                } else {
                    answer(anthropic, stream, max, usage)
                };
                if path.starts_with("/cut/") || path.starts_with("/hold/") {
                    let first = out.find("\n\n").map_or(out.len(), |i| i + 2);
                    let head = format!(
                        "HTTP/1.1 200 OK\r\ncontent-type: {ctype}\r\ntransfer-encoding: chunked\r\nconnection: close\r\n\r\n{:x}\r\n{}\r\n",
                        first,
                        &out[..first]
                    );
                    let _ = s.write_all(head.as_bytes()).await;
                    if path.starts_with("/hold/") {
                        // The same event again every 50 ms, never the usage
                        // (a stream the client leaves meanwhile).
                        let again = format!("{:x}\r\n{}\r\n", first, &out[..first]);
                        for _ in 0..200 {
                            tokio::time::sleep(std::time::Duration::from_millis(50)).await;
                            if s.write_all(again.as_bytes()).await.is_err() {
                                return;
                            }
                        }
                    }
                    return;
                }
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

/// OpenAI Responses: 20 input tokens (5 cached), `max` output.
pub fn responses_answer(stream: bool, max: u64) -> (&'static str, String) {
    let usage = format!(
        r#"{{"input_tokens":20,"input_tokens_details":{{"cached_tokens":5}},"output_tokens":{max},"total_tokens":{}}}"#,
        20 + max
    );
    if stream {
        let events = [
            (
                "response.created",
                r#"{"type":"response.created","response":{"id":"r1","usage":null}}"#.to_owned(),
            ),
            (
                "response.output_text.delta",
                r#"{"type":"response.output_text.delta","delta":"ok"}"#.to_owned(),
            ),
            (
                "response.completed",
                format!(
                    r#"{{"type":"response.completed","response":{{"id":"r1","model":"gpt-4o-mini","usage":{usage}}}}}"#
                ),
            ),
        ];
        let body = events
            .iter()
            .map(|(e, d)| format!("event: {e}\ndata: {d}\n\n"))
            .collect();
        ("text/event-stream", body)
    } else {
        (
            "application/json",
            format!(
                r#"{{"id":"r1","object":"response","model":"gpt-4o-mini","output":[],"usage":{usage}}}"#
            ),
        )
    }
}

/// Gemini: 20 prompt tokens (5 cached), `max` candidates' tokens; a stream
/// (`alt=sse`) says a running usage in each chunk, the last the whole.
pub fn gemini_answer(stream: bool, max: u64) -> (&'static str, String) {
    let usage = |out: u64| {
        format!(
            r#"{{"promptTokenCount":20,"cachedContentTokenCount":5,"candidatesTokenCount":{out},"totalTokenCount":{}}}"#,
            20 + out
        )
    };
    let chunk = |out: u64| {
        format!(
            r#"{{"candidates":[{{"content":{{"parts":[{{"text":"ok"}}]}}}}],"usageMetadata":{},"modelVersion":"gemini-x"}}"#,
            usage(out)
        )
    };
    if stream {
        let body = format!("data: {}\r\n\r\ndata: {}\r\n\r\n", chunk(1), chunk(max));
        ("text/event-stream", body)
    } else {
        ("application/json", chunk(max))
    }
}
