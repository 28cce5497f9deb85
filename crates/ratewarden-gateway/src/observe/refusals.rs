//! The refusal log: a key's first refusal under a rule in each [`PERIOD`]
//! is logged whole, once for the whole process (every worker thread sees
//! the same keys); later ones are counted, and each rule's count is
//! logged as one summary line when the period ends, by the housekeeping
//! timer, whether or not traffic goes on, and at shutdown ([`flush`]).
//! Exact counts stay in the metrics. Every refusal written as a line was
//! CPU on the refusing path and disk an attacker could fill (issue 38:
//! 80,345 lines in 4 s at a 100/s limit).

use std::hash::{BuildHasher, Hash, Hasher};
use std::sync::LazyLock;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::time::Duration;

use parking_lot::{Mutex, RwLock};

/// How long a key's first refusal stands for the rest.
pub(crate) const PERIOD: Duration = Duration::from_secs(10);

/// Keys remembered per period; past it, a new key's refusals are only
/// counted (memory an attacker spraying keys cannot grow).
const MAX_KEYS: usize = 10_000;

/// Shards of the key set: the two worker threads rarely wait on each
/// other.
const SHARDS: usize = 16;

/// One process's refusal log.
pub(crate) struct Refusals {
    /// (rule, key) hashes logged this period, by shard.
    keys: [Mutex<foldhash::HashSet<u64>>; SHARDS],
    /// How many keys the shards hold.
    held: AtomicUsize,
    /// Per rule (by id): its name and the refusals not logged this period.
    quiet: RwLock<Vec<(u64, String, AtomicU64)>>,
    hasher: foldhash::fast::RandomState,
}

static LOG: LazyLock<Refusals> = LazyLock::new(Refusals::new);

/// Whether this refusal of `key` under rule `id` is to be logged (its
/// first this period); counted otherwise.
pub(crate) fn first(id: u64, rule: &str, key: &str) -> bool {
    LOG.first(id, rule, key)
}

/// Ends the period: logs each rule's count of refusals not logged (one
/// line per rule, none for a rule with none), and forgets the keys, so
/// that each key's next refusal is logged whole again.
pub(crate) fn flush() {
    for (rule, n) in LOG.flush() {
        tracing::info!(
            rule,
            refusals = n,
            "{n} more refusals under rule {rule} in the last {PERIOD:?} (each key's first was logged)"
        );
    }
}

impl Refusals {
    fn new() -> Self {
        Self {
            keys: std::array::from_fn(|_| Mutex::new(foldhash::HashSet::default())),
            held: AtomicUsize::new(0),
            quiet: RwLock::new(Vec::new()),
            hasher: foldhash::fast::RandomState::default(),
        }
    }

    fn first(&self, id: u64, rule: &str, key: &str) -> bool {
        // A hash of both: a collision only merges two keys' log lines.
        let mut h = self.hasher.build_hasher();
        id.hash(&mut h);
        key.hash(&mut h);
        let h = h.finish();
        {
            let mut shard = self.keys[(h as usize) % SHARDS].lock();
            if shard.contains(&h) {
                // Counted below.
            } else if self.held.load(Ordering::Relaxed) < MAX_KEYS {
                shard.insert(h);
                self.held.fetch_add(1, Ordering::Relaxed);
                return true;
            }
        }
        if let Some((_, _, n)) = self.quiet.read().iter().find(|(r, _, _)| *r == id) {
            n.fetch_add(1, Ordering::Relaxed);
            return false;
        }
        let mut quiet = self.quiet.write();
        match quiet.iter().find(|(r, _, _)| *r == id) {
            Some((_, _, n)) => {
                n.fetch_add(1, Ordering::Relaxed);
            }
            None => quiet.push((id, rule.to_owned(), AtomicU64::new(1))),
        }
        false
    }

    /// The period's counts (rule, refusals not logged), each taken once;
    /// the keys forgotten.
    fn flush(&self) -> Vec<(String, u64)> {
        let summaries = self
            .quiet
            .read()
            .iter()
            .filter_map(|(_, name, n)| {
                let n = n.swap(0, Ordering::Relaxed);
                (n > 0).then(|| (name.clone(), n))
            })
            .collect();
        for shard in &self.keys {
            shard.lock().clear();
        }
        self.held.store(0, Ordering::Relaxed);
        summaries
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_keys_first_refusal_is_logged_the_rest_counted_once_per_process() {
        let log = Refusals::new();
        assert!(log.first(1, "r", "a"));
        assert!(!log.first(1, "r", "a"));
        // Another thread: the same key is not logged again.
        std::thread::scope(|s| {
            s.spawn(|| assert!(!log.first(1, "r", "a")));
        });
        assert!(log.first(1, "r", "b"), "another key");
        assert!(log.first(2, "s", "a"), "another rule");
        assert_eq!(log.flush(), vec![("r".to_owned(), 2)]);
    }

    /// A period's end gives each rule's summary once, with no traffic
    /// after it; a key's next refusal is logged whole again.
    #[test]
    fn a_flush_ends_the_period_with_one_summary_per_rule() {
        let log = Refusals::new();
        assert!(log.first(1, "r", "a"));
        for _ in 0..5 {
            assert!(!log.first(1, "r", "a"));
        }
        std::thread::scope(|s| {
            s.spawn(|| assert!(!log.first(1, "r", "a")));
        });
        assert_eq!(
            log.flush(),
            vec![("r".to_owned(), 6)],
            "one line, both threads'"
        );
        assert!(log.flush().is_empty(), "once");
        assert!(
            log.first(1, "r", "a"),
            "a new period: the key's first again"
        );
    }

    #[test]
    fn past_the_bound_new_keys_are_only_counted() {
        let log = Refusals::new();
        for i in 0..MAX_KEYS {
            assert!(log.first(1, "r", &i.to_string()));
        }
        assert!(!log.first(1, "r", "one more"));
        assert_eq!(log.flush(), vec![("r".to_owned(), 1)]);
    }
}
