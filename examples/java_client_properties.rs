//! Writes the Java Kafka client properties of a walctl config's `[wal.security]` (mode 0600: they hold the
//! password), for Kafka's own tools run against the same broker (`ProducerPerformance --producer.config FILE`,
//! `TopicCommand --command-config FILE`). `scripts/bench-load.sh` runs it when `WAL_SECURITY_TOML` is set.
//!
//! ```text
//! cargo run --example java_client_properties -- CONFIG.toml OUT.properties
//! ```

use std::path::PathBuf;
use std::process::ExitCode;

use remote_wal::wal::kafka::java_client::write_java_client_properties;
use remote_wal::wal::kafka::security::KafkaSecurityConfig;

fn main() -> ExitCode {
    let args: Vec<PathBuf> = std::env::args_os().skip(1).map(PathBuf::from).collect();
    let [config, out] = args.as_slice() else {
        eprintln!("usage: java_client_properties CONFIG.toml OUT.properties");
        return ExitCode::from(2);
    };
    match KafkaSecurityConfig::from_toml_file(config)
        .and_then(|security| write_java_client_properties(&security, out))
    {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("java_client_properties: {e}");
            ExitCode::FAILURE
        }
    }
}
