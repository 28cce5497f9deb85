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

use std::num::NonZeroU64;

use super::{Algorithm, Check, NEVER, ParamError, ScriptState};
use crate::clock::Micros;

/// Parameters: `limit` per `window`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SlidingWindowCounter {
    limit: u64,
    window: Micros,
    /// A tick of elapsed time: a millisecond, or a microsecond.
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
    /// use std::num::NonZeroU64;
    /// use ratewarden::algorithm::sliding_window_counter::{SlidingWindowCounter, State};
    /// use ratewarden::clock::Micros;
    /// let c = SlidingWindowCounter::new(NonZeroU64::new(10).unwrap(), Micros::from_secs(60)).unwrap();
    /// // 10 in the previous minute; a quarter into this one, 7.5 of them still count.
    /// let s = State { start: Micros::from_secs(60), prev: 10, cur: 0 };
    /// let at = Micros::from_secs(75);
    /// assert_eq!(c.check(&s, at, 2).remaining, 0);
    /// assert!(!c.check(&s, at, 3).allowed);
    /// ```
    pub fn new(limit: NonZeroU64, window: Micros) -> Result<Self, ParamError> {
        if window == Micros::ZERO {
            return Err(ParamError("`window` must be at least 1µs"));
        }
        let ms = Micros::from_millis(1);
        let tick = if window % ms == Micros::ZERO {
            ms
        } else {
            Micros::new(1)
        };
        Ok(Self {
            limit: limit.get(),
            window,
            tick,
        })
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
            start + self.tick * e - now
        } else {
            // This window is full: wait into the next, where `cur` becomes the
            // previous count.
            let room = self.limit - cost;
            let e = w - room * w / cur;
            start + self.window + self.tick * e - now
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
        s.start + self.window * 2
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
    /// Off the current window's count first, then the previous one's:
    /// exact within the window the cost was charged in.
    fn refund(&self, s: &mut State, now: Micros, cost: u64) {
        let (start, _, prev, cur) = self.roll(s, now);
        let from_cur = cur.min(cost);
        *s = State {
            start,
            prev: prev.saturating_sub(cost - from_cur) as u32,
            cur: (cur - from_cur) as u32,
        };
    }
    fn idle_at(&self, s: &State) -> Micros {
        SlidingWindowCounter::idle_at(self, s)
    }
    fn script_params(&self) -> [u64; 4] {
        [self.limit, self.window.get(), self.tick.get(), 0]
    }
    fn to_script(s: &State) -> ScriptState {
        ScriptState {
            words: [s.start.get(), u64::from(s.prev), u64::from(s.cur)],
            log: vec![],
        }
    }
    fn from_script(s: &ScriptState) -> State {
        State {
            start: Micros::new(s.words[0]),
            prev: s.words[1] as u32,
            cur: s.words[2] as u32,
        }
    }
    fn to_mirror(s: &State) -> Option<[u64; 2]> {
        Some([s.start.get(), u64::from(s.prev) << 32 | u64::from(s.cur)])
    }
    fn from_mirror(w: [u64; 2]) -> State {
        State {
            start: Micros::new(w[0]),
            prev: (w[1] >> 32) as u32,
            cur: w[1] as u32,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const W: Micros = Micros::from_secs(1);
    const fn us(n: u64) -> Micros {
        Micros::new(n)
    }
    fn swc(limit: u64) -> SlidingWindowCounter {
        SlidingWindowCounter::new(NonZeroU64::new(limit).unwrap(), W).unwrap()
    }

    #[test]
    fn retry_after_is_the_first_instant_the_estimate_fits() {
        let c = swc(10);
        let s = State {
            start: W,
            prev: 10,
            cur: 5,
        };
        let now = W + us(100_000);
        let r = c.check(&s, now, 1);
        assert!(!r.allowed);
        let at = now + r.retry_after;
        assert!(c.check(&s, at, 1).allowed);
        assert!(!c.check(&s, at - us(1), 1).allowed);
    }

    #[test]
    fn full_current_window_waits_into_the_next() {
        let c = swc(4);
        let mut s = State::default();
        for _ in 0..4 {
            c.charge(&mut s, us(10), 1);
        }
        let r = c.check(&s, us(10), 1);
        let at = us(10) + r.retry_after;
        assert!(at > W);
        assert!(c.check(&s, at, 1).allowed);
        assert!(!c.check(&s, at - us(1), 1).allowed);
    }

    #[test]
    fn a_window_two_back_is_forgotten() {
        let c = swc(2);
        let mut s = State::default();
        c.charge(&mut s, us(0), 2);
        assert_eq!(c.idle_at(&s), W * 2);
        assert_eq!(c.check(&s, W * 2, 1).remaining, 1);
    }
}
