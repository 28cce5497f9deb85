//! [`Leased`]: a gateway's side of leasing (see the parent module). Needs
//! the `redis` feature (tokio, for waiting on a renewal): leasing serves a
//! store shared by gateways.

use std::collections::HashMap;
use std::hash::BuildHasher;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use super::{Ask, Grant};
use crate::Rule;
use crate::algorithm::{Check, Kind};
use crate::clock::{Clock, Micros, SystemClock};
use crate::rule::Verdict;
use crate::store::{KeyInfo, Mode, Op, Settle, Store, StoreError, admitted};

/// How long a slice may be used: a window, at most a second. On
/// `fixed_window` also no later than the end of the window it was charged
/// in (`reset_after` of the charge).
fn lifetime(rule: &Rule) -> Micros {
    Micros::from(rule.window()).min(Micros::from_secs(1))
}

/// Slots kept at most: leasing is for a few hot keys; beyond this many,
/// new keys are decided directly.
const MAX_SLOTS: usize = 10_000;

/// One leased key, on one gateway.
struct Cell {
    rule: Rule,
    key: Box<str>,
    group: Box<str>,
    slot: parking_lot::Mutex<Slot>,
    /// Woken when a renewal ends.
    renewed: tokio::sync::Notify,
}

#[derive(Debug, Default)]
struct Slot {
    /// Units of the slice left, usable until `until`.
    units: u64,
    until: Micros,
    /// Changes with every grant: units taken from an older slice are not
    /// put back into a newer one.
    generation: u64,
    /// A renewal is under way; renewals finished so far.
    renewing: bool,
    renewals: u64,
    /// Units wanted by requests waiting for the renewal under way.
    waiting: u64,
    /// The last grant: when, how many units, and how many used since.
    granted_at: Micros,
    granted: u64,
    used: u64,
    /// What the key had left after the last grant, and when it is whole.
    remaining: u64,
    reset_at: Micros,
    /// The key refused a slice: answer so until then.
    refused: Option<(Micros, Verdict)>,
    /// The lease room was full: decide directly until then.
    full_until: Micros,
}

/// What a leased op got locally.
enum Local {
    /// `units` taken from the slice of `generation`.
    Took(Arc<Cell>, u64, u64, Verdict),
    Refused(Verdict),
    Direct,
    /// Wait for the renewal under way (the slot's `renewals` when seen).
    Wait(Arc<Cell>, u64),
}

/// A store whose leased rules (`distribution: {mode: lease}`) are answered
/// from slices leased from `inner`; every other op goes to `inner` as is.
pub struct Leased<S> {
    inner: S,
    holder: u64,
    clock: Arc<dyn Clock>,
    seed: foldhash::quality::RandomState,
    cells: parking_lot::Mutex<HashMap<u64, Arc<Cell>>>,
    /// Slices granted, and decisions answered from them (for metrics).
    grants: AtomicU64,
    local: AtomicU64,
}

impl<S: std::fmt::Debug> std::fmt::Debug for Leased<S> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Leased")
            .field("inner", &self.inner)
            .field("holder", &format_args!("{:016x}", self.holder))
            .finish()
    }
}

impl<S: Store> Leased<S> {
    /// Leases over `inner`, on the system clock, as a holder with an id of
    /// its own.
    pub fn new(inner: S) -> Self {
        Self::with_clock(inner, Arc::new(SystemClock::new()))
    }

    /// The same on `clock` (tests: a manual one, shared with the store).
    pub fn with_clock(inner: S, clock: Arc<dyn Clock>) -> Self {
        let seed = foldhash::quality::RandomState::default();
        let holder = std::hash::BuildHasher::hash_one(
            &seed,
            (
                std::process::id(),
                std::time::SystemTime::now(),
                &seed as *const _ as usize,
            ),
        );
        Self {
            inner,
            holder,
            clock,
            seed,
            cells: Default::default(),
            grants: AtomicU64::new(0),
            local: AtomicU64::new(0),
        }
    }

    /// The store underneath.
    pub fn inner(&self) -> &S {
        &self.inner
    }

    /// This gateway's holder id.
    pub fn holder(&self) -> u64 {
        self.holder
    }

    /// Slices granted so far, and decisions answered from slices.
    pub fn counts(&self) -> (u64, u64) {
        (
            self.grants.load(Ordering::Relaxed),
            self.local.load(Ordering::Relaxed),
        )
    }

    /// Units this gateway holds in live slices and has not used.
    pub fn held(&self) -> u64 {
        let now = self.clock.now();
        let cells = self.cells.lock();
        cells
            .values()
            .map(|c| {
                let s = c.slot.lock();
                if s.until > now { s.units } else { 0 }
            })
            .sum()
    }

    /// The cell of `op`, made if there is room.
    fn cell(&self, op: &Op<'_>, now: Micros) -> Option<Arc<Cell>> {
        let h = self.seed.hash_one((op.rule.id(), op.key, op.group));
        let mut cells = self.cells.lock();
        if let Some(c) = cells.get(&h) {
            let same = c.rule.id() == op.rule.id() && *c.key == *op.key && *c.group == *op.group;
            return same.then(|| c.clone());
        }
        if cells.len() >= MAX_SLOTS {
            cells.retain(|_, c| {
                let s = c.slot.lock();
                s.renewing || s.until > now || s.refused.is_some_and(|(t, _)| t > now)
            });
            if cells.len() >= MAX_SLOTS {
                return None;
            }
        }
        let c = Arc::new(Cell {
            rule: op.rule.clone(),
            key: op.key.into(),
            group: op.group.into(),
            slot: Default::default(),
            renewed: tokio::sync::Notify::new(),
        });
        cells.insert(h, c.clone());
        Some(c)
    }

    /// A leased op of weight `w`: from the slice, renewed first if it is
    /// low; a request that finds it empty while another renews it waits
    /// for that renewal (a few times at most, then it is decided directly).
    async fn take(&self, op: &Op<'_>, w: u64) -> Local {
        // Each renewal is one store call; a request queued behind several
        // (a burst larger than a slice) still costs less than a call of
        // its own, up to a point.
        for _ in 0..16 {
            match self.take_once(op, w).await {
                Local::Wait(cell, seen) => {
                    let renewed = cell.renewed.notified();
                    tokio::pin!(renewed);
                    renewed.as_mut().enable();
                    if cell.slot.lock().renewals == seen {
                        renewed.await;
                    }
                }
                other => return other,
            }
        }
        Local::Direct
    }

    async fn take_once(&self, op: &Op<'_>, w: u64) -> Local {
        let now = self.clock.now();
        let Some(cell) = self.cell(op, now) else {
            return Local::Direct;
        };
        let c = op.rule.cost(1);
        let (ask, early) = {
            let mut s = cell.slot.lock();
            let live = s.until > now;
            let low = !live || s.units < w.max(s.granted / 4);
            let mut early = None;
            if live && s.units >= w {
                s.units -= w;
                s.used += w;
                early = Some(Local::Took(
                    cell.clone(),
                    s.generation,
                    w,
                    allowed(s.remaining + s.units * c, s.reset_at.saturating_sub(now)),
                ));
            }
            let backing_off = s.full_until > now || s.refused.is_some_and(|(t, _)| t > now);
            if early.is_none() && s.renewing && !backing_off {
                // Wait for the renewal under way rather than call the store.
                s.waiting += w;
                return Local::Wait(cell.clone(), s.renewals);
            }
            if !low || s.renewing || backing_off {
                return early.unwrap_or_else(|| match s.refused {
                    Some((t, v)) if t > now => Local::Refused(refused_since(v, t, now)),
                    _ => Local::Direct,
                });
            }
            // Renew: this task asks, the others go on with what is left.
            s.renewing = true;
            let elapsed = now.saturating_sub(s.granted_at).get().max(1);
            let life = lifetime(op.rule).get();
            let by_rate = (s.used as u128 * life as u128 / elapsed as u128) as u64;
            let d = op.rule.distribution().expect("a leased rule");
            let room = op.rule.lease_room();
            let share = d.share(room);
            let need = if early.is_some() { 1 } else { w };
            let (held, returned) = if live { (s.units, 0) } else { (0, s.units) };
            if !live {
                s.units = 0;
            }
            // What this gateway holds in all stays within its share.
            // At least what waits for it (the first slice of a burst).
            let demand = by_rate.max(std::mem::take(&mut s.waiting) + need);
            let want = demand.min(share).saturating_sub(held).max(need);
            let ask = Ask {
                holder: self.holder,
                want,
                need,
                held,
                returned,
                lifetime: lifetime(op.rule),
                cap: room,
            };
            (ask, early)
        };
        // A request dropped while it renews (its client went away) must
        // not leave the slot renewing for ever, with requests waiting on it.
        let mut unfinished = Unfinished(Some(&cell));
        let answer = self.inner.grant(*op, &ask).await;
        unfinished.0 = None;
        let out = self.renewed(&cell, op, w, now, &ask, early, answer);
        cell.renewed.notify_waiters();
        out
    }

    /// The slot after a renewal's `answer`, and what the renewing request
    /// gets.
    #[allow(clippy::too_many_arguments)]
    fn renewed(
        &self,
        cell: &Arc<Cell>,
        op: &Op<'_>,
        w: u64,
        now: Micros,
        ask: &Ask,
        early: Option<Local>,
        answer: Result<Grant, StoreError>,
    ) -> Local {
        let c = op.rule.cost(1);
        let mut s = cell.slot.lock();
        s.renewing = false;
        s.renewals += 1;
        match answer {
            Ok(Grant::Granted { units, verdict }) => {
                self.grants.fetch_add(1, Ordering::Relaxed);
                let mut until = now + ask.lifetime;
                if op.rule.spec().algorithm == Kind::FixedWindow {
                    until = until.min(now + verdict.check.reset_after);
                }
                let kept = s.units.min(ask.held);
                s.units = kept + units;
                s.until = until;
                s.generation += 1;
                s.granted_at = now;
                s.granted = s.units;
                s.used = 0;
                s.remaining = verdict.check.remaining;
                s.reset_at = now + verdict.check.reset_after;
                s.refused = None;
                if let Some(early) = early {
                    return early;
                }
                if s.units >= w {
                    s.units -= w;
                    s.used += w;
                    return Local::Took(
                        cell.clone(),
                        s.generation,
                        w,
                        allowed(s.remaining + s.units * c, verdict.check.reset_after),
                    );
                }
                Local::Direct
            }
            Ok(Grant::Refused(v)) => {
                let until = now + v.check.retry_after.min(ask.lifetime);
                s.refused = Some((until, v));
                early.unwrap_or(Local::Refused(v))
            }
            Ok(Grant::Full) => {
                s.full_until = now + ask.lifetime / 16;
                early.unwrap_or(Local::Direct)
            }
            Ok(Grant::Returned) | Err(_) => early.unwrap_or(Local::Direct),
        }
    }

    /// Puts units taken for a request that was not admitted back into the
    /// slice they came from, if it is still the current one.
    fn put_back(&self, took: &[Local]) {
        for l in took {
            if let Local::Took(cell, generation, w, _) = l {
                let mut s = cell.slot.lock();
                if s.generation == *generation {
                    s.units += w;
                    s.used = s.used.saturating_sub(*w);
                }
            }
        }
    }

    /// Gives back what this gateway holds and has not used (on shutdown):
    /// one call per leased key with a live slice. Errors are returned
    /// after every key was tried.
    pub async fn give_back(&self) -> Result<(), StoreError> {
        let now = self.clock.now();
        let cells: Vec<Arc<Cell>> = self.cells.lock().values().cloned().collect();
        let mut out = Ok(());
        for cell in cells {
            let units = {
                let mut s = cell.slot.lock();
                if s.until <= now {
                    continue;
                }
                s.until = now;
                std::mem::take(&mut s.units)
            };
            let op = Op::grouped(&cell.rule, &cell.key, &cell.group);
            let ask = Ask {
                holder: self.holder,
                want: 0,
                need: 0,
                held: 0,
                returned: units,
                lifetime: lifetime(&cell.rule),
                cap: cell.rule.lease_room(),
            };
            if let Err(e) = self.inner.grant(op, &ask).await {
                out = Err(e);
            }
        }
        out
    }
}

/// Ends a renewal whose request was dropped before the store answered:
/// the slot is no longer renewing, and the requests waiting on it go on
/// (what the store may have granted meanwhile lapses unused).
struct Unfinished<'a>(Option<&'a Cell>);

impl Drop for Unfinished<'_> {
    fn drop(&mut self) {
        if let Some(cell) = self.0 {
            {
                let mut s = cell.slot.lock();
                s.renewing = false;
                s.renewals += 1;
            }
            cell.renewed.notify_waiters();
        }
    }
}

/// An admitting verdict from a slice.
fn allowed(remaining: u64, reset_after: Micros) -> Verdict {
    Verdict {
        check: Check {
            allowed: true,
            remaining,
            reset_after,
            retry_after: Micros::ZERO,
            delay: Micros::ZERO,
        },
        reason: None,
        lease: None,
    }
}

/// A refusal cached until `until`, as it reads at `now`.
fn refused_since(mut v: Verdict, until: Micros, now: Micros) -> Verdict {
    let left = until.saturating_sub(now);
    v.check.retry_after = v.check.retry_after.min(left).max(Micros::new(1));
    v
}

impl<S: Store> Store for Leased<S> {
    async fn decide(
        &self,
        ops: &[Op<'_>],
        weight: u64,
        mode: Mode,
    ) -> Result<Vec<Verdict>, StoreError> {
        if mode == Mode::Peek || !ops.iter().any(|op| op.rule.distribution().is_some()) {
            return self.inner.decide(ops, weight, mode).await;
        }
        let mut locals = Vec::with_capacity(ops.len());
        for op in ops {
            locals.push(match op.rule.distribution() {
                Some(_) => {
                    let w = if op.weight > 0 {
                        op.weight
                    } else {
                        weight.max(1)
                    };
                    self.take(op, w).await
                }
                None => Local::Direct,
            });
        }
        let refused = ops
            .iter()
            .zip(&locals)
            .any(|(op, l)| matches!(l, Local::Refused(_)) && !op.rule.is_shadow());
        let rest: Vec<Op<'_>> = ops
            .iter()
            .zip(&locals)
            .filter(|(_, l)| matches!(l, Local::Direct | Local::Wait(..)))
            .map(|(op, _)| *op)
            .collect();
        let mut direct = vec![];
        if !rest.is_empty() {
            // A refused leased rule refuses the request: the others are
            // only looked at, as one store call would have done.
            let mode = if refused { Mode::Peek } else { Mode::Apply };
            match self.inner.decide(&rest, weight, mode).await {
                Ok(v) => direct = v,
                Err(e) => {
                    self.put_back(&locals);
                    return Err(e);
                }
            }
            if !refused && !admitted(&rest, &direct) {
                self.put_back(&locals);
            }
        } else if refused {
            self.put_back(&locals);
        }
        let mut direct = direct.into_iter();
        Ok(locals
            .into_iter()
            .map(|l| match l {
                Local::Took(_, _, _, v) => {
                    self.local.fetch_add(1, Ordering::Relaxed);
                    v
                }
                Local::Refused(v) => v,
                Local::Direct | Local::Wait(..) => {
                    direct.next().expect("one verdict per direct op")
                }
            })
            .collect())
    }

    async fn settle(&self, ops: &[Op<'_>], how: Settle) -> Result<(), StoreError> {
        self.inner.settle(ops, how).await
    }

    async fn release(&self, leases: &[(Op<'_>, u64, u64)]) -> Result<(), StoreError> {
        self.inner.release(leases).await
    }

    async fn renew(&self, leases: &[(Op<'_>, u64, u64)]) -> Result<(), StoreError> {
        self.inner.renew(leases).await
    }

    async fn grant(&self, op: Op<'_>, ask: &Ask) -> Result<Grant, StoreError> {
        self.inner.grant(op, ask).await
    }

    async fn inspect(&self, op: Op<'_>) -> Result<KeyInfo, StoreError> {
        self.inner.inspect(op).await
    }

    async fn clear(&self, op: Op<'_>) -> Result<bool, StoreError> {
        self.inner.clear(op).await
    }

    async fn ping(&self) -> Result<(), StoreError> {
        self.inner.ping().await
    }

    async fn ban(&self, op: Op<'_>, left: std::time::Duration) -> Result<(), StoreError> {
        self.inner.ban(op, left).await
    }

    fn instances(&self) -> u64 {
        self.inner.instances()
    }
}
