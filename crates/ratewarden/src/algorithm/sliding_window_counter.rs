//! `sliding_window_counter`: the previous window's count, weighted by how much
//! of it still overlaps the rolling window, plus the current window's count.
//! O(1) state; an estimate by design (it assumes the previous window's
//! requests were spread evenly).
//!
//! The comparison `prev × (window − elapsed) / window + cur + cost <= limit` is
//! done multiplied through by `window`, in integers, so there is no rounding.

use super::{Check, NEVER, mul_div_floor};
use crate::clock::Micros;

/// Parameters: `limit` per `window`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SlidingWindowCounter {
    limit: u64,
    window: Micros,
}

/// Counts of the window starting at `start` and of the one before it.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct State {
    /// Start of the current window (µs since the epoch).
    pub start: Micros,
    /// Count of the window before `start`.
    pub prev: u64,
    /// Count of the window starting at `start`.
    pub cur: u64,
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
        Self { limit, window }
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
        (start, now - start, prev, cur)
    }

    /// See the [module](super) docs.
    pub fn check(&self, s: &State, now: Micros, cost: u64) -> Check {
        let w = self.window as u128;
        let (_, elapsed, prev, cur) = self.roll(s, now);
        let left_in_window = self.window - elapsed;
        // All quantities multiplied by the window length.
        let estimate = prev as u128 * left_in_window as u128 + cur as u128 * w;
        let limit = self.limit as u128 * w;
        let need = cost as u128 * w;
        let remaining = |used: u128| (limit.saturating_sub(used) / w) as u64;
        if cost <= self.limit && estimate + need <= limit {
            return Check::allow(remaining(estimate + need), left_in_window);
        }
        let retry = if cost > self.limit {
            NEVER
        } else if cur + cost <= self.limit {
            // Wait in this window until the previous one weighs little enough:
            // the first `e` with prev × (window − e) <= room × window.
            let room = self.limit - cur - cost;
            let e = self.window - mul_div_floor(room, self.window, prev);
            e - elapsed
        } else {
            // This window is full: wait into the next, where `cur` becomes the
            // previous count.
            let room = self.limit - cost;
            let e = self.window - mul_div_floor(room, self.window, cur);
            left_in_window + e
        };
        Check::deny(remaining(estimate), left_in_window, retry)
    }

    /// See the [module](super) docs.
    pub fn charge(&self, s: &mut State, now: Micros, cost: u64) {
        let (start, _, prev, cur) = self.roll(s, now);
        *s = State {
            start,
            prev,
            cur: cur.saturating_add(cost),
        };
    }

    /// See the [module](super) docs.
    pub fn idle_at(&self, s: &State) -> Micros {
        s.start + 2 * self.window
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
