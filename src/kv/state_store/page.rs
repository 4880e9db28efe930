//! [`StateStore::scan_page`](procedures::store::StateStore::scan_page) of the [`KvStateStore`]: one limited range
//! read of the kv backend per page.

use crate::kv::{RangeRequest, display_key, prefix_end};

use super::KvStateStore;

impl KvStateStore {
    /// At most `limit` store keys under `prefix` after `after`, read with one range request.
    pub(super) async fn read_page(
        &self,
        prefix: &str,
        after: Option<&str>,
        limit: usize,
    ) -> procedures::Result<Vec<(String, Vec<u8>)>> {
        let first = self.kv_key(prefix);
        let start = match after {
            Some(after) if after >= prefix => {
                let mut key = self.kv_key(after);
                key.push(0);
                key
            }
            _ => first.clone(),
        };
        let req = RangeRequest::range(start, prefix_end(&first)).with_limit(limit.max(1));
        let resp = self
            .kv
            .range(req)
            .await
            .map_err(|e| self.error("scan", prefix, e))?;
        resp.kvs
            .into_iter()
            .map(|kv| {
                let unreadable = |reason: String| procedures::Error::Store {
                    action: "scan",
                    key: prefix.to_string(),
                    source: reason.into(),
                    retryable: false,
                };
                let rest = kv.key.strip_prefix(self.prefix.as_bytes()).ok_or_else(|| {
                    unreadable(format!(
                        "backend returned key '{}' outside the prefix",
                        display_key(&kv.key)
                    ))
                })?;
                let key = String::from_utf8(rest.to_vec()).map_err(|_| {
                    unreadable(format!("key '{}' is not UTF-8", display_key(&kv.key)))
                })?;
                Ok((key, kv.value))
            })
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use procedures::store::StateStore;

    use crate::kv::{KvStateStore, MemoryKvBackend};

    #[tokio::test]
    async fn pages_follow_key_order_within_the_prefix_and_the_store_prefix() {
        let kv = Arc::new(MemoryKvBackend::new());
        let store = KvStateStore::with_prefix(kv.clone(), "ns/");
        let other = KvStateStore::with_prefix(kv, "nt/");
        for key in ["a/1", "b/1", "b/2", "b/3", "c/1"] {
            store.put(key, key.as_bytes().to_vec()).await.unwrap();
            other.put(key, b"other".to_vec()).await.unwrap();
        }
        let keys = |page: Vec<(String, Vec<u8>)>| {
            page.into_iter()
                .map(|(k, v)| {
                    assert_eq!(k.as_bytes(), v, "each key with its own value");
                    k
                })
                .collect::<Vec<_>>()
        };
        assert_eq!(
            keys(store.scan_page("b/", None, 2).await.unwrap()),
            ["b/1", "b/2"]
        );
        assert_eq!(
            keys(store.scan_page("b/", Some("b/2"), 2).await.unwrap()),
            ["b/3"]
        );
        assert!(
            store
                .scan_page("b/", Some("b/3"), 2)
                .await
                .unwrap()
                .is_empty()
        );
        assert_eq!(
            keys(store.scan_page("b/", Some("a/9"), 5).await.unwrap()),
            ["b/1", "b/2", "b/3"]
        );
        assert_eq!(
            keys(store.scan_page("", Some("b/3"), 9).await.unwrap()),
            ["c/1"]
        );
    }
}
