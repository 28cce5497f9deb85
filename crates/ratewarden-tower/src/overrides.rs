//! Overrides: one key's limit of one rule, changed at runtime without a
//! reload (an operator's `PUT /v1/overrides/{rule}/{key}`).
//!
//! The table is read on every decision of a rule with a key, so it is a
//! local map behind a read lock, skipped with one atomic load while it is
//! empty; a front end that shares overrides between processes (the
//! gateway, through Redis) replaces the whole table when it learns of a
//! change ([`Overrides::replace`]), never per request.
//!
//! An override counts in its own state ([`ratewarden::Variant::Override`]
//! is part of the rule's id): setting or changing one starts the key
//! afresh under the new limit (Bucket4j's `RESET`), and removing one
//! brings the key back to its rule's or tier's state, as used before.

use std::collections::HashMap;
use std::num::NonZeroU64;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::time::Duration;

use parking_lot::RwLock;
use ratewarden::clock::{Clock, Micros};
use ratewarden::{Rule, RuleError, Variant};

/// What an override sets: any of the limit, the window and the burst (the
/// rest is the rule's), or no limit at all.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Override {
    /// Requests per window.
    pub limit: Option<NonZeroU64>,
    /// The window.
    pub window: Option<Duration>,
    /// The bucket size (bucket algorithms and GCRA).
    pub burst: Option<NonZeroU64>,
    /// The key is not limited by the rule at all.
    pub unlimited: bool,
    /// When it lapses (µs since the epoch), if ever.
    pub expires_at: Option<Micros>,
    /// The operator's note (a ticket number).
    pub note: Option<String>,
}

impl Override {
    /// The rule `base` with this override's parameters, in a state of its
    /// own; `Ok(None)` for an unlimited override.
    pub fn compile(&self, base: &Rule) -> Result<Option<Rule>, RuleError> {
        if self.unlimited {
            return Ok(None);
        }
        let mut spec = base.spec().clone();
        if let Some(l) = self.limit {
            spec.limit = l;
        }
        if let Some(w) = self.window {
            spec.window = w;
        }
        if self.burst.is_some() {
            spec.burst = self.burst;
        }
        spec.variant = Some(Variant::Override);
        Rule::new(spec).map(Some)
    }
}

/// What an override does to a decision.
#[derive(Debug, Clone)]
pub enum Applied {
    /// The key is decided by this rule.
    Limited(Rule),
    /// The key is not limited by the rule.
    Unlimited,
}

/// Why an override was not set.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum SetError {
    /// The table holds its most already.
    Full(usize),
    /// The parameters do not make a rule (the message says why).
    Invalid(String),
}

impl std::fmt::Display for SetError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            SetError::Full(max) => write!(
                f,
                "at most {max} overrides may be set (`overrides.max`); delete one first"
            ),
            SetError::Invalid(m) => f.write_str(m),
        }
    }
}

struct Entry {
    given: Override,
    /// Compiled against the rule whose id is `base`.
    base: u64,
    compiled: Option<Rule>,
}

/// The overrides in force, by rule and key.
pub struct Overrides {
    /// rule name -> key -> entry.
    table: RwLock<HashMap<String, HashMap<String, Entry>>>,
    /// Whether the table holds any: the common case, none, costs one load.
    any: AtomicBool,
    max: AtomicUsize,
    clock: Arc<dyn Clock>,
}

impl std::fmt::Debug for Overrides {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Overrides")
            .field("count", &self.len())
            .field("max", &self.max())
            .finish()
    }
}

impl Overrides {
    /// An empty table of at most `max` overrides, whose expiries are read
    /// on `clock`.
    pub fn new(max: usize, clock: Arc<dyn Clock>) -> Self {
        Self {
            table: RwLock::new(HashMap::new()),
            any: AtomicBool::new(false),
            max: AtomicUsize::new(max),
            clock,
        }
    }

    /// The most it holds.
    pub fn max(&self) -> usize {
        self.max.load(Ordering::Relaxed)
    }

    /// Changes the most it holds (a reload); those set already stay.
    pub fn set_max(&self, max: usize) {
        self.max.store(max, Ordering::Relaxed);
    }

    /// How many it holds (expired ones until they are swept).
    pub fn len(&self) -> usize {
        self.table.read().values().map(HashMap::len).sum()
    }

    /// The time on its clock (µs since the epoch): what expiries are read
    /// against.
    pub fn now(&self) -> Micros {
        self.clock.now()
    }

    /// Whether it holds none.
    pub fn is_empty(&self) -> bool {
        !self.any.load(Ordering::Relaxed)
    }

    fn live(&self, o: &Override) -> bool {
        o.expires_at.is_none_or(|at| self.clock.now() < at)
    }

    /// Sets `key`'s override of `rule` (replacing one), checking its
    /// parameters and the bound.
    pub fn set(&self, rule: &Rule, key: &str, o: Override) -> Result<(), SetError> {
        let compiled = o
            .compile(rule)
            .map_err(|e| SetError::Invalid(format!("{} ({})", e, e.key())))?;
        let mut t = self.table.write();
        let exists = t.get(rule.name()).is_some_and(|k| k.contains_key(key));
        let max = self.max();
        if !exists && t.values().map(HashMap::len).sum::<usize>() >= max {
            return Err(SetError::Full(max));
        }
        t.entry(rule.name().to_owned()).or_default().insert(
            key.to_owned(),
            Entry {
                given: o,
                base: rule.id(),
                compiled,
            },
        );
        self.any.store(true, Ordering::Relaxed);
        Ok(())
    }

    /// Removes `key`'s override of `rule`; whether there was one.
    pub fn remove(&self, rule: &str, key: &str) -> bool {
        let mut t = self.table.write();
        let removed = t.get_mut(rule).is_some_and(|k| k.remove(key).is_some());
        t.retain(|_, k| !k.is_empty());
        self.any.store(!t.is_empty(), Ordering::Relaxed);
        removed
    }

    /// The override in force for `key` of `rule`, if any (an expired one is
    /// not).
    pub fn get(&self, rule: &Rule, key: &str) -> Option<Applied> {
        if self.is_empty() {
            return None;
        }
        let t = self.table.read();
        let e = t.get(rule.name())?.get(key)?;
        if !self.live(&e.given) {
            return None;
        }
        if e.base == rule.id() {
            return Some(match &e.compiled {
                Some(r) => Applied::Limited(r.clone()),
                None => Applied::Unlimited,
            });
        }
        // The rule changed since (a reload that [`Self::rebase`] has not
        // seen yet): compiled afresh; one that no longer fits is ignored.
        match e.given.compile(rule) {
            Ok(Some(r)) => Some(Applied::Limited(r)),
            Ok(None) => Some(Applied::Unlimited),
            Err(_) => None,
        }
    }

    /// The overrides in force, of `rule` or of all, sorted by rule and key.
    pub fn list(&self, rule: Option<&str>) -> Vec<(String, String, Override)> {
        let t = self.table.read();
        let mut out: Vec<_> = t
            .iter()
            .filter(|(r, _)| rule.is_none_or(|want| want == r.as_str()))
            .flat_map(|(r, keys)| {
                keys.iter()
                    .filter(|(_, e)| self.live(&e.given))
                    .map(|(k, e)| (r.clone(), k.clone(), e.given.clone()))
            })
            .collect();
        out.sort_by(|a, b| (&a.0, &a.1).cmp(&(&b.0, &b.1)));
        out
    }

    /// The one override of `key` of `rule` in force.
    pub fn lookup(&self, rule: &str, key: &str) -> Option<Override> {
        let t = self.table.read();
        let e = t.get(rule)?.get(key)?;
        self.live(&e.given).then(|| e.given.clone())
    }

    /// Replaces the whole table with `entries` (what the shared store
    /// holds), compiled against the rules `rule` finds by name; an entry
    /// of a rule not found, or that no longer compiles, is kept for a
    /// policy that has it but not applied.
    pub fn replace<'r>(
        &self,
        entries: Vec<(String, String, Override)>,
        rule: impl Fn(&str) -> Option<&'r Rule>,
    ) {
        let mut t: HashMap<String, HashMap<String, Entry>> = HashMap::new();
        for (rule_name, key, given) in entries {
            let (base, compiled) = match rule(&rule_name) {
                Some(r) => match given.compile(r) {
                    Ok(c) => (r.id(), c),
                    Err(_) => (0, None),
                },
                None => (0, None),
            };
            t.entry(rule_name).or_default().insert(
                key,
                Entry {
                    given,
                    base,
                    compiled,
                },
            );
        }
        let mut table = self.table.write();
        self.any.store(!t.is_empty(), Ordering::Relaxed);
        *table = t;
    }

    /// Compiles every override against the rules `rule` finds by name
    /// again (after a reload), so that decisions find them ready.
    pub fn rebase<'r>(&self, rule: impl Fn(&str) -> Option<&'r Rule>) {
        let mut t = self.table.write();
        for (name, keys) in t.iter_mut() {
            let Some(r) = rule(name) else { continue };
            for e in keys.values_mut() {
                if e.base == r.id() {
                    continue;
                }
                if let Ok(c) = e.given.compile(r) {
                    e.base = r.id();
                    e.compiled = c;
                }
            }
        }
    }

    /// Drops the expired overrides; how many.
    pub fn sweep(&self) -> usize {
        let mut t = self.table.write();
        let mut n = 0;
        for keys in t.values_mut() {
            keys.retain(|_, e| {
                let keep = self.live(&e.given);
                n += usize::from(!keep);
                keep
            });
        }
        t.retain(|_, k| !k.is_empty());
        self.any.store(!t.is_empty(), Ordering::Relaxed);
        n
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use ratewarden::clock::ManualClock;

    fn rule() -> Rule {
        Rule::builder("api")
            .limit(10, Duration::from_secs(60))
            .build()
            .unwrap()
    }

    fn limit(n: u64) -> Override {
        Override {
            limit: NonZeroU64::new(n),
            window: None,
            burst: None,
            unlimited: false,
            expires_at: None,
            note: None,
        }
    }

    #[test]
    fn an_override_replaces_the_limit_in_a_state_of_its_own_until_it_expires() {
        let clock = ManualClock::new(1_000_000_000);
        let o = Overrides::new(10, Arc::new(clock.clone()));
        let r = rule();
        assert!(o.get(&r, "k").is_none() && o.is_empty());
        o.set(
            &r,
            "k",
            Override {
                expires_at: Some(Micros::from_secs(1_060)),
                ..limit(1000)
            },
        )
        .unwrap();
        let Some(Applied::Limited(got)) = o.get(&r, "k") else {
            panic!("no override")
        };
        assert_eq!(got.limit(), 1000);
        assert!(got.is_override());
        assert_ne!(got.id(), r.id(), "its own state");
        assert!(o.get(&r, "other").is_none());
        clock.advance(Duration::from_secs(60));
        assert!(o.get(&r, "k").is_none(), "expired");
        assert!(o.list(None).is_empty());
        assert_eq!(o.sweep(), 1);
        assert!(o.is_empty());
    }

    #[test]
    fn the_bound_is_checked_and_a_replacement_does_not_count_twice() {
        let o = Overrides::new(2, Arc::new(ManualClock::new(0)));
        let r = rule();
        o.set(&r, "a", limit(1)).unwrap();
        o.set(&r, "b", limit(2)).unwrap();
        o.set(&r, "b", limit(3)).unwrap();
        assert_eq!(o.set(&r, "c", limit(4)), Err(SetError::Full(2)));
        assert!(o.remove("api", "a"));
        o.set(&r, "c", limit(4)).unwrap();
        assert_eq!(o.len(), 2);
    }

    #[test]
    fn parameters_that_do_not_make_a_rule_are_refused() {
        let o = Overrides::new(2, Arc::new(ManualClock::new(0)));
        let bad = Override {
            burst: NonZeroU64::new(5),
            ..limit(1)
        };
        // burst does not apply to the default sliding window.
        assert!(matches!(
            o.set(&rule(), "a", bad),
            Err(SetError::Invalid(_))
        ));
        let free = Override {
            unlimited: true,
            ..limit(1)
        };
        o.set(&rule(), "a", free).unwrap();
        assert!(matches!(o.get(&rule(), "a"), Some(Applied::Unlimited)));
    }
}
