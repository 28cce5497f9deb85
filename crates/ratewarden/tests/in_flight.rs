//! `concurrency`: requests in flight, exact under contention on memory and
//! on Redis, released when they end, and lapsing when nobody releases them.

mod common;

use std::sync::Arc;
use std::time::Duration;

use common::RedisServer;
use ratewarden::algorithm::Kind;
use ratewarden::clock::{Clock, ManualClock};
use ratewarden::{Limiter, MemoryStore, Op, Pending, RedisConfig, RedisStore, Rule, Store};

fn in_flight(limit: u64, hold: Duration) -> Rule {
    Rule::builder("in-flight")
        .algorithm(Kind::Concurrency)
        .limit(limit, Duration::from_secs(1))
        .max_hold(hold)
        .build()
        .unwrap()
}

/// 100 requests at once on one key: the admitted ones, each holding a lease.
async fn burst<S: Store>(limiter: &Arc<Limiter<S>>, rule: &Rule) -> Vec<Pending> {
    let mut tasks = vec![];
    for _ in 0..100 {
        let (limiter, rule) = (limiter.clone(), rule.clone());
        tasks.push(tokio::spawn(async move {
            let a = limiter
                .acquire(&[Op::new(&rule, "user-1")], 1)
                .await
                .unwrap();
            a.decision.allowed.then(|| a.pending.expect("a lease"))
        }));
    }
    let mut held = vec![];
    for t in tasks {
        held.extend(t.await.unwrap());
    }
    held
}

/// 10 slots: 10 of 100 concurrent requests get in; 4 end, and of the next
/// 100 exactly 4 get in.
async fn exact_in_flight<S: Store>(store: S) {
    let limiter = Arc::new(Limiter::new(store));
    let rule = in_flight(10, Duration::from_secs(60));
    let mut held = burst(&limiter, &rule).await;
    assert_eq!(held.len(), 10, "in flight at once");
    let leases: std::collections::HashSet<u64> = held
        .iter()
        .flat_map(|p| p.leases().map(|(_, _, l)| l))
        .collect();
    assert_eq!(leases.len(), 10, "each its own lease");
    for p in held.drain(..4) {
        limiter.release(&p).await.unwrap();
    }
    assert_eq!(burst(&limiter, &rule).await.len(), 4);
    let d = limiter.check(&rule, "user-1").await.unwrap();
    assert!(!d.allowed, "all 10 slots held again");
    assert_eq!(d.rules[0].remaining, 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn in_flight_is_exact_under_100_concurrent_requests_in_memory() {
    exact_in_flight(MemoryStore::default()).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn in_flight_is_exact_under_100_concurrent_requests_on_redis() {
    let server = RedisServer::start();
    let store = RedisStore::new(RedisConfig {
        url: Some(server.url()),
        timeout: Duration::from_secs(2),
        ..RedisConfig::default()
    })
    .unwrap();
    exact_in_flight(store).await;
}

/// A holder that never releases (a crashed gateway): its slot counts until
/// `max_hold` has passed since it was taken, then no longer.
#[tokio::test]
async fn a_lease_nobody_releases_lapses_after_max_hold() {
    let clock = ManualClock::new(1_700_000_000_000_000);
    let limiter = Limiter::new(MemoryStore::builder().clock(clock.clone()).build());
    let rule = in_flight(1, Duration::from_secs(30));
    let first = limiter.acquire(&[Op::new(&rule, "k")], 1).await.unwrap();
    assert!(first.decision.allowed);
    std::mem::forget(first.pending); // the holder is gone
    clock.advance(Duration::from_secs(29));
    let d = limiter.check(&rule, "k").await.unwrap();
    assert!(!d.allowed);
    assert_eq!(
        d.retry_after_secs(),
        Some(1),
        "a hint: a slot may free any time"
    );
    clock.advance(Duration::from_secs(1));
    assert!(
        limiter.check(&rule, "k").await.unwrap().allowed,
        "lapsed after 30 s"
    );
}

/// The same on Redis, on Redis's own clock: a lease taken by a store
/// instance that then goes away lapses for every other instance.
#[tokio::test]
async fn a_lease_held_by_a_vanished_instance_lapses_on_redis() {
    let server = RedisServer::start();
    let config = |clock: Option<ManualClock>| RedisConfig {
        url: Some(server.url()),
        timeout: Duration::from_secs(2),
        local_clock: clock.map(|c| Arc::new(c) as Arc<dyn Clock>),
        ..RedisConfig::default()
    };
    let clock = ManualClock::new(1_987_200_000_000_000);
    let rule = in_flight(1, Duration::from_secs(30));
    {
        let gone = Limiter::new(RedisStore::new(config(Some(clock.clone()))).unwrap());
        let a = gone.acquire(&[Op::new(&rule, "k")], 1).await.unwrap();
        assert!(a.decision.allowed);
        // Dropped without releasing.
    }
    let other = Limiter::new(RedisStore::new(config(Some(clock.clone()))).unwrap());
    clock.advance(Duration::from_secs(10));
    assert!(!other.check(&rule, "k").await.unwrap().allowed);
    clock.advance(Duration::from_secs(20));
    let after = other.acquire(&[Op::new(&rule, "k")], 1).await.unwrap();
    assert!(after.decision.allowed, "lapsed after 30 s");
    assert_eq!(
        after.decision.rules[0].lease,
        Some(2),
        "the next lease number"
    );
}
