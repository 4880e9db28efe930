//! The metasrv's lifecycle on redb: `stop` lets go of the redb file before it returns.

use std::sync::Arc;

use remote_wal::config::{DatanodesConfig, MetadataBackend, MetadataStoreConfig, MetasrvConfig};
use remote_wal::ddl::{MemoryDatanodeManager, TableName};
use remote_wal::kv::{KvBackendRef, RedbKvBackend};
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
            ids: vec![1],
            ..Default::default()
        },
        ..Default::default()
    }
}

fn name(table: &str) -> TableName {
    TableName::new("greptime", "public", table)
}

#[tokio::test]
async fn stop_releases_the_redb_file_while_a_procedure_is_still_retrying() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("metadata.redb");
    let kv: KvBackendRef = Arc::new(RedbKvBackend::open(&path).unwrap());
    let datanodes = Arc::new(MemoryDatanodeManager::new());
    let m = Metasrv::with_parts(config(), kv, None, datanodes.clone()).unwrap();
    m.start().await.unwrap();
    m.create_table(name("before"), 1, false).await.unwrap();

    // The datanode is unavailable for far longer than the test: the next create-table keeps retrying its step.
    datanodes.fail_next(1, usize::MAX);
    let retrying = async {
        loop {
            let listed = m.list_procedures().await.unwrap();
            if listed
                .iter()
                .any(|p| p.state == procedures::ProcedureState::Retrying)
            {
                return;
            }
            tokio::task::yield_now().await;
        }
    };
    tokio::select! {
        result = m.create_table(name("stuck"), 1, false) => panic!("the create-table finished: {result:?}"),
        () = retrying => {}
    }

    m.stop().await.unwrap();
    drop(m);
    // At once, with no wait: redb refuses a second open of a file still held in this process.
    let reopened = RedbKvBackend::open(&path).unwrap();
    drop(reopened);
}
