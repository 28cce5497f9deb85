//! The in-process store: sharded, exact under concurrency, bounded.
//!
//! Keys are hashed once with a per-process random seed (so clients cannot
//! aim at one shard or one bucket) to 64 bits; the hash picks a shard and is
//! the map key, so a key costs no heap allocation. Two distinct keys would
//! share a state only on a full 64-bit collision of a seeded hash: about one
//! chance in 3·10^7 with a million live keys.
//!
//! A decision locks the shards of all its keys (in ascending order, so two
//! decisions cannot deadlock), evaluates every rule, then records: that is
//! what makes multi-rule decisions all-or-nothing and a hot key exact.
//!
//! Memory is bounded by `max_keys`: each shard holds at most its share. When a
//! shard is full, expired states go first, then the states that carry least:
//! each slot keeps its [`Weight`] (how much of a fresh key's allowance it has
//! used, read when it was last written), and the lightest go first, the
//! soonest to expire among equals. A ban, and a key at its limit, are never
//! evicted for another key's sake: forgetting either would admit at once what
//! its rule refuses, so a flood of new keys cannot buy back a ban. When a
//! shard holds nothing else, a new key is refused ([`Reason::Full`]) until
//! one of them lapses (nginx answers 503 when its zone cannot take a key);
//! the bound on memory stays `max_keys` states.

use std::collections::HashMap;
use std::hash::{BuildHasher, BuildHasherDefault, Hasher};
use std::sync::Arc;

use parking_lot::{RwLock, RwLockWriteGuard};

use crate::algorithm::Check;
use crate::clock::{Clock, Micros, SystemClock};
use crate::rule::{KeyState, PROTECTED, Reason, Verdict, Weight};
use crate::store::lease::{self, Ask, Grant};
use crate::store::mirror::Mirror;
use crate::store::{KeyInfo, Mode, Op, Settle, Store, StoreError, admitted};

/// The map key is already a seeded hash: pass it through.
#[derive(Default)]
struct PassThrough(u64);

impl Hasher for PassThrough {
    fn finish(&self) -> u64 {
        self.0
    }
    fn write(&mut self, bytes: &[u8]) {
        for &b in bytes {
            self.0 = (self.0 << 8) | u64::from(b);
        }
    }
    fn write_u64(&mut self, n: u64) {
        self.0 = n;
    }
}

type Map = HashMap<u64, Slot, BuildHasherDefault<PassThrough>>;

#[derive(Debug)]
struct Slot {
    state: KeyState,
    /// When `state` reads as fresh (an expired slot is treated as absent),
    /// and its weight.
    keep: Keep,
}

/// A slot's expiry and [`Weight`] in one word: the weight in the top 8
/// bits, the expiry (µs) in the low 56 (2^56 µs is 2,283 years; a later
/// one is kept as that). One word keeps an entry at 48 bytes, and orders
/// slots for eviction as they go: lighter first, sooner to expire among
/// equals.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
struct Keep(u64);

const EXPIRY_MASK: u64 = (1 << 56) - 1;

impl Keep {
    fn new(expires: Micros, weight: Weight) -> Self {
        Self((u64::from(weight) << 56) | expires.get().min(EXPIRY_MASK))
    }

    fn expires(self) -> Micros {
        Micros::new(self.0 & EXPIRY_MASK)
    }

    fn weight(self) -> Weight {
        (self.0 >> 56) as Weight
    }
}

impl Slot {
    /// Whether a lack of room may evict it: neither at its limit nor
    /// banned.
    fn evictable(&self, now: Micros) -> bool {
        self.keep.weight() != PROTECTED && self.state.marks().ban_until <= now
    }

    /// From when it may be evicted: its ban's end, or (at its limit) its
    /// expiry, when it is no longer kept at all.
    fn protected_until(&self) -> Micros {
        if self.keep.weight() == PROTECTED {
            self.keep.expires()
        } else {
            self.state.marks().ban_until
        }
    }
}

/// No room for a new key in its shard until `until` (see the module docs).
#[derive(Debug, Clone, Copy)]
struct Full {
    until: Micros,
}

impl Full {
    /// The refusal of a request on a key that could not be kept.
    fn verdict(self, now: Micros) -> Verdict {
        let wait = self.until.saturating_sub(now).max(Micros::from_secs(1));
        Verdict {
            check: Check::deny(0, wait, wait),
            reason: Some(Reason::Full),
            lease: None,
        }
    }
}

struct Shard {
    map: Map,
    /// Before this, the shard is known to hold nothing a new key may
    /// evict (each of its states is banned or at its limit): a new key is
    /// refused without looking again (a flood of them must not cost a scan
    /// of the shard each). Reset when a state stops being protected.
    full_until: Micros,
}

/// A shard and the lock-free copies of its hot states (see `mirror`). The
/// mirror is only written with the shard's write lock held.
struct Cell {
    lock: RwLock<Shard>,
    mirror: Mirror,
}

struct Inner {
    shards: Box<[Cell]>,
    per_shard: usize,
    max_keys: usize,
    seed: foldhash::quality::RandomState,
    clock: Arc<dyn Clock>,
    /// Leased slices ([`lease`]), by key hash: only keys with a live one.
    leases: parking_lot::Mutex<std::collections::HashMap<u64, Vec<lease::Holding>>>,
    /// New keys refused for want of room ([`Reason::Full`]).
    full_refusals: std::sync::atomic::AtomicU64,
}

/// The in-process store. Cheap to clone; clones share the state.
///
/// ```
/// use std::time::Duration;
/// use ratewarden::{Limiter, MemoryStore, Rule, clock::ManualClock};
/// # tokio_test_block(async {
/// let clock = ManualClock::new(0);
/// let limiter = Limiter::new(MemoryStore::builder().clock(clock.clone()).build());
/// let rule = Rule::builder("r").limit(1, Duration::from_secs(1)).build().unwrap();
/// assert!(limiter.check(&rule, "k").await.unwrap().allowed);
/// assert!(!limiter.check(&rule, "k").await.unwrap().allowed);
/// # });
/// # fn tokio_test_block(f: impl std::future::Future<Output = ()>) {
/// #     tokio::runtime::Builder::new_current_thread().build().unwrap().block_on(f)
/// # }
/// ```
#[derive(Clone)]
pub struct MemoryStore {
    inner: Arc<Inner>,
}

/// Builds a [`MemoryStore`].
pub struct MemoryStoreBuilder {
    max_keys: usize,
    clock: Arc<dyn Clock>,
}

impl std::fmt::Debug for MemoryStoreBuilder {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("MemoryStoreBuilder").finish_non_exhaustive()
    }
}

impl MemoryStoreBuilder {
    /// The most keys held at once (default 1,000,000).
    pub fn max_keys(mut self, n: usize) -> Self {
        self.max_keys = n.max(1);
        self
    }

    /// The clock (default [`SystemClock`]).
    pub fn clock(mut self, clock: impl Clock) -> Self {
        self.clock = Arc::new(clock);
        self
    }

    /// The store.
    pub fn build(self) -> MemoryStore {
        let (shards, per_shard) = layout(self.max_keys);
        MemoryStore {
            inner: Arc::new(Inner {
                // Each table is sized for its share of `max_keys` when its
                // first key arrives (`make_room`): it does not grow while it
                // fills (no rehash pause as keys arrive), and a start does
                // not wait for the whole store's memory (the kernel zeroing a
                // million keys' tables took 6 ms of each start, 50-180 ms on
                // some).
                shards: (0..shards)
                    .map(|_| Cell {
                        lock: RwLock::new(Shard {
                            map: Map::default(),
                            full_until: Micros::ZERO,
                        }),
                        mirror: Mirror::default(),
                    })
                    .collect(),
                per_shard,
                max_keys: self.max_keys,
                seed: foldhash::quality::RandomState::default(),
                leases: Default::default(),
                full_refusals: Default::default(),
                clock: self.clock,
            }),
        }
    }
}

/// Buckets of a hash table sized for `cap` entries (it keeps 1/8 free).
fn buckets(cap: usize) -> usize {
    (cap.max(1) * 8).div_ceil(7).next_power_of_two()
}

/// How many shards, and how many keys each may hold.
///
/// Tables have a power-of-two number of buckets, so a share that just misses
/// a power of two wastes half its table (1,000,000 keys over 64 shards did:
/// 155 bytes per key). Between 32 and 128 shards, pick the count that needs
/// the fewest buckets in all, the most shards on a tie. Small stores get
/// fewer shards, each of at least 1024 keys.
fn layout(max_keys: usize) -> (usize, usize) {
    if max_keys < 32 * 1024 {
        let shards = (max_keys / 1024).clamp(1, 32);
        return (shards, max_keys / shards);
    }
    let shards = (32..=128)
        .min_by_key(|&s| (s * buckets(max_keys / s), usize::MAX - s))
        .expect("non-empty range");
    (shards, max_keys / shards)
}

impl Default for MemoryStore {
    fn default() -> Self {
        Self::builder().build()
    }
}

/// parking_lot's lock rather than std's: it spins briefly before parking, and
/// a decision holds a shard for well under a microsecond; on a hot key with 2
/// threads std's mutex parked (futex) and cost 2.5× governor's time. A
/// read-write lock, because most decisions on a hot key are rejections that
/// record nothing: they share the read lock. Nothing awaits while a shard is
/// locked.
fn lock(cell: &Cell) -> RwLockWriteGuard<'_, Shard> {
    cell.lock.write()
}

impl MemoryStore {
    /// A builder with the defaults.
    pub fn builder() -> MemoryStoreBuilder {
        MemoryStoreBuilder {
            max_keys: 1_000_000,
            clock: Arc::new(SystemClock::new()),
        }
    }

    /// The configured bound.
    pub fn max_keys(&self) -> usize {
        self.inner.max_keys
    }

    /// The store's clock reading.
    pub fn now(&self) -> Micros {
        self.inner.clock.now()
    }

    /// Number of slots held (expired ones included until swept).
    pub fn len(&self) -> usize {
        self.inner
            .shards
            .iter()
            .map(|c| c.lock.read().map.len())
            .sum()
    }

    /// New keys refused so far because the store had no room for them:
    /// every state of their shard was banned or at its limit.
    pub fn full_refusals(&self) -> u64 {
        self.inner
            .full_refusals
            .load(std::sync::atomic::Ordering::Relaxed)
    }

    /// Whether the store holds nothing.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Drops every expired slot; returns how many. Call it now and then (the
    /// gateway does, every few seconds) so that a quiet store shrinks too.
    pub fn purge_expired(&self) -> usize {
        let now = self.now();
        self.inner
            .shards
            .iter()
            .map(|cell| {
                let mut s = lock(cell);
                let before = s.map.len();
                s.map.retain(|_, slot| slot.keep.expires() > now);
                let removed = before - s.map.len();
                if removed > 0 {
                    cell.mirror.clear();
                }
                removed
            })
            .sum()
    }

    fn hash(&self, op: &Op<'_>) -> u64 {
        self.inner.seed.hash_one((op.rule.id(), op.key))
    }

    fn shard_of(&self, h: u64) -> usize {
        // Bits 16..48, mapped onto the shard count by multiply-shift: the map
        // itself uses the low bits for buckets and the top seven as tags.
        let mid = (h >> 16) & 0xFFFF_FFFF;
        ((mid * self.inner.shards.len() as u64) >> 32) as usize
    }

    /// Decides synchronously (the memory store never waits). Same contract
    /// as [`Store::decide`].
    pub fn decide_now(&self, ops: &[Op<'_>], weight: u64, mode: Mode) -> Vec<Verdict> {
        if let [op] = ops {
            return vec![self.decide_one(op, weight, mode)];
        }
        let now = self.now();
        let hashes: Vec<u64> = ops.iter().map(|op| self.hash(op)).collect();
        let mut shard_ids: Vec<usize> = hashes.iter().map(|&h| self.shard_of(h)).collect();
        shard_ids.sort_unstable();
        shard_ids.dedup();
        let mut guards: Vec<RwLockWriteGuard<'_, Shard>> = shard_ids
            .iter()
            .map(|&i| lock(&self.inner.shards[i]))
            .collect();
        let guard_of = |h: u64| {
            shard_ids
                .binary_search(&self.shard_of(h))
                .expect("every key's shard is locked")
        };

        // Make room for the new keys before evaluating, so that no eviction
        // can drop a state between its check and its commit. A shard that
        // has none refuses its new keys (and so the request: all or
        // nothing).
        let mut full: Vec<Option<Full>> = vec![None; ops.len()];
        if mode == Mode::Apply {
            for (g, &sid) in guards.iter_mut().zip(&shard_ids) {
                let new = |h: &u64| {
                    self.shard_of(*h) == sid && g.map.get(h).is_none_or(|s| s.keep.expires() <= now)
                };
                let incoming = hashes.iter().filter(|h| new(h)).count();
                if incoming == 0 {
                    continue;
                }
                let is_new: Vec<bool> = hashes.iter().map(new).collect();
                if let Err(f) = self.make_room(g, &self.inner.shards[sid].mirror, now, incoming) {
                    for (slot, new) in full.iter_mut().zip(is_new) {
                        if new {
                            *slot = Some(f);
                        }
                    }
                }
            }
        }

        // Several ops on one key (an Envoy call naming a descriptor twice)
        // are decided on their sum, as one charge: the first carries it,
        // the others copy its verdict. Deciding each against the state
        // before the call would admit both where only one fits.
        let mut first: Vec<usize> = (0..ops.len()).collect();
        let mut costs: Vec<u64> = ops.iter().map(|op| op.cost(weight)).collect();
        for i in 1..ops.len() {
            if let Some(j) = (0..i).find(|&j| {
                first[j] == j
                    && hashes[j] == hashes[i]
                    && ops[j].rule.id() == ops[i].rule.id()
                    && ops[j].key == ops[i].key
            }) {
                first[i] = j;
                costs[j] = costs[j].saturating_add(costs[i]);
            }
        }

        let fresh = KeyState::default();
        let mut verdicts: Vec<Verdict> = ops
            .iter()
            .zip(&hashes)
            .zip(&costs)
            .map(|((op, &h), &cost)| {
                let state = guards[guard_of(h)]
                    .map
                    .get(&h)
                    .filter(|s| s.keep.expires() > now)
                    .map_or(&fresh, |s| &s.state);
                op.rule.verdict(state, now, cost)
            })
            .collect();
        for (v, f) in verdicts.iter_mut().zip(&full) {
            if let Some(f) = f {
                *v = f.verdict(now);
                self.count_full();
            }
        }
        for i in 0..ops.len() {
            verdicts[i] = verdicts[first[i]];
        }

        if mode == Mode::Apply {
            let ok = admitted(ops, &verdicts);
            for (i, (op, &h)) in ops.iter().zip(&hashes).enumerate() {
                if first[i] != i || full[i].is_some() {
                    continue;
                }
                let v = &mut verdicts[i];
                let shard = &mut guards[guard_of(h)];
                let mirror = &self.inner.shards[self.shard_of(h)].mirror;
                // (Room was made above: this cannot be refused.)
                let _ = self.update(shard, mirror, h, now, |state| {
                    op.rule.commit(state, now, costs[i], v, ok);
                    v.lease = op.rule.lease_taken(state, v, ok);
                    (
                        op.rule.idle_at(state),
                        op.rule.weight_after(state, now, v, ok),
                    )
                });
            }
            for i in 0..ops.len() {
                verdicts[i] = verdicts[first[i]];
            }
        }
        verdicts
    }

    /// [`Store::grant`], synchronously: the holdings of all keys sit in one
    /// table under one lock (grants are rare next to decisions), held
    /// across the grant so that two grants of a key never interleave.
    pub fn grant_now(&self, op: Op<'_>, ask: &Ask) -> Grant {
        let now = self.now();
        let h = self.hash(&op);
        let mut table = self.inner.leases.lock();
        let mut holdings = table.remove(&h).unwrap_or_default();
        holdings.retain(|x| x.until > now);
        let grant = lease::grant_with(
            ask,
            op.rule,
            now,
            &mut holdings,
            |w| self.decide_one(&op.weighing(w), 1, Mode::Apply),
            |w| self.refund_now(&op, op.rule.cost(w)),
        );
        if !holdings.is_empty() {
            table.insert(h, holdings);
        }
        grant
    }

    /// Gives `cost` back to `op`'s key, if it has a live state.
    fn refund_now(&self, op: &Op<'_>, cost: u64) {
        let now = self.now();
        let h = self.hash(op);
        let cell = &self.inner.shards[self.shard_of(h)];
        let mut shard = lock(cell);
        if shard.map.get(&h).is_some_and(|s| s.keep.expires() > now) {
            let _ = self.update(&mut shard, &cell.mirror, h, now, |state| {
                op.rule.refund(state, now, cost);
                (op.rule.idle_at(state), op.rule.weight(state, now))
            });
        }
    }

    /// One rule, one key: the common case, with one lock, one hash lookup and
    /// no allocation for a key already held.
    pub fn decide_one(&self, op: &Op<'_>, weight: u64, mode: Mode) -> Verdict {
        let now = self.now();
        let h = self.hash(op);
        let rule = op.rule;
        let cost = op.cost(weight);
        let cell = &self.inner.shards[self.shard_of(h)];
        // First from the mirror, without any lock, then under the read lock:
        // a peek, or a decision that records nothing (a plain rejection), is
        // answered there. Either is a consistent snapshot of the key's state
        // at one instant, which is all a decision that records nothing needs.
        let mirrored = cell.mirror.read(h).filter(|m| m.expires > now);
        if let Some(m) = &mirrored {
            let v = rule.verdict_parts(&m.algo, m.marks, now, cost);
            if mode == Mode::Peek || !rule.records(&v, v.allowed() || rule.is_shadow()) {
                return v;
            }
        }
        if mirrored.is_none() {
            let shard = cell.lock.read();
            let fresh = KeyState::default();
            let live = shard.map.get(&h).filter(|s| s.keep.expires() > now);
            let v = rule.verdict(live.map_or(&fresh, |s| &s.state), now, cost);
            if mode == Mode::Peek
                || (live.is_some() && !rule.records(&v, v.allowed() || rule.is_shadow()))
            {
                return v;
            }
        }
        // Something to record: decide again under the write lock, since the
        // state may have changed in between.
        let mut shard = lock(cell);
        let mut verdict = None;
        let kept = self.update(&mut shard, &cell.mirror, h, now, |state| {
            let mut v = rule.verdict(state, now, cost);
            let admitted = v.allowed() || rule.is_shadow();
            rule.commit(state, now, cost, &v, admitted);
            v.lease = rule.lease_taken(state, &v, admitted);
            verdict = Some(v);
            (
                rule.idle_at(state),
                rule.weight_after(state, now, &v, admitted),
            )
        });
        match kept {
            Ok(()) => verdict.expect("update runs its closure once"),
            Err(full) => {
                self.count_full();
                full.verdict(now)
            }
        }
    }

    fn count_full(&self) {
        self.inner
            .full_refusals
            .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    }

    /// Holds a ban on `op`'s key for `left` from now (at least: a longer
    /// one stays), as a shared store reported it: the fallback of a Redis
    /// store keeps the bans it saw, so that an outage does not lift them.
    /// Nothing is written when the key already holds it.
    pub fn hold_ban(&self, op: &Op<'_>, left: Micros) {
        let now = self.now();
        let until = now + left;
        let h = self.hash(op);
        let cell = &self.inner.shards[self.shard_of(h)];
        if cell
            .mirror
            .read(h)
            .is_some_and(|m| m.expires > now && m.marks.ban_until >= until)
        {
            return;
        }
        let mut shard = lock(cell);
        // A shard full of bans and keys at their limits has no room for
        // one more: the ban is not held here (the shared store still holds
        // it; see the README's memory bound).
        let _ = self.update(&mut shard, &cell.mirror, h, now, |state| {
            state.hold_ban(until);
            // (Past the ban's end: `idle_at` counts the marks.)
            (op.rule.idle_at(state), op.rule.weight(state, now))
        });
    }

    /// Applies `f` to the live state at `h` (fresh if absent or expired) and
    /// stores the result with the expiry and weight `f` returns; a state
    /// that is already idle is not kept. A new key needs room first, even
    /// one that records nothing yet (a `count: failures` key is written
    /// when its outcome comes): without any, `f` is not run and the key is
    /// refused (`Err`). `mirror` is the shard's, and the caller holds the
    /// shard's write lock.
    fn update(
        &self,
        shard: &mut Shard,
        mirror: &Mirror,
        h: u64,
        now: Micros,
        f: impl FnOnce(&mut KeyState) -> (Micros, Weight),
    ) -> Result<(), Full> {
        match shard.map.get_mut(&h) {
            Some(slot) => {
                if slot.keep.expires() <= now {
                    slot.state = KeyState::default();
                }
                let was = slot.keep.weight();
                let (expires, weight) = f(&mut slot.state);
                slot.keep = Keep::new(expires, weight);
                if was == PROTECTED && weight != PROTECTED {
                    // Something may be evicted again.
                    shard.full_until = Micros::ZERO;
                }
                if expires <= now {
                    shard.map.remove(&h);
                    mirror.write(h, None);
                } else {
                    mirror.write(h, Some((&slot.state, expires)));
                }
            }
            None => {
                self.make_room(shard, mirror, now, 1)?;
                let mut state = KeyState::default();
                let (expires, weight) = f(&mut state);
                if expires > now {
                    mirror.write(h, Some((&state, expires)));
                    shard.map.insert(
                        h,
                        Slot {
                            state,
                            keep: Keep::new(expires, weight),
                        },
                    );
                }
            }
        }
        Ok(())
    }

    /// Room for `incoming` new keys in `shard`: expired states go first,
    /// then an eighth of the shard at once (amortised O(1) per insert), the
    /// lightest first and the soonest to expire among equals, exactly
    /// `evict` slots even on ties; never a ban or a key at its limit.
    /// `Err` when those are all the shard holds.
    fn make_room(
        &self,
        shard: &mut Shard,
        mirror: &Mirror,
        now: Micros,
        incoming: usize,
    ) -> Result<(), Full> {
        let cap = self.inner.per_shard;
        if shard.map.capacity() == 0 {
            // The shard's first key: its table, once, at its full size.
            shard.map.reserve(cap);
        }
        if shard.map.len() + incoming <= cap {
            return Ok(());
        }
        if now < shard.full_until {
            return Err(Full {
                until: shard.full_until,
            });
        }
        // Whatever goes, its mirrored copy must go with it.
        mirror.clear();
        shard.map.retain(|_, s| s.keep.expires() > now);
        let len = shard.map.len();
        if len + incoming <= cap {
            return Ok(());
        }
        let needed = len + incoming - cap;
        let mut keeps: Vec<Keep> = shard
            .map
            .values()
            .filter(|s| s.evictable(now))
            .map(|s| s.keep)
            .collect();
        if keeps.len() < needed {
            // Every state here is kept: refuse new keys until the first of
            // them may go (or a state stops being protected).
            let until = shard
                .map
                .values()
                .filter(|s| !s.evictable(now))
                .map(Slot::protected_until)
                .min()
                .unwrap_or(now)
                .max(now + Micros::new(1));
            shard.full_until = until;
            return Err(Full { until });
        }
        let evict = (cap / 8).max(needed).min(keeps.len());
        let (_, &mut threshold, _) = keeps.select_nth_unstable(evict - 1);
        let below = keeps.iter().filter(|&&k| k < threshold).count();
        let mut ties = evict - below;
        shard.map.retain(|_, s| {
            if !s.evictable(now) || s.keep > threshold {
                true
            } else if s.keep < threshold {
                false
            } else if ties > 0 {
                ties -= 1;
                false
            } else {
                true
            }
        });
        Ok(())
    }
}

impl Store for MemoryStore {
    async fn decide(
        &self,
        ops: &[Op<'_>],
        weight: u64,
        mode: Mode,
    ) -> Result<Vec<Verdict>, StoreError> {
        Ok(self.decide_now(ops, weight, mode))
    }

    async fn settle(&self, ops: &[Op<'_>], how: Settle) -> Result<(), StoreError> {
        let now = self.now();
        for op in ops.iter().filter(|op| how.applies_to(op.rule)) {
            let cost = op.cost(how.weight());
            if let Settle::Refund(_) = how {
                self.refund_now(op, cost);
                continue;
            }
            let h = self.hash(op);
            let cell = &self.inner.shards[self.shard_of(h)];
            let mut shard = lock(cell);
            // (A key the decision found room for; another that filled the
            // shard meanwhile leaves it uncharged.)
            let _ = self.update(&mut shard, &cell.mirror, h, now, |state| {
                op.rule.settle(state, now, cost, how);
                (op.rule.idle_at(state), op.rule.weight(state, now))
            });
        }
        Ok(())
    }

    async fn release(&self, leases: &[(Op<'_>, u64, u64)]) -> Result<(), StoreError> {
        let now = self.now();
        for (op, lease, cost) in leases {
            let h = self.hash(op);
            let cell = &self.inner.shards[self.shard_of(h)];
            let mut shard = lock(cell);
            if shard.map.get(&h).is_some_and(|s| s.keep.expires() > now) {
                let _ = self.update(&mut shard, &cell.mirror, h, now, |state| {
                    op.rule.release(state, *lease, *cost);
                    (op.rule.idle_at(state), op.rule.weight(state, now))
                });
            }
        }
        Ok(())
    }

    async fn renew(&self, leases: &[(Op<'_>, u64, u64)]) -> Result<(), StoreError> {
        let now = self.now();
        for (op, lease, cost) in leases {
            let h = self.hash(op);
            let cell = &self.inner.shards[self.shard_of(h)];
            let mut shard = lock(cell);
            if shard.map.get(&h).is_some_and(|s| s.keep.expires() > now) {
                let _ = self.update(&mut shard, &cell.mirror, h, now, |state| {
                    op.rule.renew(state, *lease, *cost, now);
                    (op.rule.idle_at(state), op.rule.weight(state, now))
                });
            }
        }
        Ok(())
    }

    async fn grant(&self, op: Op<'_>, ask: &Ask) -> Result<Grant, StoreError> {
        Ok(self.grant_now(op, ask))
    }

    async fn ban(&self, op: Op<'_>, left: std::time::Duration) -> Result<(), StoreError> {
        self.hold_ban(&op, Micros::from(left));
        Ok(())
    }

    async fn inspect(&self, op: Op<'_>) -> Result<KeyInfo, StoreError> {
        let now = self.now();
        let h = self.hash(&op);
        let shard = self.inner.shards[self.shard_of(h)].lock.read();
        let live = shard.map.get(&h).filter(|s| s.keep.expires() > now);
        let fresh = KeyState::default();
        let state = live.map_or(&fresh, |s| &s.state);
        let check = op.rule.params().check(&state.algo, now, 1);
        let marks = state.marks();
        Ok(KeyInfo {
            exists: live.is_some(),
            remaining: check.remaining,
            admits: check.allowed,
            reset_after: check.reset_after.as_duration(),
            ban_left: (marks.ban_until > now).then(|| (marks.ban_until - now).as_duration()),
            ban_level: marks.ban_level,
        })
    }

    async fn clear(&self, op: Op<'_>) -> Result<bool, StoreError> {
        let now = self.now();
        let h = self.hash(&op);
        let cell = &self.inner.shards[self.shard_of(h)];
        let mut shard = lock(cell);
        cell.mirror.write(h, None);
        Ok(shard.map.remove(&h).is_some_and(|s| s.keep.expires() > now))
    }

    async fn ping(&self) -> Result<(), StoreError> {
        Ok(())
    }
}

impl std::fmt::Debug for MemoryStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("MemoryStore")
            .field("shards", &self.inner.shards.len())
            .field("max_keys", &self.inner.max_keys)
            .finish()
    }
}

#[cfg(test)]
mod tests;
