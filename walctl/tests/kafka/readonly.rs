//! Read-only commands on etcd: they claim no epoch, so five of them run at once next to a create-table without
//! fencing each other, and they leave every key and value of the namespace exactly as they were.

use std::path::{Path, PathBuf};
use std::process::Output;

use crate::support::{Env, endpoints, toml_list, unique, walctl_path};
use remote_wal::config::MetasrvConfig;
use remote_wal::kv::redb::RedbOpenMode;
use remote_wal::kv::{KeyValue, RangeRequest, range_all};
use remote_wal::metasrv::Metasrv;

/// An etcd + raft-engine config in `env` under a fresh key prefix.
fn etcd_config(env: &Env) -> PathBuf {
    let etcd = endpoints("ETCD_ENDPOINTS");
    env.write(
        "etcd.toml",
        &format!(
            r#"
[metadata_store]
backend = "etcd"
endpoints = {etcd}
key_prefix = "walctl-test/{ns}/"

[wal]
provider = "raft_engine"
"#,
            etcd = toml_list(&etcd),
            ns = unique("readonly"),
        ),
    )
}

/// Every key and value under the config's namespace, read through a metasrv that is never started.
fn etcd_contents(config: &Path) -> Vec<KeyValue> {
    let runtime = tokio::runtime::Runtime::new().expect("runtime");
    runtime.block_on(async {
        let config = MetasrvConfig::from_file(config).expect("load the config");
        let metasrv = Metasrv::open(config, RedbOpenMode::MustExist)
            .await
            .expect("connect to etcd");
        range_all(metasrv.kv().as_ref(), RangeRequest::prefix(Vec::new()), 0)
            .await
            .expect("read every key")
    })
}

fn assert_success(what: &str, out: &Output) {
    assert!(
        out.status.success(),
        "{what} failed ({}): {}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
}

#[test]
fn five_read_only_commands_and_a_create_table_run_at_once_without_fencing() {
    let env = Env::new();
    let config = etcd_config(&env);
    env.ok(Some(&config), &["create-table", "first", "--regions", "2"]);
    let list = env.json(Some(&config), &["procedures", "list"]);
    let id = list[0]["id"].as_str().expect("procedure id").to_string();

    let read_only: [&[&str]; 5] = [
        &["procedures", "list"],
        &["procedures", "show", &id],
        &["open-regions", "--datanode", "1"],
        &["procedures", "list"],
        &["open-regions", "--datanode", "1"],
    ];
    let mut children = Vec::new();
    let writer: &[&str] = &["create-table", "second", "--regions", "1"];
    for args in read_only.iter().copied().chain([writer]) {
        let child = std::process::Command::new(walctl_path())
            .current_dir(env.dir.path())
            .env_remove("RUST_LOG")
            .arg("--config")
            .arg(&config)
            .args(args)
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::piped())
            .spawn()
            .expect("spawn walctl");
        children.push((format!("walctl {args:?}"), child));
    }
    for (what, child) in children {
        let out = child.wait_with_output().expect("wait for walctl");
        assert_success(&what, &out);
    }
    let list = env.json(Some(&config), &["procedures", "list"]);
    assert_eq!(list.len(), 2, "both create-tables are recorded: {list:?}");
}

#[test]
fn read_only_commands_leave_the_etcd_namespace_unchanged_epoch_included() {
    let env = Env::new();
    let config = etcd_config(&env);
    env.ok(Some(&config), &["create-table", "demo", "--regions", "2"]);
    let before = etcd_contents(&config);
    assert!(
        before
            .iter()
            .any(|kv| String::from_utf8_lossy(&kv.key).ends_with("epoch")),
        "create-table claimed an epoch, so the store holds one: {before:?}"
    );
    let list = env.json(Some(&config), &["procedures", "list"]);
    let id = list[0]["id"].as_str().expect("procedure id").to_string();
    env.ok(Some(&config), &["procedures", "show", &id]);
    env.ok(Some(&config), &["open-regions", "--datanode", "1"]);
    assert_eq!(
        etcd_contents(&config),
        before,
        "a read-only command wrote to the store"
    );
}
