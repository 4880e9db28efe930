//! `walctl` on the embedded default (redb in `./walctl-data`, raft-engine WAL, datanode 1) and on small TOML
//! configs: every command, text and `--json` output, and one-line errors naming the culprit.

use crate::support::Env;
use serde_json::Value;

const RAFT_ENGINE: &str = r#"{"wal.provider":"raft_engine"}"#;

#[test]
fn create_table_then_open_regions_shows_its_regions_with_wal_options() {
    let env = Env::new();
    let out = env.ok(None, &["create-table", "demo", "--regions", "4"]);
    assert!(
        out.starts_with("table greptime.public.demo id "),
        "names the table and its id: {out}"
    );
    // A header and one row per region, each with datanode 1 and the raft-engine option.
    let rows: Vec<&str> = out.lines().skip(2).collect();
    assert_eq!(rows.len(), 4, "{out}");
    for (i, row) in rows.iter().enumerate() {
        let cells: Vec<&str> = row.split_whitespace().collect();
        assert_eq!(cells[0], i.to_string(), "{row}");
        assert_eq!(cells[2], "1", "datanode: {row}");
        assert_eq!(cells[3], RAFT_ENGINE, "{row}");
    }
    assert!(
        env.dir.path().join("walctl-data/metadata.redb").exists(),
        "the embedded default keeps its metadata in ./walctl-data/metadata.redb"
    );

    let out = env.ok(None, &["open-regions", "--datanode", "1"]);
    assert!(
        out.starts_with("datanode 1: 4 regions to open, 0 errors"),
        "{out}"
    );
    assert_eq!(
        out.lines().filter(|l| l.contains(RAFT_ENGINE)).count(),
        4,
        "{out}"
    );
}

#[test]
fn json_output_is_one_object_per_line_with_stable_fields() {
    let env = Env::new();
    let created = env.json(None, &["create-table", "public.metrics", "--regions", "3"]);
    assert_eq!(created.len(), 3);
    let table_id = created[0]["table_id"].as_u64().expect("table_id");
    for (i, r) in created.iter().enumerate() {
        assert_eq!(r["table"], "greptime.public.metrics");
        assert_eq!(r["table_id"].as_u64(), Some(table_id));
        assert_eq!(r["region_number"].as_u64(), Some(i as u64));
        assert_eq!(r["region_id"].as_u64(), Some((table_id << 32) | i as u64));
        assert_eq!(r["datanode_id"].as_u64(), Some(1));
        assert_eq!(r["wal_options"], RAFT_ENGINE);
    }

    let opened = env.json(None, &["open-regions", "--datanode", "1"]);
    assert_eq!(opened.len(), 3);
    let mut region_ids: Vec<u64> = opened
        .iter()
        .map(|r| {
            assert_eq!(r["kind"], "request");
            assert_eq!(r["datanode_id"].as_u64(), Some(1));
            assert_eq!(r["engine"], "mito");
            assert_eq!(r["wal_options"], RAFT_ENGINE);
            assert_eq!(r["options"]["wal_options"], RAFT_ENGINE);
            assert!(r["region_dir"].as_str().is_some_and(|d| !d.is_empty()));
            r["region_id"].as_u64().expect("region_id")
        })
        .collect();
    region_ids.sort();
    let expected: Vec<u64> = created
        .iter()
        .map(|r| r["region_id"].as_u64().unwrap())
        .collect();
    assert_eq!(
        region_ids, expected,
        "open-regions shows exactly the created regions"
    );

    let bootstrap = env.json(None, &["bootstrap"]);
    assert_eq!(bootstrap.len(), 1);
    assert_eq!(bootstrap[0]["provider"], "raft_engine");
    assert_eq!(bootstrap[0]["ready"], true);

    let procedures = env.json(None, &["procedures", "list"]);
    assert!(!procedures.is_empty());
    for p in &procedures {
        for field in [
            "id",
            "type",
            "state",
            "step",
            "created_at_ms",
            "updated_at_ms",
            "age_ms",
        ] {
            assert!(!p[field].is_null(), "field {field} in {p}");
        }
    }
}

#[test]
fn regions_spread_round_robin_over_the_configured_datanodes() {
    let env = Env::new();
    let config = env.write(
        "three.toml",
        "[metadata_store]\npath = \"meta/three.redb\"\n[datanodes]\nids = [1, 2, 3]\n",
    );
    let created = env.json(Some(&config), &["create-table", "spread", "--regions", "6"]);
    assert_eq!(created.len(), 6);
    assert!(env.dir.path().join("meta/three.redb").exists());
    for dn in [1u64, 2, 3] {
        let on_dn: Vec<u64> = created
            .iter()
            .filter(|r| r["datanode_id"].as_u64() == Some(dn))
            .map(|r| r["region_id"].as_u64().unwrap())
            .collect();
        assert_eq!(
            on_dn.len(),
            2,
            "datanode {dn} gets 2 of 6 regions: {created:?}"
        );
        let mut opened: Vec<u64> = env
            .json(
                Some(&config),
                &["open-regions", "--datanode", &dn.to_string()],
            )
            .iter()
            .map(|r| r["region_id"].as_u64().unwrap())
            .collect();
        opened.sort();
        assert_eq!(opened, on_dn, "datanode {dn} opens exactly its regions");
    }
    // A datanode that serves nothing opens nothing.
    assert!(
        env.json(Some(&config), &["open-regions", "--datanode", "9"])
            .is_empty()
    );
}

#[test]
fn create_table_twice_fails_unless_if_not_exists_which_returns_the_same_table() {
    let env = Env::new();
    let first = env.json(None, &["create-table", "twice", "--regions", "2"]);
    let id = first[0]["table_id"].as_u64().unwrap();

    let err = env.err(None, &["create-table", "twice", "--regions", "2"]);
    assert!(err.contains("already exists"), "{err}");
    assert!(
        err.contains("greptime.public.twice"),
        "names the table: {err}"
    );

    let again = env.json(
        None,
        &["create-table", "twice", "--regions", "2", "--if-not-exists"],
    );
    assert_eq!(
        again, first,
        "if-not-exists returns the existing table and its regions"
    );
    assert_eq!(again[0]["table_id"].as_u64(), Some(id));

    // Still exactly two regions on the datanode: nothing was created twice.
    assert_eq!(
        env.json(None, &["open-regions", "--datanode", "1"]).len(),
        2
    );
}

#[test]
fn table_ids_are_distinct_across_runs() {
    let env = Env::new();
    let a = env.json(None, &["create-table", "a", "--regions", "1"]);
    let b = env.json(None, &["create-table", "other.b", "--regions", "1"]);
    let c = env.json(None, &["create-table", "cat.other.c", "--regions", "1"]);
    let ids: std::collections::BTreeSet<u64> = [&a, &b, &c]
        .iter()
        .map(|t| t[0]["table_id"].as_u64().unwrap())
        .collect();
    assert_eq!(ids.len(), 3);
    assert_eq!(b[0]["table"], "greptime.other.b");
    assert_eq!(c[0]["table"], "cat.other.c");
}

#[test]
fn bad_table_names_are_errors_naming_them() {
    let env = Env::new();
    for bad in ["a.b.c.d", "bad name", "x/y", "s."] {
        let err = env.err(None, &["create-table", bad, "--regions", "1"]);
        assert!(err.contains(&format!("'{bad}'")), "{bad}: {err}");
    }
    for count in ["0", "1025"] {
        let err = env.err(None, &["create-table", "ok_name", "--regions", count]);
        assert!(
            err.contains(&format!(
                "num_regions = {count}: a table has 1 to 1024 regions"
            )),
            "{count}: {err}"
        );
    }
    // Refused before a procedure record is written.
    assert!(env.json(None, &["procedures", "list"]).is_empty());
    // Nothing was created by the failed calls.
    assert!(
        env.json(None, &["open-regions", "--datanode", "1"])
            .is_empty()
    );
}

#[test]
fn usage_errors_are_one_line_naming_the_argument() {
    let env = Env::new();
    let err = env.err(None, &["create-table", "t"]);
    assert!(err.contains("--regions"), "{err}");
    let err = env.err(None, &["open-regions", "--datanode", "one"]);
    assert!(err.contains("one"), "{err}");
    let err = env.err(None, &["frobnicate"]);
    assert!(err.contains("frobnicate"), "{err}");
}

#[test]
fn unknown_config_key_is_an_error_naming_the_key() {
    let env = Env::new();
    let config = env.write(
        "typo.toml",
        "[metadata_store]\nbackend = \"redb\"\npaht = \"x.redb\"\n",
    );
    let err = env.err(Some(&config), &["procedures", "list"]);
    assert!(err.contains("metadata_store.paht"), "{err}");
    assert!(err.contains("typo.toml"), "names the file: {err}");
    assert!(err.contains("line 3"), "names the line: {err}");

    let config = env.write("wal.toml", "[wal]\nprovider = \"kafka\"\nnum_topicz = 3\n");
    let err = env.err(Some(&config), &["topics"]);
    assert!(err.contains("num_topicz"), "{err}");
}

#[test]
fn bad_config_values_are_errors_naming_the_key() {
    let env = Env::new();
    for (text, key) in [
        (
            "[metadata_store]\nbackend = \"mysql\"\n",
            "metadata_store.backend",
        ),
        ("[datanodes]\nids = []\n", "datanodes.ids"),
        ("[datanodes]\nids = [2, 2]\n", "datanodes.ids"),
        (
            "[wal]\nprovider = \"kafka\"\nnum_topics = 0\n",
            "num_topics",
        ),
        (
            "[wal]\nprovider = \"kafka\"\ncreate_topic_timeout = \"soon\"\n",
            "create_topic_timeout",
        ),
    ] {
        let config = env.write("bad.toml", text);
        let err = env.err(Some(&config), &["bootstrap"]);
        assert!(err.contains(key), "{text:?} → {err}");
    }
    let err = env.err(Some(&env.dir.path().join("missing.toml")), &["bootstrap"]);
    assert!(err.contains("missing.toml"), "{err}");
}

#[test]
fn procedures_list_and_show_report_the_create_table_procedure() {
    let env = Env::new();
    let created = env.json(None, &["create-table", "tracked", "--regions", "2"]);
    let table_id = created[0]["table_id"].as_u64().unwrap();

    let list = env.json(None, &["procedures", "list"]);
    let create: Vec<&Value> = list
        .iter()
        .filter(|p| {
            p["type"]
                .as_str()
                .is_some_and(|t| t.contains("CreateTable"))
        })
        .collect();
    assert_eq!(create.len(), 1, "one create-table procedure: {list:?}");
    let p = create[0];
    assert_eq!(p["state"], "done");
    assert!(p["error"].is_null());
    let id = p["id"].as_str().unwrap();

    let shown = env.json(None, &["procedures", "show", id]);
    assert_eq!(shown.len(), 1);
    assert_eq!(shown[0]["id"], id);
    assert_eq!(shown[0]["state"], "done");
    assert!(
        shown[0]["output"]
            .to_string()
            .contains(&table_id.to_string()),
        "the output carries the table id: {}",
        shown[0]
    );

    let text = env.ok(None, &["procedures", "list"]);
    assert!(text.starts_with("ID"), "{text}");
    assert!(text.contains(id) && text.contains("done"), "{text}");
    let text = env.ok(None, &["procedures", "show", id]);
    assert!(
        text.contains(id) && text.contains("state") && text.contains("done"),
        "{text}"
    );

    let err = env.err(None, &["procedures", "show", "no-such-procedure"]);
    assert!(err.contains("no-such-procedure"), "{err}");
}

#[test]
fn topics_on_raft_engine_says_there_is_no_kafka_pool() {
    let env = Env::new();
    // `topics` only reads: the metadata file must exist, so a bootstrap writes it first.
    env.ok(None, &["bootstrap"]);
    let err = env.err(None, &["topics"]);
    assert!(err.contains("raft_engine"), "{err}");
    assert!(err.contains("no Kafka topic pool"), "{err}");
    let err = env.err(None, &["--json", "topics"]);
    assert!(err.contains("no Kafka topic pool"), "{err}");
}

#[test]
fn bootstrap_on_raft_engine_has_nothing_to_do() {
    let env = Env::new();
    let out = env.ok(None, &["bootstrap"]);
    assert!(out.contains("raft_engine"), "{out}");
}

#[test]
fn example_configs_are_accepted() {
    let env = Env::new();
    // The workspace root's examples/ (this package lives in walctl/).
    let examples = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../examples");
    let created = env.json(
        Some(&examples.join("embedded.toml")),
        &["create-table", "from_example", "--regions", "1"],
    );
    assert_eq!(created.len(), 1);
}

#[test]
fn a_metadata_file_held_by_another_process_is_a_clear_error() {
    let env = Env::new();
    let path = env.dir.path().join("held.redb");
    // This test process holds the file, as a running walctl or metasrv would.
    let _held = remote_wal::kv::RedbKvBackend::open(&path).expect("open redb");
    let config = env.write("held.toml", "[metadata_store]\npath = \"held.redb\"\n");
    let err = env.err(Some(&config), &["procedures", "list"]);
    assert!(err.contains("held.redb"), "names the file: {err}");
}

#[test]
fn unreachable_etcd_is_an_error_naming_the_endpoint() {
    let env = Env::new();
    let config = env.write(
        "etcd.toml",
        "[metadata_store]\nbackend = \"etcd\"\nendpoints = [\"127.0.0.1:1\"]\nconnect_timeout = \"1s\"\n",
    );
    let err = env.err(Some(&config), &["procedures", "list"]);
    assert!(err.contains("127.0.0.1:1"), "{err}");
}

#[test]
fn json_lines_keep_their_exact_bytes() {
    let env = Env::new();
    // The keys come out sorted, as walctl has always printed them.
    assert_eq!(
        env.ok(None, &["--json", "bootstrap"]),
        "{\"num_topics\":0,\"provider\":\"raft_engine\",\"ready\":true,\"recreated_topics\":0,\"topic_name_prefix\":null}\n"
    );
    let out = env.ok(None, &["--json", "create-table", "exact", "--regions", "1"]);
    let line: Value = serde_json::from_str(out.trim_end()).unwrap();
    let table_id = line["table_id"].as_u64().unwrap();
    assert_eq!(
        out,
        format!(
            "{{\"datanode_id\":1,\"region_id\":{},\"region_number\":0,\"table\":\"greptime.public.exact\",\
             \"table_id\":{table_id},\"wal_options\":\"{{\\\"wal.provider\\\":\\\"raft_engine\\\"}}\"}}\n",
            table_id << 32
        )
    );
    let out = env.ok(None, &["--json", "open-regions", "--datanode", "1"]);
    assert_eq!(
        out,
        format!(
            "{{\"datanode_id\":1,\"engine\":\"mito\",\"kind\":\"request\",\"options\":{{\"wal_options\":\
             \"{{\\\"wal.provider\\\":\\\"raft_engine\\\"}}\"}},\"region_dir\":\"data/greptime/public/{table_id}/\
             {table_id}_0000000000/\",\"region_id\":{},\"wal_options\":\"{{\\\"wal.provider\\\":\\\"raft_engine\\\"}}\"}}\n",
            table_id << 32
        )
    );
}

#[test]
fn usage_errors_read_from_the_error_kind() {
    let env = Env::new();
    for (args, expected) in [
        (
            &["create-table", "t", "--regionz", "2"][..],
            "error: unexpected argument '--regionz' found (see walctl --help)",
        ),
        (
            &["frob"][..],
            "error: unrecognized subcommand 'frob' (see walctl --help)",
        ),
        (
            &["open-regions", "--datanode", "x"][..],
            "error: invalid value 'x' for '--datanode <ID>': invalid digit found in string (see walctl --help)",
        ),
    ] {
        let out = env.walctl().args(args).output().expect("run walctl");
        assert_eq!(out.status.code(), Some(2), "{args:?}");
        assert_eq!(
            String::from_utf8_lossy(&out.stderr),
            format!("{expected}\n")
        );
    }
}
