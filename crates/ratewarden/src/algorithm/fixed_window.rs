//! `fixed_window`: windows aligned to multiples of `window` since the Unix
//! epoch, or the periods of a [`Calendar`] (days, weeks, months, years of
//! a time zone).
//!
//! The window a state belongs to is stored with its count, so a request in a
//! later window starts from zero without any timer. The state's expiry is the
//! end of its window and nothing pushes it back (seed 004's bug: an `EXPIRE`
//! refreshed by every request locks a hammering client out forever).

use std::num::NonZeroU64;
use std::sync::Arc;

use super::{Algorithm, Check, NEVER, ParamError, ScriptState};
use crate::calendar::Calendar;
use crate::clock::Micros;

/// Parameters: `limit` per `window`, or per period of a calendar.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FixedWindow {
    limit: u64,
    window: Micros,
    calendar: Option<Arc<Calendar>>,
}

/// Count of the window starting at `start`.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct State {
    /// Start of the window the count belongs to (µs since the epoch).
    pub start: Micros,
    /// Summed cost charged in that window, saturating at the limit: a full
    /// window rejects everything whatever is charged past it.
    pub count: u32,
}

impl FixedWindow {
    /// `limit` (>= 1) per `window` (>= 1 µs).
    ///
    /// ```
    /// use std::num::NonZeroU64;
    /// use ratewarden::algorithm::fixed_window::{FixedWindow, State};
    /// use ratewarden::clock::Micros;
    /// let fw = FixedWindow::new(NonZeroU64::new(2).unwrap(), Micros::from_secs(1)).unwrap();
    /// let mut s = State::default();
    /// let at = Micros::new(500);
    /// for _ in 0..2 {
    ///     assert!(fw.check(&s, at, 1).allowed);
    ///     fw.charge(&mut s, at, 1);
    /// }
    /// let third = fw.check(&s, at, 1);
    /// assert!(!third.allowed);
    /// assert_eq!(third.retry_after, Micros::new(999_500)); // the next window starts at 1 s
    /// assert!(FixedWindow::new(NonZeroU64::MIN, Micros::ZERO).is_err());
    /// ```
    pub fn new(limit: NonZeroU64, window: Micros) -> Result<Self, ParamError> {
        if window == Micros::ZERO {
            return Err(ParamError("`window` must be at least 1µs"));
        }
        Ok(Self {
            limit: limit.get(),
            window,
            calendar: None,
        })
    }

    /// `limit` per period of `calendar`.
    pub fn calendar(limit: NonZeroU64, calendar: Arc<Calendar>) -> Self {
        Self {
            limit: limit.get(),
            window: Micros::from_secs(86_400),
            calendar: Some(calendar),
        }
    }

    /// The calendar, for a calendar window.
    pub fn calendar_of(&self) -> Option<&Arc<Calendar>> {
        self.calendar.as_ref()
    }

    /// The window holding `now`: `[start, end)`.
    pub fn bounds(&self, now: Micros) -> (Micros, Micros) {
        match &self.calendar {
            Some(c) => c.period(now),
            None => {
                let start = now - now % self.window;
                (start, start + self.window)
            }
        }
    }

    fn window_start(&self, now: Micros) -> Micros {
        self.bounds(now).0
    }

    /// See the [module](super) docs.
    pub fn check(&self, s: &State, now: Micros, cost: u64) -> Check {
        let (start, end) = self.bounds(now);
        let used = if s.start == start {
            u64::from(s.count)
        } else {
            0
        };
        let reset_after = end - now;
        if cost <= self.limit && used + cost <= self.limit {
            Check::allow(self.limit - used - cost, reset_after)
        } else {
            let retry = if cost > self.limit {
                NEVER
            } else {
                reset_after
            };
            Check::deny(self.limit.saturating_sub(used), reset_after, retry)
        }
    }

    /// See the [module](super) docs.
    pub fn charge(&self, s: &mut State, now: Micros, cost: u64) {
        let start = self.window_start(now);
        if s.start != start {
            *s = State { start, count: 0 };
        }
        // The limit fits in u32 (the rule validator checks it).
        s.count = (u64::from(s.count) + cost).min(self.limit) as u32;
    }

    /// See the [module](super) docs.
    pub fn idle_at(&self, s: &State) -> Micros {
        match &self.calendar {
            Some(c) => c.period(s.start).1,
            None => s.start + self.window,
        }
    }
}

impl FixedWindow {
    /// A calendar window's parameters for the Lua port at gateway time
    /// `local`: the limit, and the bounds of two periods, `a..b..c`: the
    /// one holding `local` less a minute and the next. Redis's own time
    /// picks between them, so the boundary falls where Redis's clock says
    /// as long as the gateway's clock is less than a minute ahead of it
    /// (or a period behind).
    pub fn script_bounds(&self, local: Micros) -> Option<[u64; 4]> {
        let c = self.calendar.as_ref()?;
        let (a, b) = c.period(local.saturating_sub(Micros::from_secs(60)));
        let (_, end) = c.compute(b);
        Some([self.limit, a.get(), b.get(), end.get()])
    }
}

impl Algorithm for FixedWindow {
    type State = State;
    fn check(&self, s: &State, now: Micros, cost: u64) -> Check {
        FixedWindow::check(self, s, now, cost)
    }
    fn charge(&self, s: &mut State, now: Micros, cost: u64) {
        FixedWindow::charge(self, s, now, cost)
    }
    /// Exact within the window the cost was charged in; later, that
    /// window's count no longer counts anyway.
    fn refund(&self, s: &mut State, now: Micros, cost: u64) {
        if s.start == self.window_start(now) {
            s.count = (u64::from(s.count).saturating_sub(cost)) as u32;
        }
    }
    fn idle_at(&self, s: &State) -> Micros {
        FixedWindow::idle_at(self, s)
    }
    /// A calendar window's bounds are not fixed: the store sends them with
    /// each call ([`FixedWindow::script_bounds`]); these are placeholders.
    fn script_params(&self) -> [u64; 4] {
        [self.limit, self.window.get(), 0, 0]
    }
    fn to_script(s: &State) -> ScriptState {
        ScriptState {
            words: [s.start.get(), u64::from(s.count), 0],
            log: vec![],
        }
    }
    fn from_script(s: &ScriptState) -> State {
        State {
            start: Micros::new(s.words[0]),
            count: s.words[1] as u32,
        }
    }
    fn to_mirror(s: &State) -> Option<[u64; 2]> {
        Some([s.start.get(), u64::from(s.count)])
    }
    fn from_mirror(w: [u64; 2]) -> State {
        State {
            start: Micros::new(w[0]),
            count: w[1] as u32,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const W: Micros = Micros::from_secs(60);
    const fn us(n: u64) -> Micros {
        Micros::new(n)
    }
    fn fw(limit: u64) -> FixedWindow {
        FixedWindow::new(NonZeroU64::new(limit).unwrap(), W).unwrap()
    }

    #[test]
    fn resets_exactly_at_the_window_edge() {
        let fw = fw(3);
        let mut s = State::default();
        for _ in 0..3 {
            fw.charge(&mut s, W - us(1), 1);
        }
        assert!(!fw.check(&s, W - us(1), 1).allowed);
        assert_eq!(fw.check(&s, W - us(1), 1).retry_after, us(1));
        let at_edge = fw.check(&s, W, 1);
        assert!(at_edge.allowed);
        assert_eq!(at_edge.remaining, 2);
    }

    #[test]
    fn cost_larger_than_limit_never_fits() {
        let fw = fw(3);
        let c = fw.check(&State::default(), us(0), 4);
        assert!(!c.allowed);
        assert_eq!(c.retry_after, NEVER);
        assert_eq!(c.remaining, 3);
    }

    #[test]
    fn forced_charges_do_not_move_the_expiry() {
        let fw = fw(1);
        let mut s = State::default();
        fw.charge(&mut s, us(10), 1);
        for t in [us(20), us(30), W - us(1)] {
            fw.charge(&mut s, t, 1);
        }
        assert_eq!(fw.idle_at(&s), W);
        assert_eq!(s.count, 1, "saturates at the limit");
    }
}
