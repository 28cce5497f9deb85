//! Consumers: who an API key belongs to, and on which tier (Kong's
//! consumers, Unkey's keys).
//!
//! A front end finds a request's key (a header, a bearer token, a query
//! parameter), hashes it with its keyed hash, and asks this table for the
//! consumer that hash names ([`Consumers::find`]); the consumer then rides
//! on the request's view ([`crate::view::RequestView::consumer`]), where
//! the identity (`from: consumer`), key parts (`consumer`) and tiers
//! (`from: consumer`) read it. The table holds hashes only: no key is kept.
//!
//! Like [`crate::overrides::Overrides`], it is a local map behind a read
//! lock, changed by an operator (or replaced whole when a front end that
//! shares consumers learns of a change), never per request.

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;

use parking_lot::RwLock;
use ratewarden::clock::{Clock, Micros};

/// One consumer.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Consumer {
    /// Its name: what identities, keys, logs and the admin API show.
    pub name: String,
    /// Its key's keyed hash (never the key).
    pub key_hash: String,
    /// Its tier, for rules whose tiers come from the consumer.
    pub tier: Option<String>,
    /// The operator's metadata, as JSON text.
    pub metadata: Option<String>,
    /// When its key lapses (µs since the epoch), if ever.
    pub expires_at: Option<Micros>,
    /// When it was made (µs since the epoch).
    pub created_at: Micros,
}

impl Consumer {
    /// Whether its key has lapsed at `now`.
    pub fn expired(&self, now: Micros) -> bool {
        self.expires_at.is_some_and(|at| at <= now)
    }
}

/// Why a consumer was not added.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum AddError {
    /// The table holds its most already.
    Full(usize),
    /// Another consumer has that name.
    NameTaken(String),
    /// Another consumer has that key.
    KeyTaken,
}

impl std::fmt::Display for AddError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            AddError::Full(n) => write!(f, "{n} consumers already (consumers.max)"),
            AddError::NameTaken(n) => write!(f, "a consumer named `{n}` exists"),
            AddError::KeyTaken => f.write_str("another consumer has that key"),
        }
    }
}

impl std::error::Error for AddError {}

#[derive(Debug, Default)]
struct Index {
    by_key: HashMap<String, Arc<Consumer>>,
    by_name: BTreeMap<String, Arc<Consumer>>,
}

impl Index {
    fn of(all: impl IntoIterator<Item = Consumer>) -> Self {
        let mut index = Index::default();
        for c in all {
            let c = Arc::new(c);
            // A name or a key twice: the later one stands (the shared
            // store's fields are names, so only an imported key can be).
            if let Some(old) = index.by_name.insert(c.name.clone(), c.clone()) {
                index.by_key.remove(&old.key_hash);
            }
            index.by_key.insert(c.key_hash.clone(), c);
        }
        index
    }
}

/// The consumers a front end knows, by key hash and by name.
pub struct Consumers {
    /// Set again by each reload ([`Consumers::set_max`]).
    max: std::sync::atomic::AtomicUsize,
    clock: Arc<dyn Clock>,
    index: RwLock<Index>,
}

impl std::fmt::Debug for Consumers {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Consumers")
            .field("max", &self.max())
            .field("len", &self.len())
            .finish()
    }
}

impl Consumers {
    /// An empty table of at most `max` consumers, expiring by `clock`.
    pub fn new(max: usize, clock: Arc<dyn Clock>) -> Self {
        Self {
            max: std::sync::atomic::AtomicUsize::new(max),
            clock,
            index: RwLock::new(Index::default()),
        }
    }

    /// The most it holds.
    pub fn max(&self) -> usize {
        self.max.load(std::sync::atomic::Ordering::Relaxed)
    }

    /// A new bound (a reload's `consumers.max`). Lowered below the count
    /// held, it keeps every consumer and refuses new ones until enough are
    /// gone.
    pub fn set_max(&self, max: usize) {
        self.max.store(max, std::sync::atomic::Ordering::Relaxed);
    }

    /// How many it holds (expired ones too, until removed).
    pub fn len(&self) -> usize {
        self.index.read().by_name.len()
    }

    /// Whether it holds none.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Now, by the table's clock.
    pub fn now(&self) -> Micros {
        self.clock.now()
    }

    /// The consumer whose key hashes to `key_hash`, unless its key has
    /// lapsed: an expired key names no one.
    pub fn find(&self, key_hash: &str) -> Option<Arc<Consumer>> {
        let c = self.index.read().by_key.get(key_hash).cloned()?;
        (!c.expired(self.clock.now())).then_some(c)
    }

    /// The consumer named `name` (expired or not).
    pub fn get(&self, name: &str) -> Option<Arc<Consumer>> {
        self.index.read().by_name.get(name).cloned()
    }

    /// Every consumer, by name.
    pub fn list(&self) -> Vec<Arc<Consumer>> {
        self.index.read().by_name.values().cloned().collect()
    }

    /// Adds `c`, whose name and key must be new.
    pub fn add(&self, c: Consumer) -> Result<(), AddError> {
        let mut index = self.index.write();
        if index.by_name.contains_key(&c.name) {
            return Err(AddError::NameTaken(c.name));
        }
        if index.by_key.contains_key(&c.key_hash) {
            return Err(AddError::KeyTaken);
        }
        let max = self.max();
        if index.by_name.len() >= max {
            return Err(AddError::Full(max));
        }
        let c = Arc::new(c);
        index.by_name.insert(c.name.clone(), c.clone());
        index.by_key.insert(c.key_hash.clone(), c);
        Ok(())
    }

    /// Replaces the consumer of `c`'s name (its tier or metadata changed;
    /// its key stays); `false` when there is none.
    pub fn update(&self, c: Consumer) -> bool {
        let mut index = self.index.write();
        let Some(old) = index.by_name.get(&c.name).cloned() else {
            return false;
        };
        index.by_key.remove(&old.key_hash);
        let c = Arc::new(c);
        index.by_name.insert(c.name.clone(), c.clone());
        index.by_key.insert(c.key_hash.clone(), c);
        true
    }

    /// Removes the consumer named `name`: its key names no one from now.
    pub fn remove(&self, name: &str) -> Option<Arc<Consumer>> {
        let mut index = self.index.write();
        let c = index.by_name.remove(name)?;
        index.by_key.remove(&c.key_hash);
        Some(c)
    }

    /// Replaces the whole table (a shared store's copy, or a file read at
    /// start).
    pub fn replace(&self, all: impl IntoIterator<Item = Consumer>) {
        let index = Index::of(all);
        *self.index.write() = index;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use ratewarden::clock::ManualClock;

    fn consumer(name: &str, key: &str, expires_at: Option<u64>) -> Consumer {
        Consumer {
            name: name.into(),
            key_hash: key.into(),
            tier: Some("pro".into()),
            metadata: None,
            expires_at: expires_at.map(Micros::from_secs),
            created_at: Micros::ZERO,
        }
    }

    #[test]
    fn a_key_names_its_consumer_until_it_lapses_or_is_removed() {
        let clock = Arc::new(ManualClock::new(0));
        let t = Consumers::new(2, clock.clone());
        t.add(consumer("acme", "#a", Some(10))).unwrap();
        t.add(consumer("globex", "#b", None)).unwrap();
        assert_eq!(t.find("#a").unwrap().name, "acme");
        assert_eq!(
            t.add(consumer("initech", "#c", None)),
            Err(AddError::Full(2))
        );
        clock.advance(std::time::Duration::from_secs(10));
        assert!(t.find("#a").is_none(), "expired");
        assert!(t.get("acme").is_some(), "still listed");
        assert_eq!(t.remove("globex").unwrap().name, "globex");
        assert!(t.find("#b").is_none());
    }

    #[test]
    fn names_and_keys_are_each_one_consumers() {
        let t = Consumers::new(10, Arc::new(ManualClock::new(0)));
        t.add(consumer("acme", "#a", None)).unwrap();
        assert_eq!(
            t.add(consumer("acme", "#z", None)),
            Err(AddError::NameTaken("acme".into()))
        );
        assert_eq!(
            t.add(consumer("other", "#a", None)),
            Err(AddError::KeyTaken)
        );
        let mut changed = consumer("acme", "#a", None);
        changed.tier = Some("free".into());
        assert!(t.update(changed));
        assert_eq!(t.find("#a").unwrap().tier.as_deref(), Some("free"));
        t.replace([consumer("x", "#x", None), consumer("x", "#y", None)]);
        assert_eq!(t.len(), 1);
        assert!(t.find("#x").is_none(), "the later one stands");
        assert_eq!(t.find("#y").unwrap().name, "x");
    }
}
