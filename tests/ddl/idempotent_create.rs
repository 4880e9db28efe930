//! `create_table` under a caller-chosen procedure id: a retry with the same id returns the same table, another task
//! under the id is refused naming it.

use std::sync::Arc;

use remote_wal::config::{DatanodesConfig, MetadataBackend, MetadataStoreConfig, MetasrvConfig};
use remote_wal::ddl::{MemoryDatanodeManager, TableName};
use remote_wal::kv::{KvBackendRef, MemoryKvBackend};
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

async fn metasrv(kv: &KvBackendRef) -> Metasrv {
    let m = Metasrv::with_parts(
        config(),
        kv.clone(),
        None,
        Arc::new(MemoryDatanodeManager::new()),
    )
    .unwrap();
    m.start().await.unwrap();
    m
}

fn name(table: &str) -> TableName {
    TableName::new("greptime", "public", table)
}

#[tokio::test]
async fn create_table_with_an_id_twice_returns_the_same_table() {
    let kv: KvBackendRef = Arc::new(MemoryKvBackend::new());
    let m = metasrv(&kv).await;
    let first = m
        .create_table_with_id(name("orders"), 4, false, Some("req-1"))
        .await
        .unwrap();
    assert_eq!(first.regions.len(), 4);
    let again = m
        .create_table_with_id(name("orders"), 4, false, Some("req-1"))
        .await
        .unwrap();
    assert_eq!(again, first);
    // Without the id, the same request is a second create: refused.
    let err = m.create_table(name("orders"), 4, false).await.unwrap_err();
    assert!(err.to_string().contains("already exists"), "{err}");
    m.stop().await.unwrap();

    // After a restart too (the finished procedure is read back from the store).
    let m2 = metasrv(&kv).await;
    let later = m2
        .create_table_with_id(name("orders"), 4, false, Some("req-1"))
        .await
        .unwrap();
    assert_eq!(later, first);
    m2.stop().await.unwrap();
}

#[tokio::test]
async fn another_task_under_a_used_id_is_refused_naming_the_id() {
    let kv: KvBackendRef = Arc::new(MemoryKvBackend::new());
    let m = metasrv(&kv).await;
    m.create_table_with_id(name("a"), 2, false, Some("req-2"))
        .await
        .unwrap();
    for (table, regions) in [("b", 2), ("a", 3)] {
        let err = m
            .create_table_with_id(name(table), regions, false, Some("req-2"))
            .await
            .unwrap_err();
        assert!(
            matches!(&err, remote_wal::Error::Ddl { source }
                if matches!(&**source, remote_wal::ddl::Error::CreateTableIdInUse { procedure_id, .. }
                    if procedure_id == "req-2")),
            "{err:?}"
        );
        assert!(
            err.to_string().contains("greptime.public.a, 2 region(s)"),
            "{err}"
        );
    }
    // Nothing of the refused tasks was created.
    let err = m.create_table(name("b"), 1, false).await;
    assert!(err.is_ok(), "{err:?}");
    let err = m
        .create_table_with_id(name("c"), 1, false, Some("  "))
        .await
        .unwrap_err();
    assert!(err.to_string().contains("procedure id is empty"), "{err}");
    m.stop().await.unwrap();
}
