//! `Metasrv::prune_wal`: runs a [`WalPruneProcedure`] per topic of the Kafka pool and reports each topic's old and
//! new pruned entry id.

use procedures::ProcedureWithId;
use snafu::{IntoError, ResultExt};

use super::Metasrv;
use crate::error::{NoKafkaPoolSnafu, Result, WalPruneSnafu};
use crate::key::topic_name::list_persisted_topics;
use crate::wal::WalConfig;
use crate::wal::prune::{PruneOutput, WalPruneProcedure, prune_procedure_id};

impl Metasrv {
    /// Prunes `topic`, or every persisted topic of the pool when `None`, one procedure per topic run one after
    /// the other (each under its topic's lock), with the configured `prune_mode`. An error for a raft-engine
    /// metasrv, and for a topic that is not persisted in the pool.
    pub async fn prune_wal(&self, topic: Option<&str>) -> Result<Vec<PruneOutput>> {
        let (WalConfig::Kafka(kafka), Some(deleter)) = (&self.config.wal, &self.record_deleter)
        else {
            return NoKafkaPoolSnafu {
                operation: "wal prune",
            }
            .fail();
        };
        let topics = match topic {
            Some(topic) => vec![topic.to_string()],
            None => {
                list_persisted_topics(self.kv.as_ref(), &format!("{}_", kafka.topic_name_prefix))
                    .await?
            }
        };
        let mut reports = Vec::with_capacity(topics.len());
        for topic in topics {
            let procedure = WalPruneProcedure::new(
                topic.clone(),
                kafka.prune_mode,
                self.kv.clone(),
                deleter.clone(),
            );
            let with_id = ProcedureWithId::new(prune_procedure_id(&topic), Box::new(procedure));
            let mut watcher = self
                .procedures
                .submit(with_id)
                .await
                .context(WalPruneSnafu {
                    topic: topic.clone(),
                })?;
            let output = watcher.wait().await.context(WalPruneSnafu {
                topic: topic.clone(),
            })?;
            let report = output
                .ok_or_else(|| "the procedure finished without an output".to_string())
                .and_then(|o| {
                    serde_json::from_value::<PruneOutput>(o)
                        .map_err(|e| format!("its output is not a prune report: {e}"))
                })
                .map_err(|reason| {
                    WalPruneSnafu {
                        topic: topic.clone(),
                    }
                    .into_error(procedures::Error::external(reason))
                })?;
            reports.push(report);
        }
        Ok(reports)
    }
}
