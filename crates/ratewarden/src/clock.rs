//! Time as the limiter sees it: integer microseconds since the Unix epoch.
//!
//! Algorithms and stores never read the system time themselves; they are handed
//! a [`Clock`]. Production code uses [`SystemClock`], tests a [`ManualClock`]
//! they advance by hand, so a ten-minute ban is tested without sleeping.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

/// Microseconds: a point in time (since the Unix epoch) or a span of it.
///
/// Integer microseconds rather than floating seconds so that the Rust algorithms
/// and their Lua ports (where numbers are doubles, exact to 2^53) agree to the
/// microsecond: 2^53 µs is about 285 years. A type of its own, not a `u64`, so
/// that a count, a number of milliseconds or seconds cannot pass for one:
/// `Micros::new` and [`micros`] say which unit a number is in.
///
/// ```
/// use ratewarden::clock::Micros;
/// let window = Micros::from_secs(60);
/// let now = Micros::new(90_500_000);
/// assert_eq!(now - now % window, Micros::from_secs(60));
/// assert_eq!(window / Micros::from_secs(20), 3);
/// assert_eq!((window * 2).get(), 120_000_000);
/// ```
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Micros(u64);

impl Micros {
    /// Zero.
    pub const ZERO: Self = Self(0);
    /// The largest value (also the algorithms' "never").
    pub const MAX: Self = Self(u64::MAX);

    /// `us` microseconds.
    pub const fn new(us: u64) -> Self {
        Self(us)
    }

    /// `ms` milliseconds.
    pub const fn from_millis(ms: u64) -> Self {
        Self(ms * 1_000)
    }

    /// `s` seconds.
    pub const fn from_secs(s: u64) -> Self {
        Self(s * 1_000_000)
    }

    /// The number of microseconds.
    pub const fn get(self) -> u64 {
        self.0
    }

    /// `self - other`, or zero.
    pub const fn saturating_sub(self, other: Self) -> Self {
        Self(self.0.saturating_sub(other.0))
    }

    /// `self + other`, or [`Micros::MAX`].
    pub const fn saturating_add(self, other: Self) -> Self {
        Self(self.0.saturating_add(other.0))
    }

    /// `self × n`, or [`Micros::MAX`].
    pub const fn saturating_mul(self, n: u64) -> Self {
        Self(self.0.saturating_mul(n))
    }

    /// How many whole `unit`s fit, rounded up.
    pub const fn div_ceil(self, unit: Self) -> u64 {
        self.0.div_ceil(unit.0)
    }

    /// As a [`Duration`].
    pub const fn as_duration(self) -> Duration {
        Duration::from_micros(self.0)
    }
}

impl std::fmt::Display for Micros {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}µs", self.0)
    }
}

impl From<Duration> for Micros {
    /// Whole microseconds, saturating at [`Micros::MAX`].
    fn from(d: Duration) -> Self {
        micros(d)
    }
}

impl std::ops::Add for Micros {
    type Output = Self;
    fn add(self, o: Self) -> Self {
        Self(self.0 + o.0)
    }
}

impl std::ops::Sub for Micros {
    type Output = Self;
    fn sub(self, o: Self) -> Self {
        Self(self.0 - o.0)
    }
}

impl std::ops::AddAssign for Micros {
    fn add_assign(&mut self, o: Self) {
        self.0 += o.0;
    }
}

impl std::ops::Rem for Micros {
    type Output = Self;
    fn rem(self, o: Self) -> Self {
        Self(self.0 % o.0)
    }
}

impl std::ops::Mul<u64> for Micros {
    type Output = Self;
    fn mul(self, n: u64) -> Self {
        Self(self.0 * n)
    }
}

impl std::ops::Div<u64> for Micros {
    type Output = Self;
    fn div(self, n: u64) -> Self {
        Self(self.0 / n)
    }
}

/// How many whole `Micros` of the right fit in the left: a ratio, not a time.
impl std::ops::Div for Micros {
    type Output = u64;
    fn div(self, o: Self) -> u64 {
        self.0 / o.0
    }
}

/// Converts a duration to whole microseconds, saturating at [`Micros::MAX`].
///
/// ```
/// use std::time::Duration;
/// use ratewarden::clock::{micros, Micros};
/// assert_eq!(micros(Duration::from_millis(1500)), Micros::new(1_500_000));
/// ```
pub fn micros(d: Duration) -> Micros {
    Micros(u64::try_from(d.as_micros()).unwrap_or(u64::MAX))
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
///
/// Every `SystemClock` reads quanta's process-wide clock: it is calibrated
/// once (up to 200 ms, on first use), not once per clock.
#[derive(Debug, Clone)]
pub struct SystemClock {
    origin_wall: Micros,
    origin: quanta::Instant,
}

impl SystemClock {
    /// A clock anchored to the wall time now.
    pub fn new() -> Self {
        let origin_wall = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map(micros)
            .unwrap_or(Micros::ZERO);
        Self {
            origin_wall,
            origin: quanta::Instant::now(),
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
        let d = quanta::Instant::now().saturating_duration_since(self.origin);
        self.origin_wall + Micros(d.as_secs() * 1_000_000 + u64::from(d.subsec_micros()))
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
/// assert_eq!(other.now().get(), 3_000);
/// ```
#[derive(Debug, Clone, Default)]
pub struct ManualClock {
    now: Arc<AtomicU64>,
}

impl ManualClock {
    /// A clock standing at `start` microseconds since the epoch.
    pub fn new(start: u64) -> Self {
        Self {
            now: Arc::new(AtomicU64::new(start)),
        }
    }

    /// Moves the clock forward.
    pub fn advance(&self, by: Duration) {
        self.now.fetch_add(micros(by).get(), Ordering::SeqCst);
    }

    /// Sets the clock; a time earlier than the current one is ignored, as a
    /// real clock never goes backwards.
    pub fn set(&self, to: Micros) {
        self.now.fetch_max(to.get(), Ordering::SeqCst);
    }
}

impl Clock for ManualClock {
    fn now(&self) -> Micros {
        Micros(self.now.load(Ordering::SeqCst))
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
        assert!(a.get().abs_diff(wall.get()) < 1_000_000, "{a} vs {wall}");
        std::thread::sleep(Duration::from_millis(20));
        let c = clock.now();
        assert!(
            (20_000..1_000_000).contains(&(c - b).get()),
            "advanced {} µs",
            c - b
        );
    }

    #[test]
    fn manual_clock_ignores_backwards_set() {
        let clock = ManualClock::new(50);
        clock.set(Micros::new(10));
        assert_eq!(clock.now(), Micros::new(50));
        clock.set(Micros::new(70));
        assert_eq!(clock.now(), Micros::new(70));
    }
}
