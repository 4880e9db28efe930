//! The bad-input catalogue of `docs/errors.md`: one test per row. Each asserts the exact text a user sees (the
//! error's Display; for config files, what the config loader says) and that nothing else changed: the kv backend
//! holds what it held, no topic was created, no region was created, a damaged record is left as it was.
//!
//! Rows needing a broker use `KAFKA_ENDPOINTS` (set by scripts/test.sh) and fail when it is unset;
//! "unreachable" rows use a loopback port nobody listens on.

use std::collections::BTreeMap;
use std::io::{BufRead, BufReader, Write};
use std::process::{Command, Stdio};
use std::sync::Arc;
use std::time::Duration;

use crate::support::kv_snapshot;
use procedures::{
    LocalManager, ManagerConfig, MemoryStateStore, ProcedureId, ProcedureManager,
    ProcedureManagerRef, ProcedureRecord, ProcedureState,
};
use remote_wal::config::MetasrvConfig;
use remote_wal::datanode::{RegionOpener, WalProviderKind};
use remote_wal::ddl::{
    CreateTableTask, DatanodeManagerRef, DdlContext, DdlManager, MemoryDatanodeManager,
    RaftEngineWalSource, RoundRobinPeerSelector, TableMetadataAllocator, TableMetadataManager,
    TableName,
};
use remote_wal::key::datanode_table::DatanodeTableValue;
use remote_wal::kv::{
    EtcdConfig, EtcdKvBackend, KvBackend, KvBackendRef, KvStateStore, MemoryKvBackend, PutRequest,
    RedbKvBackend,
};
use remote_wal::wal::kafka::admin::TopicAdmin;
use remote_wal::wal::kafka::rskafka_admin::RsKafkaTopicAdmin;
use remote_wal::wal::kafka::testing::FakeTopicAdmin;
use remote_wal::wal::kafka::{KafkaTopicManager, RoundRobinTopicSelector, TopicPoolSpec};
use remote_wal::wal::{BackoffConfig, KafkaConfig, WalConfig, WalOptions};

/// The name config errors give the file.
const ORIGIN: &str = "metasrv.toml";

fn kafka_toml(extra: &str) -> String {
    format!("[wal]\nprovider = \"kafka\"\nbroker_endpoints = [\"127.0.0.1:9092\"]\n{extra}\n")
}

/// Loads `toml` as the config file, expects it refused with exactly `expected`, and checks that the same Kafka
/// section (when it parses) is refused by the topic pool too, with the inner text, before any topic is created or
/// anything is written.
async fn assert_config_refused(toml: &str, expected: &str) {
    let err = MetasrvConfig::from_toml_str(toml, ORIGIN).unwrap_err();
    assert_eq!(err.to_string(), expected);

    let file: toml::Table = toml::from_str(toml).unwrap();
    let wal = file
        .get("wal")
        .map(|w| toml::to_string(w).unwrap())
        .unwrap_or_default();
    if let Ok(WalConfig::Kafka(kafka)) = WalConfig::from_toml_str(&wal) {
        let kv = Arc::new(MemoryKvBackend::new());
        let admin = Arc::new(FakeTopicAdmin::new());
        let err = KafkaTopicManager::from_config(&kafka, kv.clone(), admin.clone()).unwrap_err();
        let inner = expected
            .strip_prefix(&format!("config file '{ORIGIN}': "))
            .unwrap();
        assert_eq!(err.to_string(), inner);
        assert!(admin.topics().is_empty() && admin.create_log().is_empty());
        assert!(kv_snapshot(kv.as_ref()).await.is_empty());
    }
}

#[tokio::test]
async fn illegal_topic_prefix() {
    assert_config_refused(
        &kafka_toml("topic_name_prefix = \"wal topic\""),
        "config file 'metasrv.toml': invalid WAL config: topic_name_prefix = wal topic: character ' ' is not \
         allowed; use only [a-zA-Z0-9._-]",
    )
    .await;
}

#[tokio::test]
async fn dot_in_topic_prefix() {
    assert_config_refused(
        &kafka_toml("topic_name_prefix = \"wal.topic\""),
        "config file 'metasrv.toml': invalid WAL config: topic_name_prefix = wal.topic: must not contain '.': \
         generated names join with '_', and Kafka treats '.' and '_' as the same character in metric names, so \
         names mixing them collide",
    )
    .await;
}

#[tokio::test]
async fn generated_topic_name_over_249_characters() {
    let prefix = "w".repeat(247);
    let longest = format!("{prefix}_63");
    assert_eq!(longest.len(), 250);
    assert_config_refused(
        &kafka_toml(&format!("topic_name_prefix = \"{prefix}\"\nnum_topics = 64")),
        &format!(
            "config file 'metasrv.toml': invalid WAL config: topic_name_prefix = {prefix}: the generated name \
             '{longest}' has 250 characters; Kafka allows at most 249"
        ),
    )
    .await;
}

#[tokio::test]
async fn double_underscore_topic_prefix() {
    assert_config_refused(
        &kafka_toml("topic_name_prefix = \"__wal\""),
        "config file 'metasrv.toml': invalid WAL config: topic_name_prefix = __wal: names starting with '__' are \
         Kafka's internal namespace",
    )
    .await;
}

#[tokio::test]
async fn zero_topics() {
    assert_config_refused(
        &kafka_toml("num_topics = 0"),
        "config file 'metasrv.toml': invalid WAL config: num_topics = 0: the pool needs at least one topic",
    )
    .await;
}

#[tokio::test]
async fn prune_interval_out_of_range() {
    assert_config_refused(
        &kafka_toml("prune_interval = \"500ms\""),
        "config file 'metasrv.toml': invalid WAL config: prune_interval = 500ms: must be 0s (off) or within 1s and \
         7days",
    )
    .await;
}

#[tokio::test]
async fn zero_replication_factor() {
    assert_config_refused(
        &kafka_toml("replication_factor = 0"),
        "config file 'metasrv.toml': invalid WAL config: replication_factor = 0: must be at least 1",
    )
    .await;
}

#[tokio::test]
async fn empty_broker_list() {
    assert_config_refused(
        "[wal]\nprovider = \"kafka\"\nbroker_endpoints = []\n",
        "config file 'metasrv.toml': invalid WAL config: broker_endpoints = []: at least one broker endpoint is \
         needed",
    )
    .await;
}

#[tokio::test]
async fn unknown_config_key() {
    assert_config_refused(
        &kafka_toml("num_topic = 8"),
        "invalid config file 'metasrv.toml', line 4, column 1, key `wal.num_topic`: unknown field `num_topic`, \
         expected one of `provider`, `broker_endpoints`, `num_topics`, `topic_name_prefix`, `num_partitions`, \
         `replication_factor`, `create_topic_timeout`, `selector_type`, `max_concurrent_creates`, \
         `create_batch_size`, `topic_config`, `prune_mode`, `prune_interval`, `security`, `backoff`",
    )
    .await;
}

#[tokio::test]
async fn unknown_config_section() {
    assert_config_refused(
        "[metasrv]\nport = 3002\n",
        "invalid config file 'metasrv.toml', line 1, column 2, key `metasrv`: unknown field `metasrv`, expected \
         one of `metadata_store`, `wal`, `datanodes`, `procedure`, `failover`, `server`, `datanode`",
    )
    .await;
}

#[tokio::test]
async fn bad_duration() {
    assert_config_refused(
        &kafka_toml("create_topic_timeout = \"30 parsecs\""),
        "invalid config file 'metasrv.toml', line 4, column 24, key `wal.create_topic_timeout`: invalid value: \
         string \"30 parsecs\", expected a duration",
    )
    .await;
}

/// A loopback port nobody listens on: bound, then released.
fn closed_port() -> u16 {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    listener.local_addr().unwrap().port()
}

#[tokio::test]
async fn unreachable_broker() {
    let endpoint = format!("127.0.0.1:{}", closed_port());
    let config = KafkaConfig {
        broker_endpoints: vec![endpoint.clone()],
        backoff: BackoffConfig {
            init: Duration::from_millis(50),
            max: Duration::from_millis(200),
            base: 2.0,
            deadline: Duration::from_secs(1),
        },
        ..KafkaConfig::default()
    };
    let err = RsKafkaTopicAdmin::connect(&config).await.unwrap_err();
    assert_eq!(
        err.to_string(),
        format!(
            "cannot connect to Kafka brokers [\"{endpoint}\"]: Connection error: all retries failed: Retry \
             exceeded deadline. Source: error connecting to broker \"{endpoint}\": IO Error: Connection refused \
             (os error 111)"
        )
    );
}

#[tokio::test]
async fn unreachable_etcd() {
    let endpoint = format!("127.0.0.1:{}", closed_port());
    let config = EtcdConfig {
        connect_timeout: Duration::from_secs(1),
        ..EtcdConfig::new([endpoint.clone()])
    };
    let err = EtcdKvBackend::connect(config).await.unwrap_err();
    assert_eq!(
        err.to_string(),
        format!(
            "cannot connect to etcd at {endpoint}: unavailable: tcp connect error (Connection refused \
             (os error 111))"
        )
    );
}

/// Replication factor 7, above the broker count of the test cluster (1, or 3): the bootstrap fails with Kafka's
/// INVALID_REPLICATION_FACTOR, and neither a topic nor a name is left behind.
#[tokio::test]
async fn replication_factor_above_broker_count() {
    let endpoints = std::env::var("KAFKA_ENDPOINTS").expect(
        "KAFKA_ENDPOINTS is not set: this test needs a Kafka broker (run through scripts/test.sh, which starts one)",
    );
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .subsec_nanos();
    let prefix = format!("bad_rf_{}_{nanos}", std::process::id());
    let config = KafkaConfig {
        broker_endpoints: endpoints.split(',').map(str::to_string).collect(),
        topic_name_prefix: prefix.clone(),
        num_topics: 1,
        replication_factor: 7,
        ..KafkaConfig::default()
    };
    let admin = Arc::new(RsKafkaTopicAdmin::connect(&config).await.unwrap());
    let kv = Arc::new(MemoryKvBackend::new());
    let topics = KafkaTopicManager::from_config(&config, kv.clone(), admin.clone()).unwrap();
    let manager: ProcedureManagerRef = Arc::new(LocalManager::new(
        Arc::new(MemoryStateStore::new()),
        ManagerConfig::default(),
    ));
    topics.register_loader(manager.as_ref()).unwrap();
    manager.start().await.unwrap();
    let err = topics.start(&manager).await.unwrap_err().to_string();
    // The tail is the broker's message; only the broker count in it depends on the cluster.
    let head = format!(
        "bootstrap of Kafka topic pool '{prefix}' failed: procedure topic_bootstrap/{prefix} failed: Kafka rejected \
         replication factor 7 for topic '{prefix}_0' (INVALID_REPLICATION_FACTOR): Unable to replicate the partition \
         7 time(s): The target replication factor of 7 cannot be reached because only "
    );
    let count = err
        .strip_prefix(&head)
        .and_then(|rest| rest.strip_suffix(" broker(s) are registered."))
        .unwrap_or_else(|| panic!("{err}"));
    assert!(count.parse::<u32>().is_ok_and(|n| n < 7), "{err}");
    let listed = admin.list_topics().await.unwrap();
    assert!(!listed.keys().any(|t| t.starts_with(&prefix)), "{listed:?}");
    assert!(kv_snapshot(kv.as_ref()).await.is_empty());
    manager.stop().await.unwrap();
}

const REDB_HOLDER: &str = "BAD_INPUT_REDB_HOLDER";

/// The redb file held by another process: opening it is refused naming the file, and the file is left as it was.
/// The other process is this test binary run again as the holder (it opens the file, says so, and holds it until
/// its stdin closes).
#[test]
fn redb_file_locked_by_another_process() {
    if let Ok(path) = std::env::var(REDB_HOLDER) {
        let _db = RedbKvBackend::open(&path).unwrap();
        println!("\nHOLDING {path}");
        std::io::stdout().flush().unwrap();
        let mut line = String::new();
        let _ = std::io::stdin().read_line(&mut line);
        return;
    }
    let rt = tokio::runtime::Runtime::new().unwrap();
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("metadata.redb");
    {
        let db = RedbKvBackend::open(&path).unwrap();
        rt.block_on(db.put(PutRequest {
            key: b"__table_name/greptime/public/cpu".to_vec(),
            value: br#"{"table_id":1024}"#.to_vec(),
            prev_kv: false,
        }))
        .unwrap();
    }
    let mut holder = Command::new(std::env::current_exe().unwrap())
        .args([
            "--exact",
            "bad_input::redb_file_locked_by_another_process",
            "--nocapture",
            "--test-threads=1",
        ])
        .env(REDB_HOLDER, &path)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let mut out = BufReader::new(holder.stdout.take().unwrap());
    let mut line = String::new();
    loop {
        line.clear();
        assert!(
            out.read_line(&mut line).unwrap() > 0,
            "the holder process exited without holding the file"
        );
        if line.starts_with("HOLDING") {
            break;
        }
    }
    // (The holder's open itself writes to the file; what matters is that the refused open below does not.)
    let before = std::fs::read(&path).unwrap();

    let err = RedbKvBackend::open(&path).unwrap_err();
    assert_eq!(
        err.to_string(),
        format!(
            "redb metadata store '{}' is already open in another process or handle; only one may hold it",
            path.display()
        )
    );
    assert!(
        std::fs::read(&path).unwrap() == before,
        "the refused open changed the file"
    );

    drop(holder.stdin.take());
    assert!(holder.wait().unwrap().success());
    // Once the holder is gone the file opens, with its contents intact.
    let db = RedbKvBackend::open(&path).unwrap();
    let got = rt
        .block_on(db.get(b"__table_name/greptime/public/cpu"))
        .unwrap()
        .unwrap();
    assert_eq!(got.value, br#"{"table_id":1024}"#.to_vec());
}

/// A manager over a kv-backed state store in which `key` (a store key, e.g. `proc/x`) holds `value`.
async fn manager_over_record(key: &str, value: &[u8]) -> (Arc<MemoryKvBackend>, LocalManager) {
    let kv = Arc::new(MemoryKvBackend::new());
    kv.put(PutRequest {
        key: format!("__procedure__/{key}").into_bytes(),
        value: value.to_vec(),
        prev_kv: false,
    })
    .await
    .unwrap();
    let manager = LocalManager::new(
        Arc::new(KvStateStore::new(kv.clone())),
        ManagerConfig::default(),
    );
    (kv, manager)
}

/// Every pair but the manager's epoch claim (the one write a starting manager makes).
async fn without_epoch(kv: &dyn KvBackend) -> Vec<(Vec<u8>, Vec<u8>)> {
    kv_snapshot(kv)
        .await
        .into_iter()
        .filter(|(k, _)| k != b"__procedure__/epoch")
        .collect()
}

#[tokio::test]
async fn corrupt_json_under_a_procedure_key() {
    let damaged = br#"{"format_version":1,"type_name":"#;
    let (kv, manager) = manager_over_record("proc/broken-1", damaged).await;
    let before = kv_snapshot(kv.as_ref()).await;
    manager.start().await.unwrap();
    let id = ProcedureId::new("broken-1");
    let info = manager.procedure_state(&id).await.unwrap().unwrap();
    assert_eq!(info.state, ProcedureState::Failed);
    let expected = "procedure broken-1 (type 'unknown', key 'proc/broken-1') cannot be recovered: the record \
                    envelope does not parse: EOF while parsing a value at line 1 column 32";
    assert_eq!(info.error.as_deref(), Some(expected));
    let err = manager
        .watch(&id)
        .await
        .unwrap()
        .unwrap()
        .wait()
        .await
        .unwrap_err();
    assert_eq!(
        err.to_string(),
        format!("procedure broken-1 failed: {expected}")
    );
    manager.stop().await.unwrap();
    // The damaged record is left as it was, for an operator to look at.
    assert_eq!(without_epoch(kv.as_ref()).await, before);
}

#[tokio::test]
async fn unknown_procedure_type() {
    let record = ProcedureRecord {
        format_version: 1,
        type_name: "remote_wal::DropTable".to_string(),
        id: ProcedureId::new("drop-7"),
        parent_id: None,
        step: 2,
        state: ProcedureState::Running,
        data: serde_json::json!({"table": "cpu"}),
        output: None,
        error: None,
        created_at_ms: 1,
        updated_at_ms: 2,
        step_name: None,
        lock_keys: Vec::new(),
        events: Vec::new(),
        waiting_for: Vec::new(),
    };
    let (kv, manager) =
        manager_over_record("proc/drop-7", &serde_json::to_vec(&record).unwrap()).await;
    let before = kv_snapshot(kv.as_ref()).await;
    manager.start().await.unwrap();
    let id = ProcedureId::new("drop-7");
    let info = manager.procedure_state(&id).await.unwrap().unwrap();
    // Stalled, not failed: a manager with the loader resumes it.
    assert_eq!(info.state, ProcedureState::Stalled);
    let expected = "procedure drop-7 (type 'remote_wal::DropTable', key 'proc/drop-7') cannot be recovered: no \
                    loader is registered for type 'remote_wal::DropTable'";
    assert_eq!(info.error.as_deref(), Some(expected));
    let err = manager
        .watch(&id)
        .await
        .unwrap()
        .unwrap()
        .wait()
        .await
        .unwrap_err();
    assert_eq!(
        err.to_string(),
        format!("procedure drop-7 is stalled: {expected}")
    );
    manager.stop().await.unwrap();
    assert_eq!(without_epoch(kv.as_ref()).await, before);
}

fn dn_value(table_id: u32, wal: &[(u32, &str)]) -> Vec<u8> {
    serde_json::to_vec(&DatanodeTableValue {
        table_id,
        regions: wal.iter().map(|(n, _)| *n).collect(),
        engine: "mito".to_string(),
        region_storage_path: "greptime/public".to_string(),
        region_options: BTreeMap::new(),
        region_wal_options: wal.iter().map(|(n, w)| (*n, w.to_string())).collect(),
        version: 0,
    })
    .unwrap()
}

async fn put(kv: &dyn KvBackend, key: &str, value: Vec<u8>) {
    kv.put(PutRequest {
        key: key.as_bytes().to_vec(),
        value,
        prev_kv: false,
    })
    .await
    .unwrap();
}

const RAFT: &str = r#"{"wal.provider":"raft_engine"}"#;

#[tokio::test]
async fn corrupt_datanode_table_value() {
    let kv = Arc::new(MemoryKvBackend::new());
    put(
        kv.as_ref(),
        "__dn_table/1/1024",
        br#"{"table_id":1024,"regions":[0,1]"#.to_vec(),
    )
    .await;
    put(
        kv.as_ref(),
        "__dn_table/1/1025",
        dn_value(1025, &[(0, RAFT)]),
    )
    .await;
    let before = kv_snapshot(kv.as_ref()).await;

    let open = RegionOpener::new(kv.clone(), 1, WalProviderKind::RaftEngine)
        .open_regions()
        .await
        .unwrap();
    // The other table's region still opens.
    let opened: Vec<u64> = open.requests.iter().map(|r| r.region_id).collect();
    assert_eq!(opened, vec![(1025u64 << 32)]);
    assert_eq!(open.errors.len(), 1);
    assert_eq!(open.errors[0].key, "__dn_table/1/1024");
    assert_eq!(open.errors[0].region_id, None);
    assert_eq!(
        open.errors[0].error.to_string(),
        "datanode table key '__dn_table/1/1024': value does not decode: EOF while parsing an object at line 1 \
         column 32"
    );
    assert_eq!(kv_snapshot(kv.as_ref()).await, before);
}

#[tokio::test]
async fn unknown_wal_provider_in_encoded_options() {
    let pulsar = r#"{"wal.provider":"pulsar"}"#;
    let decoded = WalOptions::decode(pulsar).unwrap_err();
    let decode_text = "invalid encoded WAL options '{\"wal.provider\":\"pulsar\"}': unknown variant `pulsar`, \
                       expected one of `raft_engine`, `kafka`, `noop` at line 1 column 24";
    assert_eq!(decoded.to_string(), decode_text);

    let kv = Arc::new(MemoryKvBackend::new());
    put(
        kv.as_ref(),
        "__dn_table/1/1024",
        dn_value(1024, &[(0, RAFT), (1, pulsar)]),
    )
    .await;
    let before = kv_snapshot(kv.as_ref()).await;
    let open = RegionOpener::new(kv.clone(), 1, WalProviderKind::RaftEngine)
        .open_regions()
        .await
        .unwrap();
    let opened: Vec<u64> = open.requests.iter().map(|r| r.region_id).collect();
    assert_eq!(opened, vec![(1024u64 << 32)]);
    assert_eq!(open.errors.len(), 1);
    assert_eq!(open.errors[0].region_id, Some((1024u64 << 32) | 1));
    assert_eq!(
        open.errors[0].error.to_string(),
        format!(
            "datanode table key '__dn_table/1/1024', region 1 (region id 4398046511105): {decode_text}"
        )
    );
    assert_eq!(kv_snapshot(kv.as_ref()).await, before);
}

#[tokio::test]
async fn wal_provider_mismatch_on_the_datanode() {
    let kv = Arc::new(MemoryKvBackend::new());
    put(
        kv.as_ref(),
        "__dn_table/1/1024",
        dn_value(1024, &[(0, RAFT)]),
    )
    .await;
    let before = kv_snapshot(kv.as_ref()).await;
    let open = RegionOpener::new(kv.clone(), 1, WalProviderKind::Kafka)
        .open_regions()
        .await
        .unwrap();
    assert!(open.requests.is_empty());
    assert_eq!(open.errors.len(), 1);
    assert_eq!(
        open.errors[0].error.to_string(),
        "datanode table key '__dn_table/1/1024', region 0 (region id 4398046511104): WAL provider is \
         'raft_engine' but this datanode is configured for 'kafka'"
    );
    assert_eq!(kv_snapshot(kv.as_ref()).await, before);
}

/// A started DDL manager on a memory kv (table metadata) with its procedure state in a separate store, raft-engine
/// WAL, datanodes 1 and 2.
struct Ddl {
    kv: Arc<MemoryKvBackend>,
    datanodes: Arc<MemoryDatanodeManager>,
    ddl: DdlManager,
}

async fn ddl() -> Ddl {
    let kv = Arc::new(MemoryKvBackend::new());
    let datanodes = Arc::new(MemoryDatanodeManager::new());
    let manager: ProcedureManagerRef = Arc::new(LocalManager::new(
        Arc::new(KvStateStore::new(Arc::new(MemoryKvBackend::new()))),
        ManagerConfig::default(),
    ));
    let kv_ref: KvBackendRef = kv.clone();
    let dns: DatanodeManagerRef = datanodes.clone();
    let ddl = DdlManager::new(
        manager.clone(),
        DdlContext {
            metadata: Arc::new(TableMetadataManager::new(kv_ref.clone())),
            allocator: Arc::new(TableMetadataAllocator::new(
                kv_ref,
                Arc::new(RoundRobinPeerSelector::new(vec![1, 2])),
                Arc::new(RaftEngineWalSource),
            )),
            datanodes: dns,
        },
    );
    ddl.register_loaders().unwrap();
    manager.start().await.unwrap();
    Ddl { kv, datanodes, ddl }
}

/// Runs `task` through the DDL manager, expecting it refused with `reason` (after the engine's
/// `create table {table}: procedure {id} failed: `), and nothing written or created.
async fn assert_create_refused(d: &Ddl, task: CreateTableTask, reason: &str) {
    let before = kv_snapshot(d.kv.as_ref()).await;
    let table = task.name.to_string();
    let err = d.ddl.create_table(task).await.unwrap_err().to_string();
    let head = format!("create table {table}: procedure ");
    let (id, rest) = err
        .strip_prefix(&head)
        .and_then(|r| r.split_once(' '))
        .unwrap_or_else(|| panic!("{err}"));
    assert!(!id.is_empty(), "{err}");
    assert_eq!(rest, format!("failed: {reason}"), "{err}");
    assert_eq!(kv_snapshot(d.kv.as_ref()).await, before);
}

#[tokio::test]
async fn table_name_with_illegal_characters() {
    let d = ddl().await;
    assert_create_refused(
        &d,
        CreateTableTask::new(TableName::new("greptime", "public", "cpu load"), 2),
        "invalid table name 'cpu load': character ' ' is not allowed (only [a-zA-Z0-9_-])",
    )
    .await;
    assert!(d.datanodes.regions().is_empty());

    // On the command line: a table reference is `table`, `schema.table` or `catalog.schema.table`.
    let err = remote_wal::metasrv::parse_table_name("a.b.c.d").unwrap_err();
    assert_eq!(
        err.to_string(),
        "invalid table name 'a.b.c.d': 4 dot-separated parts; expected table, schema.table or catalog.schema.table"
    );
    let err = remote_wal::metasrv::parse_table_name("cpu/load").unwrap_err();
    assert_eq!(
        err.to_string(),
        "invalid table name 'cpu/load': character '/' is not allowed (only \
         [a-zA-Z0-9_-])"
    );
}

#[tokio::test]
async fn region_count_zero() {
    // Refused by the library before a procedure is submitted: no `procedure <id> failed` prefix, no record written.
    let d = ddl().await;
    let before = kv_snapshot(d.kv.as_ref()).await;
    let err = d
        .ddl
        .create_table(CreateTableTask::new(
            TableName::new("greptime", "public", "cpu"),
            0,
        ))
        .await
        .unwrap_err();
    assert_eq!(
        err.to_string(),
        "invalid create-table request for table greptime.public.cpu: num_regions = 0: a table has 1 to 1024 regions"
    );
    assert_eq!(kv_snapshot(d.kv.as_ref()).await, before);
    assert!(d.datanodes.regions().is_empty());
}

#[tokio::test]
async fn reserved_wal_options_table_option() {
    let d = ddl().await;
    let mut task = CreateTableTask::new(TableName::new("greptime", "public", "cpu"), 1);
    task.options
        .insert("wal_options".to_string(), RAFT.to_string());
    assert_create_refused(
        &d,
        task,
        "invalid create-table request for table greptime.public.cpu: option 'wal_options' is reserved: WAL \
         options are allocated per region",
    )
    .await;
    assert!(d.datanodes.regions().is_empty());
}

#[tokio::test]
async fn recreate_an_existing_table() {
    let d = ddl().await;
    let name = TableName::new("greptime", "public", "cpu");
    let id = d
        .ddl
        .create_table(CreateTableTask::new(name.clone(), 2))
        .await
        .unwrap();
    let regions = d.datanodes.regions();
    assert_create_refused(
        &d,
        CreateTableTask::new(name.clone(), 3),
        &format!("table greptime.public.cpu already exists (table id {id})"),
    )
    .await;
    assert_eq!(d.datanodes.regions(), regions);
}

/// Allocating WAL options from a Kafka pool whose bootstrap has not run is an error, never a fallback.
#[tokio::test]
async fn allocation_before_the_pool_is_ready() {
    let kv = Arc::new(MemoryKvBackend::new());
    let admin = Arc::new(FakeTopicAdmin::new());
    let topics = KafkaTopicManager::new(
        TopicPoolSpec::new("wal_pool", 4),
        kv.clone(),
        admin.clone(),
        Arc::new(RoundRobinTopicSelector::new()),
    )
    .unwrap();
    let err = topics.alloc_batch(2).unwrap_err();
    assert_eq!(
        err.to_string(),
        "Kafka topic pool 'wal_pool' is not ready: the topic bootstrap has not completed (call start first)"
    );
    assert!(admin.create_log().is_empty());
    assert!(kv_snapshot(kv.as_ref()).await.is_empty());
}

/// A pool topic created out of band with another partition count: the bootstrap fails naming it, persists no name
/// and creates no other topic's duplicate.
#[tokio::test]
async fn pool_topic_exists_with_other_partition_count() {
    let kv = Arc::new(MemoryKvBackend::new());
    let admin = Arc::new(FakeTopicAdmin::new());
    admin.create_out_of_band("wal_pool_0", 3);
    let mut spec = TopicPoolSpec::new("wal_pool", 1);
    spec.max_concurrent_creates = 1;
    let topics = KafkaTopicManager::new(
        spec,
        kv.clone(),
        admin.clone(),
        Arc::new(RoundRobinTopicSelector::new()),
    )
    .unwrap();
    let manager: ProcedureManagerRef = Arc::new(LocalManager::new(
        Arc::new(MemoryStateStore::new()),
        ManagerConfig::default(),
    ));
    topics.register_loader(manager.as_ref()).unwrap();
    manager.start().await.unwrap();
    let err = topics.start(&manager).await.unwrap_err();
    assert_eq!(
        err.to_string(),
        "bootstrap of Kafka topic pool 'wal_pool' failed: procedure topic_bootstrap/wal_pool failed: Kafka \
         topic 'wal_pool_0' has 3 partitions but the pool needs 1; delete or fix it, or change the pool's prefix"
    );
    assert_eq!(admin.topics()["wal_pool_0"].partitions, 3);
    assert_eq!(admin.topics().len(), 1);
    assert!(kv_snapshot(kv.as_ref()).await.is_empty());
    manager.stop().await.unwrap();
}
