//! The server's Prometheus metrics (`GET /metrics`), kept in a `prometheus-client` registry.

use std::time::Duration;

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{Histogram, exponential_buckets};
use prometheus_client::registry::Registry;
use remote_wal::kv::CommitObserver;
use remote_wal::metasrv::Metasrv;
use remote_wal::wal::kafka::timed_admin::TopicAdminObserver;

/// Histogram buckets in seconds: 0.5 ms doubling to ~16 s.
fn latency_buckets() -> impl Iterator<Item = f64> {
    exponential_buckets(0.0005, 2.0, 16)
}

/// A histogram over [`latency_buckets`].
fn latency_histogram() -> Histogram {
    Histogram::new(latency_buckets())
}

/// A procedure type and state: the labels of `walctl_procedures`.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ProcedureLabels {
    /// The procedure's type name.
    pub r#type: String,
    /// Its state (`running`, `done`, `failed`, ...).
    pub state: String,
}

/// A procedure type: the label of `walctl_procedure_step_duration_seconds`.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct TypeLabels {
    /// The procedure's type name.
    pub r#type: String,
}

/// A topic-admin call and its outcome: the labels of `walctl_kafka_admin_duration_seconds`.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct AdminLabels {
    /// The call (`list_topics`, `create_topics`, ...).
    pub call: String,
    /// `ok` or `error`.
    pub outcome: String,
}

/// A pool topic: the label of `walctl_topic_regions`.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct TopicLabels {
    /// The topic.
    pub topic: String,
}

/// Every metric the server exports.
#[derive(Debug)]
pub struct Metrics {
    registry: Registry,
    procedures: Family<ProcedureLabels, Gauge>,
    topic_regions: Family<TopicLabels, Gauge>,
    /// Elections this server won.
    pub elections_won: Counter,
    /// Terms this server lost (its lease could not be proven, or a write found it deposed), not counting a
    /// shutdown's resignation.
    pub elections_lost: Counter,
    /// 1 while this server leads, else 0.
    pub leader: Gauge,
    fenced_writes: Counter,
    /// HTTP requests answered 503 because this server does not lead.
    pub not_leader_answers: Counter,
    /// Topic prunes the periodic WAL prune finished (one per topic per round).
    pub wal_prunes: Counter,
    /// Rounds of the periodic WAL prune that could not run.
    pub wal_prune_failures: Counter,
    /// Topics whose prune failed in a periodic round (the others of the round went on).
    pub wal_prune_topic_failures: Counter,
    /// 1 while this server leads with the Kafka WAL and its term's check of the brokers (the pool's bootstrap) has
    /// not completed, else 0.
    pub wal_brokers_unchecked: Gauge,
    /// Datanode registrations this server accepted.
    pub datanode_registrations: Counter,
    /// Datanode heartbeats this server answered.
    pub heartbeats: Counter,
    /// HTTP connections open now (`[server] max_connections` bounds it).
    pub http_connections: Gauge,
    /// HTTP connections closed at once because `max_connections` were open.
    pub http_connections_refused: Counter,
    datanodes: Gauge,
    datanodes_suspected: Gauge,
    unavailable_regions: Gauge,
    wal_lost_regions: Gauge,
    region_leases: Gauge,
    step_duration: Family<TypeLabels, Histogram, fn() -> Histogram>,
    retries: Counter,
    commit_duration: Histogram,
    admin_duration: Family<AdminLabels, Histogram, fn() -> Histogram>,
}

impl Metrics {
    /// The metrics, registered under the `walctl_` prefix.
    pub fn new() -> Self {
        let mut registry = Registry::with_prefix("walctl");
        let procedures = Family::<ProcedureLabels, Gauge>::default();
        registry.register(
            "procedures",
            "Procedures known to this server's manager, by type and state (the leader only)",
            procedures.clone(),
        );
        let topic_regions = Family::<TopicLabels, Gauge>::default();
        registry.register(
            "topic_regions",
            "Regions writing to each topic of the Kafka pool, as recorded in the metadata store",
            topic_regions.clone(),
        );
        let elections_won = Counter::default();
        registry.register(
            "elections_won",
            "Elections this server won",
            elections_won.clone(),
        );
        let elections_lost = Counter::default();
        registry.register(
            "elections_lost",
            "Leadership terms this server lost without resigning",
            elections_lost.clone(),
        );
        let leader = Gauge::default();
        registry.register(
            "leader",
            "1 while this server is the leader",
            leader.clone(),
        );
        let fenced_writes = Counter::default();
        registry.register(
            "fenced_writes",
            "Procedure-state writes refused because this server's leadership was gone or superseded",
            fenced_writes.clone(),
        );
        let not_leader_answers = Counter::default();
        registry.register(
            "not_leader_answers",
            "Write requests answered 503 because this server is not the leader",
            not_leader_answers.clone(),
        );
        let wal_prunes = Counter::default();
        registry.register(
            "wal_prunes",
            "Topics pruned by the leader's periodic WAL prune rounds ([wal] prune_interval)",
            wal_prunes.clone(),
        );
        let wal_prune_failures = Counter::default();
        registry.register(
            "wal_prune_failures",
            "Rounds of the leader's periodic WAL prune that could not run",
            wal_prune_failures.clone(),
        );
        let wal_prune_topic_failures = Counter::default();
        registry.register(
            "wal_prune_topic_failures",
            "Topics whose prune failed in a round of the leader's periodic WAL prune (the round went on with the \
             others)",
            wal_prune_topic_failures.clone(),
        );
        let wal_brokers_unchecked = Gauge::default();
        registry.register(
            "wal_brokers_unchecked",
            "1 while this server leads with the Kafka WAL and has not yet checked the brokers this term (its \
             pool's bootstrap has not completed; a pool the metadata store holds whole is served meanwhile)",
            wal_brokers_unchecked.clone(),
        );
        let datanode_registrations = Counter::default();
        registry.register(
            "datanode_registrations",
            "Datanode registrations (new incarnations) this server accepted while leading",
            datanode_registrations.clone(),
        );
        let heartbeats = Counter::default();
        registry.register(
            "datanode_heartbeats",
            "Datanode heartbeats this server answered while leading",
            heartbeats.clone(),
        );
        let http_connections = Gauge::default();
        registry.register(
            "http_connections",
            "HTTP connections open now ([server] max_connections bounds them)",
            http_connections.clone(),
        );
        let http_connections_refused = Counter::default();
        registry.register(
            "http_connections_refused",
            "HTTP connections closed at once because [server] max_connections were open",
            http_connections_refused.clone(),
        );
        let datanodes = Gauge::default();
        registry.register(
            "datanodes",
            "Datanodes registered with this leader's term",
            datanodes.clone(),
        );
        let datanodes_suspected = Gauge::default();
        registry.register(
            "datanodes_suspected",
            "Datanodes of this leader's term whose failure detector's phi is at or above [failover] phi_threshold",
            datanodes_suspected.clone(),
        );
        let unavailable_regions = Gauge::default();
        registry.register(
            "unavailable_regions",
            "Regions that cannot lead anywhere until their failed datanode returns (raft-engine WAL; the leader only)",
            unavailable_regions.clone(),
        );
        let wal_lost_regions = Gauge::default();
        registry.register(
            "wal_lost_regions",
            "Regions datanodes refused to open because their WAL topic is another incarnation than their checkpoint counts (the leader only)",
            wal_lost_regions.clone(),
        );
        let region_leases = Gauge::default();
        registry.register(
            "region_leases",
            "Region leases granted in the last answer to each datanode, summed (the leader only)",
            region_leases.clone(),
        );
        let step_duration: Family<TypeLabels, Histogram, fn() -> Histogram> =
            Family::new_with_constructor(latency_histogram);
        registry.register(
            "procedure_step_duration_seconds",
            "Duration of the procedure steps that returned without error, by procedure type (the leader only)",
            step_duration.clone(),
        );
        let retries = Counter::default();
        registry.register(
            "procedure_retries",
            "Steps and rollbacks that failed with a retryable error and were scheduled again",
            retries.clone(),
        );
        let commit_duration = latency_histogram();
        registry.register(
            "store_commit_duration_seconds",
            "Latency of the commits this server made on the metadata store (from the call to its answer)",
            commit_duration.clone(),
        );
        let admin_duration: Family<AdminLabels, Histogram, fn() -> Histogram> =
            Family::new_with_constructor(latency_histogram);
        registry.register(
            "kafka_admin_duration_seconds",
            "Latency of the topic-administration calls this server made to the Kafka brokers, by call and outcome",
            admin_duration.clone(),
        );
        Metrics {
            registry,
            step_duration,
            retries,
            commit_duration,
            admin_duration,
            wal_prunes,
            wal_prune_failures,
            wal_prune_topic_failures,
            wal_brokers_unchecked,
            datanode_registrations,
            heartbeats,
            http_connections,
            http_connections_refused,
            datanodes,
            datanodes_suspected,
            unavailable_regions,
            wal_lost_regions,
            region_leases,
            procedures,
            topic_regions,
            elections_won,
            elections_lost,
            leader,
            fenced_writes,
            not_leader_answers,
        }
    }

    /// Makes `metasrv` report its step durations, retries, store commits and Kafka admin calls to these metrics.
    pub fn observe(self: &std::sync::Arc<Self>, metasrv: &Metasrv) {
        metasrv.observe_procedures(self.clone());
        metasrv.observe_commits(self.clone());
        metasrv.observe_topic_admin(self.clone());
    }

    /// Refreshes what is read at scrape time (procedures, regions per topic, fenced writes) and renders the text format.
    pub async fn render(&self, metasrv: &Metasrv) -> Result<String, std::fmt::Error> {
        self.procedures.clear();
        if metasrv.is_started()
            && let Ok(list) = metasrv.list_procedures().await
        {
            for info in list {
                self.procedures
                    .get_or_create(&ProcedureLabels {
                        r#type: info.type_name.clone(),
                        state: info.state.to_string(),
                    })
                    .inc();
            }
        }
        self.topic_regions.clear();
        if let remote_wal::wal::WalConfig::Kafka(_) = &metasrv.config().wal
            && let Ok(report) = metasrv.topics().await
        {
            for usage in report.topics {
                self.topic_regions
                    .get_or_create(&TopicLabels { topic: usage.topic })
                    .set(i64::try_from(usage.regions).unwrap_or(i64::MAX));
            }
        }
        let datanodes = metasrv.datanode_registry().list();
        self.datanodes
            .set(i64::try_from(datanodes.len()).unwrap_or(i64::MAX));
        self.datanodes_suspected.set(
            i64::try_from(datanodes.iter().filter(|d| d.suspected).count()).unwrap_or(i64::MAX),
        );
        self.wal_lost_regions.set(
            i64::try_from(datanodes.iter().map(|d| d.wal_lost.len()).sum::<usize>())
                .unwrap_or(i64::MAX),
        );
        self.region_leases.set(
            i64::try_from(datanodes.iter().map(|d| d.leases).sum::<usize>()).unwrap_or(i64::MAX),
        );
        if let Ok(status) = metasrv.failover_status().await {
            self.unavailable_regions
                .set(i64::try_from(status.unavailable_regions.len()).unwrap_or(i64::MAX));
        }
        let fenced = metasrv.fenced_writes();
        let counted = self.fenced_writes.get();
        if fenced > counted {
            self.fenced_writes.inc_by(fenced - counted);
        }
        let mut text = String::new();
        prometheus_client::encoding::text::encode(&mut text, &self.registry)?;
        Ok(text)
    }
}

impl procedures::ProcedureObserver for Metrics {
    fn step_finished(&self, type_name: &str, _step: Option<&str>, elapsed: Duration) {
        self.step_duration
            .get_or_create(&TypeLabels {
                r#type: type_name.to_string(),
            })
            .observe(elapsed.as_secs_f64());
    }

    fn retried(&self, _type_name: &str, _step: Option<&str>, _error: &str) {
        self.retries.inc();
    }
}

impl CommitObserver for Metrics {
    fn committed(&self, elapsed: Duration) {
        self.commit_duration.observe(elapsed.as_secs_f64());
    }
}

impl TopicAdminObserver for Metrics {
    fn admin_call(&self, call: &'static str, elapsed: Duration, ok: bool) {
        self.admin_duration
            .get_or_create(&AdminLabels {
                call: call.to_string(),
                outcome: if ok { "ok" } else { "error" }.to_string(),
            })
            .observe(elapsed.as_secs_f64());
    }
}
