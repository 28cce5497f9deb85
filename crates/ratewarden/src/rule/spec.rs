//! What a rule is configured with ([`RuleSpec`], [`RuleBuilder`]), and the
//! validation that compiles it into a [`Rule`].

use std::num::NonZeroU64;
use std::sync::Arc;
use std::time::Duration;

use super::id::{canonical, fnv1a};
use super::{Compiled, Rule};
use crate::algorithm::{self, Kind, Params};
use crate::calendar::Calendar;
use crate::clock::{Micros, micros};

/// Why a rule could not be built.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum RuleError {
    /// The rule name is empty or not printable ASCII without quotes.
    #[error("rule name {0:?} must be 1-128 printable ASCII characters without `\"` or `\\`")]
    BadName(String),
    /// A tier's name is empty or not printable ASCII without quotes.
    #[error("tier name {0:?} must be 1-128 printable ASCII characters without `\"` or `\\`")]
    BadTier(String),
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
            RuleError::BadTier(_) => "tiers",
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
    /// `concurrency`: how long a lease counts if its holder never releases
    /// it (default 60 s).
    pub max_hold: Option<Duration>,
    /// `distribution: {mode: lease}`: gateways answer this rule's keys
    /// from slices leased from the shared store ([`crate::store::lease`]).
    pub distribution: Option<Distribution>,
    /// `calendar:` (`fixed_window` only): windows are the periods of a
    /// calendar in a time zone, not multiples of `window`.
    pub calendar: Option<Arc<Calendar>>,
    /// Which of a rule's parameter sets this is: a tier, or an override of
    /// one key. Each counts in its own state (it is part of the id).
    pub variant: Option<Variant>,
    /// The HTTP status of a refusal by this rule (`status:`), instead of
    /// the front end's default (429). Not part of the id.
    pub status: Option<u16>,
    /// The problem `type` URI of a refusal by this rule, instead of
    /// `quota-exceeded`'s. Not part of the id.
    pub problem_type: Option<String>,
}

/// Which parameter set of a rule a compiled rule is (see
/// [`RuleSpec::variant`]).
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum Variant {
    /// The tier of this name (`tiers: {values: {NAME: ...}}`).
    Tier(String),
    /// An override set at runtime for one key.
    Override,
}

/// How gateways share a hot key's allowance (`distribution: {mode: lease,
/// epsilon, max_share}`): each leases a slice of it from the shared store
/// and answers from the slice locally. The slices all gateways hold
/// together never exceed `epsilon` × `limit`, which bounds what leasing
/// can over-admit in any window ([`crate::store::lease`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Distribution {
    /// ε: what outstanding leases of one key may hold together, as a share
    /// of the limit, in millionths.
    pub epsilon_ppm: u32,
    /// The most one lease may take of that room, in millionths.
    pub max_share_ppm: u32,
}

impl Distribution {
    /// Leases bounded by `epsilon` of the limit, each at most `max_share`
    /// of that (both shares in (0, 1]; rounded to millionths).
    pub fn lease(epsilon: f64, max_share: f64) -> Self {
        let ppm = |x: f64| (x * 1e6).round().clamp(0.0, u32::MAX as f64) as u32;
        Self {
            epsilon_ppm: ppm(epsilon),
            max_share_ppm: ppm(max_share),
        }
    }

    /// ε × `limit`: what all slices of one key may hold together, in the
    /// limit's units (a request's cost each).
    pub fn room(&self, limit: u64) -> u64 {
        limit * u64::from(self.epsilon_ppm) / 1_000_000
    }

    /// The most one slice may take of `room`: `max_share` of it, at least 1.
    pub fn share(&self, room: u64) -> u64 {
        (room * u64::from(self.max_share_ppm) / 1_000_000).max(1)
    }
}

/// How long a `concurrency` lease counts when nobody releases it, unless
/// `max_hold` says otherwise.
pub const MAX_HOLD: Duration = Duration::from_secs(60);

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
    /// `concurrency`: a lease lapses this long after it was taken.
    pub fn max_hold(mut self, hold: Duration) -> Self {
        self.0.max_hold = Some(hold);
        self
    }
    /// Lease slices of the allowance to gateways ([`Distribution`]).
    pub fn distribution(mut self, d: Distribution) -> Self {
        self.0.distribution = Some(d);
        self
    }
    /// Windows are `calendar`'s periods (`fixed_window` only).
    pub fn calendar(mut self, calendar: Calendar) -> Self {
        self.0.calendar = Some(Arc::new(calendar));
        self
    }
    /// Which parameter set of a rule this is.
    pub fn variant(mut self, variant: Variant) -> Self {
        self.0.variant = Some(variant);
        self
    }
    /// The status of a refusal by this rule.
    pub fn status(mut self, status: u16) -> Self {
        self.0.status = Some(status);
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
                max_hold: None,
                distribution: None,
                calendar: None,
                variant: None,
                status: None,
                problem_type: None,
            },
            false,
        )
    }

    /// Validates `spec` and compiles it.
    pub fn new(spec: RuleSpec) -> Result<Self, RuleError> {
        // Names go into the rate-limit headers as sf-strings as they are
        // (`RateLimit-Policy: "name";q=...;tier="pro"`): checked here once,
        // so that no header is checked again per request.
        let name_ok = |n: &str| {
            !n.is_empty()
                && n.len() <= 128
                && n.bytes()
                    .all(|b| b.is_ascii_graphic() && b != b'"' && b != b'\\')
        };
        if !name_ok(&spec.name) {
            return Err(RuleError::BadName(spec.name));
        }
        if let Some(Variant::Tier(t)) = &spec.variant
            && !name_ok(t)
        {
            return Err(RuleError::BadTier(t.clone()));
        }
        let window = micros(spec.window);
        if window == Micros::ZERO {
            return Err(RuleError::ZeroDuration("window"));
        }
        if window.get() >= LUA_EXACT / 4 {
            return Err(RuleError::range(
                "window",
                "`window` must be shorter than 50 years",
            ));
        }
        let limit = spec.limit.get();
        let burst_n = spec.burst.unwrap_or(spec.limit);
        let burst = burst_n.get();
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
        if spec.algorithm == Kind::Concurrency {
            // A lease is taken when a request is admitted and given back when
            // it ends: charging rejections or reported failures would take
            // leases nobody gives back.
            if spec.count_rejected {
                return Err(RuleError::NotApplicable {
                    key: "count_rejected",
                    valid: "a time-window algorithm (not concurrency)",
                });
            }
            if matches!(spec.counting, Counting::Failures { .. }) {
                return Err(RuleError::NotApplicable {
                    key: "count",
                    valid: "a time-window algorithm (not concurrency)",
                });
            }
        } else if spec.max_hold.is_some() {
            return Err(RuleError::NotApplicable {
                key: "max_hold",
                valid: "concurrency",
            });
        }
        if spec.calendar.is_some() && spec.algorithm != Kind::FixedWindow {
            return Err(RuleError::NotApplicable {
                key: "calendar",
                valid: "fixed_window",
            });
        }
        if spec.calendar.is_some() && spec.distribution.is_some() {
            return Err(RuleError::NotApplicable {
                key: "distribution",
                valid: "a rule without `calendar`",
            });
        }
        if let Some(s) = spec.status
            && !(400..600).contains(&s)
        {
            return Err(RuleError::range(
                "status",
                "`status` must be an HTTP error status (400-599)",
            ));
        }
        let params = match spec.algorithm {
            Kind::FixedWindow => Params::FixedWindow(match &spec.calendar {
                Some(c) => algorithm::fixed_window::FixedWindow::calendar(spec.limit, c.clone()),
                None => algorithm::fixed_window::FixedWindow::new(spec.limit, window)
                    .map_err(param("window"))?,
            }),
            Kind::Concurrency => {
                let hold = micros(spec.max_hold.unwrap_or(MAX_HOLD));
                if hold == Micros::ZERO {
                    return Err(RuleError::ZeroDuration("max_hold"));
                }
                if hold.get() >= LUA_EXACT / 4 {
                    return Err(RuleError::range(
                        "max_hold",
                        "`max_hold` must be shorter than 50 years",
                    ));
                }
                Params::Concurrency(
                    algorithm::concurrency::Concurrency::new(spec.limit, hold)
                        .map_err(param("max_hold"))?,
                )
            }
            Kind::SlidingWindowLog => Params::SlidingWindowLog(
                algorithm::sliding_window_log::SlidingWindowLog::new(spec.limit, window)
                    .map_err(param("window"))?,
            ),
            Kind::SlidingWindowCounter => {
                let w = window.get();
                let ticks = if w.is_multiple_of(1_000) {
                    w / 1_000
                } else {
                    w
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
                    algorithm::sliding_window_counter::SlidingWindowCounter::new(
                        spec.limit, window,
                    )
                    .map_err(param("window"))?,
                )
            }
            Kind::TokenBucket | Kind::LeakyBucket => {
                let g = gcd(window.get(), limit);
                if (burst as u128) * ((window.get() / g) as u128) >= LUA_EXACT as u128 {
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
                    Params::TokenBucket(
                        algorithm::token_bucket::TokenBucket::new(spec.limit, window, burst_n)
                            .map_err(param("window"))?,
                    )
                } else if let Some(max) = spec.max_delay {
                    Params::LeakyBucket(
                        algorithm::leaky_bucket::LeakyBucket::delayed(
                            spec.limit,
                            window,
                            burst_n,
                            micros(max),
                        )
                        .map_err(param("mode"))?,
                    )
                } else {
                    Params::LeakyBucket(
                        algorithm::leaky_bucket::LeakyBucket::new(spec.limit, window, burst_n)
                            .map_err(param("window"))?,
                    )
                }
            }
            Kind::Gcra => {
                if window.get() < limit {
                    return Err(RuleError::range(
                        "limit",
                        "gcra needs `window / limit` of at least 1µs",
                    ));
                }
                if (window.get() / limit) as u128 * burst as u128 >= (LUA_EXACT / 4) as u128 {
                    return Err(RuleError::range(
                        "burst",
                        "gcra `burst` × `window` / `limit` must be under 70 years",
                    ));
                }
                Params::Gcra(
                    algorithm::gcra::Gcra::new(spec.limit, window, burst_n)
                        .map_err(param("limit"))?,
                )
            }
        };
        let min_interval = spec.min_interval.map_or(Micros::ZERO, micros);
        if spec.min_interval.is_some() && min_interval == Micros::ZERO {
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
        if let Some(d) = &spec.distribution {
            lease_check(&spec, d)?;
        }
        // The id names the rule's state: a rule reloaded with the same name and
        // parameters keeps its keys; change a parameter and it starts afresh.
        let id = fnv1a(canonical(&spec).bytes());
        let capacity = params
            .check(&algorithm::State::Fresh, Micros::ZERO, spec.cost.get())
            .remaining
            .saturating_add(1);
        Ok(Self(Arc::new(Compiled {
            params,
            min_interval,
            id,
            capacity,
            spec,
            script_spec: Default::default(),
        })))
    }
}

/// Whether a rule can be leased: a plain limit on an algorithm whose
/// charge can be taken ahead of use. Bans, minimum gaps and failure
/// counting decide per request, on the request's own time, which a slice
/// answered locally cannot reproduce.
fn lease_check(spec: &RuleSpec, d: &Distribution) -> Result<(), RuleError> {
    const WHERE: &str = "a plain limit (no penalty, min_interval, count: failures, \
                         count_rejected) of fixed_window, sliding_window_log, \
                         sliding_window_counter, token_bucket, gcra or leaky_bucket (reject mode)";
    let plain = spec.penalty.is_none()
        && spec.min_interval.is_none()
        && spec.counting == Counting::All
        && !spec.count_rejected
        && spec.max_delay.is_none()
        && spec.algorithm != Kind::Concurrency;
    if !plain {
        return Err(RuleError::NotApplicable {
            key: "distribution",
            valid: WHERE,
        });
    }
    let share = |x: u32| (1..=1_000_000).contains(&x);
    if !share(d.epsilon_ppm) || !share(d.max_share_ppm) {
        return Err(RuleError::range(
            "distribution",
            "`distribution.epsilon` and `distribution.max_share` must be in (0, 1] \
             (at least 0.000001)",
        ));
    }
    let room = d.room(spec.limit.get());
    if room < spec.cost.get() {
        return Err(RuleError::range(
            "distribution",
            format!(
                "`distribution.epsilon` × `limit` ({room}) must cover at least one request's \
                 cost ({}); raise epsilon, or leave the rule undistributed",
                spec.cost
            ),
        ));
    }
    Ok(())
}

/// Maps an algorithm's own parameter error onto the config key it is about.
fn param(key: &'static str) -> impl Fn(algorithm::ParamError) -> RuleError {
    move |e| RuleError::range(key, e.0)
}

fn gcd(mut a: u64, mut b: u64) -> u64 {
    while b != 0 {
        (a, b) = (b, a % b);
    }
    a
}
