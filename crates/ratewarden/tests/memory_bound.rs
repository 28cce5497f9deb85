//! The memory store never holds more than `max_keys`, whatever is thrown at it.

use std::time::Duration;

use ratewarden::algorithm::Kind;
use ratewarden::clock::ManualClock;
use ratewarden::{MemoryStore, Mode, Op, Rule};

#[test]
fn spraying_ten_times_max_keys_stays_within_max_keys() {
    for (max_keys, kind) in [
        (5_000, Kind::Gcra),
        (5_000, Kind::SlidingWindowLog),
        (100, Kind::FixedWindow),
        (70_000, Kind::TokenBucket),
    ] {
        let clock = ManualClock::new(1_700_000_000_000_000);
        let store = MemoryStore::builder()
            .max_keys(max_keys)
            .clock(clock.clone())
            .build();
        let rule = Rule::builder("spray")
            .algorithm(kind)
            .limit(10, Duration::from_secs(3600))
            .build()
            .unwrap();
        let mut peak = 0;
        for i in 0..10 * max_keys {
            let key = format!("attacker-{i}");
            let v = store.decide_now(&[Op::new(&rule, &key)], 1, Mode::Apply);
            assert!(v[0].allowed(), "a new key always starts fresh");
            if i % 97 == 0 {
                peak = peak.max(store.len());
                clock.advance(Duration::from_millis(1));
            }
        }
        peak = peak.max(store.len());
        assert!(peak <= max_keys, "{kind}: {peak} > {max_keys}");
        assert!(
            peak >= max_keys / 2,
            "{kind}: the bound is used, not bypassed ({peak})"
        );
    }
}

#[test]
fn a_busy_key_survives_a_spray_of_idle_ones() {
    let clock = ManualClock::new(1_700_000_000_000_000);
    let store = MemoryStore::builder()
        .max_keys(1_000)
        .clock(clock.clone())
        .build();
    let rule = Rule::builder("r")
        .algorithm(Kind::Gcra)
        .limit(10, Duration::from_secs(60))
        .build()
        .unwrap();
    let busy = Op::new(&rule, "busy");
    for _ in 0..10 {
        assert!(store.decide_now(&[busy], 1, Mode::Apply)[0].allowed());
    }
    for i in 0..20_000 {
        let key = i.to_string();
        store.decide_now(&[Op::new(&rule, &key)], 1, Mode::Apply);
    }
    // The busy key's state (the furthest from expiring) was kept.
    assert!(!store.decide_now(&[busy], 1, Mode::Apply)[0].allowed());
}

#[test]
fn idle_keys_expire_and_are_purged() {
    let clock = ManualClock::new(1_700_000_000_000_000);
    let store = MemoryStore::builder().clock(clock.clone()).build();
    let rule = Rule::builder("r")
        .algorithm(Kind::FixedWindow)
        .limit(10, Duration::from_secs(60))
        .build()
        .unwrap();
    for i in 0..500 {
        let key = i.to_string();
        store.decide_now(&[Op::new(&rule, &key)], 1, Mode::Apply);
    }
    assert_eq!(store.len(), 500);
    clock.advance(Duration::from_secs(60));
    assert_eq!(store.purge_expired(), 500);
    assert!(store.is_empty());
}
