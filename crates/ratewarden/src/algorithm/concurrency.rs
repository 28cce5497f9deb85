//! `concurrency`: at most `limit` requests in flight per key.
//!
//! A request admitted takes a *lease* of its cost; the lease is released
//! when the request ends (the response is sent, or the client goes away).
//! A holder that never releases (a crashed gateway, a lost connection to
//! Redis) would hold its slot for ever, so every lease lapses `max_hold`
//! after it was taken: then it no longer counts.
//!
//! Time does not free a slot, a request's end does, so no one can say when
//! the next request would fit. A rejection's `retry_after` is therefore a
//! hint: one second (`RETRY_HINT`), or sooner if a lease lapses sooner.
//! `reset_after` is when every current lease will have lapsed, the latest
//! moment the key is sure to be free.

use std::collections::VecDeque;

use std::num::NonZeroU64;

use super::{Algorithm, Check, NEVER, ParamError, ScriptState};
use crate::clock::Micros;

/// What `retry_after` says when a slot may free at any moment.
pub const RETRY_HINT: Micros = Micros::from_secs(1);

/// Parameters: `limit` slots, each lease lapsing after `max_hold`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Concurrency {
    limit: u64,
    max_hold: Micros,
}

/// One slot held: by lease `id`, until `expires`, for `cost`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Lease {
    /// The lease's number under its key (1, 2, ...).
    pub id: u64,
    /// When it lapses if not released (µs since the epoch).
    pub expires: Micros,
    /// Slots it holds.
    pub cost: u64,
}

/// The leases held, soonest to lapse first, and the last lease number.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct State {
    /// Leases not released, in the order they lapse (then by id).
    pub leases: VecDeque<Lease>,
    /// The number of the last lease taken.
    pub seq: u64,
}

impl Concurrency {
    /// `limit` (>= 1) requests in flight, each lease lapsing after
    /// `max_hold` (>= 1 µs).
    ///
    /// ```
    /// use std::num::NonZeroU64;
    /// use ratewarden::algorithm::concurrency::{Concurrency, State};
    /// use ratewarden::clock::Micros;
    /// let c = Concurrency::new(NonZeroU64::new(2).unwrap(), Micros::from_secs(60)).unwrap();
    /// let (mut s, now) = (State::default(), Micros::new(5));
    /// c.charge(&mut s, now, 1);
    /// c.charge(&mut s, now, 1);
    /// assert!(!c.check(&s, now, 1).allowed);
    /// c.release(&mut s, 1, 1); // the first request ended
    /// assert!(c.check(&s, now, 1).allowed);
    /// ```
    pub fn new(limit: NonZeroU64, max_hold: Micros) -> Result<Self, ParamError> {
        if max_hold == Micros::ZERO {
            return Err(ParamError("`max_hold` must be at least 1µs"));
        }
        Ok(Self {
            limit: limit.get(),
            max_hold,
        })
    }

    /// Slots held at `now` (lapsed leases no longer count).
    fn held(&self, s: &State, now: Micros) -> u64 {
        s.leases
            .iter()
            .filter(|l| l.expires > now)
            .map(|l| l.cost)
            .sum()
    }

    /// See the [module](self) docs.
    pub fn check(&self, s: &State, now: Micros, cost: u64) -> Check {
        let held = self.held(s, now);
        if cost <= self.limit && held + cost <= self.limit {
            return Check::allow(self.limit - held - cost, self.max_hold);
        }
        let reset = s
            .leases
            .back()
            .map_or(Micros::ZERO, |l| l.expires.saturating_sub(now));
        let retry = if cost > self.limit {
            NEVER
        } else {
            // Sooner than the hint only if enough leases lapse sooner.
            let mut left = held;
            let mut retry = RETRY_HINT;
            for l in s.leases.iter().filter(|l| l.expires > now) {
                left -= l.cost;
                if left + cost <= self.limit {
                    retry = retry.min(l.expires - now);
                    break;
                }
            }
            retry
        };
        Check::deny(self.limit.saturating_sub(held), reset, retry)
    }

    /// Takes a lease of `cost` until `now + max_hold`; its number is then
    /// `s.seq`. Lapsed leases are dropped.
    pub fn charge(&self, s: &mut State, now: Micros, cost: u64) {
        s.leases.retain(|l| l.expires > now);
        s.seq += 1;
        let lease = Lease {
            id: s.seq,
            expires: now.saturating_add(self.max_hold),
            cost,
        };
        let at = s
            .leases
            .partition_point(|l| (l.expires, l.id) < (lease.expires, lease.id));
        s.leases.insert(at, lease);
    }

    /// Releases lease `id` (of `cost`); a lease already lapsed or released
    /// is left alone.
    pub fn release(&self, s: &mut State, id: u64, cost: u64) {
        if let Some(i) = s.leases.iter().position(|l| l.id == id && l.cost == cost) {
            s.leases.remove(i);
        }
    }

    /// Renews lease `id` (of `cost`) to lapse `max_hold` from `now`: its
    /// holder is still there (a stream or a tunnel still open). A lease
    /// already lapsed or released is left alone: a holder that lost its
    /// slot does not get it back.
    pub fn renew(&self, s: &mut State, id: u64, cost: u64, now: Micros) {
        let Some(i) = s
            .leases
            .iter()
            .position(|l| l.id == id && l.cost == cost && l.expires > now)
        else {
            return;
        };
        let mut lease = s.leases.remove(i).expect("found");
        lease.expires = now.saturating_add(self.max_hold);
        let at = s
            .leases
            .partition_point(|l| (l.expires, l.id) < (lease.expires, lease.id));
        s.leases.insert(at, lease);
    }

    /// See the [module](super) docs: when the last lease lapses.
    pub fn idle_at(&self, s: &State) -> Micros {
        s.leases.back().map_or(Micros::ZERO, |l| l.expires)
    }
}

impl Algorithm for Concurrency {
    type State = State;
    fn check(&self, s: &State, now: Micros, cost: u64) -> Check {
        Concurrency::check(self, s, now, cost)
    }
    fn charge(&self, s: &mut State, now: Micros, cost: u64) {
        Concurrency::charge(self, s, now, cost)
    }
    fn idle_at(&self, s: &State) -> Micros {
        Concurrency::idle_at(self, s)
    }
    fn release(&self, s: &mut State, lease: u64, cost: u64) {
        Concurrency::release(self, s, lease, cost)
    }
    fn renew(&self, s: &mut State, lease: u64, cost: u64, now: Micros) {
        Concurrency::renew(self, s, lease, cost, now)
    }
    fn lease(s: &State) -> Option<u64> {
        Some(s.seq)
    }
    fn script_params(&self) -> [u64; 4] {
        [self.limit, self.max_hold.get(), RETRY_HINT.get(), 0]
    }
    /// `s1` the slots held, `s2` the last lease number; one zset member per
    /// lease, scored by when it lapses.
    fn to_script(s: &State) -> ScriptState {
        ScriptState {
            words: [s.leases.iter().map(|l| l.cost).sum(), s.seq, 0],
            log: s
                .leases
                .iter()
                .map(|l| (l.expires.get(), l.id, l.cost))
                .collect(),
        }
    }
    fn from_script(s: &ScriptState) -> State {
        State {
            leases: s
                .log
                .iter()
                .map(|&(expires, id, cost)| Lease {
                    id,
                    expires: Micros::new(expires),
                    cost,
                })
                .collect(),
            seq: s.words[1],
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const fn us(n: u64) -> Micros {
        Micros::new(n)
    }
    fn conc(limit: u64, hold: u64) -> Concurrency {
        Concurrency::new(NonZeroU64::new(limit).unwrap(), us(hold)).unwrap()
    }

    #[test]
    fn a_lease_nobody_releases_lapses_after_max_hold() {
        let c = conc(1, 10_000_000);
        let mut s = State::default();
        c.charge(&mut s, us(0), 1);
        assert!(!c.check(&s, us(9_999_999), 1).allowed);
        assert!(c.check(&s, us(10_000_000), 1).allowed);
        assert_eq!(c.idle_at(&s), us(10_000_000));
    }

    #[test]
    fn retry_is_a_hint_unless_a_lease_lapses_sooner() {
        let c = conc(1, 10_000_000);
        let mut s = State::default();
        c.charge(&mut s, us(0), 1);
        let early = c.check(&s, us(1), 1);
        assert_eq!(
            (early.retry_after, early.reset_after),
            (RETRY_HINT, us(9_999_999))
        );
        assert_eq!(c.check(&s, us(9_500_000), 1).retry_after, us(500_000));
        assert_eq!(c.check(&s, us(0), 2).retry_after, NEVER);
    }

    #[test]
    fn release_frees_exactly_that_lease() {
        let c = conc(3, 10_000_000);
        let mut s = State::default();
        for t in [0, 1, 2] {
            c.charge(&mut s, us(t), 1);
        }
        c.release(&mut s, 2, 1);
        c.release(&mut s, 2, 1); // twice: no effect
        c.release(&mut s, 9, 1); // unknown: no effect
        let ids: Vec<u64> = s.leases.iter().map(|l| l.id).collect();
        assert_eq!(ids, [1, 3]);
        assert_eq!(c.check(&s, us(5), 1).remaining, 0);
    }
}
