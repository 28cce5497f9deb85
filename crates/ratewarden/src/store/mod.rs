//! Where key states live, and the one operation that must be atomic.
//!
//! A store evaluates every rule of a request against its key's state and
//! records the outcome in one atomic step: in memory under the shards' locks,
//! on Redis in one script call. That is why the trait takes the whole list of
//! `(rule, key)` pairs of a request rather than one key at a time.

pub mod lease;
pub mod memory;
mod mirror;
#[cfg(feature = "redis")]
pub mod redis;

use std::future::Future;
use std::time::Duration;

use crate::rule::{Rule, Verdict};

/// One rule applied to one key.
#[derive(Debug, Clone, Copy)]
pub struct Op<'a> {
    /// The rule.
    pub rule: &'a Rule,
    /// The key under that rule (e.g. the client's address).
    pub key: &'a str,
    /// Keys of one group share a Redis Cluster hash slot, so a request's ops
    /// in one group are decided in one atomic call. The client's identity,
    /// normally; the key itself by default.
    pub group: &'a str,
    /// This op's own weight, when it differs from the call's (an Envoy
    /// descriptor's `hits_addend`); 0 takes the call's.
    pub weight: u64,
}

impl<'a> Op<'a> {
    /// `rule` on `key`, grouped by the key itself.
    pub fn new(rule: &'a Rule, key: &'a str) -> Self {
        Self::grouped(rule, key, key)
    }

    /// `rule` on `key`, in `group` (typically the client's identity).
    pub fn grouped(rule: &'a Rule, key: &'a str, group: &'a str) -> Self {
        Self {
            rule,
            key,
            group,
            weight: 0,
        }
    }

    /// The same op weighing `weight` whatever the call's weight (0: the
    /// call's).
    pub fn weighing(self, weight: u64) -> Self {
        Self { weight, ..self }
    }

    /// What it costs in a call of `weight`: its rule's cost at its own
    /// weight, or at the call's.
    pub fn cost(&self, weight: u64) -> u64 {
        self.rule
            .cost(if self.weight > 0 { self.weight } else { weight })
    }
}

/// Whether a decision records anything.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Mode {
    /// Evaluate and record (charge, start bans).
    Apply,
    /// Evaluate only: `/v1/explain`, dry runs.
    Peek,
}

/// A key's state as the admin API shows it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct KeyInfo {
    /// Whether the store holds any live state for the key.
    pub exists: bool,
    /// What a request of weight 1 would get now: what it would leave.
    pub remaining: u64,
    /// Whether the algorithm would admit that request now (then one more
    /// than `remaining` is left before it).
    pub admits: bool,
    /// Until the quota is whole again.
    pub reset_after: Duration,
    /// Time left on an active ban.
    pub ban_left: Option<Duration>,
    /// Escalation level of the current or latest ban (0 = first).
    pub ban_level: u32,
}

/// Why a store could not decide. A rejection is not an error.
#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    /// The backend did not answer in time, or not at all.
    #[error("store unavailable: {message}")]
    Unavailable {
        /// What happened.
        message: String,
        /// The error underneath, if any (a connection error, say).
        #[source]
        source: Option<Box<dyn std::error::Error + Send + Sync>>,
    },
    /// The backend answered something this version does not understand.
    #[error("store protocol error: {0}")]
    Protocol(String),
    /// The store's configuration cannot work (a bad URL, say).
    #[error("invalid store configuration: {0}")]
    Config(String),
}

impl StoreError {
    /// Unavailable, for `message`.
    pub fn unavailable(message: impl Into<String>) -> Self {
        StoreError::Unavailable {
            message: message.into(),
            source: None,
        }
    }

    /// Unavailable because of `e`, which is kept as the source.
    pub fn unavailable_from(e: impl std::error::Error + Send + Sync + 'static) -> Self {
        StoreError::Unavailable {
            message: e.to_string(),
            source: Some(Box::new(e)),
        }
    }
}

/// A place to keep key states, atomic per decision.
///
/// Futures rather than blocking calls because the Redis store waits on the
/// network; the memory store's futures are ready at once.
pub trait Store: Send + Sync + 'static {
    /// Evaluates `ops` for a request of `weight` and, in [`Mode::Apply`],
    /// records the outcome atomically: if any non-shadow rule rejects, no rule
    /// is charged (a rejecting rule may still start a ban, or charge itself
    /// under `count_rejected`). One verdict per op, in order.
    fn decide(
        &self,
        ops: &[Op<'_>],
        weight: u64,
        mode: Mode,
    ) -> impl Future<Output = Result<Vec<Verdict>, StoreError>> + Send;

    /// Settles the `count: failures` rules among `ops` once the outcome is
    /// known: charges a failure, or clears the history on a success.
    fn settle(
        &self,
        ops: &[Op<'_>],
        weight: u64,
        failure: bool,
    ) -> impl Future<Output = Result<(), StoreError>> + Send;

    /// Gives back `concurrency` leases: `(op, lease, cost)` for each, the
    /// lease as [`Verdict::lease`] named it. A lease already lapsed or
    /// released is left alone.
    fn release(
        &self,
        leases: &[(Op<'_>, u64, u64)],
    ) -> impl Future<Output = Result<(), StoreError>> + Send;

    /// Gives back what each op's cost at `weight` charged earlier (an
    /// Envoy `is_negative_hits` descriptor), in one call per store round
    /// trip; a key with no state is left alone.
    fn refund(
        &self,
        ops: &[Op<'_>],
        weight: u64,
    ) -> impl Future<Output = Result<(), StoreError>> + Send;

    /// Leases a slice of `op`'s key to a gateway, gives back what it did
    /// not use, or both, in one atomic step ([`lease`]).
    fn grant(
        &self,
        op: Op<'_>,
        ask: &lease::Ask,
    ) -> impl Future<Output = Result<lease::Grant, StoreError>> + Send;

    /// The state of one key.
    fn inspect(&self, op: Op<'_>) -> impl Future<Output = Result<KeyInfo, StoreError>> + Send;

    /// Forgets one key's state, bans included; `true` if there was any.
    fn clear(&self, op: Op<'_>) -> impl Future<Output = Result<bool, StoreError>> + Send;

    /// Whether the store answers (readiness).
    fn ping(&self) -> impl Future<Output = Result<(), StoreError>> + Send;
}

/// What to do when the store cannot decide (`on_error:`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum OnError {
    /// Decide with in-process limits until the store answers again (default).
    #[default]
    Local,
    /// Admit every request.
    Allow,
    /// Fail the decision: the gateway answers 503.
    Deny,
}

/// A store that falls back per [`OnError`] when its primary fails.
///
/// `Local` keeps an in-process [`MemoryStore`](memory::MemoryStore) with the
/// same rules: limits then hold per gateway instead of across them, which is
/// the best that can be done without the shared store, and is what the
/// gateway logs and counts.
#[derive(Debug, Clone)]
pub struct Fallback<P> {
    primary: P,
    local: memory::MemoryStore,
    policy: OnError,
    /// The primary's current outage, shared by clones.
    outage: std::sync::Arc<Outage>,
}

/// An outage of a [`Fallback`]'s primary, for its log lines.
#[derive(Debug, Default)]
struct Outage {
    /// Set while the primary fails (checked per decision without a lock).
    on: std::sync::atomic::AtomicBool,
    /// Since when, and how many decisions were made meanwhile (locally,
    /// admitted unchecked, or refused, per `policy`).
    since: parking_lot::Mutex<Option<(std::time::Instant, u64)>>,
}

impl<P: Store> Fallback<P> {
    /// `primary`, falling back per `policy` (to `local` for [`OnError::Local`]).
    pub fn new(primary: P, policy: OnError, local: memory::MemoryStore) -> Self {
        Self {
            primary,
            local,
            policy,
            outage: Default::default(),
        }
    }

    /// The primary failed a decision: the first of an outage says so.
    fn failed(&self, e: &StoreError) {
        use std::sync::atomic::Ordering;
        let mut outage = self.outage.since.lock();
        match outage.as_mut() {
            Some((_, n)) => *n += 1,
            None => {
                *outage = Some((std::time::Instant::now(), 1));
                self.outage.on.store(true, Ordering::Relaxed);
                let meanwhile = match self.policy {
                    OnError::Local => {
                        "deciding locally (on_error: local): limits hold per instance"
                    }
                    OnError::Allow => "admitting every request unchecked (on_error: allow)",
                    OnError::Deny => "refusing every request, 503 (on_error: deny)",
                };
                tracing::warn!(error = %e, "store unavailable: {meanwhile} until it answers");
            }
        }
    }

    /// The primary answered: the end of an outage, if one was on.
    fn answered(&self) {
        use std::sync::atomic::Ordering;
        if !self.outage.on.load(Ordering::Relaxed) {
            return;
        }
        if let Some((since, n)) = self.outage.since.lock().take() {
            self.outage.on.store(false, Ordering::Relaxed);
            let how = match self.policy {
                OnError::Local => "decided locally",
                OnError::Allow => "admitted unchecked",
                OnError::Deny => "refused",
            };
            tracing::info!(
                outage = ?since.elapsed(),
                decisions = n,
                "store answering again after {:?}; {n} decisions were {how} meanwhile",
                since.elapsed()
            );
        }
    }

    /// The primary store.
    pub fn primary(&self) -> &P {
        &self.primary
    }

    /// The in-process store decisions fall back to under [`OnError::Local`].
    pub fn local(&self) -> &memory::MemoryStore {
        &self.local
    }
}

impl<P: Store> Store for Fallback<P> {
    async fn decide(
        &self,
        ops: &[Op<'_>],
        weight: u64,
        mode: Mode,
    ) -> Result<Vec<Verdict>, StoreError> {
        let decided = self.primary.decide(ops, weight, mode).await;
        match &decided {
            Ok(_) => self.answered(),
            Err(e) => self.failed(e),
        }
        match decided {
            Ok(v) => Ok(v),
            Err(e) => match self.policy {
                OnError::Local => Ok(self.local.decide_now(ops, weight, mode)),
                OnError::Allow => Ok(ops
                    .iter()
                    .map(|op| Verdict {
                        check: crate::algorithm::Check {
                            allowed: true,
                            remaining: op.rule.limit(),
                            reset_after: crate::clock::Micros::ZERO,
                            retry_after: crate::clock::Micros::ZERO,
                            delay: crate::clock::Micros::ZERO,
                        },
                        reason: None,
                        lease: None,
                    })
                    .collect()),
                OnError::Deny => Err(e),
            },
        }
    }

    async fn settle(&self, ops: &[Op<'_>], weight: u64, failure: bool) -> Result<(), StoreError> {
        match self.primary.settle(ops, weight, failure).await {
            Err(_) if self.policy == OnError::Local => {
                self.local.settle(ops, weight, failure).await
            }
            other => other,
        }
    }

    async fn refund(&self, ops: &[Op<'_>], weight: u64) -> Result<(), StoreError> {
        match self.primary.refund(ops, weight).await {
            Err(_) if self.policy == OnError::Local => self.local.refund(ops, weight).await,
            other => other,
        }
    }

    async fn release(&self, leases: &[(Op<'_>, u64, u64)]) -> Result<(), StoreError> {
        // Leases taken locally (during an outage) are released locally; the
        // primary's may or may not exist: both are asked.
        let local = self.local.release(leases).await;
        match self.primary.release(leases).await {
            Err(_) if self.policy == OnError::Local => local,
            other => other,
        }
    }

    /// A grant goes to the primary only: during an outage a gateway
    /// decides directly, and so locally, without leases.
    async fn grant(&self, op: Op<'_>, ask: &lease::Ask) -> Result<lease::Grant, StoreError> {
        self.primary.grant(op, ask).await
    }

    async fn inspect(&self, op: Op<'_>) -> Result<KeyInfo, StoreError> {
        self.primary.inspect(op).await
    }

    async fn clear(&self, op: Op<'_>) -> Result<bool, StoreError> {
        let local = self.local.clear(op).await.unwrap_or(false);
        Ok(self.primary.clear(op).await? || local)
    }

    async fn ping(&self) -> Result<(), StoreError> {
        self.primary.ping().await
    }
}

/// Whether the request as a whole is admitted: every enforcing rule allows it.
pub fn admitted(ops: &[Op<'_>], verdicts: &[Verdict]) -> bool {
    ops.iter()
        .zip(verdicts)
        .all(|(op, v)| v.allowed() || op.rule.is_shadow())
}
