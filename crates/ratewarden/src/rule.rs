//! A rule: an algorithm with its limit and window, plus the modifiers of the
//! spec (`min_interval`, `penalty`, `count: failures`, `count_rejected`, `cost`,
//! `shadow`), and the pure evaluation of a request against one key's state.

use std::fmt;
use std::num::NonZeroU64;
use std::sync::Arc;
use std::time::Duration;

use crate::algorithm::{self, Check, Kind, NEVER, Params};
use crate::clock::{Micros, micros};

/// Why a rule could not be built.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum RuleError {
    /// The rule name is empty or not printable ASCII without quotes.
    #[error("rule name {0:?} must be 1-128 printable ASCII characters without `\"` or `\\`")]
    BadName(String),
    /// A duration that must be positive is zero.
    #[error("`{0}` must be longer than zero")]
    ZeroDuration(&'static str),
    /// The numbers do not fit exact integer arithmetic (here or in Lua), or
    /// are out of their range.
    #[error("{message}")]
    OutOfRange {
        /// The key whose value is at fault (the first of several).
        key: &'static str,
        /// What is wrong.
        message: String,
    },
    /// An option that does not apply to the chosen algorithm.
    #[error("`{key}` is only valid with algorithm {valid}")]
    NotApplicable {
        /// The offending key.
        key: &'static str,
        /// Where it is valid.
        valid: &'static str,
    },
}

impl RuleError {
    /// The configuration key at fault (`name`, `window`, `limit`, `burst`,
    /// `mode`, `min_interval`, `penalty`, `cost`...), so that a config
    /// error can point at it.
    ///
    /// ```
    /// use std::time::Duration;
    /// let e = ratewarden::Rule::builder("r").limit(5, Duration::ZERO).build().unwrap_err();
    /// assert_eq!(e.key(), "window");
    /// ```
    pub fn key(&self) -> &'static str {
        match self {
            RuleError::BadName(_) => "name",
            RuleError::ZeroDuration(k) => k,
            RuleError::OutOfRange { key, .. } => key,
            RuleError::NotApplicable { key, .. } => key,
        }
    }

    fn range(key: &'static str, message: impl Into<String>) -> Self {
        RuleError::OutOfRange {
            key,
            message: message.into(),
        }
    }
}

/// Escalating bans (`penalty:`): a key rejected for exceeding its limit is banned.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Penalty {
    /// Length of a first ban.
    pub duration: Duration,
    /// Each new ban within `memory` of the end of the previous one lasts this
    /// many times longer than it. 1 = no escalation.
    pub multiplier: u32,
    /// Upper bound of a ban.
    pub max: Duration,
    /// How long after a ban ends the key's ban history is remembered.
    pub memory: Duration,
}

impl Penalty {
    /// A fixed ban of `duration`, never escalating.
    ///
    /// ```
    /// use std::time::Duration;
    /// let p = ratewarden::Penalty::fixed(Duration::from_secs(600));
    /// assert_eq!((p.multiplier, p.max), (1, Duration::from_secs(600)));
    /// ```
    pub fn fixed(duration: Duration) -> Self {
        Self {
            duration,
            multiplier: 1,
            max: duration,
            memory: Duration::ZERO,
        }
    }
}

/// Which requests are charged.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub enum Counting {
    /// Every admitted request (the default).
    #[default]
    All,
    /// `count: failures`: only requests whose outcome is reported as a failure
    /// are charged; the limit and any ban are still checked before.
    Failures {
        /// A reported success clears the key's history (not an active ban).
        reset_on_success: bool,
    },
}

/// The configuration of a rule, before validation. Build one with
/// [`Rule::builder`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RuleSpec {
    /// Unique name; also the `violated-policies` entry and the header item.
    pub name: String,
    /// Algorithm (default `sliding_window_counter`).
    pub algorithm: Kind,
    /// Requests per window.
    pub limit: NonZeroU64,
    /// The window.
    pub window: Duration,
    /// Bucket / tolerance size for the bucket algorithms and GCRA (default `limit`).
    pub burst: Option<NonZeroU64>,
    /// `leaky_bucket` delay mode: hold conforming requests up to this long.
    pub max_delay: Option<Duration>,
    /// Minimum gap between admitted requests of one key.
    pub min_interval: Option<Duration>,
    /// Ban after exceeding the limit.
    pub penalty: Option<Penalty>,
    /// Which requests are charged.
    pub counting: Counting,
    /// Rejected requests are charged too.
    pub count_rejected: bool,
    /// Weight of each request under this rule.
    pub cost: NonZeroU64,
    /// Evaluate and record, never reject.
    pub shadow: bool,
}

/// Builds a [`Rule`].
#[derive(Debug, Clone)]
pub struct RuleBuilder(RuleSpec, bool);

impl RuleBuilder {
    /// The algorithm.
    pub fn algorithm(mut self, kind: Kind) -> Self {
        self.0.algorithm = kind;
        self
    }
    /// `limit` per `window`; [`build`](Self::build) rejects a zero limit.
    pub fn limit(mut self, limit: u64, window: Duration) -> Self {
        self.1 = NonZeroU64::new(limit).is_none();
        self.0.limit = NonZeroU64::new(limit).unwrap_or(NonZeroU64::MIN);
        self.0.window = window;
        self
    }
    /// Bucket / tolerance size.
    pub fn burst(mut self, burst: u64) -> Self {
        self.0.burst = NonZeroU64::new(burst);
        self
    }
    /// `leaky_bucket` delay mode with this bound.
    pub fn delay(mut self, max_delay: Duration) -> Self {
        self.0.max_delay = Some(max_delay);
        self
    }
    /// Minimum gap between admitted requests.
    pub fn min_interval(mut self, gap: Duration) -> Self {
        self.0.min_interval = Some(gap);
        self
    }
    /// Ban on exceeding the limit.
    pub fn penalty(mut self, penalty: Penalty) -> Self {
        self.0.penalty = Some(penalty);
        self
    }
    /// Charge only reported failures.
    pub fn count_failures(mut self, reset_on_success: bool) -> Self {
        self.0.counting = Counting::Failures { reset_on_success };
        self
    }
    /// Charge rejected requests too.
    pub fn count_rejected(mut self, yes: bool) -> Self {
        self.0.count_rejected = yes;
        self
    }
    /// Weight of each request; [`build`](Self::build) rejects zero.
    pub fn cost(mut self, cost: u64) -> Self {
        self.1 |= cost == 0;
        self.0.cost = NonZeroU64::new(cost).unwrap_or(NonZeroU64::MIN);
        self
    }
    /// Never reject; only record.
    pub fn shadow(mut self, yes: bool) -> Self {
        self.0.shadow = yes;
        self
    }
    /// Validates and compiles the rule.
    pub fn build(self) -> Result<Rule, RuleError> {
        if self.1 {
            return Err(RuleError::range(
                "limit",
                "`limit` and `cost` must be at least 1",
            ));
        }
        Rule::new(self.0)
    }
}

/// A validated rule, cheap to clone.
///
/// ```
/// use std::time::Duration;
/// use ratewarden::{Rule, algorithm::Kind};
/// let rule = Rule::builder("per-ip")
///     .algorithm(Kind::Gcra)
///     .limit(20, Duration::from_secs(60))
///     .build()
///     .unwrap();
/// assert_eq!(rule.name(), "per-ip");
/// assert_eq!(rule.limit(), 20);
/// ```
#[derive(Clone)]
pub struct Rule(Arc<Compiled>);

struct Compiled {
    spec: RuleSpec,
    params: Params,
    min_interval: Micros,
    id: u64,
}

impl fmt::Debug for Rule {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_tuple("Rule").field(&self.0.spec).finish()
    }
}

impl PartialEq for Rule {
    fn eq(&self, other: &Self) -> bool {
        // The same compiled rule (what a reload keeps) needs no field compare.
        Arc::ptr_eq(&self.0, &other.0) || self.0.spec == other.0.spec
    }
}

/// Largest integer every Lua number represents exactly.
const LUA_EXACT: u64 = 1 << 53;

impl Rule {
    /// A builder for `limit` 1 per second under `name`; set the rest with its methods.
    pub fn builder(name: impl Into<String>) -> RuleBuilder {
        RuleBuilder(
            RuleSpec {
                name: name.into(),
                algorithm: Kind::default(),
                limit: NonZeroU64::MIN,
                window: Duration::from_secs(1),
                burst: None,
                max_delay: None,
                min_interval: None,
                penalty: None,
                counting: Counting::All,
                count_rejected: false,
                cost: NonZeroU64::MIN,
                shadow: false,
            },
            false,
        )
    }

    /// Validates `spec` and compiles it.
    pub fn new(spec: RuleSpec) -> Result<Self, RuleError> {
        let name_ok = !spec.name.is_empty()
            && spec.name.len() <= 128
            && spec
                .name
                .bytes()
                .all(|b| b.is_ascii_graphic() && b != b'"' && b != b'\\');
        if !name_ok {
            return Err(RuleError::BadName(spec.name));
        }
        let window = micros(spec.window);
        if window == 0 {
            return Err(RuleError::ZeroDuration("window"));
        }
        if window >= LUA_EXACT / 4 {
            return Err(RuleError::range(
                "window",
                "`window` must be shorter than 50 years",
            ));
        }
        let limit = spec.limit.get();
        let burst = spec.burst.map_or(limit, NonZeroU64::get);
        if limit > u32::MAX as u64 {
            return Err(RuleError::range(
                "limit",
                "`limit` must be at most 4294967295",
            ));
        }
        if burst > u32::MAX as u64 {
            return Err(RuleError::range(
                "burst",
                "`burst` must be at most 4294967295",
            ));
        }
        let buckets = matches!(
            spec.algorithm,
            Kind::TokenBucket | Kind::LeakyBucket | Kind::Gcra
        );
        if spec.burst.is_some() && !buckets {
            return Err(RuleError::NotApplicable {
                key: "burst",
                valid: "token_bucket, leaky_bucket or gcra",
            });
        }
        if spec.max_delay.is_some() && spec.algorithm != Kind::LeakyBucket {
            return Err(RuleError::NotApplicable {
                key: "mode",
                valid: "leaky_bucket",
            });
        }
        let params = match spec.algorithm {
            Kind::FixedWindow => {
                Params::FixedWindow(algorithm::fixed_window::FixedWindow::new(limit, window))
            }
            Kind::SlidingWindowLog => Params::SlidingWindowLog(
                algorithm::sliding_window_log::SlidingWindowLog::new(limit, window),
            ),
            Kind::SlidingWindowCounter => {
                let ticks = if window % 1_000 == 0 {
                    window / 1_000
                } else {
                    window
                };
                if (limit as u128) * (ticks as u128) * 3 >= LUA_EXACT as u128 {
                    return Err(RuleError::range(
                        "limit",
                        format!(
                            "sliding_window_counter with `limit` {limit} and `window` {:?} is \
                             too large to estimate exactly; lower one of them",
                            spec.window
                        ),
                    ));
                }
                Params::SlidingWindowCounter(
                    algorithm::sliding_window_counter::SlidingWindowCounter::new(limit, window),
                )
            }
            Kind::TokenBucket | Kind::LeakyBucket => {
                let g = gcd(window, limit);
                if (burst as u128) * ((window / g) as u128) >= LUA_EXACT as u128 {
                    return Err(RuleError::range(
                        "burst",
                        format!(
                            "`burst` {burst} with `window` {:?} is too fine-grained to count \
                             exactly; use a shorter window or a limit that divides it",
                            spec.window
                        ),
                    ));
                }
                if spec.algorithm == Kind::TokenBucket {
                    Params::TokenBucket(algorithm::token_bucket::TokenBucket::new(
                        limit, window, burst,
                    ))
                } else if let Some(max) = spec.max_delay {
                    Params::LeakyBucket(algorithm::leaky_bucket::LeakyBucket::delayed(
                        limit,
                        window,
                        burst,
                        micros(max),
                    ))
                } else {
                    Params::LeakyBucket(algorithm::leaky_bucket::LeakyBucket::new(
                        limit, window, burst,
                    ))
                }
            }
            Kind::Gcra => {
                if window < limit {
                    return Err(RuleError::range(
                        "limit",
                        "gcra needs `window / limit` of at least 1µs",
                    ));
                }
                if (window / limit) as u128 * burst as u128 >= (LUA_EXACT / 4) as u128 {
                    return Err(RuleError::range(
                        "burst",
                        "gcra `burst` × `window` / `limit` must be under 70 years",
                    ));
                }
                Params::Gcra(algorithm::gcra::Gcra::new(limit, window, burst))
            }
        };
        let min_interval = spec.min_interval.map_or(0, micros);
        if spec.min_interval.is_some() && min_interval == 0 {
            return Err(RuleError::ZeroDuration("min_interval"));
        }
        if let Some(p) = &spec.penalty {
            if p.duration.is_zero() {
                return Err(RuleError::ZeroDuration("penalty"));
            }
            if p.multiplier == 0 {
                return Err(RuleError::range(
                    "penalty",
                    "`penalty.multiplier` must be at least 1",
                ));
            }
            if p.max < p.duration {
                return Err(RuleError::range(
                    "penalty",
                    "`penalty.max` must be at least `penalty.duration`",
                ));
            }
        }
        // The id names the rule's state: a rule reloaded with the same name and
        // parameters keeps its keys; change a parameter and it starts afresh.
        let id = fnv1a(canonical(&spec).as_bytes());
        Ok(Self(Arc::new(Compiled {
            params,
            min_interval,
            id,
            spec,
        })))
    }

    /// The rule's name.
    pub fn name(&self) -> &str {
        &self.0.spec.name
    }
    /// Its configuration.
    pub fn spec(&self) -> &RuleSpec {
        &self.0.spec
    }
    /// Requests per window.
    pub fn limit(&self) -> u64 {
        self.0.spec.limit.get()
    }
    /// The window.
    pub fn window(&self) -> Duration {
        self.0.spec.window
    }
    /// A stable fingerprint of name and parameters, naming the rule's state in stores.
    pub fn id(&self) -> u64 {
        self.0.id
    }
    /// The compiled algorithm.
    pub fn params(&self) -> &Params {
        &self.0.params
    }
    /// Whether the rule only records.
    pub fn is_shadow(&self) -> bool {
        self.0.spec.shadow
    }
    /// Whether the rule charges only reported failures.
    pub fn counts_failures(&self) -> bool {
        matches!(self.0.spec.counting, Counting::Failures { .. })
    }
    /// Cost of a request of `weight` under this rule.
    pub fn cost(&self, weight: u64) -> u64 {
        self.0.spec.cost.get().saturating_mul(weight.max(1))
    }
}

/// Every parameter of a rule as one string, in a fixed format: the input of
/// the rule's id, which names its keys in Redis, so it must not depend on the
/// build (as `derive(Hash)` or `Debug` output may).
fn canonical(spec: &RuleSpec) -> String {
    let us = |d: Option<Duration>| d.map_or(-1, |d| micros(d) as i128);
    let (pd, pm, px, pmem) = spec.penalty.map_or((-1, 0, -1, -1), |p| {
        (
            us(Some(p.duration)),
            p.multiplier,
            us(Some(p.max)),
            us(Some(p.memory)),
        )
    });
    let counting = match spec.counting {
        Counting::All => "all",
        Counting::Failures {
            reset_on_success: true,
        } => "failures+reset",
        Counting::Failures {
            reset_on_success: false,
        } => "failures",
    };
    format!(
        "v1|{}|{}|{}|{}|{}|{}|{}|{pd}|{pm}|{px}|{pmem}|{counting}|{}|{}|{}",
        spec.name,
        spec.algorithm,
        spec.limit,
        micros(spec.window),
        spec.burst.map_or(0, NonZeroU64::get),
        us(spec.max_delay),
        us(spec.min_interval),
        spec.count_rejected,
        spec.cost,
        spec.shadow
    )
}

/// 64-bit FNV-1a: tiny, and fixed forever.
fn fnv1a(bytes: &[u8]) -> u64 {
    bytes.iter().fold(0xcbf2_9ce4_8422_2325, |h, &b| {
        (h ^ u64::from(b)).wrapping_mul(0x0000_0100_0000_01b3)
    })
}

fn gcd(mut a: u64, mut b: u64) -> u64 {
    while b != 0 {
        (a, b) = (b, a % b);
    }
    a
}

/// Why a rule rejected a request.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Reason {
    /// Over the limit (or the cost can never fit).
    Limit,
    /// The key is banned by `penalty`.
    Banned,
    /// Too soon after the key's previous admitted request.
    MinInterval,
}

impl Reason {
    /// A short machine name: `limit`, `banned`, `min_interval`.
    pub fn as_str(self) -> &'static str {
        match self {
            Reason::Limit => "limit",
            Reason::Banned => "banned",
            Reason::MinInterval => "min_interval",
        }
    }
}

/// One key's state under one rule: the algorithm's, plus the modifiers'.
///
/// The modifiers' marks are boxed and only allocated for keys of rules that
/// use `min_interval` or have actually banned: most keys carry 8 bytes for them.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct KeyState {
    /// The algorithm's state.
    pub algo: algorithm::State,
    marks: Option<Box<Marks>>,
}

/// The modifiers' part of a key's state.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Marks {
    /// Time of the previous admitted request (for `min_interval`); 0 = none.
    pub last: Micros,
    /// The key is banned until this time; 0 = never banned.
    pub ban_until: Micros,
    /// Number of escalations of the current or latest ban (0 = first ban).
    pub ban_level: u32,
}

impl KeyState {
    /// A state from its parts.
    pub fn new(algo: algorithm::State, marks: Marks) -> Self {
        let marks = (marks != Marks::default()).then(|| Box::new(marks));
        Self { algo, marks }
    }

    /// The modifiers' marks (all zero when none were ever set).
    pub fn marks(&self) -> Marks {
        self.marks.as_deref().copied().unwrap_or_default()
    }

    fn marks_mut(&mut self) -> &mut Marks {
        self.marks.get_or_insert_with(Box::default)
    }
}

/// What a rule says about one request on one key, before anything is recorded.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Verdict {
    /// The algorithm's view (remaining, reset, retry, delay).
    pub check: Check,
    /// Why it rejects; `None` when it admits.
    pub reason: Option<Reason>,
}

impl Verdict {
    /// Whether this rule admits the request.
    pub fn allowed(&self) -> bool {
        self.reason.is_none()
    }
}

impl Rule {
    /// Evaluates a request of `cost` at `now` against `state`. Pure.
    ///
    /// Order: an active ban, then `min_interval`, then the algorithm.
    pub fn verdict(&self, state: &KeyState, now: Micros, cost: u64) -> Verdict {
        self.verdict_parts(&state.algo, state.marks(), now, cost)
    }

    /// [`Rule::verdict`] on a state given as its parts (no allocation for
    /// marks: the memory store's lock-free readers call this).
    pub(crate) fn verdict_parts(
        &self,
        algo: &algorithm::State,
        marks: Marks,
        now: Micros,
        cost: u64,
    ) -> Verdict {
        let c = &self.0;
        let check = c.params.check(algo, now, cost);
        if marks.ban_until > now {
            let left = marks.ban_until - now;
            return Verdict {
                check: Check::deny(0, check.reset_after, left),
                reason: Some(Reason::Banned),
            };
        }
        if c.min_interval > 0 && marks.last > 0 && now < marks.last + c.min_interval {
            let wait = marks.last + c.min_interval - now;
            let retry = if check.allowed {
                wait
            } else {
                wait.max(check.retry_after)
            };
            return Verdict {
                check: Check::deny(check.remaining, check.reset_after, retry),
                reason: Some(Reason::MinInterval),
            };
        }
        if !check.allowed {
            let mut check = check;
            if let Some(p) = &c.spec.penalty {
                // This rejection starts a ban: the client learns its length now.
                let (len, _) = self.next_ban(marks, now, p);
                check.retry_after = len;
                check.reset_after = check.reset_after.max(len);
            }
            return Verdict {
                check,
                reason: Some(Reason::Limit),
            };
        }
        Verdict {
            check,
            reason: None,
        }
    }

    /// Length and level of the ban a limit rejection at `now` starts.
    fn next_ban(&self, marks: Marks, now: Micros, p: &Penalty) -> (Micros, u32) {
        let remembered = marks.ban_until > 0 && now <= marks.ban_until + micros(p.memory);
        let level = if remembered { marks.ban_level + 1 } else { 0 };
        let factor = (p.multiplier as u64).saturating_pow(level);
        let len = micros(p.duration).saturating_mul(factor).min(micros(p.max));
        (len, level)
    }

    /// Records the outcome of a decision on this key.
    ///
    /// `verdict` is this rule's verdict; `admitted` whether the request as a
    /// whole was admitted (every non-shadow rule allowed it). A rule that
    /// allowed a request another rule rejected records nothing.
    pub fn commit(
        &self,
        state: &mut KeyState,
        now: Micros,
        cost: u64,
        verdict: &Verdict,
        admitted: bool,
    ) {
        let c = &self.0;
        match verdict.reason {
            None if admitted => {
                if !self.counts_failures() {
                    c.params.charge(&mut state.algo, now, cost);
                }
                if c.min_interval > 0 {
                    state.marks_mut().last = now;
                }
            }
            None | Some(Reason::Banned) => {}
            Some(reason) => {
                if c.spec.count_rejected {
                    c.params.charge(&mut state.algo, now, cost);
                    if c.min_interval > 0 {
                        state.marks_mut().last = now;
                    }
                }
                if let (Reason::Limit, Some(p)) = (reason, &c.spec.penalty) {
                    let (len, level) = self.next_ban(state.marks(), now, p);
                    let marks = state.marks_mut();
                    marks.ban_until = now + len;
                    marks.ban_level = level;
                }
            }
        }
    }

    /// Whether [`commit`](Self::commit) would change anything: a decision
    /// that records nothing can be answered without exclusive access.
    pub fn records(&self, verdict: &Verdict, admitted: bool) -> bool {
        let c = &self.0;
        match verdict.reason {
            None => admitted && (!self.counts_failures() || c.min_interval > 0),
            Some(Reason::Banned) => false,
            Some(Reason::MinInterval) => c.spec.count_rejected,
            Some(Reason::Limit) => c.spec.count_rejected || c.spec.penalty.is_some(),
        }
    }

    /// Settles a `count: failures` request after its outcome is known: a
    /// failure is charged; a success clears the history if `reset_on_success`.
    pub fn settle(&self, state: &mut KeyState, now: Micros, cost: u64, failure: bool) {
        match self.0.spec.counting {
            Counting::All => {}
            Counting::Failures { .. } if failure => {
                self.0.params.charge(&mut state.algo, now, cost)
            }
            Counting::Failures { reset_on_success } => {
                if reset_on_success {
                    state.algo = algorithm::State::Fresh;
                }
            }
        }
    }

    /// The time from which `state` reads as fresh and may be forgotten.
    pub fn idle_at(&self, state: &KeyState) -> Micros {
        let c = &self.0;
        let mut t = c.params.idle_at(&state.algo);
        let marks = state.marks();
        if marks.last > 0 {
            t = t.max(marks.last + c.min_interval);
        }
        if marks.ban_until > 0 {
            let memory = c.spec.penalty.map_or(0, |p| micros(p.memory));
            t = t.max(marks.ban_until + memory);
        }
        t
    }
}

/// Turns a `retry_after` of [`NEVER`] into `None`.
pub(crate) fn finite(us: Micros) -> Option<Micros> {
    (us != NEVER).then_some(us)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_id_is_fixed_by_name_and_parameters_alone() {
        let a = Rule::builder("r")
            .limit(5, Duration::from_secs(60))
            .build()
            .unwrap();
        let b = Rule::builder("r")
            .limit(5, Duration::from_secs(60))
            .build()
            .unwrap();
        let c = Rule::builder("r")
            .limit(6, Duration::from_secs(60))
            .build()
            .unwrap();
        assert_eq!(a.id(), b.id());
        assert_ne!(a.id(), c.id());
        // Pinned: a change here renames every key in every Redis.
        assert_eq!(
            canonical(a.spec()),
            "v1|r|sliding_window_counter|5|60000000|0|-1|-1|-1|0|-1|-1|all|false|1|false"
        );
        assert_eq!(fnv1a(b"a"), 0xaf63_dc4c_8601_ec8c);
    }
}
