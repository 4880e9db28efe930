//! `[wal] topic_config` through walctl on the real broker (`KAFKA_ENDPOINTS`): a pool made before the configs were
//! set keeps its topics' configs, and `walctl bootstrap` and `walctl topics` warn about each differing one on stderr
//! (stdout keeps the result), every time, since nothing is changed.

use crate::support::{Env, json_lines, kafka_redb_config, unique};

/// Runs walctl with `config` and `args`, expecting success; (stdout, stderr).
fn run(env: &Env, config: &std::path::PathBuf, args: &[&str]) -> (String, String) {
    let out = env
        .walctl_with(config)
        .args(args)
        .output()
        .expect("run walctl");
    let stderr = String::from_utf8(out.stderr).expect("stderr is UTF-8");
    assert!(
        out.status.success(),
        "walctl {args:?} failed ({}): {stderr}",
        out.status
    );
    (
        String::from_utf8(out.stdout).expect("stdout is UTF-8"),
        stderr,
    )
}

/// The `warning: ` lines of `stderr`.
fn warnings(stderr: &str) -> Vec<&str> {
    stderr
        .lines()
        .filter(|l| l.starts_with("warning: "))
        .collect()
}

#[test]
fn bootstrap_and_topics_warn_about_pool_topics_whose_configs_differ_and_change_nothing() {
    let env = Env::new();
    let prefix = unique("walctl_cfg");
    // The pool is made with the broker's default retention (7 days)...
    let plain = kafka_redb_config(&env, "pool", &prefix, 2, "");
    run(&env, &plain, &["bootstrap"]);
    // (`pool.toml` is rewritten in place: the metadata stays in `walctl-data/pool.redb`.)
    // ...then the config asks for one day.
    let with_config = kafka_redb_config(
        &env,
        "pool",
        &prefix,
        2,
        "topic_config = { \"retention.ms\" = \"86400000\" }",
    );
    let expected: Vec<String> = (0..2)
        .map(|i| {
            format!(
                "warning: topic '{prefix}_{i}' has retention.ms = 604800000, but [wal] topic_config asks for \
                 86400000; existing topics are not changed (alter it with Kafka's tools if intended)"
            )
        })
        .collect();
    for _ in 0..2 {
        let (stdout, stderr) = run(&env, &with_config, &["bootstrap"]);
        assert_eq!(warnings(&stderr), expected, "{stderr}");
        assert!(stdout.contains("ready"), "{stdout}");

        let (stdout, stderr) = run(&env, &with_config, &["--json", "topics"]);
        assert_eq!(warnings(&stderr), expected, "{stderr}");
        assert_eq!(json_lines(&stdout).len(), 2, "{stdout}");
    }
    // The JSON bootstrap report carries the drift too.
    let (stdout, _) = run(&env, &with_config, &["--json", "bootstrap"]);
    let report = &json_lines(&stdout)[0];
    assert_eq!(report["config_drift"][0]["key"], "retention.ms");
    assert_eq!(report["config_drift"][0]["actual"], "604800000");
    assert_eq!(report["config_drift"][0]["wanted"], "86400000");
    // Without topic configs nothing is compared or said (the same file, rewritten without them).
    let plain = kafka_redb_config(&env, "pool", &prefix, 2, "");
    let (_, stderr) = run(&env, &plain, &["topics"]);
    assert!(warnings(&stderr).is_empty(), "{stderr}");
}
