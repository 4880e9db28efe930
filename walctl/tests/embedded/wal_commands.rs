//! `walctl wal write` and `wal flush` on the embedded default (raft-engine WAL in `./walctl-data/wal/{datanode}`):
//! entries spread over the table's regions, checkpoints recorded per region (only forward), and
//! `open-regions --replay` replaying exactly the entries after each checkpoint; errors naming the table, the
//! region and the WAL.

use std::collections::BTreeMap;

use serde_json::Value;

use crate::support::Env;

fn by_region(lines: &[Value]) -> BTreeMap<u64, &Value> {
    lines
        .iter()
        .map(|l| (l["region_id"].as_u64().expect("region_id"), l))
        .collect()
}

#[test]
fn write_then_flush_then_replay_replays_exactly_the_entries_after_each_checkpoint() {
    let env = Env::new();
    let created = env.json(None, &["create-table", "public.logged", "--regions", "3"]);
    let ids: Vec<u64> = created
        .iter()
        .map(|r| r["region_id"].as_u64().expect("region_id"))
        .collect();

    // 30 entries of 64 bytes: 10 per region, ids 1..=10 in each region's own raft-engine group.
    let written = env.json(
        None,
        &[
            "wal",
            "write",
            "--table",
            "logged",
            "--entries",
            "30",
            "--entry-size",
            "64",
        ],
    );
    assert_eq!(written.len(), 1, "{written:?}");
    let report = &written[0];
    assert_eq!(report["entries"], 30);
    assert_eq!(report["bytes"], 30 * 64);
    assert_eq!(report["table"], "greptime.public.logged");
    assert!(report["entries_per_sec"].as_f64().expect("rate") > 0.0);
    assert!(report["mb_per_sec"].as_f64().expect("rate") > 0.0);
    let regions = report["regions"].as_array().expect("regions");
    assert_eq!(regions.len(), 3);
    for r in regions {
        assert_eq!(r["entries"], 10, "{r}");
        assert_eq!(r["last_entry_id"], 10, "{r}");
        assert!(
            r["wal"]
                .as_str()
                .expect("wal")
                .contains("walctl-data/wal/1"),
            "{r}"
        );
    }

    // Region 0 flushed up to entry 4; region 1 up to its last entry (10); region 2 never.
    let flushed = env.json(
        None,
        &[
            "wal",
            "flush",
            "--table",
            "logged",
            "--region",
            "0",
            "--entry-id",
            "4",
        ],
    );
    assert_eq!(flushed.len(), 1);
    assert_eq!(flushed[0]["region_id"], ids[0]);
    assert_eq!(flushed[0]["old_checkpoint"], 0);
    assert_eq!(flushed[0]["checkpoint"], 4);
    let flushed = env.json(
        None,
        &["wal", "flush", "--table", "logged", "--region", "1"],
    );
    assert_eq!(flushed[0]["checkpoint"], 10);
    // A lower entry id later leaves the checkpoint where it is.
    let flushed = env.json(
        None,
        &[
            "wal",
            "flush",
            "--table",
            "logged",
            "--region",
            "1",
            "--entry-id",
            "3",
        ],
    );
    assert_eq!(flushed[0]["old_checkpoint"], 10);
    assert_eq!(flushed[0]["checkpoint"], 10);

    // 6 more entries, 2 per region: ids 11 and 12, after the checkpoints (region 1 has no entry left below).
    env.json(
        None,
        &[
            "wal",
            "write",
            "--table",
            "logged",
            "--entries",
            "6",
            "--entry-size",
            "64",
        ],
    );
    let opened = env.json(None, &["open-regions", "--datanode", "1", "--replay"]);
    let opened = by_region(&opened);
    // Region 0: entries 5..=12; region 1: 11 and 12; region 2: 1..=12.
    for (region, wanted) in [(ids[0], 8u64), (ids[1], 2), (ids[2], 12)] {
        let line = opened[&region];
        assert!(line.get("replay_error").is_none(), "{line}");
        assert_eq!(line["entries_replayed"], wanted, "{line}");
        assert_eq!(line["bytes_replayed"], wanted * 64, "{line}");
    }

    // Text output: the throughput line and the checkpoint table.
    let text = env.ok(
        None,
        &["wal", "write", "--table", "logged", "--entries", "3"],
    );
    assert!(
        text.contains("wrote 3 entries (3072 bytes) to table greptime.public.logged in "),
        "{text}"
    );
    assert!(
        text.contains(" entries/s, ") && text.contains(" MB/s"),
        "{text}"
    );
    let text = env.ok(None, &["wal", "flush", "--table", "logged"]);
    assert!(text.contains("OLD_CHECKPOINT"), "{text}");
    assert!(
        text.contains("recorded the checkpoints of 3 regions of table greptime.public.logged"),
        "{text}"
    );
    let opened = env.json(None, &["open-regions", "--datanode", "1", "--replay"]);
    for line in &opened {
        assert_eq!(line["entries_replayed"], 0, "everything flushed: {line}");
    }
}

#[test]
fn wal_commands_name_the_table_region_and_wal_they_refuse() {
    let env = Env::new();
    let created = env.json(None, &["create-table", "public.named", "--regions", "2"]);
    let first = created[0]["region_id"].as_u64().expect("region_id");

    let err = env.err(None, &["wal", "write", "--table", "nope", "--entries", "3"]);
    assert_eq!(
        err.trim_end(),
        "error: wal write: table greptime.public.nope does not exist"
    );
    let err = env.err(None, &["wal", "flush", "--table", "named", "--region", "5"]);
    assert_eq!(
        err.trim_end(),
        "error: wal flush: table greptime.public.named has no region 5 (its regions: 0, 1)"
    );
    env.ok(
        None,
        &["wal", "write", "--table", "named", "--entries", "4"],
    );
    let err = env.err(
        None,
        &[
            "wal",
            "flush",
            "--table",
            "named",
            "--region",
            "0",
            "--entry-id",
            "3",
        ],
    );
    let dir = "raft-engine './walctl-data/wal/1'";
    assert_eq!(
        err.trim_end(),
        format!(
            "error: wal flush: table greptime.public.named, region {first} ({dir}): cannot flush region {first} \
             up to entry id 3: its WAL ({dir}) ends at entry id 2"
        )
    );
    // Nothing was recorded: every entry still replays.
    let opened = env.json(None, &["open-regions", "--datanode", "1", "--replay"]);
    for line in &opened {
        assert_eq!(line["entries_replayed"], 2, "{line}");
    }
    let err = env.err(
        None,
        &["wal", "write", "--table", "named", "--entries", "0"],
    );
    assert_eq!(
        err.trim_end(),
        "error: invalid value '0' for '--entries <N>': 0 is not in 1..=100000000 (see walctl --help)"
    );
    let err = env.err(None, &["wal", "stats"]);
    assert_eq!(
        err.trim_end(),
        "error: wal stats: the WAL provider is raft_engine, so there is no Kafka topic pool (set [wal] provider = \"kafka\")"
    );
}
