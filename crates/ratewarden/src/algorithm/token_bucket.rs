//! `token_bucket`: capacity `burst`, refilled continuously at `limit / window`.
//!
//! The state is how far the bucket is from full at a time; the refill since
//! then is computed when the next request arrives (no timers). Storing the
//! deficit rather than the token count makes the fresh state (all zeros) a full
//! bucket, so a forgotten key and a new key read the same.

use super::fluid::Fluid;
use std::num::NonZeroU64;

use super::{Algorithm, Check, NEVER, ParamError, ScriptState};
use crate::clock::Micros;

/// Parameters: `burst` tokens, `limit` tokens added per `window`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TokenBucket {
    fluid: Fluid,
}

/// Deficit (in fluid units) at time `last`.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct State {
    /// Units missing from a full bucket at `last`.
    pub deficit: u64,
    /// When `deficit` was computed (µs since the epoch).
    pub last: Micros,
}

impl TokenBucket {
    /// A bucket of `burst` tokens refilled at `limit` per `window` µs.
    ///
    /// ```
    /// use std::num::NonZeroU64;
    /// use ratewarden::algorithm::token_bucket::{State, TokenBucket};
    /// use ratewarden::clock::Micros;
    /// // 2 tokens per second, bucket of 2.
    /// let two = NonZeroU64::new(2).unwrap();
    /// let tb = TokenBucket::new(two, Micros::from_secs(1), two).unwrap();
    /// let mut s = State::default();
    /// tb.charge(&mut s, Micros::ZERO, 2);
    /// let c = tb.check(&s, Micros::ZERO, 1);
    /// assert!(!c.allowed);
    /// assert_eq!(c.retry_after, Micros::from_millis(500)); // one token every half second
    /// assert!(tb.check(&s, Micros::from_millis(500), 1).allowed);
    /// ```
    pub fn new(limit: NonZeroU64, window: Micros, burst: NonZeroU64) -> Result<Self, ParamError> {
        if window == Micros::ZERO {
            return Err(ParamError("`window` must be at least 1µs"));
        }
        Ok(Self {
            fluid: Fluid::new(limit.get(), window, burst.get()),
        })
    }

    fn deficit_at(&self, s: &State, now: Micros) -> u64 {
        self.fluid.drain(s.deficit, now.saturating_sub(s.last))
    }

    /// See the [module](super) docs.
    pub fn check(&self, s: &State, now: Micros, cost: u64) -> Check {
        let f = &self.fluid;
        let deficit = self.deficit_at(s, now);
        let need = f.units(cost);
        if deficit + need <= f.capacity {
            let after = deficit + need;
            Check::allow(f.tokens(f.capacity - after), f.time_for(after))
        } else {
            let retry = if need > f.capacity {
                NEVER
            } else {
                f.time_for(deficit + need - f.capacity)
            };
            Check::deny(f.tokens(f.capacity - deficit), f.time_for(deficit), retry)
        }
    }

    /// See the [module](super) docs.
    pub fn charge(&self, s: &mut State, now: Micros, cost: u64) {
        let deficit = self.deficit_at(s, now);
        s.deficit = (deficit.saturating_add(self.fluid.units(cost))).min(self.fluid.capacity);
        s.last = now.max(s.last);
    }

    /// See the [module](super) docs.
    pub fn idle_at(&self, s: &State) -> Micros {
        s.last + self.fluid.time_for(s.deficit)
    }
}

impl Algorithm for TokenBucket {
    type State = State;
    fn check(&self, s: &State, now: Micros, cost: u64) -> Check {
        TokenBucket::check(self, s, now, cost)
    }
    fn charge(&self, s: &mut State, now: Micros, cost: u64) {
        TokenBucket::charge(self, s, now, cost)
    }
    /// Tokens back, up to a full bucket: exact.
    fn refund(&self, s: &mut State, now: Micros, cost: u64) {
        s.deficit = self
            .deficit_at(s, now)
            .saturating_sub(self.fluid.units(cost));
        s.last = now.max(s.last);
    }
    fn idle_at(&self, s: &State) -> Micros {
        TokenBucket::idle_at(self, s)
    }
    fn script_params(&self) -> [u64; 4] {
        let f = &self.fluid;
        [f.unit, f.rate, f.capacity, 0]
    }
    fn to_script(s: &State) -> ScriptState {
        ScriptState {
            words: [s.deficit, s.last.get(), 0],
            log: vec![],
        }
    }
    fn from_script(s: &ScriptState) -> State {
        State {
            deficit: s.words[0],
            last: Micros::new(s.words[1]),
        }
    }
    fn to_mirror(s: &State) -> Option<[u64; 2]> {
        Some([s.deficit, s.last.get()])
    }
    fn from_mirror(w: [u64; 2]) -> State {
        State {
            deficit: w[0],
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
    fn tb(limit: u64, window: u64, burst: u64) -> TokenBucket {
        let n = |v| NonZeroU64::new(v).unwrap();
        TokenBucket::new(n(limit), us(window), n(burst)).unwrap()
    }

    #[test]
    fn refills_a_fractional_token_exactly() {
        // 7 per minute: one token every 8_571_428.57 µs.
        let tb = tb(7, 60_000_000, 1);
        let mut s = State::default();
        tb.charge(&mut s, us(0), 1);
        assert!(!tb.check(&s, us(8_571_428), 1).allowed);
        assert_eq!(tb.check(&s, us(8_571_428), 1).retry_after, us(1));
        assert!(tb.check(&s, us(8_571_429), 1).allowed);
    }

    #[test]
    fn bucket_never_exceeds_burst() {
        let tb = tb(10, 1_000_000, 3);
        let s = State::default();
        let c = tb.check(&s, us(5_000_000_000), 1);
        assert_eq!(c.remaining, 2);
        assert!(!tb.check(&s, us(5_000_000_000), 4).allowed);
        assert_eq!(tb.check(&s, us(0), 4).retry_after, NEVER);
    }

    #[test]
    fn forced_charge_empties_but_does_not_go_negative() {
        let tb = tb(1, 1_000_000, 2);
        let mut s = State::default();
        for _ in 0..10 {
            tb.charge(&mut s, us(0), 1);
        }
        assert_eq!(tb.check(&s, us(1_000_000), 1).remaining, 0);
        assert!(tb.check(&s, us(1_000_000), 1).allowed);
        assert_eq!(tb.idle_at(&s), us(2_000_000));
    }
}
