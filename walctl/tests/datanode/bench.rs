//! `walctl bench heartbeats` runs against a real `walctl serve` (on etcd and Kafka) and reports what it measured:
//! every simulated datanode got its regions and a lease for each, and the JSON names every figure.

use serde_json::Value;

use crate::cluster::Cluster;

#[test]
fn bench_heartbeats_leases_every_simulated_region_and_reports_its_figures() {
    let cluster = Cluster::metasrv_only(&[1, 2, 3], 2, "");
    let pid = cluster
        .serve
        .as_ref()
        .expect("serve started")
        .pid()
        .to_string();
    let out = cluster.walctl(&[
        "--json",
        "bench",
        "heartbeats",
        "--datanodes",
        "3",
        "--regions",
        "2",
        "--duration",
        "1s",
        // One in flight: two first heartbeats of one datanode at once would race for its regions' first
        // checkpoint, and the loser's answer would rightly hold one lease back.
        "--concurrency",
        "1",
        "--server-pid",
        &pid,
    ]);
    let report: Value = serde_json::from_str(out.trim()).unwrap_or_else(|e| panic!("{e}: {out}"));
    assert_eq!(report["datanodes"], 3, "{report}");
    assert_eq!(report["regions"], 2, "{report}");
    assert!(
        report["heartbeats"].as_u64().is_some_and(|h| h > 0),
        "{report}"
    );
    // Each datanode reports the 2 regions its first heartbeat told it to open, and each gets its lease.
    assert_eq!(report["leases_per_heartbeat"], 2.0, "{report}");
    for figure in [
        "seconds",
        "heartbeats_per_sec",
        "p50_ms",
        "p99_ms",
        "server_cpu_us_per_heartbeat",
        "bench_cpu_us_per_heartbeat",
    ] {
        assert!(
            report[figure].as_f64().is_some_and(|v| v >= 0.0),
            "{figure}: {report}"
        );
    }
    assert!(
        report["p99_ms"].as_f64() >= report["p50_ms"].as_f64(),
        "{report}"
    );
}
