//! The topic pool checks the brokers: bootstrap recreates a persisted topic deleted out of band and reports it,
//! the allocator never hands out a topic it has not seen on the brokers since it loaded the pool, bootstrap with
//! the brokers unreachable does not claim success, and a bootstrap recovered with another spec than the configured
//! one is superseded (or, for another prefix, abandoned) instead of creating the old pool.

use crate::support;

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use procedures::{LocalManager, ManagerConfig, MemoryStateStore, ProcedureManagerRef};
use remote_wal::config::{MetadataBackend, MetadataStoreConfig, MetasrvConfig, ProcedureConfig};
use remote_wal::ddl::MemoryDatanodeManager;
use remote_wal::key::topic_name::list_persisted_topics;
use remote_wal::kv::{KvBackendRef, MemoryKvBackend};
use remote_wal::metasrv::Metasrv;
use remote_wal::wal::kafka::admin::{TopicAdmin, TopicAdminRef};
use remote_wal::wal::kafka::testing::{FAKE_ENDPOINT, FakeFault, FakeTopicAdmin};
use remote_wal::wal::kafka::{KafkaTopicManager, RoundRobinTopicSelector, TopicPoolSpec};
use remote_wal::wal::{KafkaConfig, WalConfig};
use tokio::sync::Notify;

fn kafka_config(prefix: &str, num_topics: usize) -> MetasrvConfig {
    MetasrvConfig {
        metadata_store: MetadataStoreConfig {
            backend: MetadataBackend::Memory,
            ..Default::default()
        },
        wal: WalConfig::Kafka(KafkaConfig {
            num_topics,
            topic_name_prefix: prefix.to_string(),
            max_concurrent_creates: 1,
            ..Default::default()
        }),
        datanodes: remote_wal::config::DatanodesConfig {
            ids: vec![1],
            ..Default::default()
        },
        procedure: ProcedureConfig {
            max_retries: 0,
            ..Default::default()
        },
        ..Default::default()
    }
}

/// A metasrv (as one walctl process would build it) over `kv` and `admin`.
fn metasrv(config: MetasrvConfig, kv: &KvBackendRef, admin: &Arc<FakeTopicAdmin>) -> Metasrv {
    let admin: TopicAdminRef = admin.clone();
    Metasrv::with_parts(
        config,
        kv.clone(),
        Some(admin),
        Arc::new(MemoryDatanodeManager::new()),
    )
    .unwrap()
}

async fn persisted(kv: &KvBackendRef, prefix: &str) -> Vec<String> {
    list_persisted_topics(kv.as_ref(), &format!("{prefix}_"))
        .await
        .unwrap()
}

#[tokio::test]
async fn a_pool_topic_deleted_out_of_band_fails_the_next_bootstrap_and_is_recreated_only_when_asked()
 {
    let kv: KvBackendRef = Arc::new(MemoryKvBackend::new());
    let admin = Arc::new(FakeTopicAdmin::new());
    let first = metasrv(kafka_config("gone", 3), &kv, &admin);
    let report = first.bootstrap(|_| {}).await.unwrap();
    assert_eq!(report.recreated_topics, 0);
    first.stop().await.unwrap();

    let admin_id_before_delete = admin.topics()["gone_1"].id;
    admin.delete_out_of_band("gone_1");
    let second = metasrv(kafka_config("gone", 3), &kv, &admin);
    let err = second.bootstrap(|_| {}).await.unwrap_err().to_string();
    // The first start's load recorded the topic's id once the brokers listed it.
    let recorded = admin_id_before_delete;
    assert!(
        err.contains(&format!(
            "topic 'gone_1' (id {recorded}) is gone from the brokers"
        )),
        "{err}"
    );
    assert!(
        !admin.topics().contains_key("gone_1"),
        "not recreated unasked"
    );
    second.stop().await.unwrap();

    let second = metasrv(kafka_config("gone", 3), &kv, &admin);
    let report = second.bootstrap_with(true, |_| {}).await.unwrap();
    assert!(report.ready);
    assert_eq!(report.recreated_topics, 1, "{report:?}");
    assert!(admin.topics().contains_key("gone_1"), "recreated");
    assert_eq!(persisted(&kv, "gone").await, ["gone_0", "gone_1", "gone_2"]);
    second.stop().await.unwrap();

    // A run with nothing missing recreates nothing.
    let third = metasrv(kafka_config("gone", 3), &kv, &admin);
    assert_eq!(third.bootstrap(|_| {}).await.unwrap().recreated_topics, 0);
    third.stop().await.unwrap();
}

#[tokio::test]
async fn bootstrap_with_the_brokers_unreachable_does_not_claim_success() {
    let kv: KvBackendRef = Arc::new(MemoryKvBackend::new());
    let admin = Arc::new(FakeTopicAdmin::new());
    let first = metasrv(kafka_config("frozen", 2), &kv, &admin);
    first.bootstrap(|_| {}).await.unwrap();
    first.stop().await.unwrap();

    // The brokers are gone for the whole of rskafka's backoff.
    admin.fail_all(Some(FakeFault::DeadlineExhausted));
    let second = metasrv(kafka_config("frozen", 2), &kv, &admin);
    let err = second
        .bootstrap(|_| {})
        .await
        .expect_err("the brokers were not asked, or their silence was taken for success");
    assert!(err.to_string().contains(FAKE_ENDPOINT), "{err}");
    second.stop().await.unwrap();
}

#[tokio::test]
async fn a_pool_the_store_holds_whole_is_usable_without_the_brokers_until_they_answer_otherwise() {
    let kv: KvBackendRef = Arc::new(MemoryKvBackend::new());
    let admin = Arc::new(FakeTopicAdmin::new());
    let first = metasrv(kafka_config("trusted", 3), &kv, &admin);
    first.bootstrap(|_| {}).await.unwrap();
    assert_eq!(first.wal_brokers_checked(), Some(true));
    first.stop().await.unwrap();

    // A new leader while the brokers are down: the manager's start loads the pool from the store, asking no broker,
    // and tables get its topics.
    admin.fail_all(Some(FakeFault::DeadlineExhausted));
    let second = metasrv(kafka_config("trusted", 3), &kv, &admin);
    let reads = admin.metadata_reads();
    second.start_procedures().await.unwrap();
    assert_eq!(admin.metadata_reads(), reads, "the start asked the brokers");
    assert!(second.is_wal_ready());
    assert_eq!(second.wal_brokers_checked(), Some(false));
    let name = remote_wal::metasrv::parse_table_name("down").unwrap();
    let table = second.create_table(name, 3, false).await.unwrap();
    for region in &table.regions {
        assert!(region.wal_options.contains("trusted_"), "{region:?}");
    }

    // A check that cannot reach the brokers fails and leaves the pool usable, unchecked.
    let err = second.bootstrap(|_| {}).await.unwrap_err();
    assert!(err.to_string().contains(FAKE_ENDPOINT), "{err}");
    assert!(second.is_wal_ready());
    assert_eq!(second.wal_brokers_checked(), Some(false));

    // The brokers back, the check passes.
    admin.fail_all(None);
    assert!(second.bootstrap(|_| {}).await.unwrap().ready);
    assert_eq!(second.wal_brokers_checked(), Some(true));
    // Unreachable again: a ready pool stays usable, as unchecked.
    admin.fail_all(Some(FakeFault::DeadlineExhausted));
    second.bootstrap(|_| {}).await.unwrap_err();
    assert!(second.is_wal_ready());
    assert_eq!(second.wal_brokers_checked(), Some(false));
    second.stop().await.unwrap();

    // A check that reaches the brokers and misses a topic makes the store's word void.
    admin.fail_all(None);
    admin.delete_out_of_band("trusted_1");
    let pool = manager(TopicPoolSpec::new("trusted", 3), &kv, &admin);
    assert!(pool.load_persisted().await.unwrap());
    assert!(!pool.brokers_checked());
    let err = pool.load_ready().await.unwrap_err();
    assert!(err.to_string().contains("trusted_1"), "{err}");
    assert!(!pool.is_ready());
    assert!(pool.alloc().unwrap_err().to_string().contains("trusted_1"));

    // The config now asks for 2 partitions per topic; the names do not say how many the topics have, so the pool is
    // usable from the store until the bootstrap's refusal, which the brokers' answer then confirms.
    admin.create_topic("trusted_1", 1, 1).await.unwrap();
    let mut config = kafka_config("trusted", 3);
    if let WalConfig::Kafka(kafka) = &mut config.wal {
        kafka.num_partitions = 2;
    }
    let third = metasrv(config, &kv, &admin);
    third.start_procedures().await.unwrap();
    assert!(third.is_wal_ready());
    let err = third.bootstrap(|_| {}).await.unwrap_err().to_string();
    assert!(err.contains("partition"), "{err}");
    assert!(
        !third.is_wal_ready(),
        "the brokers' answer voids the store's word"
    );
    assert_eq!(third.wal_brokers_checked(), Some(false));
    third.stop().await.unwrap();

    // A pool the store does not hold whole (one more topic configured) is not usable without a bootstrap.
    let grown = manager(TopicPoolSpec::new("trusted", 4), &kv, &admin);
    assert!(!grown.load_persisted().await.unwrap());
    let err = grown.alloc().unwrap_err().to_string();
    assert!(
        err.contains("1 of 4 topics are not persisted") && err.contains("trusted_3"),
        "{err}"
    );
}

fn manager(
    spec: TopicPoolSpec,
    kv: &KvBackendRef,
    admin: &Arc<FakeTopicAdmin>,
) -> KafkaTopicManager {
    KafkaTopicManager::new(
        spec,
        kv.clone(),
        admin.clone(),
        Arc::new(RoundRobinTopicSelector::new()),
    )
    .unwrap()
}

#[tokio::test]
async fn the_allocator_never_hands_out_a_topic_it_has_not_seen_on_the_brokers_since_loading() {
    let kv: KvBackendRef = Arc::new(MemoryKvBackend::new());
    let admin = Arc::new(FakeTopicAdmin::new());
    let spec = TopicPoolSpec::new("seen", 3);
    let first = metasrv(kafka_config("seen", 3), &kv, &admin);
    first.bootstrap(|_| {}).await.unwrap();
    first.stop().await.unwrap();

    admin.delete_out_of_band("seen_2");
    let pool = manager(spec.clone(), &kv, &admin);
    let err = pool
        .load_ready()
        .await
        .expect_err("seen_2 is persisted but not on the brokers");
    // The text docs/errors.md quotes.
    assert_eq!(
        err.to_string(),
        "Kafka topic pool 'seen' is not ready: 1 of 3 persisted topics are not on the brokers \
         [\"fake-broker:9092\"] with 1 partition(s) (first: [\"seen_2\"]); `walctl bootstrap` names what was lost, \
         and `--recreate-missing` creates it anew"
    );
    for err in [pool.alloc().unwrap_err(), pool.alloc_batch(3).unwrap_err()] {
        let text = err.to_string();
        assert!(
            text.contains("seen_2") && text.contains("not ready"),
            "{text}"
        );
    }

    // Created again on the brokers, it is another topic (another id): the load says so and the pool stays not
    // ready; once the new incarnation is recorded (what `bootstrap --recreate-missing` does), the pool is ready.
    admin.create_topic("seen_2", 1, 1).await.unwrap();
    let err = pool
        .load_ready()
        .await
        .expect_err("seen_2 is another topic now");
    assert!(
        err.to_string()
            .contains("1 of 3 persisted topics were deleted and created again"),
        "{err}"
    );
    assert!(err.to_string().contains("'seen_2' (id "), "{err}");
    kv.put(remote_wal::kv::PutRequest {
        key: remote_wal::key::topic_name::topic_name_key("seen_2"),
        value: remote_wal::key::topic_name::TopicNameValue {
            pruned_entry_id: 0,
            topic_id: Some(admin.topics()["seen_2"].id),
        }
        .encode(),
        prev_kv: false,
    })
    .await
    .unwrap();
    pool.load_ready().await.unwrap();
    let mut handed: Vec<String> = pool
        .alloc_batch(3)
        .unwrap()
        .into_iter()
        .map(|o| o.encode())
        .collect();
    handed.sort();
    assert!(handed[2].contains("seen_2"), "{handed:?}");

    // A load that finds a topic gone makes the pool not ready again.
    admin.delete_out_of_band("seen_0");
    let err = pool.load_ready().await.unwrap_err();
    assert!(err.to_string().contains("seen_0"), "{err}");
    assert!(pool.alloc().unwrap_err().to_string().contains("seen_0"));
}

#[tokio::test]
async fn a_broker_that_has_not_caught_up_yet_delays_the_load_but_a_topic_gone_for_good_is_reported()
{
    let kv: KvBackendRef = Arc::new(MemoryKvBackend::new());
    let admin = Arc::new(FakeTopicAdmin::new());
    let first = metasrv(kafka_config("lag", 3), &kv, &admin);
    first.bootstrap(|_| {}).await.unwrap();
    first.stop().await.unwrap();
    let pool = manager(TopicPoolSpec::new("lag", 3), &kv, &admin);

    // The first listing and the first two confirmations come from a broker that lists nothing yet: the pool
    // still loads, from the answers that follow.
    admin.stale_metadata_reads(3);
    let before = admin.metadata_reads();
    pool.load_ready()
        .await
        .expect("the topics are on the brokers; one broker was only behind");
    assert_eq!(
        admin.metadata_reads() - before,
        4,
        "one listing and three confirmations"
    );
    assert_eq!(pool.alloc_batch(3).unwrap().len(), 3);

    // A topic that stays absent through every confirmation is reported, after a bounded number of reads.
    admin.delete_out_of_band("lag_1");
    let before = admin.metadata_reads();
    let err = pool.load_ready().await.expect_err("lag_1 is gone");
    assert!(err.to_string().contains("lag_1"), "{err}");
    assert_eq!(
        admin.metadata_reads() - before,
        6,
        "one listing and five confirmations"
    );
}

#[tokio::test]
async fn a_creation_acknowledged_to_this_process_counts_as_seen_by_the_next_load_only() {
    let kv: KvBackendRef = Arc::new(MemoryKvBackend::new());
    let admin = Arc::new(FakeTopicAdmin::new());
    let pool = manager(TopicPoolSpec::new("acked", 3), &kv, &admin);
    let engine: ProcedureManagerRef = Arc::new(LocalManager::new(
        Arc::new(MemoryStateStore::new()),
        ManagerConfig::default(),
    ));
    pool.register_loader(engine.as_ref()).unwrap();
    engine.start().await.unwrap();

    // No broker lists anything for a long while: the bootstrap's read and the load's listing find nothing, yet
    // the controller acknowledged every creation.
    admin.stale_metadata_reads(1_000);
    let before = admin.metadata_reads();
    pool.start(&engine)
        .await
        .expect("acknowledged creations are seen on the brokers");
    assert_eq!(
        admin.metadata_reads() - before,
        2,
        "the bootstrap's read and the load's listing, no confirmation reads"
    );
    assert_eq!(pool.alloc_batch(3).unwrap().len(), 3);

    // The acknowledgements vouched for that load only: the next one must see the topics listed.
    let err = pool
        .load_ready()
        .await
        .expect_err("no broker lists the topics and no creation was acknowledged since");
    assert!(err.to_string().contains("acked_0"), "{err}");
    assert!(!pool.is_ready());
    admin.stale_metadata_reads(0);
    pool.load_ready().await.expect("listed now");
}

/// Starts a bootstrap of `num_topics` topics that stops answering after `created` creations, as if its process had
/// been killed there, and returns once it hangs (its procedure record is at CreateMissing with that spec).
async fn killed_bootstrap(
    config: MetasrvConfig,
    created: usize,
    kv: &KvBackendRef,
    admin: &Arc<FakeTopicAdmin>,
) -> tokio::task::JoinHandle<()> {
    // Create calls past the first `created` never return (the fake runs the hook before applying a call).
    let calls = Arc::new(AtomicUsize::new(0));
    let hung = Arc::new(Notify::new());
    {
        let (calls, hung) = (calls.clone(), hung.clone());
        admin.on_create(Arc::new(move |_| {
            let call = calls.fetch_add(1, Ordering::SeqCst);
            let hung = hung.clone();
            Box::pin(async move {
                if call >= created {
                    hung.notify_one();
                    std::future::pending::<()>().await;
                }
            })
        }));
    }
    let killed = metasrv(config, kv, admin);
    let task = tokio::spawn(async move {
        let _ = killed.bootstrap(|_| {}).await;
        unreachable!("the bootstrap hangs in its create request");
    });
    hung.notified().await;
    task.abort();
    admin.on_create(Arc::new(|_| Box::pin(async {})));
    task
}

#[tokio::test]
async fn a_recovered_300_topic_bootstrap_rerun_with_100_creates_and_persists_100() {
    let kv: KvBackendRef = Arc::new(MemoryKvBackend::new());
    let admin = Arc::new(FakeTopicAdmin::new());
    let _killed = killed_bootstrap(kafka_config("shrunk", 300), 10, &kv, &admin).await;
    assert_eq!(admin.topics().len(), 10);

    let rerun = metasrv(kafka_config("shrunk", 100), &kv, &admin);
    let report = rerun.bootstrap(|_| {}).await.unwrap();
    assert_eq!(report.num_topics, 100);
    assert!(report.ready);
    let on_broker: Vec<String> = admin.topics().into_keys().collect();
    let wanted: std::collections::BTreeSet<String> =
        (0..100).map(|i| format!("shrunk_{i}")).collect();
    assert_eq!(
        on_broker.len(),
        100,
        "the recovered bootstrap's 300 must not be created"
    );
    assert!(on_broker.iter().all(|t| wanted.contains(t)));
    assert_eq!(persisted(&kv, "shrunk").await.len(), 100);
    rerun.stop().await.unwrap();
}

#[tokio::test]
async fn a_recovered_bootstrap_of_another_prefix_is_abandoned_naming_both() {
    let kv: KvBackendRef = Arc::new(MemoryKvBackend::new());
    let admin = Arc::new(FakeTopicAdmin::new());
    let _killed = killed_bootstrap(kafka_config("oldpool", 20), 3, &kv, &admin).await;

    let rerun = metasrv(kafka_config("newpool", 4), &kv, &admin);
    let report = rerun.bootstrap(|_| {}).await.unwrap();
    assert!(report.ready);
    let recovered = rerun.finish_recovered().await.unwrap();
    let old = recovered
        .iter()
        .find(|p| p.id.to_string().contains("oldpool"))
        .expect("the old pool's bootstrap was recovered");
    let text = old.error.clone().unwrap_or_default();
    assert!(
        text.contains("'oldpool'") && text.contains("'newpool'"),
        "{text}"
    );
    let old_topics = admin
        .topics()
        .into_keys()
        .filter(|t| t.starts_with("oldpool_"))
        .count();
    assert_eq!(old_topics, 3, "nothing more created for the old pool");
    assert!(persisted(&kv, "oldpool").await.is_empty());
    assert_eq!(persisted(&kv, "newpool").await.len(), 4);
    rerun.stop().await.unwrap();
}

/// Against the shared broker: a pool topic deleted with Kafka's DeleteTopics fails the next bootstrap, is back after
/// one that is asked to recreate it (its new topic id recorded), and when deleted and created again out of band
/// fails the next bootstrap naming both ids.
#[tokio::test]
async fn a_topic_deleted_on_a_real_broker_fails_the_bootstrap_until_recreated_and_a_new_incarnation_is_named()
 {
    let endpoints = support::require_endpoints("KAFKA_ENDPOINTS", "a running Kafka broker");
    let prefix = support::unique("recreate");
    let mut config = kafka_config(&prefix, 2);
    if let WalConfig::Kafka(kafka) = &mut config.wal {
        kafka.broker_endpoints = endpoints.clone();
    }
    let kv: KvBackendRef = Arc::new(MemoryKvBackend::new());
    let datanodes = || Arc::new(MemoryDatanodeManager::new());

    // The first run creates the topics; the second records their ids (the broker lists them by then).
    for _ in 0..2 {
        let run = Metasrv::with_parts(config.clone(), kv.clone(), None, datanodes()).unwrap();
        run.bootstrap(|_| {}).await.unwrap();
        run.stop().await.unwrap();
    }
    let victim = format!("{prefix}_1");
    let recorded = |kv: KvBackendRef, topic: String| async move {
        remote_wal::key::topic_name::get_topic_value(kv.as_ref(), &topic)
            .await
            .unwrap()
            .and_then(|v| v.topic_id)
    };
    let old = recorded(kv.clone(), victim.clone())
        .await
        .expect("the broker's Metadata gives topic ids");
    let client = rskafka::client::ClientBuilder::new(endpoints)
        .build()
        .await
        .unwrap();
    client
        .controller_client()
        .unwrap()
        .delete_topic(victim.clone(), 30_000)
        .await
        .unwrap();
    // Deletion is asynchronous on the broker: wait until its metadata no longer lists the topic.
    loop {
        let listed = client.list_topics().await.unwrap();
        if !listed.iter().any(|t| t.name == victim) {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }

    let refused = Metasrv::with_parts(config.clone(), kv.clone(), None, datanodes()).unwrap();
    let err = refused.bootstrap(|_| {}).await.unwrap_err().to_string();
    assert!(
        err.contains(&format!(
            "topic '{victim}' (id {old}) is gone from the brokers"
        )),
        "{err}"
    );
    refused.stop().await.unwrap();
    assert!(
        !client
            .list_topics()
            .await
            .unwrap()
            .iter()
            .any(|t| t.name == victim),
        "not recreated unasked"
    );

    let second = Metasrv::with_parts(config.clone(), kv.clone(), None, datanodes()).unwrap();
    let report = second.bootstrap_with(true, |_| {}).await.unwrap();
    assert!(report.ready);
    assert_eq!(report.recreated_topics, 1, "{report:?}");
    let listed = client.list_topics().await.unwrap();
    assert!(
        listed.iter().any(|t| t.name == victim),
        "{victim} exists again"
    );
    second.stop().await.unwrap();
    // Its new id is recorded (by this run, or the next one once the broker lists it).
    let mut new = recorded(kv.clone(), victim.clone()).await;
    for _ in 0..50 {
        if new.is_some() {
            break;
        }
        let run = Metasrv::with_parts(config.clone(), kv.clone(), None, datanodes()).unwrap();
        run.bootstrap(|_| {}).await.unwrap();
        run.stop().await.unwrap();
        new = recorded(kv.clone(), victim.clone()).await;
    }
    let new = new.expect("the new id is recorded");
    assert_ne!(new, old);

    // Deleted and created again out of band: another id, named with the recorded one.
    client
        .controller_client()
        .unwrap()
        .delete_topic(victim.clone(), 30_000)
        .await
        .unwrap();
    let mut created = false;
    for _ in 0..300 {
        match client
            .controller_client()
            .unwrap()
            .create_topic(victim.clone(), 1, 1, 30_000)
            .await
        {
            Ok(()) => {
                created = true;
                break;
            }
            // Deletion is asynchronous: the name is taken until it ends.
            Err(_) => tokio::time::sleep(Duration::from_millis(100)).await,
        }
    }
    assert!(created, "{victim} created again out of band");
    let mut err = String::new();
    for _ in 0..50 {
        let run = Metasrv::with_parts(config.clone(), kv.clone(), None, datanodes()).unwrap();
        err = match run.bootstrap(|_| {}).await {
            Ok(_) => String::new(),
            Err(e) => e.to_string(),
        };
        run.stop().await.unwrap();
        if !err.is_empty() {
            break;
        }
        // The broker answering listed the old incarnation still: asked again.
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert!(
        err.contains(&format!(
            "topic '{victim}' was deleted and created again (id {new}, now "
        )),
        "{err}"
    );

    // A prune round reads the same ids from the brokers: the recreated topic fails alone, nothing deleted from it;
    // the other topic is pruned.
    let pruning = Metasrv::with_parts(config.clone(), kv.clone(), None, datanodes()).unwrap();
    pruning.start_procedures().await.unwrap();
    let round = pruning.prune_wal(None).await.unwrap();
    pruning.stop().await.unwrap();
    assert_eq!(round.topics.len(), 2, "{round:?}");
    let kept = &round.topics[0];
    assert_eq!(kept.topic, format!("{prefix}_0"));
    assert!(!kept.failed(), "{round:?}");
    let recreated = &round.topics[1];
    assert_eq!(recreated.topic, victim);
    match &recreated.outcome {
        remote_wal::wal::prune::round::TopicOutcome::Failed { step, error, .. } => {
            assert_eq!(step, "Decide");
            assert!(
                error.contains(&format!(
                    "topic '{victim}' was deleted and created again (recorded id {new}, now "
                )),
                "{error}"
            );
        }
        other => panic!("the recreated topic must fail: {other:?}"),
    }
}

/// Holds the first compare-and-put on a `__topic_name/` key until released.
#[derive(Debug)]
struct HeldIdWrite {
    inner: KvBackendRef,
    armed: std::sync::atomic::AtomicBool,
    entered: tokio::sync::Semaphore,
    release: tokio::sync::Semaphore,
}

#[async_trait::async_trait]
impl remote_wal::kv::KvWrapper for HeldIdWrite {
    fn inner(&self) -> &dyn remote_wal::kv::KvBackend {
        self.inner.as_ref()
    }

    async fn compare_and_put(
        &self,
        req: remote_wal::kv::CompareAndPutRequest,
    ) -> remote_wal::kv::Result<remote_wal::kv::CompareAndPutResponse> {
        if req.key.starts_with(b"__topic_name/") && self.armed.swap(false, Ordering::SeqCst) {
            self.entered.add_permits(1);
            if let Ok(permit) = self.release.acquire().await {
                permit.forget();
            }
        }
        self.inner.compare_and_put(req).await
    }

    async fn put(
        &self,
        req: remote_wal::kv::PutRequest,
    ) -> remote_wal::kv::Result<Option<remote_wal::kv::KeyValue>> {
        // Held the same way: a blind write of the id would show here.
        if req.key.starts_with(b"__topic_name/") && self.armed.swap(false, Ordering::SeqCst) {
            self.entered.add_permits(1);
            if let Ok(permit) = self.release.acquire().await {
                permit.forget();
            }
        }
        self.inner.put(req).await
    }
}

/// A pool topic's id is recorded outside the procedure store (by the bootstrap's CreateMissing, which a start runs,
/// and by the pool's check), so no epoch fences that write: what stops a stale metasrv's late write is the
/// compare-and-put against the value it read (`docs/ha.md`). The start's first id write (the bootstrap's) is held
/// while the value changes under it (a newer leader's prune raises the watermark); let go, it is refused, and the
/// watermark stays whatever writes the id later. With the bootstrap's write made a blind put, the watermark goes
/// back to 0 and the test fails (checked).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_late_topic_id_write_changes_nothing_a_newer_writer_wrote() {
    use remote_wal::key::topic_name::{TopicNameValue, topic_name_key};
    let memory: KvBackendRef = Arc::new(MemoryKvBackend::new());
    let admin = Arc::new(FakeTopicAdmin::new());
    // A pool persisted by a release that recorded no ids.
    for i in 0..2 {
        let topic = format!("late_id_{i}");
        admin.create_out_of_band(&topic, 1);
        memory
            .put(remote_wal::kv::PutRequest {
                key: topic_name_key(&topic),
                value: TopicNameValue {
                    pruned_entry_id: 0,
                    topic_id: None,
                }
                .encode(),
                prev_kv: false,
            })
            .await
            .unwrap();
    }
    let held = Arc::new(HeldIdWrite {
        inner: memory.clone(),
        armed: std::sync::atomic::AtomicBool::new(true),
        entered: tokio::sync::Semaphore::new(0),
        release: tokio::sync::Semaphore::new(0),
    });
    let held_kv: KvBackendRef = held.clone();
    let stale = Arc::new(metasrv(kafka_config("late_id", 2), &held_kv, &admin));
    let starting = {
        let stale = stale.clone();
        tokio::spawn(async move { stale.start().await })
    };
    tokio::time::timeout(Duration::from_secs(30), held.entered.acquire())
        .await
        .expect("the check reaches its id write")
        .unwrap()
        .forget();
    // Meanwhile a newer leader's prune raises the watermark of the topic whose id write is held.
    let key = topic_name_key("late_id_0");
    let raised = TopicNameValue {
        pruned_entry_id: 40,
        topic_id: None,
    }
    .encode();
    memory
        .put(remote_wal::kv::PutRequest {
            key: key.clone(),
            value: raised.clone(),
            prev_kv: false,
        })
        .await
        .unwrap();
    held.release.add_permits(1);
    let _ = tokio::time::timeout(Duration::from_secs(30), starting)
        .await
        .expect("the start ends");
    let after = memory.get(&key).await.unwrap().unwrap().value;
    assert_eq!(
        TopicNameValue::decode(&key, &after)
            .unwrap()
            .pruned_entry_id,
        40,
        "the late id write put the watermark back"
    );
    let _ = stale.stop().await;
}
