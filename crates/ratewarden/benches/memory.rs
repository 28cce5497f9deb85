//! Resident memory per idle key in the memory store, for each O(1)-state
//! algorithm, beside governor's keyed limiter holding the same keys.
//!
//! `cargo bench -p ratewarden --bench memory`
//!
//! Each measurement runs in a fresh child process (this binary, re-executed)
//! so that one allocator's retained pages do not blur the next figure. The
//! figure is the growth of the resident set (`/proc/self/statm`) while
//! 1,000,000 distinct keys are decided once each (the store bounded at
//! `max_keys` = 1,000,000), divided by the number of keys held at the end.
//! The rule (10 per hour) keeps every key's state alive for the whole run.

use std::num::NonZeroU32;
use std::process::Command;
use std::time::Duration;

use ratewarden::algorithm::Kind;
use ratewarden::{MemoryStore, Mode, Op, Rule};

const KEYS: usize = 1_000_000;

fn rss_bytes() -> usize {
    let statm = std::fs::read_to_string("/proc/self/statm").expect("Linux /proc");
    let pages: usize = statm.split_whitespace().nth(1).unwrap().parse().unwrap();
    pages * 4096
}

fn key(i: usize, buf: &mut String) -> &str {
    use std::fmt::Write;
    buf.clear();
    let _ = write!(buf, "10.{}.{}.{}", i >> 16, (i >> 8) & 255, i & 255);
    buf
}

/// (bytes per key held, keys held)
fn measure(which: &str) -> (f64, usize) {
    let mut buf = String::new();
    let before = rss_bytes();
    let after = if which == "governor" {
        let quota = governor::Quota::per_second(NonZeroU32::new(1_000).unwrap());
        let gov = governor::RateLimiter::keyed(quota);
        for i in 0..KEYS {
            let _ = gov.check_key(&key(i, &mut buf).to_owned());
        }
        assert_eq!(gov.len(), KEYS);
        (rss_bytes(), KEYS)
    } else {
        let kind: Kind = which.parse().unwrap();
        let rule = Rule::builder("mem")
            .algorithm(kind)
            .limit(10, Duration::from_secs(3600))
            .build()
            .unwrap();
        let store = MemoryStore::builder().max_keys(KEYS).build();
        for i in 0..KEYS {
            let k = key(i, &mut buf);
            store.decide_one(&Op::new(&rule, k), 1, Mode::Apply);
        }
        (rss_bytes(), store.len())
    };
    ((after.0 - before) as f64 / after.1 as f64, after.1)
}

fn main() {
    if let Ok(which) = std::env::var("RATEWARDEN_MEMORY_CHILD") {
        let (bytes, held) = measure(&which);
        println!("{bytes} {held}");
        return;
    }
    if std::env::args().any(|a| a == "--list") {
        return; // `cargo bench -- --list` and test harness probes
    }
    let exe = std::env::current_exe().unwrap();
    let run = |which: &str| -> (f64, usize) {
        let out = Command::new(&exe)
            .env("RATEWARDEN_MEMORY_CHILD", which)
            .output()
            .unwrap();
        eprint!("{}", String::from_utf8_lossy(&out.stderr));
        let text = String::from_utf8_lossy(&out.stdout);
        let mut parts = text.split_whitespace();
        let bytes = parts.next().unwrap().parse().unwrap();
        (bytes, parts.next().unwrap().parse().unwrap())
    };
    let (reference, held) = run("governor");
    println!("bytes per idle key, {KEYS} distinct keys decided (resident set growth / keys held)");
    println!(
        "{:<24} {:>10} {:>10} {:>18}",
        "store", "keys held", "bytes/key", "ratio to governor"
    );
    println!(
        "{:<24} {:>10} {:>10.1} {:>18}",
        "governor keyed (String)", held, reference, "1.00"
    );
    for kind in [
        Kind::FixedWindow,
        Kind::SlidingWindowCounter,
        Kind::TokenBucket,
        Kind::LeakyBucket,
        Kind::Gcra,
    ] {
        let (b, held) = run(kind.name());
        println!(
            "{:<24} {:>10} {:>10.1} {:>18.2}",
            kind.name(),
            held,
            b,
            b / reference
        );
    }
}
