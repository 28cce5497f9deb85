use super::*;
use crate::config::cost::Price;

fn spec(count: Count) -> Arc<CostSpec> {
    Arc::new(CostSpec {
        rule: "t".into(),
        source: CostSource::Llm(LlmCost {
            dialect: Dialect::Auto,
            count,
            reserve: true,
            default_max_output: 1024,
            cap_max_output: false,
            include_usage: false,
        }),
    })
}

fn total() -> Count {
    Count::Weights {
        input: 1.0,
        cached_input: 1.0,
        output: 1.0,
    }
}

/// Feeds `body` in pieces of `step` bytes, as a relay would.
fn read(content_type: &str, body: &str, step: usize, count: Count) -> Read {
    let mut m = LlmMeter::new(spec(count), None).unwrap();
    m.field("content-type", content_type.as_bytes());
    for piece in body.as_bytes().chunks(step.max(1)) {
        m.data(piece);
    }
    m.read()
}

const OPENAI: &str = r#"{"id":"c","model":"gpt-4o-mini","choices":[],"usage":{"prompt_tokens":100,"completion_tokens":40,"total_tokens":140,"prompt_tokens_details":{"cached_tokens":60}}}"#;

#[test]
fn each_dialects_json_answer_is_read() {
    assert_eq!(
        read("application/json", OPENAI, 7, total()),
        Read::Cost(140)
    );
    let responses = r#"{"object":"response","usage":{"input_tokens":30,"output_tokens":12,"input_tokens_details":{"cached_tokens":10}}}"#;
    assert_eq!(
        read("application/json", responses, 5, total()),
        Read::Cost(42)
    );
    // Anthropic's input_tokens leaves the cache out: 10 + 50 read + 5 written.
    let anthropic = r#"{"type":"message","model":"claude","usage":{"input_tokens":10,"cache_read_input_tokens":50,"cache_creation_input_tokens":5,"output_tokens":20}}"#;
    assert_eq!(
        read("application/json", anthropic, 3, total()),
        Read::Cost(85)
    );
    let gemini = r#"{"candidates":[],"usageMetadata":{"promptTokenCount":8,"candidatesTokenCount":4,"thoughtsTokenCount":3,"cachedContentTokenCount":2}}"#;
    assert_eq!(
        read("application/json", gemini, 64, total()),
        Read::Cost(15)
    );
    // Gemini's stream without alt=sse: an array, the last usage wins.
    let array = r#"[{"usageMetadata":{"promptTokenCount":8,"candidatesTokenCount":1}},{"usageMetadata":{"promptTokenCount":8,"candidatesTokenCount":9}}]"#;
    assert_eq!(read("application/json", array, 10, total()), Read::Cost(17));
}

#[test]
fn weights_count_cached_input_apart() {
    // 40 uncached, 60 cached, 40 output.
    let w = Count::Weights {
        input: 1.0,
        cached_input: 0.1,
        output: 4.0,
    };
    assert_eq!(read("application/json", OPENAI, 9, w), Read::Cost(206));
    let out = Count::Weights {
        input: 0.0,
        cached_input: 0.0,
        output: 1.0,
    };
    assert_eq!(read("application/json", OPENAI, 9, out), Read::Cost(40));
}

#[test]
fn streams_are_read_event_by_event_whatever_the_pieces() {
    let openai = "data: {\"choices\":[{\"delta\":{\"content\":\"hi\"}}],\"usage\":null}\n\n\
                  data: {\"choices\":[],\"usage\":{\"prompt_tokens\":11,\"completion_tokens\":7}}\n\n\
                  data: [DONE]\n\n";
    let anthropic = "event: message_start\r\ndata: {\"type\":\"message_start\",\"message\":{\"model\":\"claude\",\"usage\":{\"input_tokens\":25,\"cache_read_input_tokens\":5,\"output_tokens\":1}}}\r\n\r\n\
                     event: content_block_delta\r\ndata: {\"type\":\"content_block_delta\",\"delta\":{\"text\":\"x\"}}\r\n\r\n\
                     event: message_delta\r\ndata: {\"type\":\"message_delta\",\"usage\":{\"output_tokens\":15}}\r\n\r\n\
                     event: message_stop\r\ndata: {\"type\":\"message_stop\"}\r\n\r\n";
    let responses = "event: response.created\ndata: {\"type\":\"response.created\",\"response\":{\"usage\":null}}\n\n\
                     event: response.completed\ndata: {\"type\":\"response.completed\",\"response\":{\"usage\":{\"input_tokens\":9,\"output_tokens\":3}}}\n\n";
    let gemini = "data: {\"usageMetadata\":{\"promptTokenCount\":5,\"candidatesTokenCount\":1}}\r\n\r\n\
                  data: {\"usageMetadata\":{\"promptTokenCount\":5,\"candidatesTokenCount\":6}}";
    for step in [1, 2, 3, 7, 64, 4096] {
        assert_eq!(
            read("text/event-stream", openai, step, total()),
            Read::Cost(18)
        );
        assert_eq!(
            read("text/event-stream; charset=utf-8", anthropic, step, total()),
            Read::Cost(45),
            "step {step}"
        );
        assert_eq!(
            read("text/event-stream", responses, step, total()),
            Read::Cost(12)
        );
        assert_eq!(
            read("text/event-stream", gemini, step, total()),
            Read::Cost(11)
        );
    }
}

#[test]
fn no_usage_is_said_and_never_a_cost() {
    // An OpenAI stream without include_usage.
    let s = "data: {\"choices\":[{\"delta\":{\"content\":\"hi\"}}]}\n\ndata: [DONE]\n\n";
    assert_eq!(
        read("text/event-stream", s, 4, total()),
        Read::Missing("no_usage")
    );
    assert_eq!(
        read("application/json", "<html>", 4, total()),
        Read::Missing("not_json")
    );
    assert_eq!(
        read("application/json", "{\"a\":1}", 4, total()),
        Read::Missing("no_usage")
    );
    // A stream cut mid-event: what arrived whole is all there is.
    let cut = "data: {\"usage\":{\"prompt_tokens\":3,\"completion_tok";
    assert_eq!(
        read("text/event-stream", cut, 5, total()),
        Read::Missing("no_usage")
    );
}

#[test]
fn a_price_table_counts_millionths_by_model() {
    let prices = Count::Price(vec![
        (
            "gpt-4o-mini*".into(),
            Price {
                input: 0.15,
                cached_input: 0.075,
                output: 0.60,
            },
        ),
        (
            "*".into(),
            Price {
                input: 1.0,
                cached_input: 1.0,
                output: 3.0,
            },
        ),
    ]);
    // 40 x 0.15 + 60 x 0.075 + 40 x 0.60 = 34.5 millionths, rounded up.
    assert_eq!(
        read("application/json", OPENAI, 8, prices.clone()),
        Read::Cost(35)
    );
    let other = OPENAI.replace("gpt-4o-mini", "o3");
    assert_eq!(read("application/json", &other, 8, prices), Read::Cost(220));
    let only = Count::Price(vec![(
        "claude-*".into(),
        Price {
            input: 3.0,
            cached_input: 0.3,
            output: 15.0,
        },
    )]);
    assert_eq!(
        read("application/json", OPENAI, 8, only),
        Read::Missing("no_price")
    );
}

#[test]
fn globs_match_runs() {
    assert!(glob("*", "anything"));
    assert!(glob("gpt-4o*", "gpt-4o-2024-08-06"));
    assert!(!glob("gpt-4o*", "gpt-4"));
    assert!(glob("claude-*-sonnet*", "claude-3-5-sonnet-latest"));
    assert!(!glob("claude-*-sonnet", "claude-3-5-sonnet-latest"));
    assert!(glob("exact", "exact"));
    assert!(!glob("exact", "exactly"));
    assert!(!glob("a*a", "a"));
}

#[test]
fn a_request_is_reserved_its_input_bound_and_maximum_output() {
    let body = br#"{"model":"gpt-4o","messages":[{"role":"user","content":"hello"}],"max_tokens":100,"n":2}"#;
    let v = body_json(body).unwrap();
    let a = asked(
        dialect_of(Dialect::Auto, "/v1/chat/completions"),
        &v,
        body.len(),
    );
    assert_eq!(a.max_output, Some(200));
    assert_eq!(a.model.as_deref(), Some("gpt-4o"));
    let CostSource::Llm(cost) = &spec(total()).source else {
        unreachable!()
    };
    assert_eq!(reservation(cost, Some(&a)), body.len() as u64 + 200);
    // max_completion_tokens wins over max_tokens.
    let body = br#"{"max_completion_tokens":5,"max_tokens":100}"#;
    let v = body_json(body).unwrap();
    let a = asked(Some(Dialect::OpenAi), &v, body.len());
    assert_eq!(a.max_output, Some(5));
    // No maximum: the default.
    let body = br#"{"messages":[]}"#;
    let a = asked(
        Some(Dialect::Anthropic),
        &body_json(body).unwrap(),
        body.len(),
    );
    assert_eq!(reservation(cost, Some(&a)), body.len() as u64 + 1024);
    // Gemini's maximum and candidates.
    let body = br#"{"generationConfig":{"maxOutputTokens":50,"candidateCount":3}}"#;
    let a = asked(
        dialect_of(
            Dialect::Auto,
            "/v1beta/models/gemini-2.0-flash:generateContent",
        ),
        &body_json(body).unwrap(),
        body.len(),
    );
    assert_eq!(a.max_output, Some(150));
    // Not JSON: the fallback, the default maximum output.
    assert!(body_json(b"not json").is_none());
    assert_eq!(reservation(cost, None), 1024);
}

#[test]
fn usage_objects_are_found_by_their_bytes() {
    for (text, may) in [
        (&br#"{"usage":{"prompt_tokens":1}}"#[..], true),
        (br#"{"usage" :  {"a":1}}"#, true),
        (br#"{"usageMetadata":{"promptTokenCount":1}}"#, true),
        (br#"{"choices":[],"usage":null}"#, false),
        (br#"{"usage":3}"#, false),
        (br#"{"usages":{}}"#, false),
        (br#"{"content":"no key here"}"#, false),
        // A text that ends before it can tell is read.
        (br#"{"usage":"#, true),
        (br#"{"usage""#, true),
    ] {
        assert_eq!(
            carries_usage(text),
            may,
            "{}",
            String::from_utf8_lossy(text)
        );
    }
}

/// OpenAI's chunks with `include_usage` each say `"usage":null`; only the
/// last, with the usage, is read, however the stream is cut.
#[test]
fn a_stream_of_null_usages_is_read_at_its_usage() {
    let chunk = |u: &str| format!("data: {{\"model\":\"m\",\"choices\":[],\"usage\":{u}}}\n\n");
    let mut stream = String::new();
    for _ in 0..50 {
        stream += &chunk("null");
    }
    stream += &chunk(r#"{"prompt_tokens":7,"completion_tokens":9}"#);
    stream += "data: [DONE]\n\n";
    for cut in [1, 7, 64, stream.len()] {
        assert_eq!(
            read("text/event-stream", &stream, cut, total()),
            Read::Cost(16),
            "pieces of {cut}"
        );
    }
}
