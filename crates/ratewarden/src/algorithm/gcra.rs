//! `gcra`: the generic cell rate algorithm; one timestamp of state per key.
//!
//! Each request of cost `c` moves the key's theoretical arrival time (TAT)
//! `c` emission intervals `T = window / limit` past `max(TAT, now)`; it is
//! admitted while the TAT stays within the tolerance `burst × T` of now.
//! `T` is rounded down to a whole microsecond (as governor rounds to a
//! nanosecond), so `burst` requests always fit at once and the long-run rate
//! errs, by at most 1 µs per request, towards admitting.

use std::num::NonZeroU64;

use super::{Algorithm, Check, NEVER, ParamError, ScriptState};
use crate::clock::Micros;

/// Parameters: emission interval and tolerance.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Gcra {
    /// Emission interval `T`, µs.
    interval: Micros,
    /// `burst × T`, µs.
    tolerance: Micros,
    burst: u64,
}

/// Theoretical arrival time of the next conforming request.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct State {
    /// TAT, µs since the epoch.
    pub tat: Micros,
}

impl Gcra {
    /// `limit` per `window`, `burst` at once; `window / limit` must be at
    /// least 1 µs.
    ///
    /// ```
    /// use std::num::NonZeroU64;
    /// use ratewarden::algorithm::gcra::{Gcra, State};
    /// use ratewarden::clock::Micros;
    /// let n = |v| NonZeroU64::new(v).unwrap();
    /// let g = Gcra::new(n(10), Micros::from_secs(1), n(2)).unwrap(); // 10/s, burst 2
    /// let mut s = State::default();
    /// g.charge(&mut s, Micros::ZERO, 2);
    /// let c = g.check(&s, Micros::ZERO, 1);
    /// assert!(!c.allowed);
    /// assert_eq!(c.retry_after, Micros::from_millis(100));
    /// assert!(Gcra::new(n(10), Micros::new(9), n(1)).is_err());
    /// ```
    pub fn new(limit: NonZeroU64, window: Micros, burst: NonZeroU64) -> Result<Self, ParamError> {
        let interval = window / limit.get();
        if interval == Micros::ZERO {
            return Err(ParamError("gcra needs `window / limit` of at least 1µs"));
        }
        Ok(Self {
            interval,
            tolerance: interval.saturating_mul(burst.get()),
            burst: burst.get(),
        })
    }

    /// See the [module](super) docs.
    pub fn check(&self, s: &State, now: Micros, cost: u64) -> Check {
        let start = s.tat.max(now);
        let new_tat = start.saturating_add(self.interval.saturating_mul(cost));
        let used = start - now;
        if cost <= self.burst && new_tat - now <= self.tolerance {
            Check::allow(
                (self.tolerance - (new_tat - now)) / self.interval,
                new_tat - now,
            )
        } else {
            let retry = if cost > self.burst {
                NEVER
            } else {
                new_tat - now - self.tolerance
            };
            Check::deny(
                self.tolerance.saturating_sub(used) / self.interval,
                used,
                retry,
            )
        }
    }

    /// See the [module](super) docs.
    pub fn charge(&self, s: &mut State, now: Micros, cost: u64) {
        let start = s.tat.max(now);
        let new_tat = start.saturating_add(self.interval.saturating_mul(cost));
        s.tat = new_tat.min(now.saturating_add(self.tolerance));
    }

    /// See the [module](super) docs.
    pub fn idle_at(&self, s: &State) -> Micros {
        s.tat
    }
}

impl Algorithm for Gcra {
    type State = State;
    fn check(&self, s: &State, now: Micros, cost: u64) -> Check {
        Gcra::check(self, s, now, cost)
    }
    fn charge(&self, s: &mut State, now: Micros, cost: u64) {
        Gcra::charge(self, s, now, cost)
    }
    /// The theoretical arrival time moved back, never before now: exact.
    fn refund(&self, s: &mut State, now: Micros, cost: u64) {
        if s.tat > now {
            s.tat = s
                .tat
                .saturating_sub(self.interval.saturating_mul(cost))
                .max(now);
        }
    }
    fn idle_at(&self, s: &State) -> Micros {
        Gcra::idle_at(self, s)
    }
    fn script_params(&self) -> [u64; 4] {
        [self.interval.get(), self.tolerance.get(), self.burst, 0]
    }
    fn to_script(s: &State) -> ScriptState {
        ScriptState {
            words: [s.tat.get(), 0, 0],
            log: vec![],
        }
    }
    fn from_script(s: &ScriptState) -> State {
        State {
            tat: Micros::new(s.words[0]),
        }
    }
    fn to_mirror(s: &State) -> Option<[u64; 2]> {
        Some([s.tat.get(), 0])
    }
    fn from_mirror(w: [u64; 2]) -> State {
        State {
            tat: Micros::new(w[0]),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const fn us(n: u64) -> Micros {
        Micros::new(n)
    }
    fn gcra(limit: u64, window: u64, burst: u64) -> Gcra {
        let n = |v| NonZeroU64::new(v).unwrap();
        Gcra::new(n(limit), us(window), n(burst)).unwrap()
    }

    #[test]
    fn burst_fits_at_once_even_when_the_interval_is_rounded() {
        // 60 s / 7 = 8_571_428.57 µs, rounded down.
        let g = gcra(7, 60_000_000, 7);
        let mut s = State::default();
        let now = us(1_000_000_000);
        for i in 0..7 {
            let c = g.check(&s, now, 1);
            assert!(c.allowed, "request {i}");
            assert_eq!(c.remaining, 6 - i);
            g.charge(&mut s, now, 1);
        }
        assert!(!g.check(&s, now, 1).allowed);
        assert_eq!(g.check(&s, now, 1).retry_after, us(8_571_428));
    }

    #[test]
    fn cost_above_burst_never_fits() {
        let g = gcra(10, 1_000_000, 3);
        assert_eq!(g.check(&State::default(), us(5), 4).retry_after, NEVER);
    }
}
