//! `leaky_bucket`: a queue of capacity `burst` drained at `limit / window`.
//!
//! In `reject` mode a request that does not fit in the queue is rejected. In
//! `delay` mode it is admitted and told how long to wait before being
//! forwarded: the time the queue ahead of it takes to drain, as nginx
//! `limit_req` without `nodelay` does. A wait longer than `max_delay` is a
//! rejection instead.

use super::fluid::Fluid;
use std::num::NonZeroU64;

use super::{Algorithm, Check, NEVER, ParamError, ScriptState};
use crate::clock::Micros;

/// Parameters: queue of `burst`, drained at `limit` per `window`, optional delay.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LeakyBucket {
    fluid: Fluid,
    /// `Some(max_delay)` in delay mode.
    max_delay: Option<Micros>,
}

/// Queue level (in fluid units) at time `last`.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct State {
    /// Units in the queue at `last`.
    pub level: u64,
    /// When `level` was computed (µs since the epoch).
    pub last: Micros,
}

impl LeakyBucket {
    /// Reject mode: a queue of `burst` drained at `limit` per `window`.
    pub fn new(limit: NonZeroU64, window: Micros, burst: NonZeroU64) -> Result<Self, ParamError> {
        if window == Micros::ZERO {
            return Err(ParamError("`window` must be at least 1µs"));
        }
        Ok(Self {
            fluid: Fluid::new(limit.get(), window, burst.get()),
            max_delay: None,
        })
    }

    /// Delay mode: requests wait for the queue ahead of them, at most `max_delay` µs.
    ///
    /// ```
    /// use std::num::NonZeroU64;
    /// use ratewarden::algorithm::leaky_bucket::{LeakyBucket, State};
    /// use ratewarden::clock::Micros;
    /// // 10 per second, queue of 5, wait at most 1 s.
    /// let n = |v| NonZeroU64::new(v).unwrap();
    /// let second = Micros::from_secs(1);
    /// let lb = LeakyBucket::delayed(n(10), second, n(5), second).unwrap();
    /// let mut s = State::default();
    /// let delays: Vec<u64> = (0..3)
    ///     .map(|_| {
    ///         let c = lb.check(&s, Micros::ZERO, 1);
    ///         lb.charge(&mut s, Micros::ZERO, 1);
    ///         c.delay.get()
    ///     })
    ///     .collect();
    /// assert_eq!(delays, [0, 100_000, 200_000]);
    /// ```
    pub fn delayed(
        limit: NonZeroU64,
        window: Micros,
        burst: NonZeroU64,
        max_delay: Micros,
    ) -> Result<Self, ParamError> {
        Ok(Self {
            max_delay: Some(max_delay),
            ..Self::new(limit, window, burst)?
        })
    }

    fn level_at(&self, s: &State, now: Micros) -> u64 {
        self.fluid.drain(s.level, now.saturating_sub(s.last))
    }

    /// See the [module](super) docs.
    pub fn check(&self, s: &State, now: Micros, cost: u64) -> Check {
        let f = &self.fluid;
        let level = self.level_at(s, now);
        let need = f.units(cost);
        let fits = level + need <= f.capacity;
        // In delay mode the request leaves once the queue ahead has drained.
        let delay = match self.max_delay {
            Some(_) => f.time_for(level),
            None => Micros::ZERO,
        };
        let delay_ok = self.max_delay.is_none_or(|max| delay <= max);
        if fits && delay_ok {
            let after = level + need;
            let mut c = Check::allow(f.tokens(f.capacity - after), f.time_for(after));
            c.delay = delay;
            c
        } else {
            let retry = if need > f.capacity {
                NEVER
            } else {
                let over_capacity = (level + need).saturating_sub(f.capacity);
                let over_delay = match self.max_delay {
                    Some(max) => level.saturating_sub(max.get().saturating_mul(f.rate)),
                    None => 0,
                };
                f.time_for(over_capacity.max(over_delay))
            };
            Check::deny(f.tokens(f.capacity - level), f.time_for(level), retry)
        }
    }

    /// See the [module](super) docs.
    pub fn charge(&self, s: &mut State, now: Micros, cost: u64) {
        let level = self.level_at(s, now);
        s.level = (level.saturating_add(self.fluid.units(cost))).min(self.fluid.capacity);
        s.last = now.max(s.last);
    }

    /// See the [module](super) docs.
    pub fn idle_at(&self, s: &State) -> Micros {
        s.last + self.fluid.time_for(s.level)
    }
}

impl Algorithm for LeakyBucket {
    type State = State;
    fn check(&self, s: &State, now: Micros, cost: u64) -> Check {
        LeakyBucket::check(self, s, now, cost)
    }
    fn charge(&self, s: &mut State, now: Micros, cost: u64) {
        LeakyBucket::charge(self, s, now, cost)
    }
    /// Out of the queue, down to empty: exact.
    fn refund(&self, s: &mut State, now: Micros, cost: u64) {
        s.level = self.level_at(s, now).saturating_sub(self.fluid.units(cost));
        s.last = now.max(s.last);
    }
    fn idle_at(&self, s: &State) -> Micros {
        LeakyBucket::idle_at(self, s)
    }
    /// `p4` is the delay bound, `u64::MAX` in reject mode (sent as -1).
    fn script_params(&self) -> [u64; 4] {
        let f = &self.fluid;
        [
            f.unit,
            f.rate,
            f.capacity,
            self.max_delay.map_or(u64::MAX, Micros::get),
        ]
    }
    fn to_script(s: &State) -> ScriptState {
        ScriptState {
            words: [s.level, s.last.get(), 0],
            log: vec![],
        }
    }
    fn from_script(s: &ScriptState) -> State {
        State {
            level: s.words[0],
            last: Micros::new(s.words[1]),
        }
    }
    fn to_mirror(s: &State) -> Option<[u64; 2]> {
        Some([s.level, s.last.get()])
    }
    fn from_mirror(w: [u64; 2]) -> State {
        State {
            level: w[0],
            last: Micros::new(w[1]),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const fn us(n: u64) -> Micros {
        Micros::new(n)
    }
    fn n(v: u64) -> NonZeroU64 {
        NonZeroU64::new(v).unwrap()
    }

    #[test]
    fn reject_mode_rejects_when_full_and_drains_at_rate() {
        let lb = LeakyBucket::new(n(2), us(1_000_000), n(2)).unwrap();
        let mut s = State::default();
        lb.charge(&mut s, us(0), 1);
        lb.charge(&mut s, us(0), 1);
        let c = lb.check(&s, us(0), 1);
        assert!(!c.allowed);
        assert_eq!(c.retry_after, us(500_000));
        assert!(lb.check(&s, us(500_000), 1).allowed);
        assert_eq!(lb.check(&s, us(0), 3).retry_after, NEVER);
    }

    #[test]
    fn delay_mode_is_bounded_by_max_delay() {
        // 1 per second, queue of 10, but wait at most 2 s.
        let lb = LeakyBucket::delayed(n(1), us(1_000_000), n(10), us(2_000_000)).unwrap();
        let mut s = State::default();
        let mut delays = vec![];
        for _ in 0..4 {
            let c = lb.check(&s, us(0), 1);
            if c.allowed {
                lb.charge(&mut s, us(0), 1);
                delays.push(c.delay);
            } else {
                assert_eq!(c.retry_after, us(1_000_000));
            }
        }
        assert_eq!(delays, [us(0), us(1_000_000), us(2_000_000)]);
    }
}
