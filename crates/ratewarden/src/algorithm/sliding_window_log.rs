//! `sliding_window_log`: admit while the cost admitted in `(now − window, now]`
//! plus this request's cost stays within `limit`. Exact.
//!
//! Every charge is its own entry, so two requests in the same microsecond are
//! two entries (seed 004's sorted-set members collapsed when they shared a
//! millisecond score and member).
//!
//! The log never holds more than `limit` entries: when forced charges
//! (`count_rejected`, reported failures) push the sum past the limit, the oldest
//! entries are dropped as long as the newer ones alone still reach the limit.
//! That loses nothing: while a dropped entry would still be in the window, all
//! the newer ones are too, so the key is over its limit either way.

use std::collections::VecDeque;

use std::num::NonZeroU64;

use super::{Algorithm, Check, NEVER, ParamError, ScriptState};
use crate::clock::Micros;

/// Parameters: `limit` per rolling `window`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SlidingWindowLog {
    limit: u64,
    window: Micros,
}

/// Charged entries, oldest first.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct State {
    /// `(time, cost)` of each charge, oldest first.
    pub entries: VecDeque<(Micros, u64)>,
    /// Sum of the costs in `entries`, so a check only walks the entries that
    /// have left the window (usually none or a few), not the whole log.
    pub total: u64,
}

impl SlidingWindowLog {
    /// `limit` per rolling `window` µs.
    ///
    /// ```
    /// use std::num::NonZeroU64;
    /// use ratewarden::algorithm::sliding_window_log::{SlidingWindowLog, State};
    /// use ratewarden::clock::Micros;
    /// let s_ = Micros::from_secs;
    /// let log = SlidingWindowLog::new(NonZeroU64::new(2).unwrap(), s_(10)).unwrap();
    /// let mut s = State::default();
    /// log.charge(&mut s, s_(1), 1);
    /// log.charge(&mut s, s_(4), 1);
    /// let c = log.check(&s, s_(9), 1);
    /// assert!(!c.allowed);
    /// assert_eq!(c.retry_after, s_(2)); // the first entry leaves at 11 s
    /// assert!(log.check(&s, s_(11), 1).allowed);
    /// ```
    pub fn new(limit: NonZeroU64, window: Micros) -> Result<Self, ParamError> {
        if window == Micros::ZERO {
            return Err(ParamError("`window` must be at least 1µs"));
        }
        Ok(Self {
            limit: limit.get(),
            window,
        })
    }

    fn live<'s>(&self, s: &'s State, now: Micros) -> impl Iterator<Item = &'s (Micros, u64)> {
        let window = self.window;
        s.entries
            .iter()
            .skip_while(move |(t, _)| *t + window <= now)
    }

    /// Cost charged within the window ending at `now`.
    fn used(&self, s: &State, now: Micros) -> u64 {
        let expired: u64 = s
            .entries
            .iter()
            .take_while(|(t, _)| *t + self.window <= now)
            .map(|(_, c)| c)
            .sum();
        s.total - expired
    }

    /// See the [module](super) docs.
    pub fn check(&self, s: &State, now: Micros, cost: u64) -> Check {
        let used = self.used(s, now);
        if cost <= self.limit && used + cost <= self.limit {
            return Check::allow(self.limit - used - cost, self.window);
        }
        let reset_after = self.idle_at(s).saturating_sub(now);
        let retry = if cost > self.limit {
            NEVER
        } else {
            // The earliest time enough of the oldest entries have left.
            let mut left = used;
            let mut retry = NEVER;
            for (t, c) in self.live(s, now) {
                left -= c;
                if left + cost <= self.limit {
                    retry = *t + self.window - now;
                    break;
                }
            }
            retry
        };
        Check::deny(self.limit.saturating_sub(used), reset_after, retry)
    }

    /// See the [module](super) docs.
    pub fn charge(&self, s: &mut State, now: Micros, cost: u64) {
        while let Some(&(t, c)) = s.entries.front() {
            if t + self.window > now {
                break;
            }
            s.total -= c;
            s.entries.pop_front();
        }
        // Keep the log in time order even if a caller's clock stepped back.
        let t = s.entries.back().map_or(now, |(last, _)| now.max(*last));
        s.entries.push_back((t, cost));
        s.total = s.total.saturating_add(cost);
        while let Some(&(_, oldest)) = s.entries.front() {
            if s.total - oldest < self.limit {
                break;
            }
            s.total -= oldest;
            s.entries.pop_front();
        }
    }

    /// See the [module](super) docs.
    pub fn idle_at(&self, s: &State) -> Micros {
        s.entries
            .back()
            .map_or(Micros::ZERO, |(t, _)| *t + self.window)
    }
}

impl Algorithm for SlidingWindowLog {
    type State = State;
    fn check(&self, s: &State, now: Micros, cost: u64) -> Check {
        SlidingWindowLog::check(self, s, now, cost)
    }
    fn charge(&self, s: &mut State, now: Micros, cost: u64) {
        SlidingWindowLog::charge(self, s, now, cost)
    }
    /// The newest entries taken out of the log (the last partly): exact.
    fn refund(&self, s: &mut State, _now: Micros, cost: u64) {
        let mut left = cost;
        while left > 0 {
            let Some((t, c)) = s.entries.pop_back() else {
                break;
            };
            if c <= left {
                s.total -= c;
                left -= c;
            } else {
                s.entries.push_back((t, c - left));
                s.total -= left;
                left = 0;
            }
        }
    }
    fn idle_at(&self, s: &State) -> Micros {
        SlidingWindowLog::idle_at(self, s)
    }
    fn script_params(&self) -> [u64; 4] {
        [self.limit, self.window.get(), 0, 0]
    }
    /// `s1` the summed cost, `s2` the last entry's number; one zset member
    /// per entry.
    fn to_script(s: &State) -> ScriptState {
        ScriptState {
            // The script keeps the newest entry's time beside the sum.
            words: [
                s.total,
                s.entries.len() as u64,
                s.entries.back().map_or(0, |&(t, _)| t.get()),
            ],
            log: (1..)
                .zip(&s.entries)
                .map(|(seq, &(t, c))| (t.get(), seq, c))
                .collect(),
        }
    }
    fn from_script(s: &ScriptState) -> State {
        State {
            entries: s.log.iter().map(|&(t, _, c)| (Micros::new(t), c)).collect(),
            total: s.words[0],
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const fn us(n: u64) -> Micros {
        Micros::new(n)
    }
    fn log(limit: u64, window: u64) -> SlidingWindowLog {
        SlidingWindowLog::new(NonZeroU64::new(limit).unwrap(), us(window)).unwrap()
    }

    #[test]
    fn same_microsecond_requests_are_separate_entries() {
        let log = log(100, 1_000);
        let mut s = State::default();
        for _ in 0..100 {
            assert!(log.check(&s, us(5), 1).allowed);
            log.charge(&mut s, us(5), 1);
        }
        assert_eq!(s.entries.len(), 100);
        assert!(!log.check(&s, us(5), 1).allowed);
    }

    #[test]
    fn an_entry_leaves_exactly_one_window_later() {
        let log = log(1, 1_000);
        let mut s = State::default();
        log.charge(&mut s, us(100), 1);
        assert!(!log.check(&s, us(1_099), 1).allowed);
        assert!(log.check(&s, us(1_100), 1).allowed);
    }

    #[test]
    fn forced_charges_keep_at_most_limit_entries() {
        let log = log(3, 1_000);
        let mut s = State::default();
        for t in 0..50 {
            log.charge(&mut s, us(t), 1);
        }
        assert_eq!(s.entries.len(), 3);
        // Blocked until the newest three have left: the hammering counted.
        assert_eq!(log.check(&s, us(50), 1).retry_after, us(47 + 1_000 - 50));
    }
}
