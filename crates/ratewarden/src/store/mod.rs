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
pub mod shared;

pub use shared::{Scanned, Shared};

use std::future::Future;
use std::time::Duration;

pub use crate::rule::Settle;
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
///
/// The variants say what a caller may conclude (STYLE.md 17): whether the
/// store is *down* (nothing was applied: deciding elsewhere is safe),
/// merely *late* (the call went out and may have been applied), or
/// *broken* in a way a retry will not mend.
#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    /// The store was not reached, or said it cannot serve now: nothing was
    /// applied. Connection refused, no connection, the breaker open, or a
    /// server that is loading, busy with a script, read-only after a
    /// failover, or whose cluster is down. Transient: an outage.
    #[error("store unavailable: {message}")]
    Unavailable {
        /// What happened.
        message: String,
        /// The error underneath, if any (a connection error, say).
        #[source]
        source: Option<Box<dyn std::error::Error + Send + Sync>>,
    },
    /// The call was sent and no answer came in time (or its connection
    /// broke after it was sent): the store may still have applied it.
    /// Transient, but not an outage: deciding it elsewhere could admit a
    /// request the store has already counted or refused.
    #[error("store answer late: {0}")]
    Late(String),
    /// The server answered with an error that a retry will not mend: a
    /// script error, `WRONGTYPE`, `NOAUTH`, `NOPERM`.
    #[error("store error: {0}")]
    Server(String),
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

    /// Whether trying again later may succeed (unavailable or late), as
    /// against an error that needs an operator (a script error, say).
    pub fn is_transient(&self) -> bool {
        matches!(self, StoreError::Unavailable { .. } | StoreError::Late(_))
    }

    /// Every kind, in the order [`StoreError::kind`] names them.
    pub const KINDS: [&'static str; 5] = ["unavailable", "late", "server", "protocol", "config"];

    /// Its kind, as a metric label: `unavailable`, `late`, `server`,
    /// `protocol` or `config`.
    pub fn kind(&self) -> &'static str {
        match self {
            StoreError::Unavailable { .. } => "unavailable",
            StoreError::Late(_) => "late",
            StoreError::Server(_) => "server",
            StoreError::Protocol(_) => "protocol",
            StoreError::Config(_) => "config",
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

    /// Settles `ops` once their request's answer is known, as `how` says
    /// ([`Settle`]), in one call per store round trip (a cluster's slots
    /// apart): a failure or a success of the `count: failures` rules, or
    /// what the answer cost beyond (or short of) what admission charged.
    fn settle(
        &self,
        ops: &[Op<'_>],
        how: Settle,
    ) -> impl Future<Output = Result<(), StoreError>> + Send;

    /// Gives back `concurrency` leases: `(op, lease, cost)` for each, the
    /// lease as [`Verdict::lease`] named it. A lease already lapsed or
    /// released is left alone.
    fn release(
        &self,
        leases: &[(Op<'_>, u64, u64)],
    ) -> impl Future<Output = Result<(), StoreError>> + Send;

    /// Renews `concurrency` leases, `(op, lease, cost)` as for
    /// [`Store::release`], to lapse `max_hold` from now: their requests are
    /// still going (a stream, a tunnel), so `max_hold` bounds only a holder
    /// that vanished. A lease already lapsed or released is left alone.
    fn renew(
        &self,
        leases: &[(Op<'_>, u64, u64)],
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

    /// Bans `op`'s key for `left` from now at least (a longer ban stays;
    /// the count is left as it is): a ban an operator sets. Lifted by
    /// [`Store::clear`].
    fn ban(
        &self,
        op: Op<'_>,
        left: Duration,
    ) -> impl Future<Output = Result<(), StoreError>> + Send;

    /// How many gateways share this store, as it last knew (1 when it
    /// cannot know: an in-process store). A [`Fallback`] divides a rule
    /// among them while the store is down.
    fn instances(&self) -> u64 {
        1
    }
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

/// Where a [`Fallback`]'s primary stands, for readiness and metrics.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Health {
    /// Its last call was answered.
    Up,
    /// It cannot be reached: decisions follow `on_error` (an outage).
    Down,
    /// Its last answer was an error a retry will not mend (a script error,
    /// `WRONGTYPE`, `NOAUTH`): decisions follow `on_error`, and it needs an
    /// operator.
    Broken,
}

impl Health {
    /// `up`, `down` or `broken`.
    pub fn as_str(self) -> &'static str {
        match self {
            Health::Up => "up",
            Health::Down => "down",
            Health::Broken => "broken",
        }
    }
}

/// A store that falls back per [`OnError`] when its primary fails.
///
/// Only an error that says the primary applied nothing is an outage
/// ([`StoreError::Unavailable`]): then `Local` decides with an in-process
/// [`MemoryStore`](memory::MemoryStore) with the same rules, each rule
/// divided among the gateways that share the primary (the cost of a
/// request multiplied by `min(gateways, limit)`: see
/// [`Fallback::decide`]), and bans this gateway has seen hold there too.
/// A late answer ([`StoreError::Late`]) may have been applied: the request
/// is refused (as over a limit under `Local`, 429 with a retry in a second;
/// 503 under `Deny`; admitted under `Allow`), never decided locally, so it
/// cannot be admitted twice. A permanent error follows the policy too,
/// and is logged at ERROR once per change.
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
    /// Set while the primary is down or broken (checked per decision
    /// without a lock).
    on: std::sync::atomic::AtomicBool,
    /// Since when, how many decisions were made meanwhile (locally,
    /// admitted unchecked, or refused, per `policy`), and whether the
    /// last error was permanent, with its text.
    since: parking_lot::Mutex<Option<OutageState>>,
    /// Late answers, and when the last was logged.
    late: std::sync::atomic::AtomicU64,
    late_logged: LogEvery,
}

/// When a repeated WARN line was last written: at most one per `EVERY`
/// (a store's late answers, a silent Redis's unanswered pings), the
/// caller counting what came meanwhile.
#[derive(Debug, Default)]
pub(crate) struct LogEvery(parking_lot::Mutex<Option<std::time::Instant>>);

impl LogEvery {
    /// At most one WARN line about the same trouble per this long.
    pub(crate) const EVERY: std::time::Duration = std::time::Duration::from_secs(10);

    /// Whether a line may be written now (and, if so, it counts as written).
    pub(crate) fn due(&self) -> bool {
        let mut last = self.0.lock();
        if last.is_some_and(|t| t.elapsed() < Self::EVERY) {
            return false;
        }
        *last = Some(std::time::Instant::now());
        true
    }
}

#[derive(Debug)]
struct OutageState {
    since: std::time::Instant,
    decisions: u64,
    health: Health,
    error: String,
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

    /// The primary failed a call (`decisions`: 1 for a decision, 0 for a
    /// readiness ping): the first failure of an outage, or a change between
    /// down and broken, says so.
    fn failed(&self, e: &StoreError, decisions: u64) {
        use std::sync::atomic::Ordering;
        let health = if e.is_transient() {
            Health::Down
        } else {
            Health::Broken
        };
        let mut outage = self.outage.since.lock();
        if let Some(o) = outage.as_mut() {
            o.decisions += decisions;
            if o.health == health {
                return;
            }
            o.health = health;
            o.error = e.to_string();
        } else {
            *outage = Some(OutageState {
                since: std::time::Instant::now(),
                decisions,
                health,
                error: e.to_string(),
            });
            self.outage.on.store(true, Ordering::Relaxed);
        }
        let meanwhile = match self.policy {
            OnError::Local => "deciding locally (on_error: local): each gateway its share",
            OnError::Allow => "admitting every request unchecked (on_error: allow)",
            OnError::Deny => "refusing every request, 503 (on_error: deny)",
        };
        match health {
            Health::Broken => tracing::error!(
                error = %e,
                kind = e.kind(),
                "store error a retry will not mend: {meanwhile} until it answers; fix the store"
            ),
            _ => tracing::warn!(error = %e, "store unavailable: {meanwhile} until it answers"),
        }
    }

    /// A call was sent and its answer did not come: logged at most once
    /// per [`LogEvery::EVERY`], with the count so far.
    fn late(&self, e: &StoreError) {
        use std::sync::atomic::Ordering;
        let n = self.outage.late.fetch_add(1, Ordering::Relaxed) + 1;
        if self.outage.late_logged.due() {
            let what = match self.policy {
                OnError::Allow => "admitted (on_error: allow)",
                OnError::Local => {
                    "refused (429, Retry-After 1 s): the store may have applied it, so deciding it locally could admit it twice"
                }
                OnError::Deny => "refused with 503 (on_error: deny)",
            };
            tracing::warn!(error = %e, late_total = n, "store answer late: the request was {what}");
        }
    }

    /// The primary answered: the end of an outage, if one was on.
    fn answered(&self) {
        use std::sync::atomic::Ordering;
        if !self.outage.on.load(Ordering::Relaxed) {
            return;
        }
        if let Some(o) = self.outage.since.lock().take() {
            self.outage.on.store(false, Ordering::Relaxed);
            let how = match self.policy {
                OnError::Local => "decided locally",
                OnError::Allow => "admitted unchecked",
                OnError::Deny => "refused",
            };
            let n = o.decisions;
            tracing::info!(
                outage = ?o.since.elapsed(),
                decisions = n,
                "store answering again after {:?}; {n} decisions were {how} meanwhile",
                o.since.elapsed()
            );
        }
    }

    /// Where the primary stands, and the last error while it is not up.
    pub fn health(&self) -> (Health, Option<String>) {
        match self.outage.since.lock().as_ref() {
            Some(o) => (o.health, Some(o.error.clone())),
            None => (Health::Up, None),
        }
    }

    /// Whether the primary is down or broken now: decisions are made as
    /// the policy says, not by the primary (one atomic load).
    pub fn in_outage(&self) -> bool {
        self.outage.on.load(std::sync::atomic::Ordering::Relaxed)
    }

    /// Whether requests are answered as the policy says: always, but while
    /// the primary is down under `deny`, or broken.
    pub fn ready(&self) -> bool {
        match self.health().0 {
            Health::Up => true,
            Health::Down => self.policy != OnError::Deny,
            Health::Broken => false,
        }
    }

    /// One decision on the primary, as a request's would be: a key of
    /// its own under a rule of its own (a window of a second, so the key
    /// lapses at once), written as every decision writes.
    async fn probe(&self) -> Result<(), StoreError> {
        static PROBE: std::sync::OnceLock<crate::Rule> = std::sync::OnceLock::new();
        let rule = PROBE.get_or_init(|| {
            crate::Rule::builder("ratewarden-readiness-probe")
                .algorithm(crate::algorithm::Kind::FixedWindow)
                .limit(u64::from(u32::MAX), Duration::from_secs(1))
                .build()
                .expect("a valid rule")
        });
        self.primary
            .decide(&[Op::new(rule, "probe")], 1, Mode::Apply)
            .await
            .map(drop)
    }

    /// Late answers since the store was made.
    pub fn late_answers(&self) -> u64 {
        self.outage.late.load(std::sync::atomic::Ordering::Relaxed)
    }

    /// The policy.
    pub fn policy(&self) -> OnError {
        self.policy
    }

    /// The primary store.
    pub fn primary(&self) -> &P {
        &self.primary
    }

    /// The in-process store decisions fall back to under [`OnError::Local`].
    pub fn local(&self) -> &memory::MemoryStore {
        &self.local
    }

    /// This gateway's share of an op during an outage: `m = min(gateways,
    /// limit)`, and the op's weight multiplied by it, so that each of `n`
    /// gateways admits `floor(limit / m)` of a window and all of them
    /// together at most `max(limit, n)`. `concurrency` keeps its weight:
    /// a slot's release must give back what it took, whatever the count
    /// of gateways then.
    fn share(&self, op: &Op<'_>) -> u64 {
        let n = self.primary.instances().max(1);
        if n == 1 || op.rule.spec().algorithm == crate::algorithm::Kind::Concurrency {
            return 1;
        }
        n.min(op.rule.limit()).max(1)
    }

    /// `ops` at this gateway's share, with each op's factor.
    fn shared<'a>(&self, ops: &[Op<'a>], weight: u64) -> (Vec<Op<'a>>, Vec<u64>) {
        let shares: Vec<u64> = ops.iter().map(|op| self.share(op)).collect();
        let scaled = ops
            .iter()
            .zip(&shares)
            .map(|(op, &m)| {
                let w = if op.weight > 0 { op.weight } else { weight };
                op.weighing(w.max(1).saturating_mul(m))
            })
            .collect();
        (scaled, shares)
    }

    /// A decision of the local store at this gateway's share; `remaining`
    /// told in requests of the caller's weight, as the primary would.
    fn decide_locally(&self, ops: &[Op<'_>], weight: u64, mode: Mode) -> Vec<Verdict> {
        let (scaled, shares) = self.shared(ops, weight);
        let mut verdicts = self.local.decide_now(&scaled, weight, mode);
        for (v, m) in verdicts.iter_mut().zip(shares) {
            v.check.remaining /= m;
        }
        verdicts
    }

    /// Every op admitted, unchecked (`on_error: allow`).
    fn allow_all(ops: &[Op<'_>]) -> Vec<Verdict> {
        ops.iter()
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
            .collect()
    }

    /// Every op refusing, to be asked again in a second: a late answer
    /// under `local` (the store may have applied the call, so it cannot be
    /// decided here without risking a second admission).
    fn refuse_all(ops: &[Op<'_>]) -> Vec<Verdict> {
        let second = crate::clock::Micros::from_secs(1);
        ops.iter()
            .map(|_| Verdict {
                check: crate::algorithm::Check::deny(0, second, second),
                reason: Some(crate::rule::Reason::Limit),
                lease: None,
            })
            .collect()
    }

    /// Bans the primary reported, held in the local store too, so that
    /// they outlast an outage that begins before they end.
    fn hold_bans(&self, ops: &[Op<'_>], verdicts: &[Verdict]) {
        if self.policy != OnError::Local {
            return;
        }
        for (op, v) in ops.iter().zip(verdicts) {
            let banned = match v.reason {
                Some(crate::rule::Reason::Banned) => true,
                Some(_) => op.rule.spec().penalty.is_some(),
                None => false,
            };
            if banned && v.check.retry_after > crate::clock::Micros::ZERO {
                self.local.hold_ban(op, v.check.retry_after);
            }
        }
    }
}

impl<P: Store> Store for Fallback<P> {
    /// The primary's decision; if it cannot decide, per the policy (see
    /// [`Fallback`]).
    ///
    /// During an outage under `Local`, each op is decided at this
    /// gateway's share: with `n` gateways announced in the store and `m =
    /// min(n, limit)`, its cost is multiplied by `m`. A rule of `limit` per
    /// window then admits `floor(limit / m)` per gateway, and `n` gateways
    /// at most `max(limit, n)` together, per window of the outage.
    async fn decide(
        &self,
        ops: &[Op<'_>],
        weight: u64,
        mode: Mode,
    ) -> Result<Vec<Verdict>, StoreError> {
        match self.primary.decide(ops, weight, mode).await {
            Ok(v) => {
                self.answered();
                self.hold_bans(ops, &v);
                Ok(v)
            }
            Err(e @ StoreError::Late(_)) => {
                self.late(&e);
                match self.policy {
                    OnError::Allow => Ok(Self::allow_all(ops)),
                    // Refused as over a limit, not a 5xx: under `local` the
                    // limiter's failure is never a 5xx (SPEC §5).
                    OnError::Local => Ok(Self::refuse_all(ops)),
                    OnError::Deny => Err(e),
                }
            }
            Err(e) => {
                self.failed(&e, 1);
                match self.policy {
                    OnError::Local => Ok(self.decide_locally(ops, weight, mode)),
                    OnError::Allow => Ok(Self::allow_all(ops)),
                    OnError::Deny => Err(e),
                }
            }
        }
    }

    async fn settle(&self, ops: &[Op<'_>], how: Settle) -> Result<(), StoreError> {
        match self.primary.settle(ops, how).await {
            Err(e) if self.policy == OnError::Local && !matches!(e, StoreError::Late(_)) => {
                // At this gateway's share, as the decision was: the ops
                // carry the scaled weight.
                let (scaled, _) = self.shared(ops, how.weight().max(1));
                self.local.settle(&scaled, how).await
            }
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

    async fn renew(&self, leases: &[(Op<'_>, u64, u64)]) -> Result<(), StoreError> {
        // As for a release: a lease taken locally lives locally.
        let local = self.local.renew(leases).await;
        match self.primary.renew(leases).await {
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

    /// The primary's ping, which also tells [`Fallback::health`]: an idle
    /// gateway learns of an outage (or of its end) from its readiness
    /// probe. A late answer says nothing of it, as for a decision.
    ///
    /// A primary that is *broken* (its decisions failed with errors a
    /// retry will not mend: a full Redis under `noeviction`, a script
    /// error) is asked with a decision instead, since a PING it answers
    /// says nothing of them: readiness follows what decisions see, and
    /// does not flap between broken and up with each probe.
    async fn ping(&self) -> Result<(), StoreError> {
        let r = if self.health().0 == Health::Broken {
            self.probe().await
        } else {
            self.primary.ping().await
        };
        match &r {
            Ok(()) => self.answered(),
            Err(StoreError::Late(_)) => {}
            Err(e) => self.failed(e, 0),
        }
        r
    }

    /// On the primary, and held locally too (it then outlasts an outage
    /// on this gateway, as a ban it saw does).
    async fn ban(&self, op: Op<'_>, left: Duration) -> Result<(), StoreError> {
        self.primary.ban(op, left).await?;
        self.local.hold_ban(&op, crate::clock::Micros::from(left));
        Ok(())
    }

    fn instances(&self) -> u64 {
        self.primary.instances()
    }
}

/// Whether the request as a whole is admitted: every enforcing rule allows it.
pub fn admitted(ops: &[Op<'_>], verdicts: &[Verdict]) -> bool {
    ops.iter()
        .zip(verdicts)
        .all(|(op, v)| v.allowed() || op.rule.is_shadow())
}
