//! `sliding_window_counter`: the previous window's count, weighted by how much
//! of it still overlaps the rolling window, plus the current window's count.
//! O(1) state; an estimate by design (it assumes the previous window's
//! requests were spread evenly).
//!
//! The comparison `prev × (window − elapsed) / window + cur + cost <= limit` is
//! done multiplied through by `window`, in integers, so there is no rounding.
//! Elapsed time is counted in milliseconds when the window is a whole number of
//! them (it always is when written as `5m` or `500ms`), which keeps those
//! products exact in a Lua double (the rule validator checks `limit × window`).
//! Counts saturate at the limit: a window counted full stays full.

use super::{Algorithm, Check, NEVER, ScriptState};
use crate::clock::Micros;

/// Parameters: `limit` per `window`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SlidingWindowCounter {
    limit: u64,
    window: Micros,
    /// Microseconds per tick of elapsed time (1000 or 1).
    tick: Micros,
}

/// Counts of the window starting at `start` and of the one before it.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct State {
    /// Start of the current window (µs since the epoch).
    pub start: Micros,
    /// Count of the window before `start`.
    pub prev: u32,
    /// Count of the window starting at `start`.
    pub cur: u32,
}

impl SlidingWindowCounter {
    /// `limit` per `window` µs.
    ///
    /// ```
    /// use ratewarden::algorithm::sliding_window_counter::{SlidingWindowCounter, State};
    /// let c = SlidingWindowCounter::new(10, 60_000_000);
    /// // 10 in the previous minute; a quarter into this one, 7.5 of them still count.
    /// let s = State { start: 60_000_000, prev: 10, cur: 0 };
    /// let at = 75_000_000;
    /// assert_eq!(c.check(&s, at, 2).remaining, 0);
    /// assert!(!c.check(&s, at, 3).allowed);
    /// ```
    pub fn new(limit: u64, window: Micros) -> Self {
        assert!(limit >= 1 && window >= 1);
        let tick = if window % 1_000 == 0 { 1_000 } else { 1 };
        Self {
            limit,
            window,
            tick,
        }
    }

    /// `(window start, elapsed, prev, cur)` as seen at `now`.
    fn roll(&self, s: &State, now: Micros) -> (Micros, Micros, u64, u64) {
        let start = now - now % self.window;
        let (prev, cur) = if s.start == start {
            (s.prev, s.cur)
        } else if s.start + self.window == start {
            (s.cur, 0)
        } else {
            (0, 0)
        };
        (start, now - start, u64::from(prev), u64::from(cur))
    }

    /// See the [module](super) docs.
    pub fn check(&self, s: &State, now: Micros, cost: u64) -> Check {
        // All times in ticks from here on; the window is a whole number of them.
        let w = self.window / self.tick;
        let (start, elapsed_us, prev, cur) = self.roll(s, now);
        let elapsed = elapsed_us / self.tick;
        let left_in_window = start + self.window - now;
        // All counts multiplied by the window length in ticks.
        let estimate = prev * (w - elapsed) + cur * w;
        let limit = self.limit * w;
        let need = cost.saturating_mul(w);
        let remaining = |used: u64| limit.saturating_sub(used) / w;
        if cost <= self.limit && estimate + need <= limit {
            return Check::allow(remaining(estimate + need), left_in_window);
        }
        // The first tick `e` (of this window or the next) at which the request
        // fits; it is admitted from the start of that tick.
        let retry = if cost > self.limit {
            NEVER
        } else if cur + cost <= self.limit {
            // Wait in this window until the previous one weighs little enough:
            // the first `e` with prev × (w − e) <= room × w.
            let room = self.limit - cur - cost;
            let e = w - room * w / prev;
            start + e * self.tick - now
        } else {
            // This window is full: wait into the next, where `cur` becomes the
            // previous count.
            let room = self.limit - cost;
            let e = w - room * w / cur;
            start + self.window + e * self.tick - now
        };
        Check::deny(remaining(estimate), left_in_window, retry)
    }

    /// See the [module](super) docs.
    pub fn charge(&self, s: &mut State, now: Micros, cost: u64) {
        let (start, _, prev, cur) = self.roll(s, now);
        // Both counts stay within the limit, which fits in u32.
        *s = State {
            start,
            prev: prev as u32,
            cur: (cur + cost).min(self.limit) as u32,
        };
    }

    /// See the [module](super) docs.
    pub fn idle_at(&self, s: &State) -> Micros {
        s.start + 2 * self.window
    }
}

impl Algorithm for SlidingWindowCounter {
    type State = State;
    fn check(&self, s: &State, now: Micros, cost: u64) -> Check {
        SlidingWindowCounter::check(self, s, now, cost)
    }
    fn charge(&self, s: &mut State, now: Micros, cost: u64) {
        SlidingWindowCounter::charge(self, s, now, cost)
    }
    fn idle_at(&self, s: &State) -> Micros {
        SlidingWindowCounter::idle_at(self, s)
    }
    fn script_params(&self) -> [u64; 4] {
        [self.limit, self.window, self.tick, 0]
    }
    fn to_script(s: &State) -> ScriptState {
        ScriptState {
            words: [s.start, u64::from(s.prev), u64::from(s.cur)],
            log: vec![],
        }
    }
    fn from_script(s: &ScriptState) -> State {
        State {
            start: s.words[0],
            prev: s.words[1] as u32,
            cur: s.words[2] as u32,
        }
    }
    fn to_mirror(s: &State) -> Option<[u64; 2]> {
        Some([s.start, u64::from(s.prev) << 32 | u64::from(s.cur)])
    }
    fn from_mirror(w: [u64; 2]) -> State {
        State {
            start: w[0],
            prev: (w[1] >> 32) as u32,
            cur: w[1] as u32,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const W: Micros = 1_000_000;

    #[test]
    fn retry_after_is_the_first_instant_the_estimate_fits() {
        let c = SlidingWindowCounter::new(10, W);
        let s = State {
            start: W,
            prev: 10,
            cur: 5,
        };
        let now = W + 100_000;
        let r = c.check(&s, now, 1);
        assert!(!r.allowed);
        let at = now + r.retry_after;
        assert!(c.check(&s, at, 1).allowed);
        assert!(!c.check(&s, at - 1, 1).allowed);
    }

    #[test]
    fn full_current_window_waits_into_the_next() {
        let c = SlidingWindowCounter::new(4, W);
        let mut s = State::default();
        for _ in 0..4 {
            c.charge(&mut s, 10, 1);
        }
        let r = c.check(&s, 10, 1);
        let at = 10 + r.retry_after;
        assert!(at > W);
        assert!(c.check(&s, at, 1).allowed);
        assert!(!c.check(&s, at - 1, 1).allowed);
    }

    #[test]
    fn a_window_two_back_is_forgotten() {
        let c = SlidingWindowCounter::new(2, W);
        let mut s = State::default();
        c.charge(&mut s, 0, 2);
        assert_eq!(c.idle_at(&s), 2 * W);
        assert_eq!(c.check(&s, 2 * W, 1).remaining, 1);
    }
}
