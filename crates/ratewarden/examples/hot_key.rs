//! For bench/hot_key.sh: one gateway's decision stack (leases over the
//! Redis store with its `on_error: local` fallback, as the gateway builds
//! it) deciding one global key from `--tasks` tasks for `--seconds`, with
//! the rule leased (`--lease`) or not. Prints `decisions= rate= local=
//! grants= admitted=`.
//!
//!     cargo run --release -p ratewarden --example hot_key -- redis://127.0.0.1:6379 [--lease [--epsilon-ppm 10000]] [--seconds 5] [--tasks 64]

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use ratewarden::algorithm::Kind;
use ratewarden::store::lease::Leased;
use ratewarden::store::redis::{RedisConfig, RedisStore};
use ratewarden::{Distribution, Fallback, MemoryStore, Mode, OnError, Op, Rule, Store};

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let url = args
        .first()
        .cloned()
        .unwrap_or_else(|| "redis://127.0.0.1:6379".into());
    let flag = |name: &str, default: u64| {
        args.iter()
            .position(|a| a == name)
            .and_then(|i| args.get(i + 1))
            .map_or(default, |v| v.parse().expect("a number"))
    };
    let seconds = flag("--seconds", 5);
    let tasks = flag("--tasks", 64);
    let lease = args.iter().any(|a| a == "--lease");
    // In millionths of the limit (default 10000: 0.01).
    let epsilon = flag("--epsilon-ppm", 10_000) as f64 / 1e6;
    let mut b = Rule::builder("global")
        .algorithm(Kind::FixedWindow)
        // Never reached in a run: the figure is what is decided, not refused.
        .limit(4_000_000_000, Duration::from_secs(3600));
    if lease {
        b = b.distribution(Distribution::lease(epsilon, 0.25));
    }
    let rule = b.build().expect("a rule");
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("a runtime");
    rt.block_on(async move {
        let redis = RedisStore::new(RedisConfig {
            url: Some(url),
            timeout: Duration::from_secs(1),
            ..Default::default()
        })
        .expect("a store");
        redis
            .connect_now(Duration::from_secs(2))
            .await
            .expect("redis");
        let store = Arc::new(Leased::new(Fallback::new(
            redis,
            OnError::Local,
            MemoryStore::default(),
        )));
        let stop = Arc::new(AtomicBool::new(false));
        let (decisions, admitted) = (Arc::new(AtomicU64::new(0)), Arc::new(AtomicU64::new(0)));
        let start = Instant::now();
        let mut handles = vec![];
        for _ in 0..tasks {
            let (store, stop, rule) = (store.clone(), stop.clone(), rule.clone());
            let (decisions, admitted) = (decisions.clone(), admitted.clone());
            handles.push(tokio::spawn(async move {
                let op = [Op::new(&rule, "global")];
                while !stop.load(Ordering::Relaxed) {
                    let v = store.decide(&op, 1, Mode::Apply).await.expect("a decision");
                    decisions.fetch_add(1, Ordering::Relaxed);
                    if v[0].allowed() {
                        admitted.fetch_add(1, Ordering::Relaxed);
                    }
                    // Let the other tasks (and Redis replies) in, as a
                    // server's requests would.
                    tokio::task::yield_now().await;
                }
            }));
        }
        tokio::time::sleep(Duration::from_secs(seconds)).await;
        stop.store(true, Ordering::Relaxed);
        let elapsed = start.elapsed().as_secs_f64();
        for h in handles {
            h.await.expect("a task");
        }
        store.give_back().await.ok();
        let n = decisions.load(Ordering::Relaxed);
        let (grants, local) = store.counts();
        println!(
            "decisions={n} rate={:.0} local={local} grants={grants} admitted={}",
            n as f64 / elapsed,
            admitted.load(Ordering::Relaxed)
        );
    });
}
