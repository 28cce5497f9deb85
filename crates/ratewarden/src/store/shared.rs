//! What only a store shared by several gateways can do, beside deciding
//! ([`Shared`]): tables every gateway reads alike, the keys of a rule
//! listed, leased slices given back, a connection made ahead. A store no
//! other gateway shares (the memory store) answers each trivially, so a
//! front end asks the capability, never which store it runs on.

use std::future::Future;
use std::time::Duration;

use super::StoreError;

/// What [`Shared::scan`] found.
#[derive(Debug, Clone, Default)]
pub struct Scanned {
    /// `(group, key)`, each once, in the order found.
    pub keys: Vec<(String, String)>,
    /// Whether every server was scanned to its end within the budget.
    pub complete: bool,
}

/// A store's side shared with other gateways (see the [module](self)).
pub trait Shared: Send + Sync {
    /// Whether other gateways share the store (Redis) or not (memory).
    fn is_shared(&self) -> bool;

    /// Connects now, within `within`, so that a gateway's first requests
    /// are decided by the store and not by `on_error` while it connects.
    fn connect_now(&self, within: Duration) -> impl Future<Output = Result<(), StoreError>> + Send;

    /// A shared table's version: a counter every change moves (0 before
    /// the first, and always on a store no one shares: its tables are the
    /// gateway's own).
    fn table_version(&self, name: &str) -> impl Future<Output = Result<u64, StoreError>> + Send;

    /// A shared table whole, with its version, read at once.
    fn table_load(
        &self,
        name: &str,
    ) -> impl Future<Output = Result<(u64, Vec<(String, String)>), StoreError>> + Send;

    /// Sets `field` of a shared table to `value` unless the table holds
    /// `max` fields already and `field` is not one of them; moves the
    /// version. `false`: the table is full.
    fn table_put(
        &self,
        name: &str,
        field: &str,
        value: &str,
        max: usize,
    ) -> impl Future<Output = Result<bool, StoreError>> + Send;

    /// Removes `field` of a shared table (moving the version when it was
    /// there); whether it was.
    fn table_delete(
        &self,
        name: &str,
        field: &str,
    ) -> impl Future<Output = Result<bool, StoreError>> + Send;

    /// The keys of `rule` held in the store, by a bounded scan of at most
    /// `budget` names per server (none on a store that keeps hashes).
    fn scan(
        &self,
        rule: &crate::Rule,
        budget: usize,
    ) -> impl Future<Output = Result<Scanned, StoreError>> + Send;

    /// Gives back the leased slices this gateway holds unused (on
    /// shutdown), for the other gateways.
    fn give_back(&self) -> impl Future<Output = Result<(), StoreError>> + Send;
}

/// The memory store is no one else's: its tables are the gateway's own
/// (kept in process), it lists no keys (it keeps hashes), leases nothing.
impl Shared for super::memory::MemoryStore {
    fn is_shared(&self) -> bool {
        false
    }
    async fn connect_now(&self, _: Duration) -> Result<(), StoreError> {
        Ok(())
    }
    async fn table_version(&self, _: &str) -> Result<u64, StoreError> {
        Ok(0)
    }
    async fn table_load(&self, _: &str) -> Result<(u64, Vec<(String, String)>), StoreError> {
        Ok((0, vec![]))
    }
    async fn table_put(&self, _: &str, _: &str, _: &str, _: usize) -> Result<bool, StoreError> {
        Ok(true)
    }
    async fn table_delete(&self, _: &str, _: &str) -> Result<bool, StoreError> {
        Ok(false)
    }
    async fn scan(&self, _: &crate::Rule, _: usize) -> Result<Scanned, StoreError> {
        Ok(Scanned {
            keys: vec![],
            complete: true,
        })
    }
    async fn give_back(&self) -> Result<(), StoreError> {
        Ok(())
    }
}

/// The primary's: a fallback shares what its primary shares.
impl<P: Shared + super::Store> Shared for super::Fallback<P> {
    fn is_shared(&self) -> bool {
        self.primary().is_shared()
    }
    async fn connect_now(&self, within: Duration) -> Result<(), StoreError> {
        self.primary().connect_now(within).await
    }
    async fn table_version(&self, name: &str) -> Result<u64, StoreError> {
        self.primary().table_version(name).await
    }
    async fn table_load(&self, name: &str) -> Result<(u64, Vec<(String, String)>), StoreError> {
        self.primary().table_load(name).await
    }
    async fn table_put(
        &self,
        name: &str,
        field: &str,
        value: &str,
        max: usize,
    ) -> Result<bool, StoreError> {
        self.primary().table_put(name, field, value, max).await
    }
    async fn table_delete(&self, name: &str, field: &str) -> Result<bool, StoreError> {
        self.primary().table_delete(name, field).await
    }
    async fn scan(&self, rule: &crate::Rule, budget: usize) -> Result<Scanned, StoreError> {
        self.primary().scan(rule, budget).await
    }
    async fn give_back(&self) -> Result<(), StoreError> {
        self.primary().give_back().await
    }
}

/// The inner store's, but for slices: a leasing wrapper gives back its own.
#[cfg(feature = "redis")]
impl<S: Shared + super::Store> Shared for super::lease::Leased<S> {
    fn is_shared(&self) -> bool {
        self.inner().is_shared()
    }
    async fn connect_now(&self, within: Duration) -> Result<(), StoreError> {
        self.inner().connect_now(within).await
    }
    async fn table_version(&self, name: &str) -> Result<u64, StoreError> {
        self.inner().table_version(name).await
    }
    async fn table_load(&self, name: &str) -> Result<(u64, Vec<(String, String)>), StoreError> {
        self.inner().table_load(name).await
    }
    async fn table_put(
        &self,
        name: &str,
        field: &str,
        value: &str,
        max: usize,
    ) -> Result<bool, StoreError> {
        self.inner().table_put(name, field, value, max).await
    }
    async fn table_delete(&self, name: &str, field: &str) -> Result<bool, StoreError> {
        self.inner().table_delete(name, field).await
    }
    async fn scan(&self, rule: &crate::Rule, budget: usize) -> Result<Scanned, StoreError> {
        self.inner().scan(rule, budget).await
    }
    async fn give_back(&self) -> Result<(), StoreError> {
        super::lease::Leased::give_back(self).await
    }
}
