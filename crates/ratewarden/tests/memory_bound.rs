//! The memory store never holds more than `max_keys`, whatever is thrown at it.

use std::time::Duration;

use ratewarden::algorithm::Kind;
use ratewarden::clock::ManualClock;
use ratewarden::{MemoryStore, Mode, Op, Reason, Rule};

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

/// A flood of new keys on another rule (10× `max_keys`, each a fresh
/// state of a day-long rule) never evicts a ban nor a key at its limit:
/// both still refuse afterwards, though both expire sooner than the
/// flood's keys (the store used to give up the soonest to expire first,
/// and lost a ban to 1,200 requests of `/search?q=sprayN`).
#[test]
fn a_flood_of_new_keys_never_evicts_a_ban_or_a_key_at_its_limit() {
    let clock = ManualClock::new(1_700_000_000_000_000);
    let max_keys = 1_000;
    let store = MemoryStore::builder()
        .max_keys(max_keys)
        .clock(clock.clone())
        .build();
    let login = Rule::builder("login")
        .algorithm(Kind::FixedWindow)
        .limit(3, Duration::from_secs(60))
        .penalty(ratewarden::Penalty::fixed(Duration::from_secs(3600)))
        .build()
        .unwrap();
    let api = Rule::builder("api")
        .algorithm(Kind::SlidingWindowLog)
        .limit(2, Duration::from_secs(60))
        .build()
        .unwrap();
    // Each spray key lives a day: longer than the ban and the limit, so a
    // store that gave up the soonest to expire gave those up first.
    let search = Rule::builder("search")
        .algorithm(Kind::SlidingWindowLog)
        .limit(100, Duration::from_secs(86_400))
        .build()
        .unwrap();
    let victim = Op::new(&login, "mallory");
    for _ in 0..3 {
        assert!(store.decide_one(&victim, 1, Mode::Apply).allowed());
    }
    let v = store.decide_one(&victim, 1, Mode::Apply);
    assert_eq!(v.reason, Some(Reason::Limit), "the fourth starts the ban");
    let full = Op::new(&api, "busy");
    for _ in 0..2 {
        assert!(store.decide_one(&full, 1, Mode::Apply).allowed());
    }
    assert!(!store.decide_one(&full, 1, Mode::Apply).allowed());
    let mut peak = 0;
    for i in 0..10 * max_keys {
        let key = format!("spray{i}");
        let v = store.decide_one(&Op::new(&search, &key), 1, Mode::Apply);
        assert!(v.allowed(), "a spray key carries little: room is made");
        if i % 50 == 0 {
            peak = peak.max(store.len());
            clock.advance(Duration::from_millis(10));
        }
    }
    assert!(peak <= max_keys, "{peak}");
    let v = store.decide_one(&victim, 1, Mode::Apply);
    assert_eq!(v.reason, Some(Reason::Banned), "the ban held");
    let v = store.decide_one(&full, 1, Mode::Apply);
    assert_eq!(v.reason, Some(Reason::Limit), "the key at its limit held");
}

/// The lightest states go first: of two keys of one rule, the one that
/// used more of its allowance stays, though it expires sooner.
#[test]
fn the_lightest_state_is_evicted_first() {
    let clock = ManualClock::new(1_700_000_000_000_000);
    let store = MemoryStore::builder()
        .max_keys(1_000)
        .clock(clock.clone())
        .build();
    let rule = Rule::builder("r")
        .algorithm(Kind::SlidingWindowLog)
        .limit(10, Duration::from_secs(60))
        .build()
        .unwrap();
    let heavy = Op::new(&rule, "heavy");
    for _ in 0..9 {
        assert!(store.decide_one(&heavy, 1, Mode::Apply).allowed());
    }
    // Sprayed later, so each expires after `heavy`, each 1 of 10 used.
    clock.advance(Duration::from_secs(1));
    for i in 0..5_000 {
        store.decide_one(&Op::new(&rule, &i.to_string()), 1, Mode::Apply);
    }
    let v = store.decide_one(&heavy, 1, Mode::Apply);
    assert!(v.allowed());
    assert_eq!(v.check.remaining, 0, "its nine uses were kept");
}

/// A store whose every slot is banned or at its limit refuses a new key
/// (`store_full`) rather than forget one of them, holds `max_keys`, and
/// takes new keys again once those lapse; a flood of new keys meanwhile
/// does not rescan the shard for each (they are refused until the first
/// lapses).
#[test]
fn a_store_full_of_protected_keys_refuses_new_ones_until_they_lapse() {
    let clock = ManualClock::new(1_700_000_000_000_000);
    let max_keys = 1_024;
    let store = MemoryStore::builder()
        .max_keys(max_keys)
        .clock(clock.clone())
        .build();
    // Limit 1: each key is at its limit after one request.
    let one = Rule::builder("one")
        .algorithm(Kind::FixedWindow)
        .limit(1, Duration::from_secs(60))
        .build()
        .unwrap();
    let (mut admitted, mut full) = (0, 0);
    for i in 0..2 * max_keys {
        let v = store.decide_one(&Op::new(&one, &format!("k{i}")), 1, Mode::Apply);
        match v.reason {
            None => admitted += 1,
            Some(Reason::Full) => {
                full += 1;
                assert!(v.check.retry_after >= ratewarden::clock::Micros::from_secs(1));
            }
            other => panic!("{other:?}"),
        }
    }
    assert_eq!(
        admitted, max_keys,
        "the store held max_keys, each at its limit"
    );
    assert_eq!(full, max_keys);
    assert!(store.len() <= max_keys);
    // Every one of them still refuses.
    for i in 0..max_keys {
        let v = store.decide_one(&Op::new(&one, &format!("k{i}")), 1, Mode::Apply);
        assert_eq!(v.reason, Some(Reason::Limit), "k{i}");
    }
    // The window ends: they lapse, and new keys are taken again.
    clock.advance(Duration::from_secs(60));
    assert!(
        store
            .decide_one(&Op::new(&one, "late"), 1, Mode::Apply)
            .allowed()
    );
}
