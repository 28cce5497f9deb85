//! Where key states live, and the one operation that must be atomic.
//!
//! A store evaluates every rule of a request against its key's state and
//! records the outcome in one atomic step: in memory under the shards' locks,
//! on Redis in one script call. That is why the trait takes the whole list of
//! `(rule, key)` pairs of a request rather than one key at a time.

pub mod memory;

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
    /// What a request of weight 1 would get now.
    pub remaining: u64,
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
    #[error("store unavailable: {0}")]
    Unavailable(String),
    /// The backend answered something this version does not understand.
    #[error("store protocol error: {0}")]
    Protocol(String),
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

    /// The state of one key.
    fn inspect(&self, op: Op<'_>) -> impl Future<Output = Result<KeyInfo, StoreError>> + Send;

    /// Forgets one key's state, bans included; `true` if there was any.
    fn clear(&self, op: Op<'_>) -> impl Future<Output = Result<bool, StoreError>> + Send;

    /// Whether the store answers (readiness).
    fn ping(&self) -> impl Future<Output = Result<(), StoreError>> + Send;
}

/// Whether the request as a whole is admitted: every enforcing rule allows it.
pub fn admitted(ops: &[Op<'_>], verdicts: &[Verdict]) -> bool {
    ops.iter()
        .zip(verdicts)
        .all(|(op, v)| v.allowed() || op.rule.is_shadow())
}
