//! [`KvWrapper`]: a kv backend for tests that changes a few calls of another backend and forwards the rest.
//!
//! A test that needs a store to stall, fail, record or check some calls implements [`KvWrapper`] for its type,
//! names the backend underneath ([`KvWrapper::inner`]) and overrides only the calls it changes; every
//! `KvWrapper` is a [`KvBackend`], so it is shared as a [`KvBackendRef`](crate::kv::KvBackendRef) like any other.

use std::fmt::Debug;

use async_trait::async_trait;

use crate::kv::error::Result;
use crate::kv::{
    CompareAndPutRequest, CompareAndPutResponse, KeyValue, KvBackend, PutRequest, RangeRequest,
    RangeResponse, Txn, TxnResponse,
};

/// A backend that forwards every call to [`KvWrapper::inner`] unless it overrides it. Each method has the
/// meaning of the [`KvBackend`] method of the same name.
#[async_trait]
pub trait KvWrapper: Send + Sync + Debug {
    /// The backend underneath.
    fn inner(&self) -> &dyn KvBackend;

    /// [`KvBackend::name`].
    fn name(&self) -> String {
        self.inner().name()
    }

    /// [`KvBackend::max_txn_ops`].
    fn max_txn_ops(&self) -> usize {
        self.inner().max_txn_ops()
    }

    /// [`KvBackend::max_request_bytes`].
    fn max_request_bytes(&self) -> usize {
        self.inner().max_request_bytes()
    }

    /// [`KvBackend::max_txns_in_flight`].
    fn max_txns_in_flight(&self) -> usize {
        self.inner().max_txns_in_flight()
    }

    /// The inner backend's watch (see [`KvBackend::watch_prefix`]).
    fn watch_prefix(&self, prefix: &[u8]) -> Option<tokio::sync::watch::Receiver<u64>> {
        self.inner().watch_prefix(prefix)
    }

    /// [`KvBackend::get`].
    async fn get(&self, key: &[u8]) -> Result<Option<KeyValue>> {
        self.inner().get(key).await
    }

    /// [`KvBackend::batch_get`].
    async fn batch_get(&self, keys: &[Vec<u8>]) -> Result<Vec<KeyValue>> {
        self.inner().batch_get(keys).await
    }

    /// [`KvBackend::range`].
    async fn range(&self, req: RangeRequest) -> Result<RangeResponse> {
        self.inner().range(req).await
    }

    /// [`KvBackend::put`].
    async fn put(&self, req: PutRequest) -> Result<Option<KeyValue>> {
        self.inner().put(req).await
    }

    /// [`KvBackend::batch_put`].
    async fn batch_put(&self, kvs: Vec<KeyValue>, prev_kv: bool) -> Result<Vec<KeyValue>> {
        self.inner().batch_put(kvs, prev_kv).await
    }

    /// [`KvBackend::compare_and_put`].
    async fn compare_and_put(&self, req: CompareAndPutRequest) -> Result<CompareAndPutResponse> {
        self.inner().compare_and_put(req).await
    }

    /// [`KvBackend::delete_range`].
    async fn delete_range(
        &self,
        key: &[u8],
        range_end: &[u8],
        prev_kv: bool,
    ) -> Result<(u64, Vec<KeyValue>)> {
        self.inner().delete_range(key, range_end, prev_kv).await
    }

    /// [`KvBackend::batch_delete`].
    async fn batch_delete(&self, keys: &[Vec<u8>], prev_kv: bool) -> Result<Vec<KeyValue>> {
        self.inner().batch_delete(keys, prev_kv).await
    }

    /// [`KvBackend::txn`].
    async fn txn(&self, txn: Txn) -> Result<TxnResponse> {
        self.inner().txn(txn).await
    }
}

#[async_trait]
impl<W: KvWrapper> KvBackend for W {
    fn name(&self) -> String {
        KvWrapper::name(self)
    }

    fn max_txn_ops(&self) -> usize {
        KvWrapper::max_txn_ops(self)
    }

    fn max_request_bytes(&self) -> usize {
        KvWrapper::max_request_bytes(self)
    }

    fn max_txns_in_flight(&self) -> usize {
        KvWrapper::max_txns_in_flight(self)
    }

    fn watch_prefix(&self, prefix: &[u8]) -> Option<tokio::sync::watch::Receiver<u64>> {
        KvWrapper::watch_prefix(self, prefix)
    }

    async fn get(&self, key: &[u8]) -> Result<Option<KeyValue>> {
        KvWrapper::get(self, key).await
    }

    async fn batch_get(&self, keys: &[Vec<u8>]) -> Result<Vec<KeyValue>> {
        KvWrapper::batch_get(self, keys).await
    }

    async fn range(&self, req: RangeRequest) -> Result<RangeResponse> {
        KvWrapper::range(self, req).await
    }

    async fn put(&self, req: PutRequest) -> Result<Option<KeyValue>> {
        KvWrapper::put(self, req).await
    }

    async fn batch_put(&self, kvs: Vec<KeyValue>, prev_kv: bool) -> Result<Vec<KeyValue>> {
        KvWrapper::batch_put(self, kvs, prev_kv).await
    }

    async fn compare_and_put(&self, req: CompareAndPutRequest) -> Result<CompareAndPutResponse> {
        KvWrapper::compare_and_put(self, req).await
    }

    async fn delete_range(
        &self,
        key: &[u8],
        range_end: &[u8],
        prev_kv: bool,
    ) -> Result<(u64, Vec<KeyValue>)> {
        KvWrapper::delete_range(self, key, range_end, prev_kv).await
    }

    async fn batch_delete(&self, keys: &[Vec<u8>], prev_kv: bool) -> Result<Vec<KeyValue>> {
        KvWrapper::batch_delete(self, keys, prev_kv).await
    }

    async fn txn(&self, txn: Txn) -> Result<TxnResponse> {
        KvWrapper::txn(self, txn).await
    }
}
