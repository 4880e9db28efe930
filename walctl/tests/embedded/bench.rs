//! `walctl bench ddl` on the embedded default: it creates only its own `bench_{run}_*` tables, reports them in text
//! and JSON, counts the store's commits, and refuses to run without `--tables`.

use crate::support::Env;
use serde_json::Value;

fn bench(env: &Env, tables: &str, concurrency: &str) -> Value {
    bench_with(env, tables, concurrency, &[])
}

fn bench_with(env: &Env, tables: &str, concurrency: &str, extra: &[&str]) -> Value {
    let mut args = vec![
        "bench",
        "ddl",
        "--tables",
        tables,
        "--concurrency",
        concurrency,
        "--regions",
        "2",
    ];
    args.extend_from_slice(extra);
    let mut lines = env.json(None, &args);
    assert_eq!(lines.len(), 1, "one report object: {lines:?}");
    lines.remove(0)
}

#[test]
fn bench_ddl_creates_its_own_tables_and_reports_every_field() {
    let env = Env::new();
    // A table of the user's, created first: the benchmark must leave it alone.
    env.ok(None, &["create-table", "mine", "--regions", "1"]);
    let before = env.ok(None, &["open-regions", "--datanode", "1"]);
    assert!(
        before.starts_with("datanode 1: 1 regions to open"),
        "{before}"
    );

    let report = bench(&env, "6", "3");
    assert_eq!(report["tables"], 6);
    assert_eq!(report["concurrency"], 3);
    assert_eq!(report["regions"], 2);
    for field in ["elapsed_s", "tables_per_s", "p50_ms", "p99_ms", "max_ms"] {
        assert!(
            report[field].as_f64().is_some_and(|v| v > 0.0),
            "{field} is a positive number: {report}"
        );
    }
    let (p50, p99, max) = (
        report["p50_ms"].as_f64().unwrap(),
        report["p99_ms"].as_f64().unwrap(),
        report["max_ms"].as_f64().unwrap(),
    );
    assert!(p50 <= p99 && p99 <= max, "{report}");
    let commits = report["commits"].as_u64().expect("commits");
    assert!(commits >= 6, "at least one commit per table: {report}");
    assert_eq!(
        report["commits_per_table"].as_f64(),
        Some(commits as f64 / 6.0)
    );

    // Its tables exist under its run's names (2 regions each) next to the user's table, which is unchanged.
    let run = report["run"].as_str().expect("run");
    let after = env.ok(None, &["open-regions", "--datanode", "1"]);
    assert!(
        after.starts_with("datanode 1: 13 regions to open"),
        "{after}"
    );
    for i in 0..6 {
        let out = env.ok(
            None,
            &[
                "create-table",
                &format!("bench_{run}_{i}"),
                "--regions",
                "2",
                "--if-not-exists",
            ],
        );
        assert!(
            out.starts_with(&format!("table greptime.public.bench_{run}_{i} id ")),
            "{out}"
        );
    }
    let mine = env.ok(
        None,
        &["create-table", "mine", "--regions", "1", "--if-not-exists"],
    );
    assert_eq!(
        mine.lines().count(),
        3,
        "the user's table still has its one region: {mine}"
    );

    // A second run picks new names: nothing collides with the first run's tables.
    let second = bench(&env, "2", "2");
    assert_ne!(second["run"], report["run"]);
    let last = env.ok(None, &["open-regions", "--datanode", "1"]);
    assert!(last.starts_with("datanode 1: 17 regions to open"), "{last}");
}

#[test]
fn bench_ddl_counts_each_tables_commits_and_one_id_range_per_run() {
    // Each run is a new process: its first table reserves a range of `TABLE_ID_STEP` (10) table ids with one
    // commit, then every table costs the same k commits. Runs of 1, 4 and 7 tables (all within one range) thus
    // count 1 + k, 1 + 4k and 1 + 7k: the counter counts every commit of each create-table and nothing of the
    // run's start-up.
    // Group commit off: the create-tables in flight do not share commits, so each costs exactly its own.
    let env = Env::new();
    let off = ["--no-group-commit"];
    let run = |tables, concurrency| {
        let report = bench_with(&env, tables, concurrency, &off);
        assert_eq!(report["group_commit"], false, "{report}");
        report["commits"].as_u64().expect("commits")
    };
    let (c1, c4, c7) = (run("1", "1"), run("4", "2"), run("7", "3"));
    assert_eq!(
        c7 - c4,
        c4 - c1,
        "the same commits per table: {c1}, {c4}, {c7}"
    );
    let per_table = (c4 - c1) / 3;
    assert_eq!((c4 - c1) % 3, 0, "{c1}, {c4}");
    // Submission; allocation with the state; metadata with the final state (docs/create-table.md).
    assert_eq!(per_table, 3, "commits per create-table: {c1}, {c4}, {c7}");
    assert_eq!(c1, per_table + 1, "one table and one id range reservation");
}

#[test]
fn bench_ddl_with_group_commit_costs_at_most_three_commits_a_table() {
    // On by default: create-tables in flight may share commits (how many do depends on how they meet), never cost
    // more than alone. 1 + 3 per table: the id range reservation, then at most three each.
    let env = Env::new();
    let report = bench(&env, "8", "8");
    assert_eq!(report["group_commit"], true, "{report}");
    let commits = report["commits"].as_u64().expect("commits");
    assert!(commits <= 1 + 3 * 8, "{report}");
    assert!(
        commits > 3,
        "the reservation and at least the three commits of the last table: {report}"
    );
}

#[test]
fn bench_ddl_text_names_throughput_latency_and_commits() {
    let env = Env::new();
    let out = env.ok(None, &["bench", "ddl", "--tables", "2"]);
    let lines: Vec<&str> = out.lines().collect();
    assert_eq!(lines.len(), 3, "{out}");
    assert!(lines[0].starts_with("created 2 tables bench_"), "{out}");
    assert!(
        lines[0].contains("(1 regions each, 16 in flight)") && lines[0].ends_with("tables/s"),
        "{out}"
    );
    assert!(
        lines[1].starts_with("latency: p50 ") && lines[1].contains(", p99 "),
        "{out}"
    );
    assert!(lines[2].starts_with("store commits: "), "{out}");
}

#[test]
fn bench_ddl_refuses_to_run_without_tables() {
    let env = Env::new();
    let err = env.err(None, &["bench", "ddl", "--concurrency", "4"]);
    assert!(
        err.contains("the following required arguments were not provided: --tables <N>"),
        "{err}"
    );
    assert!(
        !env.dir.path().join("walctl-data").exists(),
        "a refused benchmark writes nothing"
    );
    let err = env.err(None, &["bench", "ddl", "--tables", "0"]);
    assert!(
        err.contains("invalid value '0' for '--tables <N>'"),
        "{err}"
    );
}
