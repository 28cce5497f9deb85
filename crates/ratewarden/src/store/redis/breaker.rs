//! The circuit breaker: stops hammering a dead server.
//!
//! After `THRESHOLD` consecutive failures the circuit opens; while open,
//! calls fail at once without touching the network; when the backoff has
//! passed, one call is let through as a probe. A failed probe doubles the
//! backoff (100 ms to 500 ms); a success closes the circuit. Time is the
//! store's [`Clock`], so tests drive it by hand.

use std::sync::Arc;

use crate::clock::{Clock, Micros};

const THRESHOLD: u32 = 3;
const MIN_BACKOFF: Micros = Micros::from_millis(100);
/// At most this long between probes: once Redis answers again, decisions
/// stay local (`on_error: local`, limits per gateway) until the next probe,
/// so the cap is short (the README promises Redis again within a second of
/// its answering); two probes a second per gateway cost Redis nothing.
const MAX_BACKOFF: Micros = Micros::from_millis(500);

/// What the breaker did with a call, for the caller to log a change.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Change {
    /// Nothing changed.
    None,
    /// The first failure after a success (the circuit is still closed).
    Failing,
    /// The circuit opened: calls now fail at once.
    Opened,
    /// The circuit closed again after being open for this long.
    Closed(Micros),
}

/// What the breaker says of a call.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Admit {
    /// The circuit is closed: go.
    Closed,
    /// The circuit is open and this call is its probe.
    Probe,
    /// The circuit is open: fail at once.
    Refused,
}

pub(crate) struct Breaker {
    state: parking_lot::Mutex<State>,
    clock: Arc<dyn Clock>,
}

struct State {
    failures: u32,
    /// Open until this time (µs); `None` when closed.
    open_until: Option<Micros>,
    /// When the circuit opened (µs).
    opened_at: Micros,
    backoff: Micros,
    probing: bool,
}

impl Breaker {
    pub(crate) fn new(clock: Arc<dyn Clock>) -> Self {
        Self {
            state: parking_lot::Mutex::new(State {
                failures: 0,
                open_until: None,
                opened_at: Micros::ZERO,
                backoff: MIN_BACKOFF,
                probing: false,
            }),
            clock,
        }
    }

    /// Whether a call may go to the network now, and whether as the probe
    /// of an open circuit.
    pub(crate) fn admit_as(&self) -> Admit {
        let mut s = self.state.lock();
        match s.open_until {
            None => Admit::Closed,
            Some(until) if self.clock.now() < until || s.probing => Admit::Refused,
            Some(_) => {
                s.probing = true;
                Admit::Probe
            }
        }
    }

    pub(crate) fn success(&self) -> Change {
        let mut s = self.state.lock();
        let change = match s.open_until {
            Some(_) => Change::Closed(self.clock.now().saturating_sub(s.opened_at)),
            None => Change::None,
        };
        s.failures = 0;
        s.open_until = None;
        s.backoff = MIN_BACKOFF;
        s.probing = false;
        change
    }

    pub(crate) fn failure(&self) -> Change {
        let mut s = self.state.lock();
        s.failures += 1;
        let first = s.failures == 1 && s.open_until.is_none();
        if s.probing || s.failures >= THRESHOLD {
            let now = self.clock.now();
            let opened = s.open_until.is_none();
            if opened {
                s.opened_at = now;
            }
            s.open_until = Some(now + s.backoff);
            s.backoff = (s.backoff * 2).min(MAX_BACKOFF);
            s.probing = false;
            if opened {
                return Change::Opened;
            }
            return Change::None;
        }
        if first { Change::Failing } else { Change::None }
    }

    /// A call went out and its answer did not come in time. That says
    /// nothing of the server's health (a busy host makes answers late), so
    /// it neither opens nor closes the circuit; but a late probe is a
    /// failed one, or the circuit would wait for it for ever.
    pub(crate) fn late(&self) {
        let probing = self.state.lock().probing;
        if probing {
            self.failure();
        }
    }

    /// Whether calls have failed since the last success (an outage may be
    /// starting), open or not.
    pub(crate) fn failing(&self) -> bool {
        let s = self.state.lock();
        s.failures > 0 || s.open_until.is_some()
    }

    pub(crate) fn is_open(&self) -> bool {
        self.state.lock().open_until.is_some()
    }

    /// Whether it is open and its wait between probes has reached its cap
    /// (a long outage).
    pub(crate) fn at_longest_backoff(&self) -> bool {
        let s = self.state.lock();
        s.open_until.is_some() && s.backoff >= MAX_BACKOFF
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::clock::ManualClock;
    use std::time::Duration;

    #[test]
    fn opens_after_three_failures_probes_after_the_backoff_and_doubles_it() {
        let clock = ManualClock::new(1_000_000);
        let b = Breaker::new(Arc::new(clock.clone()));
        assert_eq!(b.failure(), Change::Failing);
        assert_eq!(b.failure(), Change::None);
        assert_eq!(b.failure(), Change::Opened);
        assert_eq!(b.admit_as(), Admit::Refused, "open: calls fail at once");
        clock.advance(Duration::from_millis(100));
        assert_eq!(b.admit_as(), Admit::Probe, "one probe after 100 ms");
        assert_eq!(b.admit_as(), Admit::Refused, "only one");
        assert_eq!(b.failure(), Change::None, "a failed probe keeps it open");
        clock.advance(Duration::from_millis(199));
        assert_eq!(
            b.admit_as(),
            Admit::Refused,
            "the backoff doubled to 200 ms"
        );
        clock.advance(Duration::from_millis(1));
        assert_eq!(b.admit_as(), Admit::Probe);
        assert_eq!(b.success(), Change::Closed(Micros::from_millis(300)));
        assert!(b.admit_as() == Admit::Closed && !b.is_open());
    }

    /// A late answer neither opens nor closes the circuit, but a late probe
    /// is a failed one (or the circuit would wait on it for ever); the
    /// backoff stops at 500 ms.
    #[test]
    fn a_late_answer_is_no_failure_but_a_late_probe_is() {
        let clock = ManualClock::new(1_000_000);
        let b = Breaker::new(Arc::new(clock.clone()));
        for _ in 0..10 {
            b.late();
        }
        assert!(!b.is_open() && !b.failing());
        for _ in 0..3 {
            b.failure();
        }
        assert!(b.is_open());
        for _ in 0..5 {
            clock.advance(Duration::from_secs(1));
            assert_eq!(b.admit_as(), Admit::Probe);
            b.late();
            assert_eq!(b.admit_as(), Admit::Refused, "the late probe failed");
        }
        clock.advance(Duration::from_millis(499));
        assert_eq!(b.admit_as(), Admit::Refused);
        clock.advance(Duration::from_millis(1));
        assert_eq!(b.admit_as(), Admit::Probe, "capped at 500 ms");
    }
}
