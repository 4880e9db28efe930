//! `Metasrv::prune_wal`: runs one [`WalPruneRound`] over the topics of the Kafka pool (or the one named) and
//! reports each topic's result.

use procedures::ProcedureWithId;
use snafu::{IntoError, ResultExt};

use super::Metasrv;
use crate::error::{NoKafkaPoolSnafu, Result};
use crate::key::topic_name::{list_persisted_topics, topic_name_key};
use crate::wal::WalConfig;
use crate::wal::error::{PruneTopicUnknownSnafu, WalPruneSnafu};
use crate::wal::prune::round::{PruneRoundOutput, WalPruneRound, prune_round_id};

/// The name the round's errors give in place of a topic.
const EVERY_TOPIC: &str = "(every topic of the pool)";

impl Metasrv {
    /// Prunes `topic`, or every persisted topic of the pool when `None`, in one round procedure (rounds run one at
    /// a time) with the configured `prune_mode`. A topic that fails is reported in the output and never stops the
    /// others. An error for a raft-engine metasrv, for a named topic that is not persisted in the pool (before any
    /// record is written), and when the round itself cannot run.
    pub async fn prune_wal(&self, topic: Option<&str>) -> Result<PruneRoundOutput> {
        let (WalConfig::Kafka(kafka), Some(deleter)) = (&self.config.wal, &self.record_deleter)
        else {
            return NoKafkaPoolSnafu {
                operation: "wal prune",
            }
            .fail();
        };
        let topics = match topic {
            Some(topic) => {
                if self.kv.get(&topic_name_key(topic)).await?.is_none() {
                    return Err(PruneTopicUnknownSnafu {
                        topic: topic.to_string(),
                        key: String::from_utf8_lossy(&topic_name_key(topic)).into_owned(),
                    }
                    .build()
                    .into());
                }
                vec![topic.to_string()]
            }
            None => {
                list_persisted_topics(self.kv.as_ref(), &format!("{}_", kafka.topic_name_prefix))
                    .await?
            }
        };
        let name = topic.unwrap_or(EVERY_TOPIC).to_string();
        let round = WalPruneRound::new(topics, kafka.prune_mode, self.kv.clone(), deleter.clone());
        let with_id = ProcedureWithId::new(prune_round_id(), Box::new(round));
        let mut watcher = self
            .procedures
            .submit(with_id)
            .await
            .context(WalPruneSnafu {
                topic: name.clone(),
            })?;
        let output = watcher.wait().await.context(WalPruneSnafu {
            topic: name.clone(),
        })?;
        output
            .ok_or_else(|| "the procedure finished without an output".to_string())
            .and_then(|o| {
                serde_json::from_value::<PruneRoundOutput>(o)
                    .map_err(|e| format!("its output is not a prune round's report: {e}"))
            })
            .map_err(|reason| {
                WalPruneSnafu { topic: name }
                    .into_error(procedures::Error::external(reason))
                    .into()
            })
    }
}
