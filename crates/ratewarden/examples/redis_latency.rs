//! Redis call latency through the store's own client, as a gateway sees it:
//! `C` callers on a two-worker runtime (the gateway's shape on this host)
//! each deciding one op at a time until `N` decisions are made, every
//! decision timed from the call to its answer.
//!
//!   cargo run --release -p ratewarden --example redis_latency -- URL [N] [C]
//!
//! Prints `p50_us=.. p99_us=.. p999_us=.. max_us=.. late=..` (late: calls
//! past the store's timeout, here 10 s so that none is cut short).
//! `bench/redis_latency.sh` runs it on an idle host and beside two CPU-bound
//! processes.

use std::sync::Arc;
use std::time::{Duration, Instant};

use ratewarden::algorithm::Kind;
use ratewarden::{Mode, Op, RedisConfig, RedisStore, Rule, Store};

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let url = args
        .get(1)
        .cloned()
        .unwrap_or("redis://127.0.0.1:6379".into());
    let n: usize = args.get(2).map_or(200_000, |v| v.parse().unwrap());
    let c: usize = args.get(3).map_or(16, |v| v.parse().unwrap());
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(async move {
        let store = RedisStore::new(RedisConfig {
            url: Some(url),
            key_prefix: "lat:".into(),
            timeout: Duration::from_secs(10),
            ..RedisConfig::default()
        })
        .unwrap();
        store.connect_now(Duration::from_secs(5)).await.unwrap();
        let rule = Arc::new(
            Rule::builder("latency")
                .algorithm(Kind::FixedWindow)
                .limit(1_000_000_000, Duration::from_secs(60))
                .build()
                .unwrap(),
        );
        let tasks: Vec<_> = (0..c)
            .map(|i| {
                let (store, rule) = (store.clone(), rule.clone());
                tokio::spawn(async move {
                    let key = format!("k{i}");
                    let mut took = Vec::with_capacity(n / c);
                    for _ in 0..n / c {
                        let t = Instant::now();
                        store
                            .decide(&[Op::new(&rule, &key)], 1, Mode::Apply)
                            .await
                            .unwrap();
                        took.push(t.elapsed().as_micros() as u64);
                    }
                    took
                })
            })
            .collect();
        let mut all = vec![];
        for t in tasks {
            all.extend(t.await.unwrap());
        }
        all.sort_unstable();
        let q = |p: f64| all[((all.len() as f64 * p) as usize).min(all.len() - 1)];
        let late = all.iter().filter(|&&us| us > 1_000_000).count();
        println!(
            "calls={} p50_us={} p99_us={} p999_us={} max_us={} over_1s={late}",
            all.len(),
            q(0.5),
            q(0.99),
            q(0.999),
            all[all.len() - 1]
        );
    });
}
