//! [`StateStoreWrapper`]: a state store for tests that changes a few calls of another store and forwards the rest.
//!
//! A test that needs a store to gate, count, fail or record some calls implements [`StateStoreWrapper`] for its
//! type, names the store underneath ([`StateStoreWrapper::inner`]) and overrides only the calls it changes; every
//! `StateStoreWrapper` is a [`StateStore`]. [`StateStore::joins`] and [`StateStore::write_with_step`] keep their
//! defaults (a wrapped store joins no step store), and [`StateStoreWrapper::scan_page`] pages through the wrapper's
//! own [`StateStoreWrapper::scan`], as [`StateStore::scan_page`]'s default does, so a wrapper that changes `scan`
//! changes what recovery reads too.

use async_trait::async_trait;

use crate::error::Result;
use crate::store::{Condition, StateStore, WriteOp, WriteOutcome, page_of};

/// A state store that forwards every call to [`StateStoreWrapper::inner`] unless it overrides it. Each method has
/// the meaning of the [`StateStore`] method of the same name.
#[async_trait]
pub trait StateStoreWrapper: Send + Sync {
    /// The store underneath.
    fn inner(&self) -> &dyn StateStore;

    /// [`StateStore::get`].
    async fn get(&self, key: &str) -> Result<Option<Vec<u8>>> {
        self.inner().get(key).await
    }

    /// [`StateStore::scan`].
    async fn scan(&self, prefix: &str) -> Result<Vec<(String, Vec<u8>)>> {
        self.inner().scan(prefix).await
    }

    /// [`StateStore::scan_page`]: by default a page of this wrapper's [`StateStoreWrapper::scan`].
    async fn scan_page(
        &self,
        prefix: &str,
        after: Option<&str>,
        limit: usize,
    ) -> Result<Vec<(String, Vec<u8>)>> {
        Ok(page_of(self.scan(prefix).await?, after, limit))
    }

    /// [`StateStore::put`].
    async fn put(&self, key: &str, value: Vec<u8>) -> Result<()> {
        self.inner().put(key, value).await
    }

    /// [`StateStore::delete`].
    async fn delete(&self, keys: &[String]) -> Result<()> {
        self.inner().delete(keys).await
    }

    /// [`StateStore::write`].
    async fn write(&self, conditions: Vec<Condition>, ops: Vec<WriteOp>) -> Result<WriteOutcome> {
        self.inner().write(conditions, ops).await
    }
}

#[async_trait]
impl<W: StateStoreWrapper> StateStore for W {
    async fn get(&self, key: &str) -> Result<Option<Vec<u8>>> {
        StateStoreWrapper::get(self, key).await
    }

    async fn scan(&self, prefix: &str) -> Result<Vec<(String, Vec<u8>)>> {
        StateStoreWrapper::scan(self, prefix).await
    }

    async fn scan_page(
        &self,
        prefix: &str,
        after: Option<&str>,
        limit: usize,
    ) -> Result<Vec<(String, Vec<u8>)>> {
        StateStoreWrapper::scan_page(self, prefix, after, limit).await
    }

    async fn put(&self, key: &str, value: Vec<u8>) -> Result<()> {
        StateStoreWrapper::put(self, key, value).await
    }

    async fn delete(&self, keys: &[String]) -> Result<()> {
        StateStoreWrapper::delete(self, keys).await
    }

    async fn write(&self, conditions: Vec<Condition>, ops: Vec<WriteOp>) -> Result<WriteOutcome> {
        StateStoreWrapper::write(self, conditions, ops).await
    }
}
