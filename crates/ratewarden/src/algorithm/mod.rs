//! The algorithms, each a pure transition, and the one table that names
//! them.
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
//! the Redis store is checked against them on a shared table of cases,
//! `tests/cases.table`).
//!
//! # How to add an algorithm
//!
//! 1. Its Rust file here: parameters, a `State` whose `Default` is "never
//!    seen", and an [`Algorithm`] impl (check, charge, idle_at, how its state
//!    is written for the Lua script and, if it fits in two words, for the
//!    memory store's mirror).
//! 2. Its row in [`table!`]: the variant, the module, a new id.
//! 3. Its Lua file, `store/redis/lua/<module>.lua`, returning its `check`,
//!    `charge` and `idle` (the script is assembled from the table).
//! 4. Its rows in the case table, `tests/cases.table`, which run against both.
//! 5. Its parameters in `Rule::new` (rule/spec.rs), and the docs.

pub mod concurrency;
pub mod fixed_window;
pub mod gcra;
pub mod leaky_bucket;
pub mod sliding_window_counter;
pub mod sliding_window_log;
pub mod token_bucket;

mod fluid;

use std::borrow::{Borrow, BorrowMut};

use crate::clock::Micros;

/// Sentinel for "this request can never be admitted" (its cost exceeds the
/// capacity), used as a `retry_after`.
pub const NEVER: Micros = Micros::MAX;

/// Why an algorithm's parameters are refused (its constructor's error).
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub struct ParamError(pub &'static str);

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
            retry_after: Micros::ZERO,
            delay: Micros::ZERO,
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
            delay: Micros::ZERO,
        }
    }
}

/// The algorithms: variant, module (and config name), id. The id names the
/// algorithm in the Lua script (`algo[id]`) and in the memory store's
/// mirror; `boxed` states (those that grow with the limit) are boxed in
/// [`State`]. Everything else about an algorithm comes from its
/// [`Algorithm`] impl.
macro_rules! table {
    ($callback:ident) => {
        $callback! {
            FixedWindow fixed_window 1,
            SlidingWindowLog sliding_window_log 2 boxed,
            SlidingWindowCounter sliding_window_counter 3,
            TokenBucket token_bucket 4,
            LeakyBucket leaky_bucket 5,
            Gcra gcra 6,
            Concurrency concurrency 7 boxed,
        }
    };
}
#[cfg(feature = "redis")]
pub(crate) use table;

/// What every algorithm is: a pure transition of its own state.
pub trait Algorithm: Clone + PartialEq + Eq + std::fmt::Debug + Send + Sync + 'static {
    /// A key's state; `Default` is "never seen".
    type State: Clone + Default + PartialEq + Eq + std::fmt::Debug + Send + Sync + 'static;
    /// What a request of weight `cost` at `now` would get. Pure.
    fn check(&self, s: &Self::State, now: Micros, cost: u64) -> Check;
    /// Records `cost` at `now` (saturating when it does not fit).
    fn charge(&self, s: &mut Self::State, now: Micros, cost: u64);
    /// The time from which `s` reads as fresh.
    fn idle_at(&self, s: &Self::State) -> Micros;
    /// Releases lease `lease` of `cost` (only `concurrency` has leases).
    fn release(&self, _s: &mut Self::State, _lease: u64, _cost: u64) {}
    /// Renews lease `lease` of `cost` from `now`: its holder is alive.
    fn renew(&self, _s: &mut Self::State, _lease: u64, _cost: u64, _now: Micros) {}
    /// Gives back `cost` charged earlier (an Envoy `is_negative_hits`
    /// descriptor): the inverse of [`charge`](Self::charge), never past a
    /// fresh state. `concurrency` has none: its leases are released.
    fn refund(&self, _s: &mut Self::State, _now: Micros, _cost: u64) {}
    /// The lease the last charge took (only `concurrency` has leases).
    fn lease(_s: &Self::State) -> Option<u64> {
        None
    }
    /// The four parameters the Lua port reads (`p1`..`p4`).
    fn script_params(&self) -> [u64; 4];
    /// The state as the Lua port keeps it.
    fn to_script(s: &Self::State) -> ScriptState;
    /// The state from how the Lua port keeps it.
    fn from_script(s: &ScriptState) -> Self::State;
    /// The state in two words, for the memory store's lock-free mirror;
    /// `None` for states that do not fit (they are not mirrored).
    fn to_mirror(_s: &Self::State) -> Option<[u64; 2]> {
        None
    }
    /// The state from its two mirrored words.
    fn from_mirror(_w: [u64; 2]) -> Self::State {
        Self::State::default()
    }
}

/// A state as the Lua script keeps it: the algorithm's fields `s1`..`s3`,
/// and the entries of its log (a log's entries, concurrency leases; in the
/// state string's tail or the op's zset, `lua/rule.lua`).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ScriptState {
    /// `s1`, `s2`, `s3`.
    pub words: [u64; 3],
    /// The entries, oldest first: `(time or lapse time, number, cost)`.
    pub log: Vec<(u64, u64, u64)>,
}

/// The mirror code of [`State::Fresh`] (algorithm ids are small; 0 is an
/// empty mirror entry).
pub(crate) const FRESH_CODE: u8 = 0xFF;

macro_rules! stored {
    (boxed $t:ty) => { Box<$t> };
    ($t:ty) => { $t };
}

macro_rules! define {
    ($($variant:ident $module:ident $id:literal $($boxed:ident)?),* $(,)?) => {
        /// The algorithm named by `algorithm:` in a rule.
        #[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
        pub enum Kind {
            $(
                #[doc = concat!("`", stringify!($module), "`")]
                $variant,
            )*
        }

        /// How many algorithms the table has.
        const COUNT: usize = [$(stringify!($variant)),*].len();

        impl Kind {
            /// Every algorithm, in the order of the table.
            pub const ALL: [Kind; COUNT] = [$(Kind::$variant),*];

            /// The name used in configuration files.
            ///
            /// ```
            /// use ratewarden::algorithm::Kind;
            /// assert_eq!(Kind::Gcra.name(), "gcra");
            /// assert_eq!("token_bucket".parse::<Kind>(), Ok(Kind::TokenBucket));
            /// ```
            pub fn name(self) -> &'static str {
                match self {
                    $(Kind::$variant => stringify!($module),)*
                }
            }

            /// The number naming it in the Lua script and the mirror.
            pub fn id(self) -> u8 {
                match self {
                    $(Kind::$variant => $id,)*
                }
            }

            /// The algorithm numbered `id`.
            pub fn from_id(id: u8) -> Option<Self> {
                match id {
                    $($id => Some(Kind::$variant),)*
                    _ => None,
                }
            }
        }

        /// Parameters of one algorithm, compiled from a rule.
        #[derive(Debug, Clone, PartialEq, Eq)]
        pub enum Params {
            $(
                #[doc = concat!("See [`", stringify!($module), "`].")]
                $variant($module::$variant),
            )*
        }

        /// The state of one key under one algorithm.
        #[derive(Debug, Clone, Default, PartialEq, Eq)]
        pub enum State {
            /// Never seen, or forgotten: every algorithm reads it as its fresh state.
            #[default]
            Fresh,
            $(
                #[doc = concat!("See [`", stringify!($module), "::State`].")]
                $variant(stored!($($boxed)? <$module::$variant as Algorithm>::State)),
            )*
        }

        impl Params {
            /// The algorithm these parameters belong to.
            pub fn kind(&self) -> Kind {
                match self {
                    $(Params::$variant(_) => Kind::$variant,)*
                }
            }

            /// The algorithm's id and its four parameters, as the Lua port reads them.
            #[cfg(feature = "redis")]
            pub(crate) fn script_params(&self) -> (u8, [u64; 4]) {
                match self {
                    $(Params::$variant(p) => ($id, Algorithm::script_params(p)),)*
                }
            }

            /// What a request of weight `cost` at `now` would get. Pure. A
            /// state of another algorithm (a reloaded rule) reads as fresh.
            pub fn check(&self, state: &State, now: Micros, cost: u64) -> Check {
                match (self, state) {
                    $(
                        (Params::$variant(p), State::$variant(s)) => Algorithm::check(p, s.borrow(), now, cost),
                        (Params::$variant(p), _) => Algorithm::check(p, &Default::default(), now, cost),
                    )*
                }
            }

            /// Records `cost` at `now` (saturating when it does not fit).
            pub fn charge(&self, state: &mut State, now: Micros, cost: u64) {
                match self {
                    $(
                        Params::$variant(p) => {
                            if !matches!(state, State::$variant(_)) {
                                *state = State::$variant(Default::default());
                            }
                            if let State::$variant(s) = state {
                                Algorithm::charge(p, s.borrow_mut(), now, cost);
                            }
                        }
                    )*
                }
            }

            /// Gives back `cost` charged earlier (see [`Algorithm::refund`]).
            pub fn refund(&self, state: &mut State, now: Micros, cost: u64) {
                match (self, state) {
                    $(
                        (Params::$variant(p), State::$variant(s)) => Algorithm::refund(p, s.borrow_mut(), now, cost),
                    )*
                    _ => {}
                }
            }

            /// Releases lease `lease` of `cost`, if the state holds it.
            pub fn release(&self, state: &mut State, lease: u64, cost: u64) {
                match (self, state) {
                    $(
                        (Params::$variant(p), State::$variant(s)) => Algorithm::release(p, s.borrow_mut(), lease, cost),
                    )*
                    _ => {}
                }
            }

            /// Renews lease `lease` of `cost` from `now`, if the state
            /// holds it still.
            pub fn renew(&self, state: &mut State, lease: u64, cost: u64, now: Micros) {
                match (self, state) {
                    $(
                        (Params::$variant(p), State::$variant(s)) => Algorithm::renew(p, s.borrow_mut(), lease, cost, now),
                    )*
                    _ => {}
                }
            }

            /// The lease the last charge of `state` took, if any.
            pub fn lease(&self, state: &State) -> Option<u64> {
                match (self, state) {
                    $(
                        (Params::$variant(_), State::$variant(s)) => <$module::$variant as Algorithm>::lease(s.borrow()),
                    )*
                    _ => None,
                }
            }

            /// The time from which `state` reads as fresh.
            pub fn idle_at(&self, state: &State) -> Micros {
                match (self, state) {
                    $(
                        (Params::$variant(p), State::$variant(s)) => Algorithm::idle_at(p, s.borrow()),
                    )*
                    _ => Micros::ZERO,
                }
            }

            /// `state` as the Lua port keeps it (fresh when it belongs to
            /// another algorithm).
            pub fn to_script(&self, state: &State) -> ScriptState {
                match (self, state) {
                    $(
                        (Params::$variant(_), State::$variant(s)) => <$module::$variant as Algorithm>::to_script(s.borrow()),
                    )*
                    _ => ScriptState::default(),
                }
            }

            /// A state of this algorithm from how the Lua port keeps it.
            pub fn from_script(&self, s: &ScriptState) -> State {
                if *s == ScriptState::default() {
                    return State::Fresh;
                }
                match self {
                    $(
                        Params::$variant(_) => State::$variant(<$module::$variant as Algorithm>::from_script(s).into()),
                    )*
                }
            }
        }

        impl State {
            /// The mirror's code and two words of this state; `None` when
            /// it does not fit.
            pub(crate) fn to_mirror(&self) -> Option<(u8, [u64; 2])> {
                match self {
                    State::Fresh => Some((FRESH_CODE, [0, 0])),
                    $(
                        State::$variant(s) => <$module::$variant as Algorithm>::to_mirror(s.borrow()).map(|w| ($id, w)),
                    )*
                }
            }

            /// The state a mirror entry holds.
            pub(crate) fn from_mirror(code: u8, w: [u64; 2]) -> Option<State> {
                match code {
                    FRESH_CODE => Some(State::Fresh),
                    $(
                        $id => <$module::$variant as Algorithm>::to_mirror(&Default::default())
                            .map(|_| State::$variant(<$module::$variant as Algorithm>::from_mirror(w).into())),
                    )*
                    _ => None,
                }
            }
        }
    };
}

table!(define);

impl Default for Kind {
    /// `sliding_window_counter`, the spec's default.
    fn default() -> Self {
        Kind::SlidingWindowCounter
    }
}

impl Kind {
    /// Whether N concurrent requests admit exactly min(N, limit): every
    /// algorithm except the counter, which estimates by design.
    pub fn is_exact(self) -> bool {
        self != Kind::SlidingWindowCounter
    }

    /// Whether the algorithm counts requests in flight (leases) rather than
    /// requests over time.
    pub fn holds_leases(self) -> bool {
        self == Kind::Concurrency
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ids_and_names_are_one_to_one() {
        for k in Kind::ALL {
            assert_eq!(Kind::from_id(k.id()), Some(k));
            assert_eq!(k.name().parse::<Kind>(), Ok(k));
            assert_ne!(k.id(), 0);
            assert_ne!(k.id(), FRESH_CODE);
        }
        assert_eq!(Kind::from_id(0), None);
    }
}
