//! Many tasks on a multi-threaded runtime hammering one key admit exactly the
//! limit, for every exact algorithm, alone and combined with a second rule.

use std::sync::Arc;
use std::time::Duration;

use ratewarden::algorithm::Kind;
use ratewarden::clock::ManualClock;
use ratewarden::{Limiter, MemoryStore, Op, Rule};

async fn admitted(limiter: Arc<Limiter<MemoryStore>>, rules: Vec<Rule>, tasks: usize) -> u64 {
    let mut handles = vec![];
    for _ in 0..tasks {
        let limiter = limiter.clone();
        let rules = rules.clone();
        handles.push(tokio::spawn(async move {
            let mut n = 0u64;
            for _ in 0..20 {
                let ops: Vec<Op<'_>> = rules.iter().map(|rule| Op::new(rule, "hot")).collect();
                n += u64::from(limiter.acquire(&ops, 1).await.unwrap().decision.allowed);
                tokio::task::yield_now().await;
            }
            n
        }));
    }
    let mut total = 0;
    for h in handles {
        total += h.await.unwrap();
    }
    total
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn concurrent_requests_on_one_key_admit_exactly_the_limit() {
    for kind in Kind::ALL.into_iter().filter(|k| k.is_exact()) {
        // The clock stands still: no refill, no window edge, so exactly
        // `limit` of the 64 × 20 requests fit.
        let clock = ManualClock::new(1_700_000_000_000_000);
        let limiter = Arc::new(Limiter::new(MemoryStore::builder().clock(clock).build()));
        let rule = Rule::builder("hot")
            .algorithm(kind)
            .limit(100, Duration::from_secs(60))
            .build()
            .unwrap();
        assert_eq!(admitted(limiter, vec![rule], 64).await, 100, "{kind}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn two_rules_stay_all_or_nothing_under_contention() {
    let clock = ManualClock::new(1_700_000_000_000_000);
    let limiter = Arc::new(Limiter::new(MemoryStore::builder().clock(clock).build()));
    let narrow = Rule::builder("narrow")
        .algorithm(Kind::Gcra)
        .limit(30, Duration::from_secs(60))
        .build()
        .unwrap();
    let wide = Rule::builder("wide")
        .algorithm(Kind::SlidingWindowLog)
        .limit(1_000, Duration::from_secs(60))
        .build()
        .unwrap();
    let n = admitted(limiter.clone(), vec![narrow, wide.clone()], 64).await;
    assert_eq!(n, 30);
    let d = limiter.check(&wide, "hot").await.unwrap();
    assert_eq!(d.rules[0].remaining, 1_000 - 30 - 1);
}
