//! Leased local quotas for hot keys (`distribution: {mode: lease}`).
//!
//! A key every request shares (`global`) makes every decision a call on
//! one Redis key, so one Redis core bounds the whole fleet. With leases a
//! gateway instead takes a *slice* of the key's allowance from the store
//! in one call ([`Store::grant`]) and answers from it locally until it is
//! used up or lapses.
//!
//! What makes it safe:
//!
//! * A slice is **charged up front** through the rule's own algorithm, as a
//!   request of the slice's weight: the store's state counts it as used
//!   the moment it is granted, so a slice is never more than the key had
//!   left, and the algorithm's own bound holds for everything charged.
//! * The store keeps, per key, what each gateway holds (**outstanding**:
//!   granted and neither given back nor lapsed), and grants a slice only
//!   while all outstanding slices together stay within the rule's lease
//!   room, ε × limit. A slice used later than it was charged is the only
//!   way leasing can admit more in a window than the algorithm would, and
//!   what is used in a window but was charged before it is at most what
//!   was outstanding when the window began: so **admitted ≤ limit × (1 + ε)
//!   in every window** for the exact window algorithms (`fixed_window`,
//!   `sliding_window_log`), and the algorithm's own bound plus ε × limit
//!   for the others. On `fixed_window` a slice also ends with the window it
//!   was charged in, so none is used in the next one and leasing admits no
//!   more than the limit at all.
//! * A slice lapses `lifetime` after the call that granted it began (local
//!   clock), and the store forgets it `lifetime` after it ran (its clock):
//!   the store never stops counting a slice a gateway may still use. A
//!   gateway killed while holding one leaves it counted until it lapses:
//!   those units are lost (under-admission), never admitted twice.
//! * What a gateway did not use is given back (refunded to the state) when
//!   it renews or shuts down ([`Leased::give_back`]), where the algorithm's
//!   refund is exact whenever it happens: `gcra`, the buckets, and
//!   `fixed_window` within its window. On `sliding_window_log` (a refund
//!   takes the newest entries, which need not be the slice's) and
//!   `sliding_window_counter` (it may fall in a later sub-window) unused
//!   units are not given back: they count until their window passes.
//!
//! The size of a slice follows the gateway's rate: what it used of its last
//! slice per unit of time, times the lifetime, at least the request at hand
//! and at most `max_share` of the lease room. A gateway renews when a
//! quarter of its slice is left, so its requests rarely wait; a request
//! that finds the slice empty while a renewal is under way is decided by
//! the store directly (exact). When the room is taken by other gateways'
//! slices, or the store cannot be reached, decisions go to the store as
//! without leases (and so to `on_error`).

use std::collections::HashMap;
use std::hash::BuildHasher;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use crate::Rule;
use crate::algorithm::{Check, Kind};
use crate::clock::{Clock, Micros, SystemClock};
use crate::rule::Verdict;
use crate::store::{KeyInfo, Mode, Op, Store, StoreError, admitted};

/// A gateway's request for a slice of one key ([`Store::grant`]). Units
/// are requests of weight 1 under the rule (each costs the rule's `cost`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Ask {
    /// Who holds the slice: one id per gateway process.
    pub holder: u64,
    /// The slice wanted.
    pub want: u64,
    /// The least worth granting (the request at hand); 0 with `want` 0
    /// only gives back.
    pub need: u64,
    /// Units of the holder's current slice it goes on using: they stay
    /// outstanding, with the new slice's lifetime.
    pub held: u64,
    /// Units of the holder's current slice it will not use: given back.
    pub returned: u64,
    /// How long the slice may be used after the call.
    pub lifetime: Micros,
    /// The lease room: what all holders' slices may total (ε × limit).
    pub cap: u64,
}

/// What [`Store::grant`] answered.
#[derive(Debug, Clone, PartialEq)]
pub enum Grant {
    /// `units` charged to the key for the holder; `verdict` is the
    /// charge's (its `remaining` is what the key has left after it).
    Granted {
        /// The slice.
        units: u64,
        /// The charge's verdict.
        verdict: Verdict,
    },
    /// The key refuses even `need`: the verdict says until when.
    Refused(Verdict),
    /// The other holders' slices fill the lease room: decide directly.
    Full,
    /// Nothing asked (`need` 0): only given back.
    Returned,
}

/// Whether a refund of unused units is exact whenever it happens (see the
/// module's documentation); on `fixed_window`, within the window the units
/// were charged in, which the store checks.
pub fn gives_back(rule: &Rule) -> bool {
    matches!(
        rule.spec().algorithm,
        Kind::Gcra | Kind::TokenBucket | Kind::LeakyBucket | Kind::FixedWindow
    )
}

/// One holder's slice as a store keeps it.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Holding {
    pub holder: u64,
    pub units: u64,
    pub until: Micros,
    /// When it was last granted to: a `fixed_window` slice is given back
    /// only within the window it was charged in.
    pub since: Micros,
}

/// The store side of a grant, for a store that keeps `holdings` of one key
/// (live ones only) and decides with `decide(weight)` (an apply of the op
/// at that weight) and gives back with `refund(weight)`: both
/// [`MemoryStore`](super::MemoryStore) and the script (`lua/rule.lua`,
/// mode 7) follow it step by step.
pub(crate) fn grant_with(
    ask: &Ask,
    rule: &Rule,
    now: Micros,
    holdings: &mut Vec<Holding>,
    mut decide: impl FnMut(u64) -> Verdict,
    refund: impl FnOnce(u64),
) -> Grant {
    let mine = holdings
        .iter()
        .position(|h| h.holder == ask.holder)
        .map(|i| holdings.swap_remove(i));
    let mut held = 0;
    if let Some(mine) = mine {
        held = ask.held.min(mine.units);
        let back = ask.returned.min(mine.units - held);
        let w = Micros::from(rule.window()).get();
        let same_window =
            rule.spec().algorithm != Kind::FixedWindow || mine.since.get() / w == now.get() / w;
        if back > 0 && gives_back(rule) && same_window {
            refund(back);
        }
    }
    let others: u64 = holdings.iter().map(|h| h.units).sum();
    let keep = |holdings: &mut Vec<Holding>, units: u64| {
        if units > 0 {
            holdings.push(Holding {
                holder: ask.holder,
                units,
                until: now + ask.lifetime,
                since: now,
            });
        }
    };
    if ask.need == 0 {
        keep(holdings, held);
        return Grant::Returned;
    }
    let room = ask.cap.saturating_sub(others + held);
    let want = ask.want.min(room);
    if want < ask.need {
        keep(holdings, held);
        return Grant::Full;
    }
    let mut verdict = decide(want);
    let mut units = want;
    if !verdict.allowed() {
        // As much as the key has left, if that covers the request at hand.
        let left = verdict.check.remaining / rule.cost(1);
        if left >= ask.need && left < want {
            verdict = decide(left);
            units = left;
        }
    }
    if verdict.allowed() {
        keep(holdings, held + units);
        Grant::Granted { units, verdict }
    } else {
        keep(holdings, held);
        Grant::Refused(verdict)
    }
}

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
}

#[derive(Debug, Default)]
struct Slot {
    /// Units of the slice left, usable until `until`.
    units: u64,
    until: Micros,
    /// Changes with every grant: units taken from an older slice are not
    /// put back into a newer one.
    generation: u64,
    /// A renewal is under way.
    renewing: bool,
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
        });
        cells.insert(h, c.clone());
        Some(c)
    }

    /// A leased op of weight `w`: from the slice, renewed first if it is
    /// low.
    async fn take(&self, op: &Op<'_>, w: u64) -> Local {
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
            let share = (room * u64::from(d.max_share_ppm) / 1_000_000).max(1);
            let need = if early.is_some() { 1 } else { w };
            let (held, returned) = if live { (s.units, 0) } else { (0, s.units) };
            if !live {
                s.units = 0;
            }
            // What this gateway holds in all stays within its share.
            let want = by_rate.min(share).saturating_sub(held).max(need);
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
        let answer = self.inner.grant(*op, &ask).await;
        let mut s = cell.slot.lock();
        s.renewing = false;
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
            .filter(|(_, l)| matches!(l, Local::Direct))
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
                Local::Direct => direct.next().expect("one verdict per direct op"),
            })
            .collect())
    }

    async fn settle(&self, ops: &[Op<'_>], weight: u64, failure: bool) -> Result<(), StoreError> {
        self.inner.settle(ops, weight, failure).await
    }

    async fn release(&self, leases: &[(Op<'_>, u64, u64)]) -> Result<(), StoreError> {
        self.inner.release(leases).await
    }

    async fn refund(&self, ops: &[Op<'_>], weight: u64) -> Result<(), StoreError> {
        self.inner.refund(ops, weight).await
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
}
