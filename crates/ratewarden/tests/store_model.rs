//! The memory store against a plain fold of `Rule::verdict`/`commit` over a
//! map, over random mixes of decisions, peeks, settlements, clears, sweeps and
//! clock steps on keys that share lock-free mirror entries. Whatever path the
//! store answers from (mirror, read lock, write lock), it must answer exactly
//! what the fold does.

use std::collections::HashMap;
use std::time::Duration;

use proptest::prelude::*;
use ratewarden::algorithm::Kind;
use ratewarden::clock::{ManualClock, Micros};
use ratewarden::{KeyState, MemoryStore, Mode, Op, Rule, Settle, Store};

mod fixtures;
use fixtures::{COUNT, rules};

#[derive(Debug, Clone)]
enum Step {
    Decide { key: u8, cost: u64, peek: bool },
    Settle { key: u8, failure: bool },
    Clear { key: u8 },
    Advance(u64),
    Purge,
}

fn step() -> impl Strategy<Value = Step> {
    // 12 keys over one shard's 8 mirror entries: entries are shared and
    // overwritten now and then.
    prop_oneof![
        6 => (0u8..12, 1u64..3, prop::bool::weighted(0.1))
            .prop_map(|(key, cost, peek)| Step::Decide { key, cost, peek }),
        3 => (0u8..12, prop::bool::weighted(0.8)).prop_map(|(key, failure)| Step::Settle { key, failure }),
        1 => (0u8..12).prop_map(|key| Step::Clear { key }),
        2 => (0u64..20_000).prop_map(Step::Advance),
        1 => Just(Step::Purge),
    ]
}

/// The model: the live state of each key, or fresh.
struct Model {
    states: HashMap<u8, (KeyState, Micros)>,
}

impl Model {
    fn live(&mut self, key: u8, now: Micros) -> &mut KeyState {
        let e = self.states.entry(key).or_default();
        if e.1 <= now {
            *e = (KeyState::default(), Micros::ZERO);
        }
        &mut e.0
    }

    fn keep(&mut self, rule: &Rule, key: u8, now: Micros) {
        let e = self.states.get_mut(&key).expect("just touched");
        e.1 = rule.idle_at(&e.0);
        if e.1 <= now {
            self.states.remove(&key);
        }
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(1024))]
    #[test]
    fn memory_store_matches_a_fold_of_verdict_and_commit(
        which in 0usize..COUNT, steps in prop::collection::vec(step(), 1..150)
    ) {
        let rule = &rules()[which];
        let clock = ManualClock::new(1_700_000_000_000_000);
        let store = MemoryStore::builder().max_keys(1024).clock(clock.clone()).build();
        let rt = tokio::runtime::Builder::new_current_thread().build().unwrap();
        let mut model = Model { states: HashMap::new() };
        for s in steps {
            let now = store.now();
            match s {
                Step::Decide { key, cost, peek } => {
                    let k = key.to_string();
                    let mode = if peek { Mode::Peek } else { Mode::Apply };
                    let got = store.decide_now(&[Op::new(rule, &k)], cost, mode);
                    let state = model.live(key, now);
                    let mut want = rule.verdict(state, now, rule.cost(cost));
                    if !peek {
                        let admitted = want.allowed() || rule.is_shadow();
                        rule.commit(state, now, rule.cost(cost), &want, admitted);
                        want.lease = rule.lease_taken(state, &want, admitted);
                    }
                    model.keep(rule, key, now);
                    prop_assert_eq!(got, vec![want], "key {} at {}", key, now);
                }
                Step::Settle { key, failure } => {
                    let k = key.to_string();
                    let how = if failure { Settle::Failure(1) } else { Settle::Success };
                    rt.block_on(store.settle(&[Op::new(rule, &k)], how)).unwrap();
                    if rule.counts_failures() {
                        rule.settle(model.live(key, now), now, rule.cost(1), how);
                        model.keep(rule, key, now);
                    }
                }
                Step::Clear { key } => {
                    let k = key.to_string();
                    let held = rt.block_on(store.clear(Op::new(rule, &k))).unwrap();
                    let was = model.states.remove(&key).is_some_and(|(_, exp)| exp > now);
                    prop_assert_eq!(held, was);
                }
                Step::Advance(us) => clock.advance(Duration::from_micros(us)),
                Step::Purge => {
                    store.purge_expired();
                }
            }
        }
    }
}

/// A rejected hot key is answered from its mirror entry; once eviction drops
/// the key, the store must read it as fresh, not from the stale copy. (The
/// key is refused by its minimum gap, not at its limit: a key at its limit
/// is never evicted for another key's sake.)
#[test]
fn an_evicted_key_is_fresh_even_after_being_answered_lock_free() {
    let clock = ManualClock::new(1_700_000_000_000_000);
    let store = MemoryStore::builder()
        .max_keys(1024)
        .clock(clock.clone())
        .build();
    let short = Rule::builder("short")
        .limit(10, Duration::from_secs(1))
        .min_interval(Duration::from_secs(1))
        .build()
        .unwrap();
    let long = Rule::builder("long")
        .algorithm(Kind::SlidingWindowLog)
        .limit(10, Duration::from_secs(3600))
        .build()
        .unwrap();
    let hot = [Op::new(&short, "hot")];
    assert!(store.decide_now(&hot, 1, Mode::Apply)[0].allowed());
    for _ in 0..3 {
        assert!(!store.decide_now(&hot, 1, Mode::Apply)[0].allowed());
    }
    // Fill the one shard with keys as light (one use of ten) that expire
    // later: "hot" expires soonest, so it is evicted first. The fillers are
    // logs, which are never mirrored, so they cannot overwrite the hot
    // key's mirror entry themselves.
    for i in 0..store.max_keys() + 10 {
        let k = format!("k{i}");
        store.decide_now(&[Op::new(&long, &k)], 1, Mode::Apply);
    }
    assert!(
        store.decide_now(&hot, 1, Mode::Apply)[0].allowed(),
        "an evicted key starts fresh"
    );
}

/// Clearing a key through the admin path forgets its lock-free copy too.
#[test]
fn a_cleared_key_is_fresh_even_after_being_answered_lock_free() {
    let clock = ManualClock::new(1_700_000_000_000_000);
    let store = MemoryStore::builder().clock(clock).build();
    let rule = Rule::builder("r")
        .limit(1, Duration::from_secs(60))
        .build()
        .unwrap();
    let op = [Op::new(&rule, "k")];
    assert!(store.decide_now(&op, 1, Mode::Apply)[0].allowed());
    assert!(!store.decide_now(&op, 1, Mode::Apply)[0].allowed());
    let rt = tokio::runtime::Builder::new_current_thread()
        .build()
        .unwrap();
    assert!(rt.block_on(store.clear(op[0])).unwrap());
    assert!(store.decide_now(&op, 1, Mode::Apply)[0].allowed());
}
