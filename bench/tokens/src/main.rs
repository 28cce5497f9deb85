//! How far `cost: {from: llm}`'s input bound (the request body's length in
//! bytes) is from the real token count, on a corpus of chat requests made
//! from the files named on the command line (each paragraph a message; a
//! request of one to eight of them): the tokens OpenAI's o200k_base and
//! cl100k_base encodings count for the messages (content plus the chat
//! format's 3 tokens per message and 3 per reply), against the body's
//! bytes. The bound holds when bytes >= tokens for every request.
use std::io::Read;

fn main() {
    let mut paragraphs: Vec<String> = vec![];
    for path in std::env::args().skip(1) {
        let mut text = String::new();
        std::fs::File::open(&path)
            .and_then(|mut f| f.read_to_string(&mut text))
            .unwrap_or_else(|e| panic!("{path}: {e}"));
        paragraphs.extend(
            text.split("\n\n")
                .map(str::trim)
                .filter(|p| p.len() >= 20)
                .map(str::to_owned),
        );
    }
    assert!(!paragraphs.is_empty(), "no paragraphs");
    for (name, bpe) in [
        ("o200k_base", tiktoken_rs::o200k_base().unwrap()),
        ("cl100k_base", tiktoken_rs::cl100k_base().unwrap()),
    ] {
        let mut ratios: Vec<f64> = vec![];
        let (mut bytes_all, mut tokens_all) = (0u64, 0u64);
        let mut i = 0;
        let mut n = 1;
        while i < paragraphs.len() {
            let take = &paragraphs[i..(i + n).min(paragraphs.len())];
            let messages: Vec<_> = take
                .iter()
                .map(|p| serde_json::json!({"role": "user", "content": p}))
                .collect();
            let body = serde_json::json!({"model": "gpt-4o", "messages": messages, "max_tokens": 256}).to_string();
            let tokens: usize = take
                .iter()
                .map(|p| bpe.encode_with_special_tokens(p).len() + 3)
                .sum::<usize>()
                + 3;
            let bytes = body.len();
            assert!(bytes >= tokens, "{name}: {bytes} bytes, {tokens} tokens: the bound fails");
            ratios.push(bytes as f64 / tokens as f64);
            bytes_all += bytes as u64;
            tokens_all += tokens as u64;
            i += n;
            n = n % 8 + 1;
        }
        ratios.sort_by(f64::total_cmp);
        let q = |f: f64| ratios[((ratios.len() - 1) as f64 * f) as usize];
        println!(
            "{name}: {} requests, {} paragraphs; bytes/tokens min {:.2}, median {:.2}, p90 {:.2}, max {:.2}; all {:.2} ({bytes_all} bytes, {tokens_all} tokens); never under: {}",
            ratios.len(),
            paragraphs.len(),
            q(0.0),
            q(0.5),
            q(0.9),
            q(1.0),
            bytes_all as f64 / tokens_all as f64,
            ratios[0] >= 1.0
        );
    }
}
