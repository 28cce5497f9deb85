use super::*;
use crate::Rule;
use crate::algorithm::Kind;
use std::time::Duration;

/// Envoy's case: one call naming a descriptor twice, then one naming
/// it nine times, against a limit of 10. Decided on their sums the
/// second is refused (2 + 9 > 10); decided against the state before
/// each call, as each copy alone, both were admitted: 11 requests.
#[test]
fn copies_of_one_key_in_a_call_are_decided_on_their_sum() {
    let rule = Rule::builder("r")
        .algorithm(Kind::FixedWindow)
        .limit(10, Duration::from_secs(60))
        .build()
        .unwrap();
    let other = Rule::builder("other")
        .algorithm(Kind::FixedWindow)
        .limit(100, Duration::from_secs(60))
        .build()
        .unwrap();
    let store = MemoryStore::builder()
        .clock(crate::clock::ManualClock::new(1_000_000))
        .build();
    let op = Op::new(&rule, "k");
    let mut ops = vec![op, Op::new(&other, "k"), op];
    let v = store.decide_now(&ops, 1, Mode::Apply);
    assert!(admitted(&ops, &v));
    assert_eq!(v[0], v[2], "the copies share one verdict");
    assert_eq!(v[0].check.remaining, 8);
    ops = vec![op; 9];
    let v = store.decide_now(&ops, 1, Mode::Apply);
    assert!(!admitted(&ops, &v), "2 + 9 is over 10");
    assert!(v.iter().all(|x| *x == v[0]));
    let v = store.decide_now(&vec![op; 8], 1, Mode::Apply);
    assert!(v.iter().all(Verdict::allowed), "2 + 8 fits");
    assert!(!store.decide_one(&op, 1, Mode::Apply).allowed(), "full");
}

/// A store's tables are made when their first key arrives, each at
/// its full share at once: a new store holds no table, one key makes
/// one, and the store then fills to its bound and no further.
#[test]
fn tables_are_sized_once_at_their_first_key() {
    let rule = Rule::builder("r")
        .algorithm(Kind::FixedWindow)
        .limit(10, Duration::from_secs(60))
        .build()
        .unwrap();
    let store = MemoryStore::builder()
        .max_keys(64 * 1024)
        .clock(crate::clock::ManualClock::new(1_000_000))
        .build();
    let capacities = || -> Vec<usize> {
        store
            .inner
            .shards
            .iter()
            .map(|c| c.lock.read().map.capacity())
            .collect()
    };
    assert!(capacities().iter().all(|&c| c == 0), "nothing up front");
    assert!(
        store
            .decide_one(&Op::new(&rule, "k0"), 1, Mode::Apply)
            .allowed()
    );
    let made: Vec<usize> = capacities().into_iter().filter(|&c| c > 0).collect();
    assert_eq!(made.len(), 1, "one key, one table");
    let per_shard = store.inner.per_shard;
    assert!(made[0] >= per_shard, "{} for {per_shard}", made[0]);
    // Four times the store's bound in keys: every shard made, the bound
    // held.
    for i in 0..4 * 64 * 1024 {
        store.decide_one(&Op::new(&rule, &format!("k{i}")), 1, Mode::Apply);
    }
    assert!(capacities().iter().all(|&c| c > 0), "{:?}", capacities());
    let held: usize = store
        .inner
        .shards
        .iter()
        .map(|c| c.lock.read().map.len())
        .sum();
    assert!(held <= 64 * 1024, "{held}");
}

/// A ban held from a shared store refuses the key locally until it ends.
#[test]
fn a_held_ban_refuses_until_it_ends() {
    let rule = Rule::builder("r")
        .algorithm(Kind::FixedWindow)
        .limit(10, Duration::from_secs(60))
        .build()
        .unwrap();
    let clock = crate::clock::ManualClock::new(1_000_000);
    let store = MemoryStore::builder().clock(clock.clone()).build();
    let op = Op::new(&rule, "k");
    store.hold_ban(&op, Micros::from_secs(30));
    let v = store.decide_one(&op, 1, Mode::Apply);
    assert_eq!(v.reason, Some(crate::rule::Reason::Banned));
    assert_eq!(v.check.retry_after, Micros::from_secs(30));
    clock.advance(Duration::from_secs(30));
    assert!(store.decide_one(&op, 1, Mode::Apply).allowed());
}

#[test]
fn layout_fills_tables_and_never_exceeds_max_keys() {
    for max in [1, 100, 5_000, 40_000, 1_000_000, 1 << 20, 10_000_000] {
        let (shards, per) = layout(max);
        assert!(shards * per <= max, "{max}");
        assert!(shards * per >= max * 9 / 10, "{max}: {shards} × {per}");
    }
    let (shards, per) = layout(1_000_000);
    let load = (shards * per) as f64 / (shards * buckets(per)) as f64;
    assert!(load > 0.8, "1M keys: {shards} shards, load {load}");
}

#[test]
fn slots_stay_small() {
    assert_eq!(std::mem::size_of::<(u64, Slot)>(), 48);
}
