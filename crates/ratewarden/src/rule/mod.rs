//! A rule: an algorithm with its limit and window, plus the modifiers of the
//! spec (`min_interval`, `penalty`, `count: failures`, `count_rejected`, `cost`,
//! `shadow`).
//!
//! * [`spec`]: what a rule is configured with, and its validation;
//! * [`eval`]: the pure evaluation of a request against one key's state;
//! * [`id`]: the fingerprint that names a rule's state in stores.

mod eval;
mod id;
mod settle;
mod spec;

use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use crate::algorithm::Params;
use crate::clock::Micros;

pub(crate) use eval::finite;
pub use eval::{KeyState, Marks, PROTECTED, Reason, Verdict, Weight};
pub use id::fnv1a;
pub use settle::Settle;
pub use spec::{
    Counting, Distribution, MAX_HOLD, Penalty, RuleBuilder, RuleError, RuleSpec, Variant,
};

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
    /// Requests of its cost a fresh key admits (at least 1): what a key's
    /// use is measured against for eviction ([`Rule::weight`]).
    capacity: u64,
    /// The rule as the Redis script takes it, made on first use.
    #[cfg_attr(not(feature = "redis"), allow(dead_code))]
    script_spec: std::sync::OnceLock<Box<str>>,
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

impl Rule {
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
    /// The tier this is, for a tier of a rule.
    pub fn tier(&self) -> Option<&str> {
        match &self.0.spec.variant {
            Some(spec::Variant::Tier(t)) => Some(t),
            _ => None,
        }
    }
    /// Whether this is an override of one key's parameters.
    pub fn is_override(&self) -> bool {
        self.0.spec.variant == Some(spec::Variant::Override)
    }
    /// The calendar of a calendar window.
    pub fn calendar(&self) -> Option<&crate::calendar::Calendar> {
        self.0.spec.calendar.as_deref()
    }
    /// Whether the rule only records.
    pub fn is_shadow(&self) -> bool {
        self.0.spec.shadow
    }
    /// Whether the rule charges only reported failures.
    pub fn counts_failures(&self) -> bool {
        matches!(self.0.spec.counting, Counting::Failures { .. })
    }
    /// How gateways share its allowance, if they lease it.
    pub fn distribution(&self) -> Option<&spec::Distribution> {
        self.0.spec.distribution.as_ref()
    }
    /// What all leases of one key may hold together, in requests of weight
    /// 1: ε × limit / cost (at least 1 for a leased rule; 0 otherwise).
    pub fn lease_room(&self) -> u64 {
        self.0
            .spec
            .distribution
            .map_or(0, |d| d.room(self.limit()) / self.0.spec.cost.get())
    }
    /// The rule's spec as the Redis script takes it, made once by `make`.
    #[cfg(feature = "redis")]
    pub(crate) fn script_spec(&self, make: impl FnOnce() -> String) -> &str {
        self.0.script_spec.get_or_init(|| make().into_boxed_str())
    }
    /// Cost of a request of `weight` under this rule.
    pub fn cost(&self, weight: u64) -> u64 {
        self.0.spec.cost.get().saturating_mul(weight.max(1))
    }
}
