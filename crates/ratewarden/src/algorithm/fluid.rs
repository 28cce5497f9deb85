//! Exact integer arithmetic for a level that drains continuously at
//! `limit / window` (shared by `token_bucket` and `leaky_bucket`).
//!
//! One token is `unit = window / g` fluid units and one microsecond drains
//! `rate = limit / g` units, with `g = gcd(window, limit)`. Everything stays an
//! integer, so a fractional token is represented exactly, and the numbers stay
//! small enough for Lua doubles (the rule validator checks `capacity <= 2^53`).

use crate::clock::Micros;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Fluid {
    /// Units per token.
    pub unit: u64,
    /// Units drained per microsecond.
    pub rate: u64,
    /// Units held when full (`burst` tokens).
    pub capacity: u64,
}

fn gcd(mut a: u64, mut b: u64) -> u64 {
    while b != 0 {
        (a, b) = (b, a % b);
    }
    a
}

impl Fluid {
    pub(super) fn new(limit: u64, window: Micros, burst: u64) -> Self {
        let g = gcd(window.get(), limit);
        let unit = window.get() / g;
        Self {
            unit,
            rate: limit / g,
            capacity: burst.saturating_mul(unit),
        }
    }

    /// The level `elapsed` after it was `level`.
    pub(super) fn drain(&self, level: u64, elapsed: Micros) -> u64 {
        // Capping `elapsed` at the time a full bucket takes to drain keeps the
        // product below capacity + rate: no overflow, here or in Lua.
        let cap = self.capacity.div_ceil(self.rate);
        level.saturating_sub(elapsed.get().min(cap) * self.rate)
    }

    /// The time `units` take to drain, rounded up to the microsecond.
    pub(super) fn time_for(&self, units: u64) -> Micros {
        Micros::new(units.div_ceil(self.rate))
    }

    /// Units of `cost` tokens.
    pub(super) fn units(&self, cost: u64) -> u64 {
        cost.saturating_mul(self.unit)
    }

    /// Whole tokens in `units`, rounded down.
    pub(super) fn tokens(&self, units: u64) -> u64 {
        units / self.unit
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn units_are_reduced_by_the_gcd() {
        let f = Fluid::new(1_000, Micros::from_secs(60), 1_000);
        assert_eq!((f.unit, f.rate), (60_000, 1));
        let f = Fluid::new(7, Micros::from_secs(60), 7);
        assert_eq!((f.unit, f.rate), (60_000_000, 7));
        assert_eq!(f.capacity, 420_000_000);
    }

    #[test]
    fn drain_saturates_at_empty_without_overflow() {
        let f = Fluid::new(7, Micros::from_secs(60), 7);
        assert_eq!(f.drain(100, Micros::MAX), 0);
        assert_eq!(f.drain(100, Micros::new(10)), 30);
    }
}
