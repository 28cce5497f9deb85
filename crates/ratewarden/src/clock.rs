//! Time as the limiter sees it: integer microseconds since the Unix epoch.
//!
//! Algorithms and stores never read the system time themselves; they are handed
//! a [`Clock`]. Production code uses [`SystemClock`], tests a [`ManualClock`]
//! they advance by hand, so a ten-minute ban is tested without sleeping.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

/// A point in time: microseconds since the Unix epoch.
///
/// Integer microseconds rather than floating seconds so that the Rust algorithms
/// and their Lua ports (where numbers are doubles, exact to 2^53) agree to the
/// microsecond: 2^53 µs is about 285 years.
pub type Micros = u64;

/// Converts a duration to whole microseconds, saturating at `u64::MAX`.
///
/// ```
/// use std::time::Duration;
/// assert_eq!(ratewarden::clock::micros(Duration::from_millis(1500)), 1_500_000);
/// ```
pub fn micros(d: Duration) -> Micros {
    u64::try_from(d.as_micros()).unwrap_or(u64::MAX)
}

/// A source of time for limiters and stores.
pub trait Clock: Send + Sync + 'static {
    /// The current time. Successive calls never go backwards.
    fn now(&self) -> Micros;
}

/// Wall-clock time that never goes backwards.
///
/// Tied once to the wall clock when created, then advanced by the monotonic
/// clock: a system clock step (NTP, a manual `date -s`) cannot make a window
/// restart or a ban vanish. The monotonic clock is quanta's (the CPU's
/// invariant TSC where it has one, calibrated against the OS clock): reading
/// `std::time::Instant` cost 30 ns here, more than a whole decision should.
#[derive(Debug, Clone)]
pub struct SystemClock {
    origin_wall: Micros,
    origin: quanta::Instant,
    clock: quanta::Clock,
}

impl SystemClock {
    /// A clock anchored to the wall time now.
    pub fn new() -> Self {
        let origin_wall = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map(micros)
            .unwrap_or(0);
        let clock = quanta::Clock::new();
        Self {
            origin_wall,
            origin: clock.now(),
            clock,
        }
    }
}

impl Default for SystemClock {
    fn default() -> Self {
        Self::new()
    }
}

impl Clock for SystemClock {
    fn now(&self) -> Micros {
        let d = self.clock.now().saturating_duration_since(self.origin);
        self.origin_wall + d.as_secs() * 1_000_000 + u64::from(d.subsec_micros())
    }
}

/// A clock that moves only when told to; clones share the same time.
///
/// ```
/// use std::time::Duration;
/// use ratewarden::clock::{Clock, ManualClock};
/// let clock = ManualClock::new(1_000);
/// let other = clock.clone();
/// clock.advance(Duration::from_millis(2));
/// assert_eq!(other.now(), 3_000);
/// ```
#[derive(Debug, Clone, Default)]
pub struct ManualClock {
    now: Arc<AtomicU64>,
}

impl ManualClock {
    /// A clock standing at `start` microseconds since the epoch.
    pub fn new(start: Micros) -> Self {
        Self {
            now: Arc::new(AtomicU64::new(start)),
        }
    }

    /// Moves the clock forward.
    pub fn advance(&self, by: Duration) {
        self.now.fetch_add(micros(by), Ordering::SeqCst);
    }

    /// Sets the clock; a time earlier than the current one is ignored, as a
    /// real clock never goes backwards.
    pub fn set(&self, to: Micros) {
        self.now.fetch_max(to, Ordering::SeqCst);
    }
}

impl Clock for ManualClock {
    fn now(&self) -> Micros {
        self.now.load(Ordering::SeqCst)
    }
}

impl<C: Clock + ?Sized> Clock for Arc<C> {
    fn now(&self) -> Micros {
        (**self).now()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn system_clock_is_near_wall_time_and_monotone() {
        let clock = SystemClock::new();
        let wall = micros(SystemTime::now().duration_since(UNIX_EPOCH).unwrap());
        let a = clock.now();
        let b = clock.now();
        assert!(b >= a);
        assert!(a.abs_diff(wall) < 1_000_000, "{a} vs {wall}");
        std::thread::sleep(Duration::from_millis(20));
        let c = clock.now();
        assert!(
            (20_000..1_000_000).contains(&(c - b)),
            "advanced {} µs",
            c - b
        );
    }

    #[test]
    fn manual_clock_ignores_backwards_set() {
        let clock = ManualClock::new(50);
        clock.set(10);
        assert_eq!(clock.now(), 50);
        clock.set(70);
        assert_eq!(clock.now(), 70);
    }
}
