#!/usr/bin/env bash
# The one command that runs every test of remote-wal (what .ci/run calls).
#
# It installs what a fresh machine lacks (Debian: etcd, etcdctl, protoc; Maven Central: the Apache Kafka jars,
# cached under target/kafka-libs), starts one Kafka broker (KRaft) and one etcd on free loopback ports, waits until
# both answer, runs the whole workspace's tests (and builds the benchmarks), and stops the services again — also
# when tests fail, in which case it prints the services' logs.
#
# KAFKA_ENDPOINTS / ETCD_ENDPOINTS set in the environment: use those services instead of starting our own.
set -euo pipefail

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$ROOT"
SERVICES="$ROOT/scripts/services.sh"
export REMOTE_WAL_SERVICES_SCRIPT="$SERVICES"

started=()
cleanup() {
  local rc=$?
  if ((rc != 0)) && ((${#started[@]})); then
    for s in "${started[@]}"; do
      echo "---- last lines of the $s log (target/services/$s/) ----" >&2
      LINES_SHOWN=40 "$SERVICES" logs "$s" "$s" >&2 || true
    done
  fi
  # Every service this checkout started, including ones tests started for themselves.
  "$SERVICES" stop-all || true
  exit $rc
}
trap cleanup EXIT INT TERM

"$SERVICES" install

if [[ -z ${ETCD_ENDPOINTS:-} ]]; then
  "$SERVICES" start etcd
  started+=(etcd)
  export ETCD_ENDPOINTS=$("$SERVICES" endpoint etcd)
fi
if [[ -z ${KAFKA_ENDPOINTS:-} ]]; then
  "$SERVICES" start kafka
  started+=(kafka)
  export KAFKA_ENDPOINTS=$("$SERVICES" endpoint kafka)
fi
echo "[test] KAFKA_ENDPOINTS=$KAFKA_ENDPOINTS ETCD_ENDPOINTS=$ETCD_ENDPOINTS"

cargo build --workspace --all-targets
cargo test --workspace --no-fail-fast
