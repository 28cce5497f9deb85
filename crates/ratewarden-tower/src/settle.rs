//! Stage 4 of the one admission path ([`crate::admission`]): what a
//! request's answer settles once it has ended, and the `concurrency` leases
//! it holds until then.
//!
//! Every front end settles through [`Settlement`]: the gateway's end phase
//! (an HTTP status, a gRPC status from the trailers, what the answer cost),
//! the tower layer, and (through [`Limiter::settle`]) `/v1/report`. Each
//! answer is one store call per distinct [`Settle`] (most: one).

use std::sync::Arc;

use ratewarden::{Limiter, Op, Pending, Rule, Settle, Store, StoreError};
use smallvec::SmallVec;

/// One matched rule's part of a [`Settlement`]: the rule it was decided by
/// (its own, a tier's, an override), its key and group, and what counts as
/// a failure of it.
#[derive(Debug, Clone)]
pub struct Owed {
    /// The rule decided.
    pub rule: Rule,
    /// Its key.
    pub key: String,
    /// Its group (a Redis Cluster hash tag).
    pub group: String,
    /// HTTP statuses that are failures (`failure_status`), inclusive ranges.
    pub failure_status: Vec<(u16, u16)>,
    /// gRPC statuses that are failures (`failure_grpc_status`).
    pub failure_grpc: Vec<u16>,
    /// A rule charged by its answer: the units reserved at admission,
    /// which the answer's cost replaces.
    pub reserved: Option<u64>,
}

/// What an answer cost a rule charged by its answer, as the front end read
/// it when the answer ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AnswerCost {
    /// It cost this many units.
    Known(u64),
    /// No cost could be read (the client left mid-answer, the upstream
    /// cut it, the body was not what was expected): the reservation stays
    /// charged, the safe side.
    Unknown,
    /// The upstream failed before any output (no connection, a 5xx with
    /// no body): nothing was spent, the reservation is given back.
    Nothing,
}

impl Owed {
    /// What the answer's `cost` settles of a rule charged by its answer:
    /// the difference from what was reserved, charged or given back.
    /// Nothing for other rules, or when the cost is what was reserved.
    pub fn on_cost(&self, cost: AnswerCost) -> Option<Settle> {
        let reserved = self.reserved?;
        let cost = match cost {
            AnswerCost::Known(c) => c,
            AnswerCost::Unknown => return None,
            AnswerCost::Nothing => 0,
        };
        match cost.cmp(&reserved) {
            std::cmp::Ordering::Greater => Some(Settle::Charge(cost - reserved)),
            std::cmp::Ordering::Less => Some(Settle::Refund(reserved - cost)),
            std::cmp::Ordering::Equal => None,
        }
    }

    /// A failure or a success of a `count: failures` rule, at the
    /// request's weight (1).
    pub fn outcome(failure: bool) -> Settle {
        if failure {
            Settle::Failure(1)
        } else {
            Settle::Success
        }
    }

    /// What an answer of HTTP `status` (and, for a gRPC answer, its
    /// `grpc` status, which decides instead) settles of a `count:
    /// failures` rule: a failure when its statuses say so; a success on
    /// any other HTTP status, and on gRPC's 0 (OK); a gRPC status that is
    /// neither leaves the key alone. Nothing for other rules.
    pub fn on_status(&self, status: u16, grpc: Option<u16>) -> Option<Settle> {
        if !self.rule.counts_failures() || self.reserved.is_some() {
            return None;
        }
        match grpc {
            Some(code) if self.failure_grpc.contains(&code) => Some(Self::outcome(true)),
            Some(0) => Some(Self::outcome(false)),
            Some(_) => None,
            None => Some(Self::outcome(
                self.failure_status
                    .iter()
                    .any(|&(lo, hi)| (lo..=hi).contains(&status)),
            )),
        }
    }
}

/// What a request's answer settles once it has ended, owned so that it can
/// outlive the request's own scope; made by
/// [`Admitted::settlement`](crate::admission::Admitted::settlement).
pub struct Settlement<S: Store> {
    limiter: Arc<Limiter<S>>,
    owed: Vec<Owed>,
}

impl<S: Store> std::fmt::Debug for Settlement<S> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Settlement")
            .field("owed", &self.owed)
            .finish_non_exhaustive()
    }
}

impl<S: Store> Settlement<S> {
    /// `owed` on `limiter`'s store; `None` when nothing is owed.
    pub fn new(limiter: &Arc<Limiter<S>>, owed: Vec<Owed>) -> Option<Self> {
        (!owed.is_empty()).then(|| Self {
            limiter: limiter.clone(),
            owed,
        })
    }

    /// The rules it settles.
    pub fn owed(&self) -> &[Owed] {
        &self.owed
    }

    /// Settles each rule as `how` says of it (`None`: nothing), in one
    /// store call per distinct [`Settle`]: most answers make one.
    pub async fn settle_with(
        self,
        how: impl Fn(&Owed) -> Option<Settle>,
    ) -> Result<(), StoreError> {
        let mut calls: SmallVec<[(Settle, SmallVec<[Op<'_>; 2]>); 2]> = SmallVec::new();
        for o in &self.owed {
            let Some(s) = how(o) else { continue };
            let op = Op::grouped(&o.rule, &o.key, &o.group);
            match calls.iter_mut().find(|(c, _)| *c == s) {
                Some((_, ops)) => ops.push(op),
                None => calls.push((s, SmallVec::from_elem(op, 1))),
            }
        }
        for (s, ops) in &calls {
            self.limiter.settle(ops, *s).await?;
        }
        Ok(())
    }

    /// Settles the `count: failures` rules on how the answer ended: HTTP
    /// `status`, or a gRPC answer's `grpc` status (see [`Owed::on_status`]).
    /// A store error is not fatal: the store counted it.
    pub async fn on_status(self, status: u16, grpc: Option<u16>) {
        let _ = self.settle_with(|o| o.on_status(status, grpc)).await;
    }

    /// The end of an answer: the `count: failures` rules settled on its
    /// statuses, each rule charged by the answer on what it cost that rule
    /// (`cost`; see [`Owed::on_cost`]). A store error is not fatal: the
    /// store counted it.
    pub async fn on_end(self, status: u16, grpc: Option<u16>, cost: impl Fn(&Owed) -> AnswerCost) {
        let _ = self
            .settle_with(|o| o.on_status(status, grpc).or_else(|| o.on_cost(cost(o))))
            .await;
    }
}

type Release = Box<
    dyn FnOnce() -> std::pin::Pin<Box<dyn std::future::Future<Output = ()> + Send>> + Send + Sync,
>;

/// A request's `concurrency` leases, given back when this is dropped:
/// however its answer ends (sent whole, or the client gone). Awaiting
/// [`Held::release`] gives them back at once instead. While it is held, a
/// task renews the leases every third of their `max_hold`: a stream or a
/// tunnel open for longer keeps its slot, and `max_hold` bounds only a
/// holder that vanished (a gateway that died, a store it lost).
pub struct Held {
    release: Option<Release>,
    /// The renewing task, stopped when the leases go back.
    renewing: Option<tokio::task::AbortHandle>,
}

impl std::fmt::Debug for Held {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Held")
            .field("armed", &self.release.is_some())
            .field("renewing", &self.renewing.is_some())
            .finish()
    }
}

impl Held {
    /// Guards the leases in `pending`: renewed while held, released when
    /// dropped (see [`Admitted::hold`](crate::admission::Admitted::hold)).
    pub fn of<S: Store>(pending: Pending, limiter: &Arc<Limiter<S>>) -> Option<Self> {
        let pending = Arc::new(pending);
        let renewing = match (pending.renew_every(), tokio::runtime::Handle::try_current()) {
            (Some(every), Ok(rt)) => {
                let (limiter, pending) = (limiter.clone(), pending.clone());
                Some(
                    rt.spawn(async move {
                        let mut tick =
                            tokio::time::interval_at(tokio::time::Instant::now() + every, every);
                        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
                        loop {
                            tick.tick().await;
                            // A renewal that fails (the store down) is
                            // tried again next time; the lease lapses only
                            // after `max_hold` without one.
                            let _ = limiter.renew(&pending).await;
                        }
                    })
                    .abort_handle(),
                )
            }
            _ => None,
        };
        let limiter = limiter.clone();
        Some(Self {
            release: Some(Box::new(move || {
                Box::pin(async move {
                    // A release that fails (the store down) leaves the lease
                    // to lapse after `max_hold`.
                    let _ = limiter.release(&pending).await;
                })
            })),
            renewing,
        })
    }

    /// Gives the leases back now.
    pub async fn release(mut self) {
        if let Some(t) = self.renewing.take() {
            t.abort();
        }
        if let Some(r) = self.release.take() {
            r().await;
        }
    }
}

impl Drop for Held {
    fn drop(&mut self) {
        if let Some(t) = self.renewing.take() {
            t.abort();
        }
        let Some(r) = self.release.take() else { return };
        // Polled once here: the memory store's release is ready at once, so
        // the slot is free before the next request can ask for it. Only a
        // release that waits (on Redis) is left to a task.
        let mut release = r();
        let mut cx = std::task::Context::from_waker(std::task::Waker::noop());
        if release.as_mut().poll(&mut cx).is_pending()
            && let Ok(rt) = tokio::runtime::Handle::try_current()
        {
            rt.spawn(release);
        }
    }
}
