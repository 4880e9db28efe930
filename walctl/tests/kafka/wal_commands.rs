//! `walctl wal write`, `wal flush`, `wal stats` and `wal prune` on the real broker (`KAFKA_ENDPOINTS`) and etcd
//! (`ETCD_ENDPOINTS`); the test fails saying so when either is unset. Two regions share a one-topic pool: write,
//! flush each region to its own entry id, prune, write again, and `open-regions --replay` replays exactly the
//! entries after each checkpoint; `wal stats` reports the watermarks and what a replay reads at each stage.

use std::collections::BTreeMap;

use crate::support::{Env, kafka_etcd_config, unique};

#[test]
fn write_flush_prune_then_replay_replays_exactly_the_entries_after_each_checkpoint() {
    let env = Env::new();
    let prefix = unique("walctl_walcmd");
    let config = kafka_etcd_config(&env, &prefix, 1, &[1]);
    let topic = format!("{prefix}_0");
    env.json(Some(&config), &["bootstrap"]);
    let created = env.json(
        Some(&config),
        &["create-table", "public.logged", "--regions", "2"],
    );
    let ids: Vec<u64> = created
        .iter()
        .map(|r| r["region_id"].as_u64().expect("region_id"))
        .collect();
    let cfg = Some(&config);

    // Before any write: the topic is empty, each region replays nothing.
    let stats = env.json(cfg, &["wal", "stats"]);
    assert_eq!(stats.len(), 1, "{stats:?}");
    assert_eq!(stats[0]["topic"], topic.as_str());
    assert_eq!(stats[0]["high_watermark"], 0);
    assert_eq!(stats[0]["regions"], 2);
    assert_eq!(stats[0]["replay_bytes"], 0);

    // 20 entries of 100 bytes, alternating: region 0 gets entry ids 1, 3, …, 19, region 1 gets 2, 4, …, 20.
    let written = env.json(
        cfg,
        &[
            "wal",
            "write",
            "--table",
            "logged",
            "--entries",
            "20",
            "--entry-size",
            "100",
        ],
    );
    let regions = written[0]["regions"].as_array().expect("regions");
    let last: BTreeMap<u64, u64> = regions
        .iter()
        .map(|r| {
            assert_eq!(r["entries"], 10, "{r}");
            assert_eq!(r["wal"], format!("topic '{topic}'"), "{r}");
            (
                r["region_id"].as_u64().expect("id"),
                r["last_entry_id"].as_u64().expect("last"),
            )
        })
        .collect();
    assert_eq!(last, BTreeMap::from([(ids[0], 19), (ids[1], 20)]));

    // Region 0 flushed up to entry 7 (6 of its entries remain), region 1 up to 12 (4 remain).
    for (number, entry) in [("0", "7"), ("1", "12")] {
        let flushed = env.json(
            cfg,
            &[
                "wal",
                "flush",
                "--table",
                "logged",
                "--region",
                number,
                "--entry-id",
                entry,
            ],
        );
        assert_eq!(flushed[0]["checkpoint"].to_string(), entry, "{flushed:?}");
    }
    let err = env.err(
        cfg,
        &[
            "wal",
            "flush",
            "--table",
            "logged",
            "--region",
            "0",
            "--entry-id",
            "1000",
        ],
    );
    let wal = format!("topic '{topic}'");
    assert_eq!(
        err.trim_end(),
        format!(
            "error: wal flush: table greptime.public.logged, region {r} ({wal}): cannot flush region {r} up to \
             entry id 1000: its WAL ({wal}) ends at entry id 20",
            r = ids[0]
        )
    );

    // A replay would read from entry 8 (offset 7) to the end: 13 records of key (region id) + 30 + 100 bytes.
    let record_bytes = ids[0].to_string().len() as u64 + 30 + 100;
    let stats = env.json(cfg, &["wal", "stats"]);
    assert_eq!(stats[0]["low_watermark"], 0);
    assert_eq!(stats[0]["high_watermark"], 20);
    assert_eq!(stats[0]["replay_from"], 7);
    assert_eq!(stats[0]["replay_records"], 13);
    assert_eq!(stats[0]["replay_bytes"], 13 * record_bytes);

    let pruned = env.json(cfg, &["wal", "prune"]);
    assert_eq!(pruned[0]["new_pruned_entry_id"], 7, "{pruned:?}");
    let stats = env.json(cfg, &["wal", "stats"]);
    assert_eq!(stats[0]["low_watermark"], 7, "offsets 0..=6 deleted");
    assert_eq!(stats[0]["pruned_entry_id"], 7);
    assert_eq!(stats[0]["replay_records"], 13);

    // 4 more entries (ids 21..=24, 2 per region) after the prune.
    env.json(
        cfg,
        &[
            "wal",
            "write",
            "--table",
            "logged",
            "--entries",
            "4",
            "--entry-size",
            "100",
        ],
    );
    let opened = env.json(cfg, &["open-regions", "--datanode", "1", "--replay"]);
    assert_eq!(opened.len(), 2, "{opened:?}");
    for line in &opened {
        let region = line["region_id"].as_u64().expect("region_id");
        assert!(line.get("replay_error").is_none(), "{line}");
        let wanted = if region == ids[0] { 6 + 2 } else { 4 + 2 };
        assert_eq!(line["entries_replayed"], wanted, "{line}");
        assert_eq!(line["bytes_replayed"], wanted * 100, "{line}");
    }

    let text = env.ok(cfg, &["wal", "stats"]);
    assert!(text.contains("HIGH_WATERMARK"), "{text}");
    assert!(
        text.contains(&format!(
            "1 topics; a replay of their regions would read {} bytes",
            17 * record_bytes
        )),
        "{text}"
    );
}
