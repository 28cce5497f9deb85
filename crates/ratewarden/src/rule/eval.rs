//! The pure evaluation of a request against one key's state: a rule's
//! [`Verdict`], and how it is recorded (`commit`), settled and forgotten.

use crate::algorithm::{self, Check, NEVER};
use crate::clock::{Micros, micros};

use super::Settle;
use super::{Counting, Penalty, Rule};

/// Why a rule rejected a request.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Reason {
    /// Over the limit (or the cost can never fit).
    Limit,
    /// The key is banned by `penalty`.
    Banned,
    /// Too soon after the key's previous admitted request.
    MinInterval,
    /// A new key, and the memory store has no room for it: every state it
    /// holds is a ban or a key at its limit, which traffic on other keys
    /// never evicts (see [`crate::MemoryStore`]).
    Full,
}

impl Reason {
    /// A short machine name: `limit`, `banned`, `min_interval`,
    /// `store_full`.
    pub fn as_str(self) -> &'static str {
        match self {
            Reason::Limit => "limit",
            Reason::Banned => "banned",
            Reason::MinInterval => "min_interval",
            Reason::Full => "store_full",
        }
    }
}

/// How much a key's state carries, for a bounded store choosing what to
/// forget: [`PROTECTED`] for a key at its limit (forgetting it would admit
/// at once what its limit refuses), else 0 for a fresh state up to 254 for
/// one nearly used up, in proportion to the requests it has used of a fresh
/// key's allowance. A ban is read from the state itself, while it lasts.
pub type Weight = u8;

/// The weight of a state a store never evicts for another key's sake.
pub const PROTECTED: Weight = u8::MAX;

/// One key's state under one rule: the algorithm's, plus the modifiers'.
///
/// The modifiers' marks are boxed and only allocated for keys of rules that
/// use `min_interval` or have actually banned: most keys carry 8 bytes for them.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct KeyState {
    /// The algorithm's state.
    pub algo: algorithm::State,
    marks: Option<Box<Marks>>,
}

/// The modifiers' part of a key's state.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Marks {
    /// Time of the previous admitted request (for `min_interval`); 0 = none.
    pub last: Micros,
    /// The key is banned until this time; 0 = never banned.
    pub ban_until: Micros,
    /// Number of escalations of the current or latest ban (0 = first ban).
    pub ban_level: u32,
}

impl KeyState {
    /// A state from its parts.
    pub fn new(algo: algorithm::State, marks: Marks) -> Self {
        let marks = (marks != Marks::default()).then(|| Box::new(marks));
        Self { algo, marks }
    }

    /// The modifiers' marks (all zero when none were ever set).
    pub fn marks(&self) -> Marks {
        self.marks.as_deref().copied().unwrap_or_default()
    }

    /// Holds a ban until `until` at least: one a shared store reported
    /// (kept by the local fallback through an outage), or one an operator
    /// set. A longer ban stays; the count is left as it is.
    pub fn hold_ban(&mut self, until: Micros) {
        let m = self.marks_mut();
        m.ban_until = m.ban_until.max(until);
    }

    fn marks_mut(&mut self) -> &mut Marks {
        self.marks.get_or_insert_with(Box::default)
    }
}

/// What a rule says about one request on one key, before anything is recorded.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Verdict {
    /// The algorithm's view (remaining, reset, retry, delay).
    pub check: Check,
    /// Why it rejects; `None` when it admits.
    pub reason: Option<Reason>,
    /// The `concurrency` lease the admitted request took; stores set it
    /// once the decision is recorded ([`Rule::lease_taken`]).
    pub lease: Option<u64>,
}

impl Verdict {
    /// Whether this rule admits the request.
    pub fn allowed(&self) -> bool {
        self.reason.is_none()
    }
}

impl Rule {
    /// Evaluates a request of `cost` at `now` against `state`. Pure.
    ///
    /// Order: an active ban, then `min_interval`, then the algorithm.
    pub fn verdict(&self, state: &KeyState, now: Micros, cost: u64) -> Verdict {
        self.verdict_parts(&state.algo, state.marks(), now, cost)
    }

    /// [`Rule::verdict`] on a state given as its parts (no allocation for
    /// marks: the memory store's lock-free readers call this).
    pub(crate) fn verdict_parts(
        &self,
        algo: &algorithm::State,
        marks: Marks,
        now: Micros,
        cost: u64,
    ) -> Verdict {
        let c = &self.0;
        let check = c.params.check(algo, now, cost);
        if marks.ban_until > now {
            let left = marks.ban_until - now;
            return Verdict {
                check: Check::deny(0, check.reset_after, left),
                reason: Some(Reason::Banned),
                lease: None,
            };
        }
        if c.min_interval > Micros::ZERO
            && marks.last > Micros::ZERO
            && now < marks.last + c.min_interval
        {
            let wait = marks.last + c.min_interval - now;
            let retry = if check.allowed {
                wait
            } else {
                wait.max(check.retry_after)
            };
            return Verdict {
                check: Check::deny(check.remaining, check.reset_after, retry),
                reason: Some(Reason::MinInterval),
                lease: None,
            };
        }
        if !check.allowed {
            let mut check = check;
            if let Some(p) = &c.spec.penalty {
                // This rejection starts a ban: the client learns its length now.
                let (len, _) = self.next_ban(marks, now, p);
                check.retry_after = len;
                check.reset_after = check.reset_after.max(len);
            }
            return Verdict {
                check,
                reason: Some(Reason::Limit),
                lease: None,
            };
        }
        Verdict {
            check,
            reason: None,
            lease: None,
        }
    }

    /// Length and level of the ban a limit rejection at `now` starts.
    fn next_ban(&self, marks: Marks, now: Micros, p: &Penalty) -> (Micros, u32) {
        let remembered =
            marks.ban_until > Micros::ZERO && now <= marks.ban_until + micros(p.memory);
        let level = if remembered { marks.ban_level + 1 } else { 0 };
        let factor = (p.multiplier as u64).saturating_pow(level);
        let len = micros(p.duration).saturating_mul(factor).min(micros(p.max));
        (len, level)
    }

    /// Records the outcome of a decision on this key.
    ///
    /// `verdict` is this rule's verdict; `admitted` whether the request as a
    /// whole was admitted (every non-shadow rule allowed it). A rule that
    /// allowed a request another rule rejected records nothing.
    pub fn commit(
        &self,
        state: &mut KeyState,
        now: Micros,
        cost: u64,
        verdict: &Verdict,
        admitted: bool,
    ) {
        let c = &self.0;
        match verdict.reason {
            None if admitted => {
                if !self.counts_failures() {
                    c.params.charge(&mut state.algo, now, cost);
                }
                if c.min_interval > Micros::ZERO {
                    state.marks_mut().last = now;
                }
            }
            // A full store recorded nothing of this key: nothing to charge.
            None | Some(Reason::Banned | Reason::Full) => {}
            Some(reason) => {
                if c.spec.count_rejected {
                    c.params.charge(&mut state.algo, now, cost);
                    if c.min_interval > Micros::ZERO {
                        state.marks_mut().last = now;
                    }
                }
                if let (Reason::Limit, Some(p)) = (reason, &c.spec.penalty) {
                    let (len, level) = self.next_ban(state.marks(), now, p);
                    let marks = state.marks_mut();
                    marks.ban_until = now + len;
                    marks.ban_level = level;
                }
            }
        }
    }

    /// Whether [`commit`](Self::commit) would change anything: a decision
    /// that records nothing can be answered without exclusive access.
    pub fn records(&self, verdict: &Verdict, admitted: bool) -> bool {
        let c = &self.0;
        match verdict.reason {
            None => admitted && (!self.counts_failures() || c.min_interval > Micros::ZERO),
            Some(Reason::Banned | Reason::Full) => false,
            Some(Reason::MinInterval) => c.spec.count_rejected,
            Some(Reason::Limit) => c.spec.count_rejected || c.spec.penalty.is_some(),
        }
    }

    /// Gives back `cost` charged earlier on this key (an Envoy refund):
    /// see [`Algorithm::refund`](crate::algorithm::Algorithm::refund) for
    /// how exact each algorithm is. Bans and the minimum gap stay.
    pub fn refund(&self, state: &mut KeyState, now: Micros, cost: u64) {
        self.0.params.refund(&mut state.algo, now, cost);
    }

    /// Settles a request on this key once its answer is known, `cost`
    /// being what [`Settle`]'s weight costs under this rule: a `count:
    /// failures` rule charges a failure and clears its history on a
    /// success (if `reset_on_success`); any rule but `concurrency` is
    /// charged an answer's extra cost, and gives back what it did not
    /// cost ([`Rule::refund`]).
    pub fn settle(&self, state: &mut KeyState, now: Micros, cost: u64, how: Settle) {
        match (how, self.0.spec.counting) {
            (Settle::Failure(_), Counting::Failures { .. }) => {
                self.0.params.charge(&mut state.algo, now, cost)
            }
            (Settle::Success, Counting::Failures { reset_on_success }) => {
                if reset_on_success {
                    state.algo = algorithm::State::Fresh;
                }
            }
            (Settle::Failure(_) | Settle::Success, Counting::All) => {}
            (Settle::Charge(_), _) => {
                if !self.0.spec.algorithm.holds_leases() {
                    self.0.params.charge(&mut state.algo, now, cost)
                }
            }
            (Settle::Refund(_), _) => self.refund(state, now, cost),
        }
    }

    /// The lease an admitted request took under this rule, read from the
    /// state [`commit`](Self::commit) recorded it in: only `concurrency`
    /// rules take one, and only for a request admitted as a whole.
    pub fn lease_taken(&self, state: &KeyState, verdict: &Verdict, admitted: bool) -> Option<u64> {
        let takes = self.0.spec.algorithm.holds_leases() && verdict.allowed() && admitted;
        takes.then(|| self.0.params.lease(&state.algo)).flatten()
    }

    /// Releases lease `lease` of `cost` (a `concurrency` request ended).
    pub fn release(&self, state: &mut KeyState, lease: u64, cost: u64) {
        self.0.params.release(&mut state.algo, lease, cost);
    }

    /// Renews lease `lease` of `cost` from `now` (a `concurrency` request
    /// still going: a stream, a tunnel).
    pub fn renew(&self, state: &mut KeyState, lease: u64, cost: u64, now: Micros) {
        self.0.params.renew(&mut state.algo, lease, cost, now);
    }

    /// How long a lease this rule hands out lasts unrenewed (`max_hold`
    /// of a `concurrency` rule); `None` for a rule without leases.
    pub fn max_hold(&self) -> Option<std::time::Duration> {
        self.0
            .spec
            .algorithm
            .holds_leases()
            .then(|| self.0.spec.max_hold.unwrap_or(super::MAX_HOLD))
    }

    /// `used` requests of a fresh key's allowance as a [`Weight`] below
    /// [`PROTECTED`]: any use weighs at least 1, only a fresh state 0.
    fn scale(&self, used: u64) -> Weight {
        let n = self.0.capacity;
        // In 64 bits (a 128-bit division is a library call, on the path of
        // every recorded decision): a capacity past 2^48 is scaled down
        // first, which loses nothing a weight of 254 steps can show.
        let shift = 16u32.saturating_sub(n.leading_zeros());
        let (used, n) = (used.min(n) >> shift, (n >> shift).max(1));
        ((used * 254).div_ceil(n)).min(254) as Weight
    }

    /// The [`Weight`] of `state` at `now`: protected when the next request
    /// of the rule's cost would be refused, else the share of a fresh key's
    /// allowance used.
    pub fn weight(&self, state: &KeyState, now: Micros) -> Weight {
        let next = self
            .0
            .params
            .check(&state.algo, now, self.0.spec.cost.get());
        if !next.allowed {
            return PROTECTED;
        }
        self.scale(
            self.0
                .capacity
                .saturating_sub(next.remaining.saturating_add(1)),
        )
    }

    /// The [`Weight`] of `state` once [`commit`](Self::commit) recorded
    /// `verdict` in it at `now`: read from the verdict for a request admitted
    /// and charged (its `remaining` is what is left after it: no second
    /// check on the common path), else checked again.
    pub fn weight_after(
        &self,
        state: &KeyState,
        now: Micros,
        verdict: &Verdict,
        admitted: bool,
    ) -> Weight {
        if admitted && verdict.reason.is_none() && !self.counts_failures() {
            return match verdict.check.remaining {
                0 => PROTECTED,
                left => self.scale(self.0.capacity.saturating_sub(left)),
            };
        }
        self.weight(state, now)
    }

    /// The time from which `state` reads as fresh and may be forgotten.
    pub fn idle_at(&self, state: &KeyState) -> Micros {
        let c = &self.0;
        let mut t = c.params.idle_at(&state.algo);
        let marks = state.marks();
        if marks.last > Micros::ZERO {
            t = t.max(marks.last + c.min_interval);
        }
        if marks.ban_until > Micros::ZERO {
            let memory = c.spec.penalty.map_or(Micros::ZERO, |p| micros(p.memory));
            t = t.max(marks.ban_until + memory);
        }
        t
    }
}

/// Turns a `retry_after` of [`NEVER`] into `None`.
pub(crate) fn finite(us: Micros) -> Option<Micros> {
    (us != NEVER).then_some(us)
}
