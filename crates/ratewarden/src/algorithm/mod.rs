//! The six algorithms of the spec, each a pure transition.
//!
//! Every algorithm has parameters (built once from a [`Rule`](crate::Rule)), a
//! state whose `Default` is "never seen", and three functions:
//!
//! * `check(state, now, cost)`: what would happen to a request of weight `cost`
//!   at `now`, without changing anything;
//! * `charge(state, now, cost)`: record `cost` at `now`. For an admitted request
//!   this is the normal update; for a forced charge (`count_rejected`, a failure
//!   reported after the fact) the state saturates at "full" instead of going past it;
//! * `idle_at(state)`: the time from which the state is indistinguishable from a
//!   fresh one, so a store may forget it (memory expiry, Redis TTL).
//!
//! Stores only make these atomic; they never reimplement them (the Lua port of
//! the Redis store is checked against them on a shared table of cases).

pub mod fixed_window;
pub mod gcra;
pub mod leaky_bucket;
pub mod sliding_window_counter;
pub mod sliding_window_log;
pub mod token_bucket;

mod fluid;

use crate::clock::Micros;

/// Sentinel for "this request can never be admitted" (its cost exceeds the
/// capacity), used as a `retry_after`.
pub const NEVER: Micros = u64::MAX;

/// What an algorithm says about one request, before anything is recorded.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Check {
    /// Whether the request fits.
    pub allowed: bool,
    /// Requests of weight 1 still admissible after this one (if admitted).
    pub remaining: u64,
    /// Microseconds until the quota is whole again (after this request, if admitted).
    pub reset_after: Micros,
    /// Microseconds until a request of this cost would fit; 0 when allowed,
    /// [`NEVER`] when the cost exceeds the capacity.
    pub retry_after: Micros,
    /// For `leaky_bucket` in delay mode: microseconds to hold the request
    /// before forwarding it. 0 otherwise.
    pub delay: Micros,
}

impl Check {
    pub(crate) fn allow(remaining: u64, reset_after: Micros) -> Self {
        Self {
            allowed: true,
            remaining,
            reset_after,
            retry_after: 0,
            delay: 0,
        }
    }

    pub(crate) fn deny(remaining: u64, reset_after: Micros, retry_after: Micros) -> Self {
        Self {
            allowed: false,
            remaining,
            reset_after: if retry_after == NEVER {
                reset_after
            } else {
                reset_after.max(retry_after)
            },
            retry_after,
            delay: 0,
        }
    }
}

/// The algorithm named by `algorithm:` in a rule.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub enum Kind {
    /// `fixed_window`
    FixedWindow,
    /// `sliding_window_log`
    SlidingWindowLog,
    /// `sliding_window_counter` (the default)
    #[default]
    SlidingWindowCounter,
    /// `token_bucket`
    TokenBucket,
    /// `leaky_bucket`
    LeakyBucket,
    /// `gcra`
    Gcra,
}

impl Kind {
    /// Every algorithm, in the order of the spec.
    pub const ALL: [Kind; 6] = [
        Kind::FixedWindow,
        Kind::SlidingWindowLog,
        Kind::SlidingWindowCounter,
        Kind::TokenBucket,
        Kind::LeakyBucket,
        Kind::Gcra,
    ];

    /// The name used in configuration files.
    ///
    /// ```
    /// use ratewarden::algorithm::Kind;
    /// assert_eq!(Kind::Gcra.name(), "gcra");
    /// assert_eq!("token_bucket".parse::<Kind>(), Ok(Kind::TokenBucket));
    /// ```
    pub fn name(self) -> &'static str {
        match self {
            Kind::FixedWindow => "fixed_window",
            Kind::SlidingWindowLog => "sliding_window_log",
            Kind::SlidingWindowCounter => "sliding_window_counter",
            Kind::TokenBucket => "token_bucket",
            Kind::LeakyBucket => "leaky_bucket",
            Kind::Gcra => "gcra",
        }
    }

    /// Whether N concurrent requests admit exactly min(N, limit): every
    /// algorithm except the counter, which estimates by design.
    pub fn is_exact(self) -> bool {
        self != Kind::SlidingWindowCounter
    }
}

impl std::fmt::Display for Kind {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

impl std::str::FromStr for Kind {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        Kind::ALL
            .into_iter()
            .find(|k| k.name() == s)
            .ok_or_else(|| format!("unknown algorithm `{s}`"))
    }
}

/// Parameters of one algorithm, compiled from a rule.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Params {
    /// See [`fixed_window`].
    FixedWindow(fixed_window::FixedWindow),
    /// See [`sliding_window_log`].
    SlidingWindowLog(sliding_window_log::SlidingWindowLog),
    /// See [`sliding_window_counter`].
    SlidingWindowCounter(sliding_window_counter::SlidingWindowCounter),
    /// See [`token_bucket`].
    TokenBucket(token_bucket::TokenBucket),
    /// See [`leaky_bucket`].
    LeakyBucket(leaky_bucket::LeakyBucket),
    /// See [`gcra`].
    Gcra(gcra::Gcra),
}

/// The state of one key under one algorithm.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub enum State {
    /// Never seen, or forgotten: every algorithm reads it as its fresh state.
    #[default]
    Fresh,
    /// See [`fixed_window::State`].
    FixedWindow(fixed_window::State),
    /// Boxed: a log is the one state whose size grows with the limit.
    SlidingWindowLog(Box<sliding_window_log::State>),
    /// See [`sliding_window_counter::State`].
    SlidingWindowCounter(sliding_window_counter::State),
    /// See [`token_bucket::State`].
    TokenBucket(token_bucket::State),
    /// See [`leaky_bucket::State`].
    LeakyBucket(leaky_bucket::State),
    /// See [`gcra::State`].
    Gcra(gcra::State),
}

/// Dispatches to the algorithm's function with its own state type, treating a
/// state of another algorithm (a reloaded rule) as fresh.
macro_rules! dispatch {
    ($params:expr, $state:expr, |$p:ident, $s:ident| $body:expr) => {
        match $params {
            Params::FixedWindow($p) => {
                let fresh = fixed_window::State::default();
                let $s = match $state {
                    State::FixedWindow(s) => s,
                    _ => &fresh,
                };
                $body
            }
            Params::SlidingWindowLog($p) => {
                let fresh = sliding_window_log::State::default();
                let $s = match $state {
                    State::SlidingWindowLog(s) => &**s,
                    _ => &fresh,
                };
                $body
            }
            Params::SlidingWindowCounter($p) => {
                let fresh = sliding_window_counter::State::default();
                let $s = match $state {
                    State::SlidingWindowCounter(s) => s,
                    _ => &fresh,
                };
                $body
            }
            Params::TokenBucket($p) => {
                let fresh = token_bucket::State::default();
                let $s = match $state {
                    State::TokenBucket(s) => s,
                    _ => &fresh,
                };
                $body
            }
            Params::LeakyBucket($p) => {
                let fresh = leaky_bucket::State::default();
                let $s = match $state {
                    State::LeakyBucket(s) => s,
                    _ => &fresh,
                };
                $body
            }
            Params::Gcra($p) => {
                let fresh = gcra::State::default();
                let $s = match $state {
                    State::Gcra(s) => s,
                    _ => &fresh,
                };
                $body
            }
        }
    };
}

impl Params {
    /// The algorithm these parameters belong to.
    pub fn kind(&self) -> Kind {
        match self {
            Params::FixedWindow(_) => Kind::FixedWindow,
            Params::SlidingWindowLog(_) => Kind::SlidingWindowLog,
            Params::SlidingWindowCounter(_) => Kind::SlidingWindowCounter,
            Params::TokenBucket(_) => Kind::TokenBucket,
            Params::LeakyBucket(_) => Kind::LeakyBucket,
            Params::Gcra(_) => Kind::Gcra,
        }
    }

    /// The algorithm's number in the Lua port and its four parameters.
    pub(crate) fn script_params(&self) -> (u8, [u64; 4]) {
        match self {
            Params::FixedWindow(p) => (1, p.script_params()),
            Params::SlidingWindowLog(p) => (2, p.script_params()),
            Params::SlidingWindowCounter(p) => (3, p.script_params()),
            Params::TokenBucket(p) => (4, p.script_params()),
            Params::LeakyBucket(p) => (5, p.script_params()),
            Params::Gcra(p) => (6, p.script_params()),
        }
    }

    /// What a request of weight `cost` at `now` would get. Pure.
    pub fn check(&self, state: &State, now: Micros, cost: u64) -> Check {
        dispatch!(self, state, |p, s| p.check(s, now, cost))
    }

    /// The time from which `state` reads as fresh.
    pub fn idle_at(&self, state: &State) -> Micros {
        if matches!(state, State::Fresh) {
            return 0;
        }
        dispatch!(self, state, |p, s| p.idle_at(s))
    }

    /// Records `cost` at `now` (saturating when it does not fit).
    pub fn charge(&self, state: &mut State, now: Micros, cost: u64) {
        // Move the state out, update it, move it back: one code path whether
        // the key was fresh, of this algorithm, or left over from a reload.
        let taken = std::mem::take(state);
        *state = match (self, taken) {
            (Params::FixedWindow(p), State::FixedWindow(mut s)) => {
                p.charge(&mut s, now, cost);
                State::FixedWindow(s)
            }
            (Params::FixedWindow(p), _) => {
                let mut s = Default::default();
                p.charge(&mut s, now, cost);
                State::FixedWindow(s)
            }
            (Params::SlidingWindowLog(p), State::SlidingWindowLog(mut s)) => {
                p.charge(&mut s, now, cost);
                State::SlidingWindowLog(s)
            }
            (Params::SlidingWindowLog(p), _) => {
                let mut s = Box::default();
                p.charge(&mut s, now, cost);
                State::SlidingWindowLog(s)
            }
            (Params::SlidingWindowCounter(p), State::SlidingWindowCounter(mut s)) => {
                p.charge(&mut s, now, cost);
                State::SlidingWindowCounter(s)
            }
            (Params::SlidingWindowCounter(p), _) => {
                let mut s = Default::default();
                p.charge(&mut s, now, cost);
                State::SlidingWindowCounter(s)
            }
            (Params::TokenBucket(p), State::TokenBucket(mut s)) => {
                p.charge(&mut s, now, cost);
                State::TokenBucket(s)
            }
            (Params::TokenBucket(p), _) => {
                let mut s = Default::default();
                p.charge(&mut s, now, cost);
                State::TokenBucket(s)
            }
            (Params::LeakyBucket(p), State::LeakyBucket(mut s)) => {
                p.charge(&mut s, now, cost);
                State::LeakyBucket(s)
            }
            (Params::LeakyBucket(p), _) => {
                let mut s = Default::default();
                p.charge(&mut s, now, cost);
                State::LeakyBucket(s)
            }
            (Params::Gcra(p), State::Gcra(mut s)) => {
                p.charge(&mut s, now, cost);
                State::Gcra(s)
            }
            (Params::Gcra(p), _) => {
                let mut s = Default::default();
                p.charge(&mut s, now, cost);
                State::Gcra(s)
            }
        };
    }
}
