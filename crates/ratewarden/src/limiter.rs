//! The front door: decisions over any [`Store`], and the settle step of
//! `count: failures` rules.

use crate::clock::Micros;

use crate::decision::{Decision, RuleDecision};
use crate::rule::{Rule, Verdict, finite};
use crate::store::{Mode, Op, Settle, Store, StoreError};

/// Decides requests against rules, over a store.
///
/// ```
/// use std::time::Duration;
/// use ratewarden::{Limiter, MemoryStore, Penalty, Rule, algorithm::Kind, clock::ManualClock};
/// # tokio::runtime::Builder::new_current_thread().build().unwrap().block_on(async {
/// // 20 requests per minute per IP; going over earns a 10-minute ban.
/// let clock = ManualClock::new(1_700_000_000_000_000);
/// let limiter = Limiter::new(MemoryStore::builder().clock(clock.clone()).build());
/// let per_ip = Rule::builder("per-ip")
///     .algorithm(Kind::SlidingWindowLog)
///     .limit(20, Duration::from_secs(60))
///     .penalty(Penalty::fixed(Duration::from_secs(600)))
///     .build()
///     .unwrap();
/// for _ in 0..20 {
///     assert!(limiter.check(&per_ip, "203.0.113.7").await.unwrap().allowed);
/// }
/// let d = limiter.check(&per_ip, "203.0.113.7").await.unwrap();
/// assert!(!d.allowed);
/// assert_eq!(d.retry_after_secs(), Some(600));
/// // Another address is unaffected.
/// assert!(limiter.check(&per_ip, "198.51.100.1").await.unwrap().allowed);
/// // Nine minutes later the first is still banned, though its window has passed.
/// clock.advance(Duration::from_secs(540));
/// assert_eq!(limiter.check(&per_ip, "203.0.113.7").await.unwrap().retry_after_secs(), Some(60));
/// clock.advance(Duration::from_secs(60));
/// assert!(limiter.check(&per_ip, "203.0.113.7").await.unwrap().allowed);
/// # });
/// ```
#[derive(Debug, Clone)]
pub struct Limiter<S> {
    store: S,
}

/// An admitted request whose `count: failures` rules wait for its outcome,
/// or whose `concurrency` rules hold leases until it ends.
#[derive(Debug, Clone)]
#[must_use = "report the outcome and release the leases, or failures are never counted and slots stay held until they lapse"]
pub struct Pending {
    /// (rule, key, group) of each `count: failures` op.
    ops: Vec<(Rule, String, String)>,
    /// (rule, key, group, lease, cost) of each lease held.
    leases: Vec<(Rule, String, String, u64, u64)>,
    weight: u64,
}

impl Pending {
    /// Whether some rule waits for the outcome (`count: failures`).
    pub fn awaits_outcome(&self) -> bool {
        !self.ops.is_empty()
    }

    /// Takes the leases out into a pending of their own (to release when
    /// the request ends), leaving the `count: failures` ops (to settle
    /// when its answer is known).
    pub fn take_leases(&mut self) -> Option<Pending> {
        (!self.leases.is_empty()).then(|| Pending {
            ops: vec![],
            leases: std::mem::take(&mut self.leases),
            weight: self.weight,
        })
    }

    /// How often the leases held are renewed while their request goes on
    /// (a stream, a tunnel): a third of the shortest `max_hold` among
    /// them, so that two renewals may be lost before a live lease lapses;
    /// `None` when none is held.
    pub fn renew_every(&self) -> Option<std::time::Duration> {
        self.leases
            .iter()
            .filter_map(|(r, ..)| r.max_hold())
            .min()
            .map(|hold| (hold / 3).max(std::time::Duration::from_millis(10)))
    }

    /// The leases held: (rule name, key, lease).
    pub fn leases(&self) -> impl Iterator<Item = (&str, &str, u64)> {
        self.leases
            .iter()
            .map(|(r, k, _, lease, _)| (r.name(), k.as_str(), *lease))
    }
}

/// The answer to [`Limiter::acquire`].
#[derive(Debug)]
pub struct Admission {
    /// The decision.
    pub decision: Decision,
    /// Set when the request was admitted and some rule counts failures or
    /// holds a lease: pass it to [`Limiter::report`] with the outcome, and
    /// to [`Limiter::release`] when the request has ended.
    pub pending: Option<Pending>,
}

impl Admission {
    /// What a store's `verdicts` on `ops` amount to: the decision and, in
    /// [`Mode::Apply`] when admitted, what stays to settle or release. The
    /// one way from verdicts to a decision (for a front end that calls the
    /// store itself, as the tower crate's `decide_ops` does).
    pub fn from_verdicts(ops: &[Op<'_>], verdicts: &[Verdict], weight: u64, mode: Mode) -> Self {
        let decision = assemble(ops, verdicts);
        let pending = match mode {
            Mode::Apply if decision.allowed => pending(ops, verdicts, weight),
            _ => None,
        };
        Admission { decision, pending }
    }
}

impl<S: Store> Limiter<S> {
    /// A limiter over `store`.
    pub fn new(store: S) -> Self {
        Self { store }
    }

    /// The store.
    pub fn store(&self) -> &S {
        &self.store
    }

    /// One rule, one key, weight 1.
    pub async fn check(&self, rule: &Rule, key: &str) -> Result<Decision, StoreError> {
        Ok(self.acquire(&[Op::new(rule, key)], 1).await?.decision)
    }

    /// Decides a request under every rule in `ops` at once, all-or-nothing.
    pub async fn acquire(&self, ops: &[Op<'_>], weight: u64) -> Result<Admission, StoreError> {
        self.decide(ops, weight, Mode::Apply).await
    }

    /// What [`acquire`](Self::acquire) would decide now, recording nothing.
    pub async fn peek(&self, ops: &[Op<'_>], weight: u64) -> Result<Decision, StoreError> {
        Ok(self.decide(ops, weight, Mode::Peek).await?.decision)
    }

    /// [`acquire`](Self::acquire) in [`Mode::Apply`], [`peek`](Self::peek)
    /// in [`Mode::Peek`] (which leaves nothing pending).
    pub async fn decide(
        &self,
        ops: &[Op<'_>],
        weight: u64,
        mode: Mode,
    ) -> Result<Admission, StoreError> {
        let verdicts = self.store.decide(ops, weight, mode).await?;
        Ok(Admission::from_verdicts(ops, &verdicts, weight, mode))
    }

    /// Settles a request's `count: failures` rules: `failure` charges them
    /// (at the request's weight), a success clears their history (with
    /// `reset_on_success`).
    pub async fn report(&self, pending: &Pending, failure: bool) -> Result<(), StoreError> {
        if pending.ops.is_empty() {
            return Ok(());
        }
        let ops: Vec<Op<'_>> = pending
            .ops
            .iter()
            .map(|(rule, key, group)| Op::grouped(rule, key, group))
            .collect();
        let how = if failure {
            Settle::Failure(pending.weight)
        } else {
            Settle::Success
        };
        self.store.settle(&ops, how).await
    }

    /// Settles `ops` as `how` says (see [`Settle`]): the one way a cost is
    /// corrected once an answer is known, in one store call.
    pub async fn settle(&self, ops: &[Op<'_>], how: Settle) -> Result<(), StoreError> {
        self.store.settle(ops, how).await
    }

    /// Renews the `concurrency` leases a request holds: it goes on (see
    /// [`Store::renew`]).
    pub async fn renew(&self, pending: &Pending) -> Result<(), StoreError> {
        if pending.leases.is_empty() {
            return Ok(());
        }
        let leases: Vec<(Op<'_>, u64, u64)> = pending
            .leases
            .iter()
            .map(|(rule, key, group, lease, cost)| (Op::grouped(rule, key, group), *lease, *cost))
            .collect();
        self.store.renew(&leases).await
    }

    /// Gives back the `concurrency` leases a request held: it has ended.
    pub async fn release(&self, pending: &Pending) -> Result<(), StoreError> {
        if pending.leases.is_empty() {
            return Ok(());
        }
        let leases: Vec<(Op<'_>, u64, u64)> = pending
            .leases
            .iter()
            .map(|(rule, key, group, lease, cost)| (Op::grouped(rule, key, group), *lease, *cost))
            .collect();
        self.store.release(&leases).await
    }
}

/// What an admitted request leaves to settle: its `count: failures` ops and
/// the leases its `concurrency` ops took; `None` when there is nothing.
pub(crate) fn pending(ops: &[Op<'_>], verdicts: &[Verdict], weight: u64) -> Option<Pending> {
    // Most requests leave nothing pending: say so without building anything.
    if !ops.iter().any(|op| op.rule.counts_failures()) && verdicts.iter().all(|v| v.lease.is_none())
    {
        return None;
    }
    let failures: Vec<_> = ops
        .iter()
        .filter(|op| op.rule.counts_failures())
        .map(|op| (op.rule.clone(), op.key.to_owned(), op.group.to_owned()))
        .collect();
    let leases: Vec<_> = ops
        .iter()
        .zip(verdicts)
        .filter_map(|(op, v)| {
            v.lease.map(|lease| {
                let (r, k, g) = (op.rule.clone(), op.key.to_owned(), op.group.to_owned());
                (r, k, g, lease, op.cost(weight))
            })
        })
        .collect();
    (!failures.is_empty() || !leases.is_empty()).then_some(Pending {
        ops: failures,
        leases,
        weight,
    })
}

/// Builds the decision a store's verdicts amount to.
pub(crate) fn assemble(ops: &[Op<'_>], verdicts: &[Verdict]) -> Decision {
    let allowed = crate::store::admitted(ops, verdicts);
    let delay = if allowed {
        verdicts
            .iter()
            .map(|v| v.check.delay)
            .max()
            .unwrap_or(Micros::ZERO)
    } else {
        Micros::ZERO
    };
    Decision {
        allowed,
        delay: delay.as_duration(),
        rules: ops
            .iter()
            .zip(verdicts)
            .map(|(op, v)| RuleDecision {
                rule: op.rule.clone(),
                key: op.key.to_owned(),
                reason: v.reason,
                remaining: v.check.remaining,
                reset_after: v.check.reset_after.as_duration(),
                retry_after: if v.allowed() {
                    None
                } else {
                    finite(v.check.retry_after).map(Micros::as_duration)
                },
                lease: v.lease,
            })
            .collect(),
    }
}
