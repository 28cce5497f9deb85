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
//! slice per unit of time, times the lifetime, at least what the requests
//! waiting for it want, and at most `max_share` of the lease room (less what
//! the gateway still holds). A gateway renews when a quarter of its slice is
//! left, so its requests rarely wait; a request that finds the slice empty
//! while a renewal is under way waits for that renewal (after 16 renewals
//! it is decided by the store directly, which is exact). When the room is
//! taken by other gateways' slices, or the store cannot be reached,
//! decisions go to the store as without leases (and so to `on_error`).

#[cfg(feature = "redis")]
mod leased;

use crate::Rule;
use crate::algorithm::Kind;
use crate::clock::Micros;
use crate::rule::Verdict;
#[cfg(feature = "redis")]
pub use leased::Leased;

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
