//! Config errors through the library API: a parse error names the file, the position and the dotted key, inside
//! `[table]`s, `[a.b]` sub-tables, dotted keys, inline tables and arrays alike; the WAL table refuses Kafka keys
//! under raft-engine and lists every key it accepts.

use remote_wal::config::MetasrvConfig;
use remote_wal::wal::{KafkaConfig, WalConfig};

/// The error `toml` (the file's text) is refused with.
fn refused(toml: &str) -> String {
    MetasrvConfig::from_toml_str(toml, "metasrv.toml")
        .unwrap_err()
        .to_string()
}

#[test]
fn a_bad_value_in_an_inline_table_names_the_inner_key_and_its_position() {
    assert_eq!(
        refused("[wal]\nprovider = \"kafka\"\nbackoff = { init = \"1s\", deadline = \"soon\" }\n"),
        "invalid config file 'metasrv.toml', line 3, column 37, key `wal.backoff.deadline`: invalid value: \
         string \"soon\", expected a duration"
    );
    assert_eq!(
        refused("wal = { provider = \"kafka\", num_topics = \"many\" }\n"),
        "invalid config file 'metasrv.toml', line 1, column 42, key `wal.num_topics`: invalid type: string \
         \"many\", expected usize"
    );
}

#[test]
fn dotted_keys_and_sub_tables_name_the_full_path() {
    assert_eq!(
        refused("[wal]\nprovider = \"kafka\"\nbackoff.deadline = 5\n"),
        "invalid config file 'metasrv.toml', line 3, column 20, key `wal.backoff.deadline`: invalid type: \
         integer `5`, expected a duration"
    );
    assert_eq!(
        refused("[wal]\nprovider = \"kafka\"\n[wal.backoff]\nfoo = \"1s\"\n"),
        "invalid config file 'metasrv.toml', line 4, column 1, key `wal.backoff.foo`: unknown field `foo`, \
         expected one of `init`, `max`, `base`, `multiplier`, `deadline`"
    );
    assert_eq!(
        refused("datanodes.ids = \"x\"\n"),
        "invalid config file 'metasrv.toml', line 1, column 17, key `datanodes.ids`: invalid type: string \
         \"x\", expected a sequence"
    );
}

#[test]
fn an_array_element_is_named_by_its_index() {
    assert_eq!(
        refused("[datanodes]\nids = [1, \"two\"]\n"),
        "invalid config file 'metasrv.toml', line 2, column 11, key `datanodes.ids[1]`: invalid type: string \
         \"two\", expected u64"
    );
}

#[test]
fn columns_count_characters_not_bytes() {
    // "é" is two bytes: the column of `"mysql"` stays 11 on line 3, and the key line is found past it.
    assert_eq!(
        refused("[metadata_store]\nkey_prefix = \"é\"\nbackend = \"mysql\"\n"),
        "invalid config file 'metasrv.toml', line 3, column 11, key `metadata_store.backend`: unknown variant \
         `mysql`, expected one of `redb`, `etcd`, `postgres`, `memory`"
    );
    assert_eq!(
        refused("[procedure]\nmax_retries = -1 # é\n"),
        "invalid config file 'metasrv.toml', line 2, column 15, key `procedure.max_retries`: invalid value: \
         integer `-1`, expected usize"
    );
}

#[test]
fn kafka_keys_under_raft_engine_are_refused_naming_the_key() {
    assert_eq!(
        refused("[wal]\nprovider = \"raft_engine\"\nnum_topics = 3\n"),
        "invalid config file 'metasrv.toml', line 1, column 1, key `wal`: key `num_topics` applies only to \
         provider = \"kafka\", not \"raft_engine\""
    );
    // The provider may come after the Kafka keys.
    assert_eq!(
        refused("[wal]\nbackoff = { init = \"1s\" }\nprovider = \"raft_engine\"\n"),
        "invalid config file 'metasrv.toml', line 1, column 1, key `wal`: key `backoff` applies only to \
         provider = \"kafka\", not \"raft_engine\""
    );
}

#[test]
fn a_wal_table_without_provider_is_refused() {
    assert_eq!(
        refused("[wal]\nnum_topics = 3\n"),
        "invalid config file 'metasrv.toml', line 1, column 1, key `wal`: missing field `provider`"
    );
}

#[test]
fn an_unknown_wal_key_lists_every_key_of_the_kafka_config() {
    let err = refused("[wal]\nprovider = \"kafka\"\nnum_topicz = 3\n");
    assert_eq!(
        err,
        "invalid config file 'metasrv.toml', line 3, column 1, key `wal.num_topicz`: unknown field \
         `num_topicz`, expected one of `provider`, `broker_endpoints`, `num_topics`, `topic_name_prefix`, \
         `num_partitions`, `replication_factor`, `create_topic_timeout`, `selector_type`, \
         `max_concurrent_creates`, `create_batch_size`, `topic_config`, `prune_mode`, `prune_interval`, \
         `security`, `backoff`"
    );
    // The list is KafkaConfig's own fields: every one of them is accepted as a key.
    let defaults = toml::Table::try_from(KafkaConfig::default()).unwrap();
    assert_eq!(defaults.len(), 12);
    for key in defaults.keys() {
        assert!(
            err.contains(&format!("`{key}`")),
            "{key} missing from: {err}"
        );
    }
}

#[test]
fn syntax_errors_name_the_file_and_position() {
    assert_eq!(
        refused("[datanodes]\nids = [1, 2\n"),
        "invalid config file 'metasrv.toml', line 2, column 12: unclosed array, expected `]`"
    );
    assert_eq!(
        refused("[wal]\nprovider = \"kafka\"\nprovider = \"kafka\"\n"),
        "invalid config file 'metasrv.toml', line 3, column 1: duplicate key"
    );
}

#[test]
fn every_kafka_key_round_trips_through_the_wal_table() {
    let text = "provider = \"kafka\"\nbroker_endpoints = [\"k:1\"]\nnum_topics = 3\ntopic_name_prefix = \"p\"\n\
                num_partitions = 2\nreplication_factor = 3\ncreate_topic_timeout = \"2s\"\n\
                selector_type = \"round_robin\"\nmax_concurrent_creates = 5\ncreate_batch_size = 250\nprune_mode = \"logical\"\n\
                prune_interval = \"30s\"\n\n[backoff]\ninit = \"1s\"\n\
                max = \"2s\"\nbase = 3.0\ndeadline = \"1m\"\n";
    let parsed = WalConfig::from_toml_str(text).unwrap();
    let WalConfig::Kafka(kafka) = &parsed else {
        panic!("expected kafka: {parsed:?}")
    };
    assert_eq!(kafka.num_partitions, 2);
    assert_eq!(kafka.max_concurrent_creates, 5);
    assert_eq!(kafka.create_batch_size, 250);
    assert_eq!(kafka.prune_mode, remote_wal::wal::prune::PruneMode::Logical);
    assert_eq!(kafka.prune_interval, std::time::Duration::from_secs(30));
    assert_eq!(kafka.backoff.base, 3.0);
    assert_eq!(toml::to_string(&parsed).unwrap(), text);
}

#[test]
fn wal_security_errors_name_the_key_and_never_read_the_password_into_the_message() {
    let err = refused(
        "[wal]\nprovider = \"kafka\"\n[wal.security]\nsasl = { mechanism = \"SCRAM-SHA-1\", username = \"u\", \
         password_file = \"pw\" }\n",
    );
    assert!(err.contains("key `wal.security.sasl.mechanism`"), "{err}");
    assert!(
        err.contains("`PLAIN`, `SCRAM-SHA-256`, `SCRAM-SHA-512`"),
        "{err}"
    );
    let err = refused("[wal]\nprovider = \"kafka\"\n[wal.security]\ntls = { cert = \"c.pem\" }\n");
    assert!(err.contains("wal.security.tls"), "{err}");
    assert!(err.contains("missing field `ca`"), "{err}");
    let err = refused(
        "[wal]\nprovider = \"kafka\"\n[wal.security]\ntls = { ca = \"ca.pem\", cert = \"c.pem\" }\n",
    );
    assert!(err.contains("security.tls.key"), "{err}");

    // A password file is read when a client connects; its contents never reach an error.
    let dir = tempfile::tempdir().unwrap();
    let password = dir.path().join("password");
    std::fs::write(&password, "hunter2-secret\n").unwrap();
    let config = MetasrvConfig::from_toml_str(
        &format!(
            "[wal]\nprovider = \"kafka\"\n[wal.security]\nsasl = {{ mechanism = \"SCRAM-SHA-512\", username = \
             \"walctl\", password_file = {:?} }}\n",
            password.display().to_string()
        ),
        "metasrv.toml",
    )
    .unwrap();
    let WalConfig::Kafka(kafka) = &config.wal else {
        panic!("a Kafka WAL")
    };
    let loaded = kafka.security.load().unwrap();
    let sasl = loaded.sasl.as_ref().unwrap();
    assert_eq!(sasl.password.expose(), "hunter2-secret");
    for shown in [format!("{config:?}"), format!("{loaded:?}")] {
        assert!(!shown.contains("hunter2"), "{shown}");
    }
}
