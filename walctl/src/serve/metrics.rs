//! The server's Prometheus metrics (`GET /metrics`), kept in a `prometheus-client` registry.

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::registry::Registry;
use remote_wal::metasrv::Metasrv;

/// A procedure type and state: the labels of `walctl_procedures`.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ProcedureLabels {
    /// The procedure's type name.
    pub r#type: String,
    /// Its state (`running`, `done`, `failed`, ...).
    pub state: String,
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
    /// Rounds of the periodic WAL prune that failed.
    pub wal_prune_failures: Counter,
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
            "Topic prunes finished by the leader's periodic WAL prune ([wal] prune_interval)",
            wal_prunes.clone(),
        );
        let wal_prune_failures = Counter::default();
        registry.register(
            "wal_prune_failures",
            "Rounds of the leader's periodic WAL prune that failed",
            wal_prune_failures.clone(),
        );
        Metrics {
            registry,
            wal_prunes,
            wal_prune_failures,
            procedures,
            topic_regions,
            elections_won,
            elections_lost,
            leader,
            fenced_writes,
            not_leader_answers,
        }
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
