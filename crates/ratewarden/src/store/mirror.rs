//! Lock-free read copies of a shard's recently written states.
//!
//! On a hot key most decisions are rejections that record nothing. Taking
//! even a shared lock for them costs two atomic read-modify-writes on one
//! cache line that every core then fights over. A mirror entry lets a reader
//! answer such a decision with plain loads: the cache line stays shared.
//!
//! Each entry is a seqlock made only of atomics (no `unsafe`): the writer makes
//! the sequence odd, writes the words, makes it even again; a reader that sees
//! the same even sequence before and after its loads has read one consistent
//! state. Writers are serialised by the shard's write lock, which they hold
//! whenever they touch the shard's mirror, so an entry never has two writers.
//!
//! The invariant that keeps decisions exact: an entry that names a key holds
//! exactly that key's state and expiry in the shard's map. Every change to the
//! map rewrites or invalidates the entry of the key it changes, and bulk
//! removals (expiry sweeps, eviction) invalidate the whole mirror.

use std::sync::atomic::{AtomicU64, Ordering, fence};

use crate::algorithm::State;
#[cfg(test)]
use crate::algorithm::{fixed_window, gcra, leaky_bucket, sliding_window_counter, token_bucket};
use crate::clock::Micros;
use crate::rule::{KeyState, Marks};

/// Entries per shard: a handful of hot keys per shard is what matters.
const ENTRIES: usize = 8;

/// One mirrored state: 8 words, one cache line.
#[derive(Default)]
#[repr(align(64))]
struct Entry {
    seq: AtomicU64,
    key: AtomicU64,
    /// Bits 0..8: the state's code (0 = empty entry, else the algorithm's
    /// id in the table, or `FRESH_CODE`); bits 32..64: the ban level.
    kind: AtomicU64,
    w1: AtomicU64,
    w2: AtomicU64,
    expires: AtomicU64,
    last: AtomicU64,
    ban_until: AtomicU64,
}

/// A shard's mirror.
#[derive(Default)]
pub(crate) struct Mirror {
    entries: [Entry; ENTRIES],
}

/// A state read back from the mirror.
pub(crate) struct Mirrored {
    pub algo: State,
    pub marks: Marks,
    pub expires: Micros,
}

fn slot(h: u64) -> usize {
    // The top bits: the map uses the low ones, shard selection the middle.
    (h >> 58) as usize % ENTRIES
}

fn encode(algo: &State) -> Option<(u64, u64, u64)> {
    algo.to_mirror()
        .map(|(code, [w1, w2])| (u64::from(code), w1, w2))
}

fn decode(kind: u64, w1: u64, w2: u64) -> Option<State> {
    State::from_mirror(u8::try_from(kind).ok()?, [w1, w2])
}

impl Mirror {
    /// The state of key `h`, if its entry holds it and no write overlapped
    /// the read.
    pub(super) fn read(&self, h: u64) -> Option<Mirrored> {
        let e = &self.entries[slot(h)];
        let seq = e.seq.load(Ordering::Acquire);
        if seq & 1 == 1 {
            return None;
        }
        let key = e.key.load(Ordering::Relaxed);
        let kind = e.kind.load(Ordering::Relaxed);
        let w1 = e.w1.load(Ordering::Relaxed);
        let w2 = e.w2.load(Ordering::Relaxed);
        let expires = e.expires.load(Ordering::Relaxed);
        let last = e.last.load(Ordering::Relaxed);
        let ban_until = e.ban_until.load(Ordering::Relaxed);
        fence(Ordering::Acquire);
        if e.seq.load(Ordering::Relaxed) != seq || key != h {
            return None;
        }
        Some(Mirrored {
            algo: decode(kind & 0xFF, w1, w2)?,
            marks: Marks {
                last: Micros::new(last),
                ban_until: Micros::new(ban_until),
                ban_level: (kind >> 32) as u32,
            },
            expires: Micros::new(expires),
        })
    }

    /// Records that key `h` now holds `state` until `expires`, or, with
    /// `None` (removed) or a state that cannot be mirrored, forgets it.
    /// Caller holds the shard's write lock.
    pub(super) fn write(&self, h: u64, state: Option<(&KeyState, Micros)>) {
        let e = &self.entries[slot(h)];
        let words = state.and_then(|(s, exp)| encode(&s.algo).map(|w| (w, s.marks(), exp)));
        match words {
            Some(((kind, w1, w2), marks, expires)) => self.store(
                e,
                [
                    h,
                    kind | u64::from(marks.ban_level) << 32,
                    w1,
                    w2,
                    expires.get(),
                    marks.last.get(),
                    marks.ban_until.get(),
                ],
            ),
            None if e.key.load(Ordering::Relaxed) == h => self.store(e, [0; 7]),
            None => {}
        }
    }

    /// Forgets every entry (after a bulk removal). Caller holds the write lock.
    pub(super) fn clear(&self) {
        for e in &self.entries {
            if e.kind.load(Ordering::Relaxed) != 0 {
                self.store(e, [0; 7]);
            }
        }
    }

    fn store(&self, e: &Entry, w: [u64; 7]) {
        let seq = e.seq.load(Ordering::Relaxed);
        e.seq.store(seq.wrapping_add(1), Ordering::Relaxed);
        fence(Ordering::Release);
        e.key.store(w[0], Ordering::Relaxed);
        e.kind.store(w[1], Ordering::Relaxed);
        e.w1.store(w[2], Ordering::Relaxed);
        e.w2.store(w[3], Ordering::Relaxed);
        e.expires.store(w[4], Ordering::Relaxed);
        e.last.store(w[5], Ordering::Relaxed);
        e.ban_until.store(w[6], Ordering::Relaxed);
        e.seq.store(seq.wrapping_add(2), Ordering::Release);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn state(algo: State, marks: Marks) -> KeyState {
        KeyState::new(algo, marks)
    }

    #[test]
    fn every_constant_size_state_round_trips() {
        let marks = Marks {
            last: Micros::new(7),
            ban_until: Micros::new(9),
            ban_level: 3,
        };
        let states = [
            State::Fresh,
            State::FixedWindow(fixed_window::State {
                start: Micros::new(5),
                count: 4,
            }),
            State::SlidingWindowCounter(sliding_window_counter::State {
                start: Micros::new(5),
                prev: u32::MAX,
                cur: 1,
            }),
            State::TokenBucket(token_bucket::State {
                deficit: 3,
                last: Micros::new(8),
            }),
            State::LeakyBucket(leaky_bucket::State {
                level: 2,
                last: Micros::new(11),
            }),
            State::Gcra(gcra::State {
                tat: Micros::new(123),
            }),
        ];
        let m = Mirror::default();
        for (i, algo) in states.into_iter().enumerate() {
            let h = 0xABCD_0000 + i as u64;
            m.write(h, Some((&state(algo.clone(), marks), Micros::new(99))));
            let got = m.read(h).expect("just written");
            assert_eq!(
                (got.algo, got.marks, got.expires),
                (algo, marks, Micros::new(99))
            );
        }
    }

    #[test]
    fn removal_and_clear_forget_and_other_keys_miss() {
        let m = Mirror::default();
        let s = state(
            State::Gcra(gcra::State {
                tat: Micros::new(1),
            }),
            Marks::default(),
        );
        m.write(42, Some((&s, Micros::new(10))));
        assert!(m.read(42).is_some());
        assert!(m.read(42 ^ (1 << 20)).is_none(), "same entry, other key");
        m.write(42, None);
        assert!(m.read(42).is_none());
        m.write(42, Some((&s, Micros::new(10))));
        m.clear();
        assert!(m.read(42).is_none());
    }

    #[test]
    fn a_log_or_leases_are_never_mirrored() {
        let m = Mirror::default();
        let gcra = state(
            State::Gcra(gcra::State {
                tat: Micros::new(1),
            }),
            Marks::default(),
        );
        m.write(42, Some((&gcra, Micros::new(10))));
        let log = state(State::SlidingWindowLog(Box::default()), Marks::default());
        m.write(42, Some((&log, Micros::new(10))));
        assert!(m.read(42).is_none(), "the stale copy must be gone");
        m.write(42, Some((&gcra, Micros::new(10))));
        let leases = state(State::Concurrency(Box::default()), Marks::default());
        m.write(42, Some((&leases, Micros::new(10))));
        assert!(m.read(42).is_none(), "leases are never mirrored either");
    }
}
