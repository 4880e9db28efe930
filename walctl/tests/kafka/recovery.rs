//! Issue 16 F1 through the binary: a create-table killed after its first persisted step (its record at step 1,
//! state `allocate`, no allocation yet) on a bootstrapped Kafka pool. A read-only command leaves it as it is and
//! never fails it; the next command that writes loads the pool before it recovers the procedure, and finishes the
//! table. (Before the fix, the recovery ran before the pool was loaded and failed the table for good with "topic
//! pool … is not ready".)

use std::path::PathBuf;

use crate::support::{Env, kafka_redb_config, unique};
use remote_wal::kv::{KvBackend, PutRequest, RedbKvBackend};
use serde_json::{Value, json};

/// The record a create-table left when it was killed right after persisting its first step, as the issue describes.
fn planted_record(id: &str, table: &str) -> Value {
    json!({
        "format_version": 1,
        "type_name": "remote_wal::CreateTable",
        "id": id,
        "parent_id": null,
        "step": 1,
        "state": "running",
        "data": {
            "allocation": null,
            "state": "allocate",
            "task": {
                "engine": "mito",
                "if_not_exists": false,
                "name": {"catalog": "greptime", "schema": "public", "table": table},
                "num_regions": 2,
                "options": {}
            }
        },
        "output": null,
        "error": null,
        "created_at_ms": 1_796_092_205_678u64,
        "updated_at_ms": 1_796_092_205_678u64
    })
}

fn procedure_state(env: &Env, config: &PathBuf, id: &str) -> String {
    let shown = env.json(Some(config), &["procedures", "show", id]);
    assert_eq!(shown.len(), 1, "{shown:?}");
    shown[0]["state"].as_str().expect("a state").to_string()
}

#[test]
fn a_create_table_killed_at_allocate_is_finished_by_the_next_writing_command() {
    let env = Env::new();
    let prefix = unique("walctl_f1");
    let config = kafka_redb_config(&env, "f1", &prefix, 2, "");
    env.json(Some(&config), &["bootstrap"]);

    let id = "f1-planted-create-table";
    let table = "f1_table";
    let planted = planted_record(id, table).to_string();
    {
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .expect("a runtime");
        runtime.block_on(async {
            let kv =
                RedbKvBackend::open(env.dir.path().join("walctl-data/f1.redb")).expect("open redb");
            kv.put(PutRequest {
                key: format!("__procedure__/proc/{id}").into_bytes(),
                value: planted.clone().into_bytes(),
                prev_kv: false,
            })
            .await
            .expect("plant the record");
        });
    }

    // Read-only: the record is shown as it is and left untouched, the command succeeds.
    let topics = env.json(Some(&config), &["topics"]);
    assert_eq!(topics.len(), 2, "{topics:?}");
    assert_eq!(procedure_state(&env, &config, id), "running");

    // The next command that writes loads the pool, recovers the procedure and finishes the table.
    env.json(Some(&config), &["bootstrap"]);
    assert_eq!(procedure_state(&env, &config, id), "done");
    let topics = env.json(Some(&config), &["topics"]);
    let regions: u64 = topics.iter().map(|t| t["regions"].as_u64().unwrap()).sum();
    assert_eq!(
        regions, 2,
        "both regions of {table} write to pool topics: {topics:?}"
    );
    let mut opened = 0;
    for datanode in ["1", "2"] {
        let lines = env.json(Some(&config), &["open-regions", "--datanode", datanode]);
        assert!(lines.iter().all(|l| l["kind"] == "request"), "{lines:?}");
        opened += lines.len();
    }
    // The planted table is the only table: its two regions, and nothing else, open.
    assert_eq!(opened, 2, "every region of {table} opens");
}
