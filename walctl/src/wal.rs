//! `walctl wal …`: the WAL commands (`docs/walctl.md`). `wal prune`
//! runs one WAL prune round over the topics of the Kafka pool (or the one named) and prints each topic's result
//! (pruned from and to, skipped and why, failed and why), exiting non-zero when a topic failed; `wal stats` prints each topic's watermarks, regions and what a replay would read.

use clap::Subcommand;
use remote_wal::metasrv::Metasrv;
use remote_wal::metasrv::wal_stats::TopicWalStats;
use remote_wal::wal::prune::round::{PruneRoundOutput, TopicOutcome};

use crate::output::Output;

/// The `wal` subcommands.
#[derive(Debug, Subcommand)]
pub enum WalCommand {
    /// Ask the datanodes leading a table's regions to flush them to region storage (their checkpoints follow with
    /// their next heartbeats), and print each region's flushed entry id.
    Flush {
        /// `table`, `schema.table` or `catalog.schema.table`.
        #[arg(long, value_name = "NAME")]
        table: String,
        /// Only this region number (default: every region of the table).
        #[arg(long, value_name = "N")]
        region: Option<u32>,
    },
    /// Prune the Kafka WAL: delete (or, with `prune_mode = "logical"`, only mark) the entries every region on a
    /// topic has flushed, and print each topic's result: its old and new pruned entry id, or why it was skipped or
    /// failed. A failing topic never stops the others; the command exits non-zero when one failed.
    Prune {
        /// Prune only this topic (default: every topic of the pool).
        #[arg(long, value_name = "TOPIC")]
        topic: Option<String>,
    },
    /// Per topic of the Kafka pool: low and high watermark, pruned entry id, regions, the records a replay of
    /// those regions would read, and the region that pins the watermark (the lowest checkpoint) with how many
    /// entries behind the topic's end it is.
    Stats,
}

impl WalCommand {
    /// Whether the command runs procedures (and so starts the procedure manager): only `wal prune`.
    pub fn runs_procedures(&self) -> bool {
        matches!(self, WalCommand::Prune { .. })
    }

    /// The subcommand's name as typed (`write`, `flush`, `stats`, `prune`).
    pub fn name(&self) -> &'static str {
        match self {
            WalCommand::Flush { .. } => "flush",
            WalCommand::Stats => "stats",
            WalCommand::Prune { .. } => "prune",
        }
    }
}

/// Runs `command` on a started metasrv.
pub async fn execute(
    metasrv: &Metasrv,
    command: &WalCommand,
    out: &mut Output,
) -> remote_wal::Result<()> {
    match command {
        WalCommand::Flush { .. } => Ok(()),
        WalCommand::Stats => {
            let stats = metasrv.wal_stats().await?;
            print_stats(out, &stats);
            Ok(())
        }
        WalCommand::Prune { topic } => {
            let round = metasrv.prune_wal(topic.as_deref()).await?;
            print_prune(out, &round);
            match prune_failure(&round) {
                Some(error) => Err(error),
                None => Ok(()),
            }
        }
    }
}

/// One line per topic — `topic T: pruned entry id A -> B (mode, R regions)`, `topic T: skipped at pruned entry id
/// A (R regions): REASON`, `topic T: failed at STEP: ERROR` — then a count; with `--json` one object per topic (the
/// round's output for the topic).
pub fn print_prune(out: &mut Output, round: &PruneRoundOutput) {
    let json = out.is_json();
    for r in &round.topics {
        if json {
            out.json_line(r);
            continue;
        }
        let line = match &r.outcome {
            TopicOutcome::Pruned {
                old_pruned_entry_id,
                new_pruned_entry_id,
                regions,
                held_by,
                last_entry_id,
            } => {
                let held = match (held_by, last_entry_id) {
                    (Some(region), Some(last)) => format!(
                        "; held by region {region}, {} entries behind",
                        last.saturating_sub(*new_pruned_entry_id)
                    ),
                    (Some(region), None) => format!("; held by region {region}"),
                    _ => String::new(),
                };
                format!(
                    "topic {}: pruned entry id {old_pruned_entry_id} -> {new_pruned_entry_id} ({}, {regions} \
                     regions){held}",
                    r.topic, round.mode
                )
            }
            TopicOutcome::Skipped {
                pruned_entry_id,
                regions,
                reason,
                ..
            } => format!(
                "topic {}: skipped at pruned entry id {pruned_entry_id} ({regions} regions): {reason}",
                r.topic
            ),
            TopicOutcome::Failed {
                step,
                error,
                retryable,
            } => format!(
                "topic {}: failed at {step}: {error}{}",
                r.topic,
                if *retryable { " (transient)" } else { "" }
            ),
        };
        out.line(&line);
    }
    if json {
        return;
    }
    if round.topics.is_empty() {
        out.line("no topic to prune");
    } else {
        let (pruned, skipped, failed) = round.counts();
        out.line(&format!(
            "{} topics: {pruned} pruned, {skipped} skipped, {failed} failed",
            round.topics.len()
        ));
    }
}

/// The error that makes the command exit non-zero when topics of the round failed, if any did.
pub fn prune_failure(round: &PruneRoundOutput) -> Option<remote_wal::Error> {
    let failed = round.failed_topics();
    (!failed.is_empty()).then(|| {
        remote_wal::wal::Error::WalPruneTopicsFailed {
            failed: failed.len(),
            total: round.topics.len(),
            topics: failed.join(", "),
        }
        .into()
    })
}

/// One row per topic; with `--json` one object per topic.
fn print_stats(out: &mut Output, stats: &[TopicWalStats]) {
    if out.is_json() {
        for t in stats {
            out.json_line(t);
        }
        return;
    }
    let rows = stats
        .iter()
        .map(|t| {
            vec![
                t.topic.clone(),
                t.low_watermark.to_string(),
                t.high_watermark.to_string(),
                t.pruned_entry_id.to_string(),
                t.regions.to_string(),
                t.replay_from.map_or("-".to_string(), |f| f.to_string()),
                t.replay_records.to_string(),
                t.pinned_by.as_ref().map_or("-".to_string(), |p| {
                    let at = p
                        .flushed_entry_id
                        .map_or("no checkpoint".to_string(), |f| format!("at {f}"));
                    format!("region {} ({at}), {} behind", p.region_id, p.behind)
                }),
            ]
        })
        .collect();
    out.table(
        &[
            "TOPIC",
            "LOW_WATERMARK",
            "HIGH_WATERMARK",
            "PRUNED_ENTRY_ID",
            "REGIONS",
            "REPLAY_FROM",
            "REPLAY_RECORDS",
            "PINNED_BY",
        ],
        rows,
    );
    let records: u64 = stats.iter().map(|t| t.replay_records).sum();
    out.line(&format!(
        "{} topics; a replay of their regions would read {records} records",
        stats.len()
    ));
}

/// `wal flush`: each region's leader datanode flushes it; one line (or JSON object) per region.
///
/// A region whose datanode answers "not leader" (it is reopening the region, its lease is being renewed, it is
/// restarting) is asked again, its leader read anew, until `wait` runs out.
pub fn flush(
    router: &mut crate::route::Router,
    table: &str,
    region: Option<u32>,
    wait: std::time::Duration,
    access: &crate::access::Access,
    out: &mut Output,
) -> Result<(), crate::Failure> {
    let deadline = std::time::Instant::now() + wait;
    let mut leaders = router.table(table)?;
    let numbers: Vec<u32> = leaders
        .regions
        .iter()
        .filter(|r| region.is_none_or(|n| n == r.region_number))
        .map(|r| r.region_number)
        .collect();
    if numbers.is_empty() {
        return Err(crate::Failure::Refused(format!(
            "wal flush: table {} has no region {}",
            leaders.table,
            region.map_or(String::new(), |n| n.to_string())
        )));
    }
    // `--ca` too: a datanode serving TLS registers an `https://` address.
    let agent = access.agent(
        std::time::Duration::from_secs(2),
        std::time::Duration::from_secs(60),
    );
    for number in numbers {
        let (r, value) = loop {
            let Some(r) = leaders
                .regions
                .iter()
                .find(|r| r.region_number == number)
                .cloned()
            else {
                return Err(crate::Failure::Refused(format!(
                    "wal flush: table {} no longer has region {number}",
                    leaders.table
                )));
            };
            match flush_one(&agent, access, &r)? {
                Some(value) => break (r, value),
                None if std::time::Instant::now() < deadline => {
                    std::thread::sleep(std::time::Duration::from_millis(200));
                    leaders = router.table(table)?;
                }
                None => {
                    return Err(crate::Failure::Refused(format!(
                        "wal flush: region {} on datanode {}: no datanode leading it took the flush within {} \
                         (--wait)",
                        r.region_id,
                        r.datanode_id,
                        humantime::format_duration(wait)
                    )));
                }
            }
        };
        if out.is_json() {
            out.json_line(&value);
        } else {
            out.line(&format!(
                "region {} (number {}) on datanode {}: flushed up to entry id {} ({} entries written)",
                r.region_id, r.region_number, r.datanode_id, value["flushed_entry_id"], value["entries"]
            ));
        }
    }
    Ok(())
}

/// Asks the region's leader datanode to flush it: its answer, `None` when it is not (yet) the leader or did not
/// answer, an error for a definite refusal.
fn flush_one(
    agent: &ureq::Agent,
    access: &crate::access::Access,
    r: &remote_wal::metasrv::datanodes::RegionLeader,
) -> Result<Option<serde_json::Value>, crate::Failure> {
    let Some(address) = &r.address else {
        return Ok(None);
    };
    let url = format!(
        "{}/v1/regions/{}/flush",
        crate::datanode_server::link::base_url(address),
        r.region_id
    );
    let Ok(mut response) = access.authorize(agent.post(&url)).send_empty() else {
        return Ok(None);
    };
    let status = response.status().as_u16();
    let value: serde_json::Value = response
        .body_mut()
        .read_json()
        .unwrap_or(serde_json::Value::Null);
    if status == 200 {
        return Ok(Some(value));
    }
    if value["error"]["retryable"]
        .as_bool()
        .unwrap_or(status == 503)
    {
        return Ok(None);
    }
    Err(crate::Failure::Refused(format!(
        "wal flush: region {}: {}",
        r.region_id,
        value["error"]["message"].as_str().unwrap_or("no message")
    )))
}
