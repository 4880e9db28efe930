//! Issue 16, F10 and F11 at the library: a table id already in use is refused naming the key that clashed, ids
//! below 1024 are never handed out, and a region count outside 1..=1024 is refused before anything is written.

use std::sync::Arc;
use std::time::Duration;

use crate::support::kv_keys;
use remote_wal::config::{DatanodesConfig, MetadataBackend, MetadataStoreConfig, MetasrvConfig};
use remote_wal::ddl::allocator::MIN_USER_TABLE_ID;
use remote_wal::ddl::{MemoryDatanodeManager, TableName};
use remote_wal::kv::{KeyValue, KvBackend, KvBackendRef, KvWrapper, MemoryKvBackend, PutRequest};
use remote_wal::metasrv::Metasrv;
use remote_wal::wal::WalConfig;

fn config() -> MetasrvConfig {
    MetasrvConfig {
        metadata_store: MetadataStoreConfig {
            backend: MetadataBackend::Memory,
            ..Default::default()
        },
        wal: WalConfig::RaftEngine,
        datanodes: DatanodesConfig {
            ids: vec![1, 2],
            ..Default::default()
        },
        ..Default::default()
    }
}

/// A started metasrv on `kv`, with datanodes of its own (a fresh process: no cached table ids).
async fn metasrv(kv: &KvBackendRef) -> (Metasrv, Arc<MemoryDatanodeManager>) {
    let datanodes = Arc::new(MemoryDatanodeManager::new());
    let m = Metasrv::with_parts(config(), kv.clone(), None, datanodes.clone()).unwrap();
    m.start().await.unwrap();
    (m, datanodes)
}

fn name(table: &str) -> TableName {
    TableName::new("greptime", "public", table)
}

async fn set_sequence(kv: &KvBackendRef, value: &str) {
    kv.put(PutRequest {
        key: b"__table_id_seq".to_vec(),
        value: value.as_bytes().to_vec(),
        prev_kv: false,
    })
    .await
    .unwrap();
}

#[tokio::test]
async fn a_table_id_in_use_is_refused_naming_the_table_info_key_before_any_region_exists() {
    let kv: KvBackendRef = Arc::new(MemoryKvBackend::new());
    let (first, _) = metasrv(&kv).await;
    let a = first.create_table(name("a"), 2, false).await.unwrap();
    assert_eq!(a.table_id, MIN_USER_TABLE_ID);
    first.stop().await.unwrap();

    // The sequence set back to an id in use; a fresh process creates another table.
    set_sequence(&kv, &MIN_USER_TABLE_ID.to_string()).await;
    let (second, datanodes) = metasrv(&kv).await;
    let err = second
        .create_table(name("b"), 2, false)
        .await
        .unwrap_err()
        .to_string();
    assert!(
        err.contains(&format!("__table_info/{MIN_USER_TABLE_ID}")),
        "{err}"
    );
    assert!(!err.contains("__table_name/"), "{err}");
    // Refused at Allocate: no region of b was created, its reservation is gone, a is untouched.
    assert_eq!(datanodes.calls(), 0);
    assert_eq!(
        kv_keys(kv.as_ref(), "__table_allocation/").await,
        Vec::<String>::new()
    );
    assert_eq!(
        kv_keys(kv.as_ref(), "__table_name/").await,
        vec!["__table_name/greptime/public/a"]
    );
    second.stop().await.unwrap();
}

#[tokio::test]
async fn a_sequence_below_the_first_user_id_starts_at_it() {
    let kv: KvBackendRef = Arc::new(MemoryKvBackend::new());
    set_sequence(&kv, "5").await;
    let (m, _) = metasrv(&kv).await;
    let t = m.create_table(name("low"), 1, false).await.unwrap();
    assert_eq!(t.table_id, MIN_USER_TABLE_ID);
    m.stop().await.unwrap();
}

#[tokio::test]
async fn a_region_count_out_of_range_is_refused_before_anything_is_written() {
    let kv: KvBackendRef = Arc::new(MemoryKvBackend::new());
    let (m, datanodes) = metasrv(&kv).await;
    let before = kv_keys(kv.as_ref(), "").await;
    for n in [0, 1025] {
        let err = m
            .create_table(name("regions"), n, false)
            .await
            .unwrap_err()
            .to_string();
        assert!(err.contains(&format!("num_regions = {n}")), "{n}: {err}");
        assert!(err.contains("greptime.public.regions"), "{n}: {err}");
    }
    // No procedure record, no reservation, no sequence, no region.
    assert_eq!(kv_keys(kv.as_ref(), "").await, before);
    assert!(m.list_procedures().await.unwrap().is_empty());
    assert_eq!(datanodes.calls(), 0);
    m.stop().await.unwrap();
}

#[tokio::test]
async fn the_metadata_write_names_the_key_that_clashed_not_the_absent_name() {
    use remote_wal::ddl::{CreateTableTask, TableAllocation, TableMetadata, TableMetadataManager};
    let kv: KvBackendRef = Arc::new(MemoryKvBackend::new());
    let metadata = TableMetadataManager::new(kv.clone());
    let allocation = TableAllocation {
        table_id: 2048,
        region_routes: [(0, 1)].into(),
        region_wal_options: [(0, r#"{"wal.provider":"raft_engine"}"#.to_string())].into(),
    };
    let a = TableMetadata::new(&CreateTableTask::new(name("a"), 1), &allocation);
    metadata.create_table_metadata(&a).await.unwrap();
    // Another table with the same id (what the persist step of a replay with a set-back sequence would write).
    let b = TableMetadata::new(&CreateTableTask::new(name("b"), 1), &allocation);
    let err = metadata
        .create_table_metadata(&b)
        .await
        .unwrap_err()
        .to_string();
    assert!(err.contains("'__table_info/2048'"), "{err}");
    assert!(err.contains("greptime.public.b"), "{err}");
}

/// The metadata kv of a metasrv whose reads of `__table_info/…` time out as etcd's would (a retryable error), while
/// `failing` is set; everything else goes through.
#[derive(Debug)]
struct TableInfoReadsTimeOut {
    inner: KvBackendRef,
    failing: std::sync::atomic::AtomicBool,
}

#[async_trait::async_trait]
impl KvWrapper for TableInfoReadsTimeOut {
    fn inner(&self) -> &dyn KvBackend {
        self.inner.as_ref()
    }
    async fn get(&self, key: &[u8]) -> remote_wal::kv::Result<Option<KeyValue>> {
        if self.failing.load(std::sync::atomic::Ordering::SeqCst)
            && key.starts_with(b"__table_info/")
        {
            return Err(remote_wal::kv::Error::EtcdTimeout {
                endpoints: "127.0.0.1:2379".into(),
                action: "get",
                key: String::from_utf8_lossy(key).into_owned(),
                timeout: Duration::from_secs(1),
            });
        }
        self.inner.get(key).await
    }
    /// As etcd's: one timeout for the chunk, naming its first key.
    async fn batch_get(&self, keys: &[Vec<u8>]) -> remote_wal::kv::Result<Vec<KeyValue>> {
        if self.failing.load(std::sync::atomic::Ordering::SeqCst)
            && keys.iter().any(|key| key.starts_with(b"__table_info/"))
        {
            return Err(remote_wal::kv::Error::EtcdTimeout {
                endpoints: "127.0.0.1:2379".into(),
                action: "batch_get",
                key: keys
                    .first()
                    .map(|key| String::from_utf8_lossy(key).into_owned())
                    .unwrap_or_default(),
                timeout: Duration::from_secs(1),
            });
        }
        self.inner.batch_get(keys).await
    }
}

/// Issue 16, F3: a reservation written by Allocate does not outlive a procedure whose Allocate then failed
/// retryably until the step's retries ran out — the procedure fails through its rollback, which deletes it.
#[tokio::test]
async fn an_allocate_whose_retries_run_out_leaves_no_reservation() {
    let kv: KvBackendRef = Arc::new(TableInfoReadsTimeOut {
        inner: Arc::new(MemoryKvBackend::new()),
        failing: true.into(),
    });
    let mut config = config();
    config.procedure.max_retries = 2;
    config.procedure.retry_delay = Duration::from_millis(1);
    config.procedure.max_retry_delay = Duration::from_millis(5);
    let datanodes = Arc::new(MemoryDatanodeManager::new());
    let m = Metasrv::with_parts(config, kv.clone(), None, datanodes.clone()).unwrap();
    m.start().await.unwrap();

    let err = m
        .create_table(name("flaky"), 2, false)
        .await
        .unwrap_err()
        .to_string();
    assert!(err.contains("retries ran out"), "{err}");
    // Each attempt draws a fresh table id (an id is never reused; the allocation is stored only with the state).
    let named_id: u64 = err
        .split("batch_get on key '__table_info/")
        .nth(1)
        .and_then(|rest| rest.split('\'').next())
        .and_then(|id| id.parse().ok())
        .unwrap_or_else(|| panic!("the error names the __table_info key it read: {err}"));
    assert!(named_id >= u64::from(MIN_USER_TABLE_ID), "{err}");
    // The allocation lives in the procedure's record: no reservation key is written, and none is left.
    assert_eq!(
        kv_keys(kv.as_ref(), "__table_allocation/").await,
        Vec::<String>::new(),
        "a reservation outlived its failed procedure"
    );
    assert_eq!(
        kv_keys(kv.as_ref(), "__table_name/").await,
        Vec::<String>::new()
    );
    assert_eq!(datanodes.calls(), 0);
    m.stop().await.unwrap();
}
