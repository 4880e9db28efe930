//! Our topic pool bootstrap against Kafka's own Java AdminClient, on the real broker (`KAFKA_ENDPOINTS`) and etcd
//! (`ETCD_ENDPOINTS`), in the same run. Not part of the test command; run it with
//!
//! ```text
//! KAFKA_ENDPOINTS=… ETCD_ENDPOINTS=… cargo bench --bench bootstrap_vs_adminclient
//! ```
//!
//! For N = 256, 1,024 and 4,096 topics (or the counts in `BENCH_SIZES`, e.g. `BENCH_SIZES=1024`) it times, twice
//! (anchor first, then ours first, each on topics of its own):
//! - **ours**: a `TopicBootstrapProcedure` run by the procedure engine, its records and the topic names on etcd
//!   (under a fresh key prefix), creating through `RsKafkaTopicAdmin` (batched CreateTopics of `[wal]
//!   create_batch_size` topics, `BENCH_CREATE_BATCH_SIZE` or the default): from the submission to the procedure's
//!   end, names persisted included; and, for information, until the broker lists every topic;
//! - **anchor**: `benches/java/CreateTopicsAnchor.java` creating N other topics in one `createTopics` call (compiled
//!   here with `javac` against the jars `scripts/services.sh install` puts in `target/kafka-libs`, or `KAFKA_LIBS`),
//!   timed inside the JVM from the call to every future completing (the controller acknowledged), and to
//!   `describeTopics` finding every topic (the broker lists them).
//!
//! Between the phases the broker is left idle: the anchor's topics are listed, then deleted and gone from the
//! listing, and ours are listed, before the next phase starts, so neither waits behind the other's backlog.
//!
//! Then **resume**: the 4,096-topic pool's bootstrap resumed after a crash before PersistNames (every topic exists,
//! no name persisted, a fresh etcd prefix): one metadata read plus persisting the names; and the same resume once
//! every name is persisted (one metadata read and one range read of the names). It prints a table with the
//! ratios and deletes every topic and etcd key it made (each size's topics once measured, in requests of 500).
//! Against a secure broker, `WAL_SECURITY_TOML=FILE` names a file with a `[wal.security]` table (a walctl config
//! will do): ours connects with it, and the anchor with the same settings as Java client properties
//! (`target/bench-java/client.properties`, mode 0600, passed as `ANCHOR_CLIENT_CONFIG`).
//! `BENCH_TRACE=1` (or `=debug`) prints the bootstrap's info (or debug) logs with timestamps on stderr (each
//! phase's duration).

use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::{Arc, OnceLock};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use procedures::{LocalManager, ManagerConfig, ProcedureManager, ProcedureWithId};
use remote_wal::kv::NamespacedKvBackend;
use remote_wal::kv::{EtcdConfig, EtcdKvBackend, KvBackendRef, KvStateStore};
use remote_wal::wal::KafkaConfig;
use remote_wal::wal::kafka::TopicPoolSpec;
use remote_wal::wal::kafka::admin::TopicAdminRef;
use remote_wal::wal::kafka::bootstrap::{
    BootstrapStep, TopicBootstrapData, TopicBootstrapProcedure, bootstrap_procedure_id,
};
use remote_wal::wal::kafka::java_client::write_java_client_properties;
use remote_wal::wal::kafka::rskafka_admin::RsKafkaTopicAdmin;
use remote_wal::wal::kafka::security::KafkaSecurityConfig;

/// The pool sizes measured when `BENCH_SIZES` (comma-separated topic counts) is not set.
const SIZES: [usize; 3] = [256, 1_024, 4_096];

/// The sizes to measure: `BENCH_SIZES`, or [`SIZES`]. The resume runs on the largest.
fn sizes() -> Vec<usize> {
    match std::env::var("BENCH_SIZES") {
        Ok(raw) => {
            let sizes: Vec<usize> = raw
                .split(',')
                .map(|n| {
                    n.trim()
                        .parse()
                        .expect("BENCH_SIZES holds comma-separated topic counts")
                })
                .collect();
            assert!(!sizes.is_empty(), "BENCH_SIZES is empty");
            sizes
        }
        Err(_) if smoke() => vec![16],
        Err(_) => SIZES.to_vec(),
    }
}

fn endpoints(var: &str, what: &str) -> Vec<String> {
    let raw = std::env::var(var).unwrap_or_default();
    let endpoints: Vec<String> = raw
        .split(',')
        .map(str::trim)
        .filter(|e| !e.is_empty())
        .map(String::from)
        .collect();
    assert!(
        !endpoints.is_empty(),
        "{var} is not set: this bench needs {what} (comma-separated host:port)"
    );
    endpoints
}

/// Which phase of a size runs first.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Order {
    AnchorFirst,
    OursFirst,
}

impl Order {
    /// The part of the topic names of this order's phases.
    fn tag(self) -> &'static str {
        match self {
            Order::AnchorFirst => "a",
            Order::OursFirst => "o",
        }
    }

    /// The table's label.
    fn label(self) -> &'static str {
        match self {
            Order::AnchorFirst => "anchor first",
            Order::OursFirst => "ours first",
        }
    }
}

/// `[wal] create_batch_size` of our bootstrap: `BENCH_CREATE_BATCH_SIZE`, or the default.
fn create_batch_size() -> usize {
    std::env::var("BENCH_CREATE_BATCH_SIZE").map_or(
        KafkaConfig::default().create_batch_size,
        |raw| {
            raw.trim()
                .parse()
                .expect("BENCH_CREATE_BATCH_SIZE holds a topic count")
        },
    )
}

/// A name part no earlier run used.
fn run_id() -> String {
    let nanos = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .expect("clock")
        .as_nanos();
    format!("{:x}", nanos % (1 << 48))
}

/// Compiles the anchor program into `target/bench-java`; the classpath to run it with.
fn compile_anchor() -> String {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let libs = std::env::var("KAFKA_LIBS")
        .map(PathBuf::from)
        .unwrap_or_else(|_| root.join("target/kafka-libs"));
    assert!(
        libs.is_dir(),
        "no Kafka jars in {} (run scripts/services.sh install, or set KAFKA_LIBS)",
        libs.display()
    );
    let classes = root.join("target/bench-java");
    std::fs::create_dir_all(&classes).expect("create target/bench-java");
    let jars = format!("{}/*", libs.display());
    let status = Command::new("javac")
        .arg("-cp")
        .arg(&jars)
        .arg("-d")
        .arg(&classes)
        .arg(root.join("benches/java/CreateTopicsAnchor.java"))
        .status()
        .expect("run javac (a JDK is needed)");
    assert!(status.success(), "javac failed: {status}");
    format!("{jars}:{}", classes.display())
}

/// `[wal.security]` from the file `WAL_SECURITY_TOML` names (none when unset), and the Java client properties the
/// anchor connects with, written from it.
fn security() -> &'static (KafkaSecurityConfig, Option<PathBuf>) {
    static SECURITY: OnceLock<(KafkaSecurityConfig, Option<PathBuf>)> = OnceLock::new();
    SECURITY.get_or_init(|| {
        let Some(file) = std::env::var_os("WAL_SECURITY_TOML").filter(|f| !f.is_empty()) else {
            return (KafkaSecurityConfig::default(), None);
        };
        let security =
            KafkaSecurityConfig::from_toml_file(Path::new(&file)).expect("WAL_SECURITY_TOML");
        let root = Path::new(env!("CARGO_MANIFEST_DIR"));
        let properties = root.join("target/bench-java/client.properties");
        write_java_client_properties(&security, &properties).expect("write client.properties");
        (security, Some(properties))
    })
}

/// Runs the anchor program; its one line of output.
fn anchor(classpath: &str, args: &[&str]) -> String {
    let mut java = Command::new("java");
    if let Some(properties) = &security().1 {
        java.env("ANCHOR_CLIENT_CONFIG", properties);
    }
    let out = java
        .arg("-cp")
        .arg(classpath)
        .arg("CreateTopicsAnchor")
        .args(args)
        .output()
        .expect("run java");
    assert!(
        out.status.success(),
        "CreateTopicsAnchor {args:?} failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).trim().to_string()
}

/// The engine, its records and the names under `namespace` of `etcd`.
struct Store {
    kv: KvBackendRef,
    manager: Arc<LocalManager>,
}

async fn store(etcd: &KvBackendRef, namespace: &str, admin: &TopicAdminRef) -> Store {
    let kv: KvBackendRef = Arc::new(NamespacedKvBackend::new(
        etcd.clone(),
        namespace.as_bytes().to_vec(),
    ));
    let manager = Arc::new(LocalManager::new(
        Arc::new(KvStateStore::new(kv.clone())),
        ManagerConfig::default(),
    ));
    manager
        .register_loader(
            TopicBootstrapProcedure::TYPE_NAME,
            TopicBootstrapProcedure::loader(kv.clone(), admin.clone()),
        )
        .expect("register the loader");
    manager.start().await.expect("start the engine");
    Store { kv, manager }
}

/// Submits `procedure` and waits for it; the time from submission to its end.
async fn run(
    store: &Store,
    prefix: &str,
    attempt: u32,
    procedure: TopicBootstrapProcedure,
) -> Duration {
    let started = Instant::now();
    store
        .manager
        .submit(ProcedureWithId::new(
            bootstrap_procedure_id(prefix, attempt),
            Box::new(procedure),
        ))
        .await
        .expect("submit")
        .wait()
        .await
        .expect("the bootstrap");
    started.elapsed()
}

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1000.0
}

/// Whether this run is `cargo test --benches` (the test command runs every bench once, at its smallest, so a
/// broken bench fails CI) rather than `cargo bench`, which passes `--bench`.
fn smoke() -> bool {
    !std::env::args().any(|a| a == "--bench")
}

fn main() {
    // BENCH_TRACE=1 (or =debug) prints the bootstrap's and the engine's info (or debug) logs, timestamped, on
    // stderr: how long each phase (metadata read, creates, each step) took.
    if let Some(trace) = std::env::var_os("BENCH_TRACE") {
        let level = if trace == "debug" {
            tracing::Level::DEBUG
        } else {
            tracing::Level::INFO
        };
        tracing_subscriber::fmt()
            .with_max_level(level)
            .with_writer(std::io::stderr)
            .init();
    }
    let sizes = sizes();
    let largest_size = sizes.iter().copied().max().unwrap_or_default();
    let brokers = endpoints("KAFKA_ENDPOINTS", "a running Kafka broker");
    let etcd_endpoints = endpoints("ETCD_ENDPOINTS", "a running etcd");
    let classpath = compile_anchor();
    // Fails before anything is measured when WAL_SECURITY_TOML is bad.
    security();
    let run_id = run_id();
    let rt = tokio::runtime::Runtime::new().expect("runtime");
    let etcd: KvBackendRef = Arc::new(
        rt.block_on(EtcdKvBackend::connect(EtcdConfig {
            endpoints: etcd_endpoints,
            ..EtcdConfig::default()
        }))
        .expect("etcd at ETCD_ENDPOINTS is unreachable"),
    );
    let brokers_list = brokers.join(",");
    let batch_size = create_batch_size();
    let mut prefixes = Vec::new();
    let mut namespaces = Vec::new();
    let mut rows = Vec::new();
    let mut largest: Option<(KafkaConfig, TopicAdminRef)> = None;
    for &n in &sizes {
        for order in [Order::AnchorFirst, Order::OursFirst] {
            let anchor_prefix = format!("rw_anchor_{run_id}_{n}_{}", order.tag());
            let prefix = format!("rw_ours_{run_id}_{n}_{}", order.tag());
            prefixes.push(anchor_prefix.clone());
            prefixes.push(prefix.clone());
            // The largest pool of ours, made last, stays for the resume.
            let keep = n == largest_size && order == Order::OursFirst;
            let config = KafkaConfig {
                broker_endpoints: brokers.clone(),
                num_topics: n,
                topic_name_prefix: prefix.clone(),
                create_batch_size: batch_size,
                security: Box::new(security().0.clone()),
                ..KafkaConfig::default()
            };
            let anchor_phase = || {
                // The anchor's figures are taken once the broker lists all of its topics; then they are deleted
                // and the broker is waited for until it lists none of them, so the next phase starts on an idle
                // broker.
                let figures = anchor(
                    &classpath,
                    &["create", &brokers_list, &anchor_prefix, &n.to_string()],
                );
                let figures: Vec<f64> = figures
                    .split_whitespace()
                    .map(|f| f.parse().expect("the anchor prints milliseconds"))
                    .collect();
                let [acked_ms, listed_ms] = figures[..] else {
                    panic!("the anchor prints two figures, got {figures:?}");
                };
                anchor(&classpath, &["delete", &brokers_list, &anchor_prefix]);
                (acked_ms, listed_ms)
            };
            let mut ours_phase = || {
                rt.block_on(async {
                    let admin: TopicAdminRef = Arc::new(
                        RsKafkaTopicAdmin::connect(&config)
                            .await
                            .expect("Kafka at KAFKA_ENDPOINTS is unreachable"),
                    );
                    let namespace = format!("rw-bench-{run_id}-{n}-{}/", order.tag());
                    namespaces.push(namespace.clone());
                    let store = store(&etcd, &namespace, &admin).await;
                    let spec = TopicPoolSpec::from_config(&config);
                    let procedure =
                        TopicBootstrapProcedure::new(spec.clone(), store.kv.clone(), admin.clone())
                            .expect("spec");
                    let started = Instant::now();
                    let took = run(&store, &prefix, 0, procedure).await;
                    store.manager.stop().await.expect("stop the engine");
                    // Not part of the figure: until the broker lists every topic (its backlog is done).
                    let names = spec.topic_names();
                    loop {
                        let listed = admin.describe_topics(&names).await.expect("metadata");
                        if listed.len() == names.len() {
                            break;
                        }
                        tokio::time::sleep(Duration::from_millis(10)).await;
                    }
                    let listed = started.elapsed();
                    if keep {
                        largest = Some((config.clone(), admin));
                    }
                    (took, listed)
                })
            };
            let ((ours, ours_listed), (acked_ms, listed_ms)) = match order {
                Order::AnchorFirst => {
                    let anchor = anchor_phase();
                    (ours_phase(), anchor)
                }
                Order::OursFirst => {
                    let ours = ours_phase();
                    (ours, anchor_phase())
                }
            };
            rows.push((n, order, ms(ours), ms(ours_listed), acked_ms, listed_ms));
            // Each topic is a partition directory and open files on the broker: drop ours unless kept.
            if !keep {
                anchor(&classpath, &["delete", &brokers_list, prefix.as_str()]);
            }
        }
    }

    // Resume after a crash before PersistNames, every topic of the largest pool existing, nothing persisted.
    let (config, admin) = largest.expect("a pool was bootstrapped");
    let (resume, complete) = rt.block_on(async {
        let namespace = format!("rw-bench-{run_id}-resume/");
        namespaces.push(namespace.clone());
        let store = store(&etcd, &namespace, &admin).await;
        let at_create_missing = || TopicBootstrapData {
            step: BootstrapStep::CreateMissing,
            spec: TopicPoolSpec::from_config(&config),
            persisted_below: 0,
        };
        let procedure = TopicBootstrapProcedure::from_data(
            at_create_missing(),
            store.kv.clone(),
            admin.clone(),
        );
        let resume = run(&store, &config.topic_name_prefix, 0, procedure).await;
        // Then the same crash once every name is persisted (before the record said so): one metadata read and one
        // range read of the names, nothing written but the engine's records.
        let procedure = TopicBootstrapProcedure::from_data(
            at_create_missing(),
            store.kv.clone(),
            admin.clone(),
        );
        let complete = run(&store, &config.topic_name_prefix, 1, procedure).await;
        store.manager.stop().await.expect("stop the engine");
        (resume, complete)
    });

    println!();
    println!("create_batch_size = {batch_size}");
    println!(
        "| topics | order | ours (bootstrap, names on etcd) | AdminClient createTopics acknowledged | ours / \
         acknowledged | AdminClient createTopics + every topic listed | ours / listed | ours + every topic listed |"
    );
    println!("|---|---|---|---|---|---|---|---|");
    for (n, order, ours, ours_listed, acked, listed) in &rows {
        println!(
            "| {n} | {} | {ours:.0} ms | {acked:.0} ms | {:.2}x | {listed:.0} ms | {:.2}x | {ours_listed:.0} ms |",
            order.label(),
            ours / acked,
            ours / listed
        );
    }
    println!(
        "| resume, {} existing, none persisted | | {:.0} ms | | | | | |",
        config.num_topics,
        ms(resume)
    );
    println!(
        "| resume, {} existing, all persisted | | {:.0} ms | | | | | |",
        config.num_topics,
        ms(complete)
    );

    // Leave the broker and etcd as found.
    let mut args = vec!["delete".to_string(), brokers.join(",")];
    args.extend(prefixes);
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let deleted = anchor(&classpath, &args);
    rt.block_on(async {
        for namespace in &namespaces {
            let start = namespace.as_bytes().to_vec();
            let end = remote_wal::kv::prefix_end(&start);
            etcd.delete_range(&start, &end, false)
                .await
                .expect("delete the bench's etcd keys");
        }
    });
    println!(
        "deleted {deleted} topics and {} etcd key prefixes",
        namespaces.len()
    );
}
