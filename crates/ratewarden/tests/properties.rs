//! Each exact algorithm against a naive reference model over random request
//! sequences. The models keep every admitted request and recount from
//! scratch; the algorithms keep O(1) state (or a pruned log).

use std::num::NonZeroU64;

use proptest::prelude::*;

use ratewarden::algorithm::fixed_window::{self, FixedWindow};
use ratewarden::algorithm::gcra::{self, Gcra};
use ratewarden::algorithm::leaky_bucket::{self, LeakyBucket};
use ratewarden::algorithm::sliding_window_counter::{self, SlidingWindowCounter};
use ratewarden::algorithm::sliding_window_log::{self, SlidingWindowLog};
use ratewarden::algorithm::token_bucket::{self, TokenBucket};
use ratewarden::clock::Micros;

mod fixtures;

fn nz(n: u64) -> NonZeroU64 {
    NonZeroU64::new(n).expect("strategies start at 1")
}

fn us(n: u64) -> Micros {
    Micros::new(n)
}

/// Random requests: (gap since the previous one in µs, cost).
fn requests(max_gap: u64) -> impl Strategy<Value = Vec<(u64, u64)>> {
    prop::collection::vec((0..max_gap, 1u64..4), 1..200)
}

/// Absolute times from gaps, starting at a realistic epoch time.
fn times(reqs: &[(u64, u64)]) -> Vec<(u64, u64)> {
    let mut t = 1_700_000_000_000_000u64;
    reqs.iter()
        .map(|&(gap, cost)| {
            t += gap;
            (t, cost)
        })
        .collect()
}

proptest! {
    #[test]
    fn fixed_window_matches_recount(limit in 1u64..20, window in 1u64..5_000, reqs in requests(2_000)) {
        let fw = FixedWindow::new(nz(limit), us(window)).unwrap();
        let mut s = fixed_window::State::default();
        let mut admitted: Vec<(u64, u64)> = vec![];
        for (now, cost) in times(&reqs) {
            let used: u64 = admitted.iter().filter(|(t, _)| t / window == now / window).map(|(_, c)| c).sum();
            let expect = used + cost <= limit;
            let got = fw.check(&s, us(now), cost);
            prop_assert_eq!(got.allowed, expect);
            if expect {
                prop_assert_eq!(got.remaining, limit - used - cost);
                fw.charge(&mut s, us(now), cost);
                admitted.push((now, cost));
            }
        }
    }

    #[test]
    fn sliding_log_matches_recount_and_retry_after_is_tight(
        limit in 1u64..20, window in 1u64..5_000, reqs in requests(1_000), forced in any::<bool>()
    ) {
        let log = SlidingWindowLog::new(nz(limit), us(window)).unwrap();
        let mut s = sliding_window_log::State::default();
        let mut charged: Vec<(u64, u64)> = vec![];
        let used_at = |charged: &[(u64, u64)], t: u64| -> u64 {
            charged.iter().filter(|(at, _)| at + window > t).map(|(_, c)| c).sum()
        };
        for (now, cost) in times(&reqs) {
            let used = used_at(&charged, now);
            let expect = used + cost <= limit;
            let got = log.check(&s, us(now), cost);
            prop_assert_eq!(got.allowed, expect);
            if !expect && cost <= limit {
                // Not one microsecond too early, not one too late.
                let at = now + got.retry_after.get();
                prop_assert!(used_at(&charged, at) + cost <= limit);
                prop_assert!(used_at(&charged, at - 1) + cost > limit);
            }
            // With `forced`, rejected requests are charged too (count_rejected):
            // the pruned log must still agree with the full recount.
            if expect || forced {
                log.charge(&mut s, us(now), cost);
                charged.push((now, cost));
            }
            prop_assert!(s.entries.len() as u64 <= limit);
        }
    }

    #[test]
    fn sliding_counter_matches_its_formula(limit in 1u64..20, window in prop_oneof![1u64..5_000, (1u64..5).prop_map(|s| s * 1_000)], reqs in requests(2_000)) {
        let c = SlidingWindowCounter::new(nz(limit), us(window)).unwrap();
        let mut s = sliding_window_counter::State::default();
        let mut admitted: Vec<(u64, u64)> = vec![];
        for (now, cost) in times(&reqs) {
            let w = now / window;
            let cur: u64 = admitted.iter().filter(|(t, _)| t / window == w).map(|(_, c)| c).sum();
            let prev: u64 = admitted.iter().filter(|(t, _)| t / window + 1 == w).map(|(_, c)| c).sum();
            // Elapsed time in whole milliseconds when the window is made of them.
            let tick = if window % 1_000 == 0 { 1_000 } else { 1 };
            let (elapsed, w) = (now % window / tick, window / tick);
            // estimate + cost <= limit, multiplied through by the window;
            // counts charged past the limit are not kept (saturation).
            let expect = prev.min(limit) * (w - elapsed) + (cur.min(limit) + cost) * w <= limit * w;
            prop_assert_eq!(c.check(&s, us(now), cost).allowed, expect);
            if expect {
                c.charge(&mut s, us(now), cost);
                admitted.push((now, cost));
            }
        }
    }

    #[test]
    fn token_bucket_matches_a_rational_model(
        limit in 1u64..20, window in 1u64..5_000, burst in 1u64..20, reqs in requests(2_000), forced in any::<bool>()
    ) {
        let tb = TokenBucket::new(nz(limit), us(window), nz(burst)).unwrap();
        let mut s = token_bucket::State::default();
        // Tokens × window, so refill (elapsed × limit) is an integer.
        let cap = burst as u128 * window as u128;
        let mut tokens = cap;
        let mut last: Option<u64> = None;
        for (now, cost) in times(&reqs) {
            if let Some(l) = last {
                tokens = (tokens + (now - l) as u128 * limit as u128).min(cap);
            }
            last = Some(now);
            let need = cost as u128 * window as u128;
            let expect = tokens >= need;
            let got = tb.check(&s, us(now), cost);
            prop_assert_eq!(got.allowed, expect);
            if expect {
                prop_assert_eq!(got.remaining as u128, (tokens - need) / window as u128);
            }
            if expect || forced {
                tb.charge(&mut s, us(now), cost);
                tokens = tokens.saturating_sub(need);
            }
        }
    }

    /// With a whole-microsecond emission interval, GCRA and the leaky bucket
    /// (reject mode) are the token bucket in other clothes: all three must
    /// agree on every request.
    #[test]
    fn gcra_and_leaky_bucket_agree_with_token_bucket(
        limit in 1u64..20, interval in 1u64..300, burst in 1u64..20, reqs in requests(2_000)
    ) {
        let window = limit * interval;
        let tb = TokenBucket::new(nz(limit), us(window), nz(burst)).unwrap();
        let g = Gcra::new(nz(limit), us(window), nz(burst)).unwrap();
        let lb = LeakyBucket::new(nz(limit), us(window), nz(burst)).unwrap();
        let (mut ts, mut gs, mut ls) = (token_bucket::State::default(), gcra::State::default(), leaky_bucket::State::default());
        for (now, cost) in times(&reqs) {
            let (a, b, c) = (tb.check(&ts, us(now), cost), g.check(&gs, us(now), cost), lb.check(&ls, us(now), cost));
            prop_assert_eq!(a.allowed, b.allowed);
            prop_assert_eq!(a.allowed, c.allowed);
            prop_assert_eq!(a.remaining, b.remaining);
            prop_assert_eq!(a.retry_after, b.retry_after);
            prop_assert_eq!(a.retry_after, c.retry_after);
            if a.allowed {
                tb.charge(&mut ts, us(now), cost);
                g.charge(&mut gs, us(now), cost);
                lb.charge(&mut ls, us(now), cost);
            }
        }
    }
}

mod records {
    use proptest::prelude::*;
    use ratewarden::KeyState;
    use ratewarden::clock::Micros;

    use crate::fixtures::{COUNT, rules};

    proptest! {
        /// The memory store answers under a shared lock when `records` says a
        /// commit would change nothing: check that whenever a commit does
        /// change the state, `records` said so. (The converse may fail
        /// harmlessly: a forced charge on a full window saturates.)
        #[test]
        fn records_is_true_whenever_commit_changes_the_state(
            which in 0usize..COUNT, steps in prop::collection::vec((0u64..20_000, 1u64..3, any::<bool>()), 1..80)
        ) {
            let rule = &rules()[which];
            let mut state = KeyState::default();
            let mut now = 1_700_000_000_000_000u64;
            for (gap, cost, other_rule_rejects) in steps {
                now += gap;
                let v = rule.verdict(&state, Micros::new(now), cost);
                let admitted = (v.allowed() || rule.is_shadow()) && !other_rule_rejects;
                let before = state.clone();
                rule.commit(&mut state, Micros::new(now), cost, &v, admitted);
                if state != before {
                    prop_assert!(rule.records(&v, admitted), "{:?} {:?}", v, before);
                }
            }
        }
    }
}
