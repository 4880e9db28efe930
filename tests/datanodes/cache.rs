//! The registry's per-term cache of what it reads at each heartbeat (a datanode's `__dn_table` records, its
//! tables' routes): a heartbeat after an unchanged one reads neither, and a write through the metasrv of a route
//! or of a datanode's table records is seen by the very next heartbeat.

use std::sync::atomic::{AtomicU64, Ordering};

use remote_wal::kv::KvWrapper;

use super::*;

/// Counts the reads of `__dn_table` and `__table_route` keys made on the store underneath.
#[derive(Debug)]
struct AssignmentReads {
    inner: KvBackendRef,
    reads: AtomicU64,
}

impl AssignmentReads {
    fn count(&self, key: &[u8]) {
        if key.starts_with(b"__dn_table/") || key.starts_with(b"__table_route/") {
            self.reads.fetch_add(1, Ordering::SeqCst);
        }
    }
}

#[async_trait::async_trait]
impl KvWrapper for AssignmentReads {
    fn inner(&self) -> &dyn KvBackend {
        self.inner.as_ref()
    }

    async fn get(&self, key: &[u8]) -> remote_wal::kv::Result<Option<remote_wal::kv::KeyValue>> {
        self.count(key);
        self.inner.get(key).await
    }

    async fn batch_get(
        &self,
        keys: &[Vec<u8>],
    ) -> remote_wal::kv::Result<Vec<remote_wal::kv::KeyValue>> {
        keys.iter().for_each(|k| self.count(k));
        self.inner.batch_get(keys).await
    }

    async fn range(
        &self,
        req: remote_wal::kv::RangeRequest,
    ) -> remote_wal::kv::Result<remote_wal::kv::RangeResponse> {
        self.count(&req.key);
        self.inner.range(req).await
    }
}

#[tokio::test]
async fn an_unchanged_assignment_is_not_read_again_and_a_metasrv_write_is_seen_at_once() {
    let counted = Arc::new(AssignmentReads {
        inner: memory_kv(),
        reads: AtomicU64::new(0),
    });
    let kv: KvBackendRef = counted.clone();
    let m = raft_metasrv(&kv, vec![1]).await;
    let created = create(&m, "cached", 2).await;
    let mine = regions_of(&created, 1);
    let registry = m.datanode_registry();
    registry.begin_term();
    registry
        .register(&register_request(1, "dn1:4001", 100))
        .await
        .unwrap();

    let first = beat(registry, 1, 1, 100, &mine, 0).await;
    assert_eq!(leased(&first), mine);
    let before = counted.reads.load(Ordering::SeqCst);
    for _ in 0..5 {
        let again = beat(registry, 1, 1, 100, &mine, 0).await;
        assert_eq!(again.leases, first.leases);
    }
    assert_eq!(
        counted.reads.load(Ordering::SeqCst),
        before,
        "heartbeats after an unchanged one read no route and no __dn_table record"
    );

    // A route written through the metasrv: the next lease carries the new epoch.
    set_region_epochs(m.kv(), created.table_id, &[(0, 7), (1, 8)]).await;
    // Reported at those epochs (as a datanode that led them there would): leased at once.
    let request = heartbeat_request(
        1,
        1,
        100,
        mine.iter()
            .zip([7, 8])
            .map(|(r, epoch)| RegionStat {
                epoch,
                ..stat(*r, 0)
            })
            .collect(),
    );
    let bumped = registry
        .heartbeat(&request, &BTreeSet::new())
        .await
        .expect("heartbeat accepted");
    let mut epochs: Vec<(u64, u64)> = bumped
        .leases
        .iter()
        .map(|l| (l.region_id, l.epoch))
        .collect();
    epochs.sort_unstable();
    assert_eq!(epochs, vec![(mine[0], 7), (mine[1], 8)]);

    // A new table's regions (new __dn_table record) are opened at the next heartbeat.
    let more = create(&m, "cached_more", 1).await;
    let answer = beat(registry, 1, 1, 100, &mine, 0).await;
    let opened: Vec<u64> = answer
        .instructions
        .iter()
        .filter_map(|i| match i {
            remote_wal::datanode::protocol::Instruction::Open(open) => Some(open.request.region_id),
            _ => None,
        })
        .collect();
    assert_eq!(opened, regions_of(&more, 1));

    // A new term forgets what the last one read.
    registry.end_term();
    registry.begin_term();
    let before = counted.reads.load(Ordering::SeqCst);
    let _ = beat(registry, 1, 1, 100, &mine, 0).await;
    assert!(
        counted.reads.load(Ordering::SeqCst) > before,
        "a new term reads again"
    );
    m.stop().await.unwrap();
}
