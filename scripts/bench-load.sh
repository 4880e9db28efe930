#!/usr/bin/env bash
# Bench (not in the test command): `walctl load` through one `walctl datanode` against Kafka's own
# ProducerPerformance (acks=all, batch.size=1048576, linger.ms=5), 1 KiB entries, on the same broker in one run.
#
#   scripts/services.sh install && scripts/services.sh start kafka
#   KAFKA_ENDPOINTS=$(scripts/services.sh endpoint kafka) scripts/bench-load.sh
#
# It builds walctl in release, starts a `walctl serve` (redb, in a temporary directory) and one datanode on free
# ports, creates a table of 1 region and one of 8 regions (8 pool topics), loads each for BENCH_SECONDS (default 10),
# runs ProducerPerformance on a fresh one-partition topic with BENCH_RECORDS (default 1,000,000), and prints the
# three figures and the ratios. It stops what it started.
#
# Against a secure broker: WAL_SECURITY_TOML=FILE names a file with a `[wal.security]` table (docs/security.md);
# it is added to the bench's walctl config, and the same settings are written as Java client properties (mode 0600,
# by `cargo run --example java_client_properties`) for TopicCommand (--command-config) and ProducerPerformance
# (--producer.config), so the anchor connects exactly as walctl does.
set -euo pipefail
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
: "${KAFKA_ENDPOINTS:?set KAFKA_ENDPOINTS (scripts/services.sh endpoint kafka)}"
SECONDS_EACH=${BENCH_SECONDS:-10}
RECORDS=${BENCH_RECORDS:-1000000}
LIBS=${KAFKA_LIBS:-$ROOT/target/kafka-libs}
cd "$ROOT"
cargo build --release -q -p walctl
WALCTL=$ROOT/target/release/walctl
DIR=$(mktemp -d)
free_port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }
SERVE=127.0.0.1:$(free_port)
DN=127.0.0.1:$(free_port)
PREFIX=bench_load_$$_$RANDOM
cat > "$DIR/bench.toml" <<TOML
[metadata_store]
backend = "redb"
path = "$DIR/meta.redb"

[wal]
provider = "kafka"
broker_endpoints = ["${KAFKA_ENDPOINTS//,/\",\"}"]
num_topics = 8
topic_name_prefix = "$PREFIX"

[datanodes]
ids = [1]

[server]
listen = "$SERVE"

[datanode]
id = 1
listen = "$DN"
metasrv = ["$SERVE"]
region_storage = "$DIR/regions"
flush_threshold = 1073741824
TOML
java_config=()
if [[ -n ${WAL_SECURITY_TOML:-} ]]; then
  cat "$WAL_SECURITY_TOML" >>"$DIR/bench.toml"
  cargo run --release -q --example java_client_properties -- "$DIR/bench.toml" "$DIR/client.properties"
  java_config=(--command-config "$DIR/client.properties")
fi
pids=()
cleanup() { for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done; rm -rf "$DIR"; }
trap cleanup EXIT
"$WALCTL" --config "$DIR/bench.toml" serve >"$DIR/serve.log" 2>&1 & pids+=($!)
"$WALCTL" --config "$DIR/bench.toml" datanode >"$DIR/datanode.log" 2>&1 & pids+=($!)
for t in one:1 eight:8; do
  "$WALCTL" --server "$SERVE" --wait 120s create-table "${t%%:*}" --regions "${t##*:}" >/dev/null
done
sleep 5
load() {
  "$WALCTL" --server "$SERVE" --json load --table "$1" --duration "${SECONDS_EACH}s" --entry-size 1024 --batch 1000 \
    --concurrency "$2" | python3 -c 'import json,sys; r=json.loads(sys.stdin.read()); print("%.1f %.0f %.1f %.1f" % (r["mb_per_sec"], r["entries_per_sec"], r["p50_ms"], r["p99_ms"]))'
}
read -r one_mb one_eps one_p50 one_p99 < <(load one 1)
read -r eight_mb eight_eps eight_p50 eight_p99 < <(load eight 8)
TOPIC=${PREFIX}_anchor
java -cp "$LIBS/*" org.apache.kafka.tools.TopicCommand --bootstrap-server "${KAFKA_ENDPOINTS%%,*}" --create \
  --topic "$TOPIC" --partitions 1 --replication-factor 1 "${java_config[@]}" >/dev/null
producer_config=()
if ((${#java_config[@]})); then producer_config=(--producer.config "$DIR/client.properties"); fi
anchor=$(java -cp "$LIBS/*" org.apache.kafka.tools.ProducerPerformance --topic "$TOPIC" --num-records "$RECORDS" \
  --record-size 1024 --throughput -1 "${producer_config[@]}" --producer-props "bootstrap.servers=${KAFKA_ENDPOINTS%%,*}" acks=all \
  batch.size=1048576 linger.ms=5 2>/dev/null | tail -1)
anchor_mb=$(echo "$anchor" | sed -E 's/.*\(([0-9.]+) MB\/sec\).*/\1/')
echo "walctl load, 1 region  (1 topic, 1 in flight):   $one_mb MB/s, $one_eps entries/s, p50 $one_p50 ms, p99 $one_p99 ms"
echo "walctl load, 8 regions (8 topics, 8 in flight): $eight_mb MB/s, $eight_eps entries/s, p50 $eight_p50 ms, p99 $eight_p99 ms"
echo "ProducerPerformance (1 partition):              $anchor_mb MB/s ($anchor)"
python3 -c "print('ratio 1 region / anchor: %.2f; 8 regions / anchor: %.2f' % ($one_mb/$anchor_mb, $eight_mb/$anchor_mb))"
