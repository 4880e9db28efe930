#!/usr/bin/env bash
# The one command that runs every test of remote-wal (what .ci/run calls).
#
# It checks formatting, installs what a fresh machine lacks (Debian: etcd, etcdctl, protoc, openssl, postgresql,
# chromium; Maven
# Central: the Apache Kafka jars, cached under target/kafka-libs), runs clippy and rustdoc with warnings denied (the
# lint gates all run before any service starts, so they fail fast), starts on free loopback ports one Kafka broker
# (KRaft), one Kafka broker with a SASL_SSL listener only, one etcd, a secure etcd (TLS, client certificates,
# users) and a PostgreSQL cluster of its own, waits until they answer, runs the whole workspace's tests, every benchmark and example once at its
# smallest, and stops the services again — also when tests fail, in which case it prints the services' logs.
#
# KAFKA_ENDPOINTS / ETCD_ENDPOINTS set in the environment: use those services instead of starting our own; the same
# for the secure etcd with ETCD_SECURE_ENDPOINTS, ETCD_SECURE_CERTS and ETCD_SECURE_PASSWORD_FILE, and for the
# secure Kafka broker with KAFKA_SECURE_ENDPOINTS and KAFKA_SECURE_DIR, and for PostgreSQL with POSTGRES_URL,
# POSTGRES_PASSWORD_FILE and POSTGRES_TLS_CERTS (its user walctl_tls admitted over TLS with a client certificate).
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

# Lint gates first, before any service is started, so a formatting, clippy or rustdoc failure fails fast.
# A toolchain installed with a minimal profile may lack rustfmt or clippy; add them when rustup is there.
if command -v rustup >/dev/null 2>&1; then
  for component in rustfmt clippy; do
    if ! rustup component list --installed 2>/dev/null | grep -q "^$component"; then
      rustup component add "$component"
    fi
  done
fi
echo "[test] cargo fmt --all --check"
cargo fmt --all --check

trap cleanup EXIT INT TERM

# Compiling needs protoc (the etcd client generates its gRPC code at build time), so install before clippy.
"$SERVICES" install
# The server's page test loads / in headless Chromium (Debian's package); it fails, never skips, without it.
if ! command -v chromium >/dev/null 2>&1; then
  echo "[test] installing Debian's chromium"
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq >/dev/null
  apt-get install -y -qq chromium >/dev/null
fi

echo "[test] cargo clippy --workspace --all-targets --all-features -- -D warnings"
cargo clippy --workspace --all-targets --all-features -- -D warnings
# --all-features so the docs of the test kit (the `testing` feature) are checked too.
echo "[test] cargo doc --workspace --no-deps --all-features (rustdoc warnings denied)"
RUSTDOCFLAGS="-D warnings" cargo doc --workspace --no-deps --all-features

# The library compiles no CLI crate: they belong to walctl. (axum is checked as a direct dependency only: the etcd
# client's gRPC crate, tonic, pulls it in through its default features.)
echo "[test] cargo tree -p remote-wal -e normal: no CLI crate"
cli_crates='clap|indicatif|comfy-table|tabled|tracing-subscriber|prometheus-client'
if cargo tree -p remote-wal -e normal --prefix none | grep -E "^($cli_crates) " ||
  cargo tree -p remote-wal -e normal --prefix none --depth 1 | grep -E '^axum '; then
  echo "[test] remote-wal depends on the CLI crates above; they belong in walctl/Cargo.toml" >&2
  exit 1
fi

# The metasrv library and the datanode package never depend on each other's side: the library (which the metasrv
# embeds) names no datanode package, and the datanode package names no CLI crate (it depends on the library's shared
# types only).
echo "[test] cargo tree: remote-wal does not depend on the datanode package; datanode on no CLI crate"
if cargo tree -p remote-wal -e normal --prefix none | grep -E '^datanode '; then
  echo "[test] remote-wal depends on the datanode package; the metasrv must not" >&2
  exit 1
fi
if cargo tree -p datanode -e normal --prefix none | grep -E "^($cli_crates|walctl) " ||
  cargo tree -p datanode -e normal --prefix none --depth 1 | grep -E '^axum '; then
  echo "[test] the datanode package depends on a CLI crate or walctl; they belong in walctl/Cargo.toml" >&2
  exit 1
fi

if [[ -z ${ETCD_ENDPOINTS:-} ]]; then
  "$SERVICES" start etcd
  started+=(etcd)
  export ETCD_ENDPOINTS=$("$SERVICES" endpoint etcd)
fi
# The secure etcd (TLS, client certificates required, auth enabled: users root and walctl); its tests fail, never
# skip, without these variables.
if [[ -z ${ETCD_SECURE_ENDPOINTS:-} ]]; then
  "$SERVICES" start etcd-secure
  started+=(etcd-secure)
  export ETCD_SECURE_ENDPOINTS=$("$SERVICES" endpoint etcd-secure)
  export ETCD_SECURE_CERTS="$ROOT/target/services/etcd-secure/certs"
  export ETCD_SECURE_PASSWORD_FILE="$ROOT/target/services/etcd-secure/walctl.password"
fi
if [[ -z ${KAFKA_ENDPOINTS:-} ]]; then
  "$SERVICES" start kafka
  started+=(kafka)
  export KAFKA_ENDPOINTS=$("$SERVICES" endpoint kafka)
fi
# The security tests' broker: SASL_SSL only (scripts/services.sh start kafka-secure). KAFKA_SECURE_DIR holds
# certs/ca.pem, certs/other-ca.pem, username and password (the SCRAM user's).
if [[ -z ${KAFKA_SECURE_ENDPOINTS:-} ]]; then
  "$SERVICES" start kafka-secure
  started+=(kafka-secure)
  export KAFKA_SECURE_ENDPOINTS=$("$SERVICES" endpoint kafka-secure)
  export KAFKA_SECURE_DIR="$ROOT/target/services/kafka-secure"
fi
# PostgreSQL as the metadata store: a cluster of the run's own, as an unprivileged user (scripts/services.sh start
# postgres); its tests fail, never skip, without POSTGRES_URL.
if [[ -z ${POSTGRES_URL:-} ]]; then
  "$SERVICES" start postgres
  started+=(postgres)
  export POSTGRES_URL="postgres://postgres@$("$SERVICES" endpoint postgres)/remote_wal"
  export POSTGRES_PASSWORD_FILE="$ROOT/target/services/postgres/password"
  # Its TLS: the authority, a client certificate for user walctl_tls (admitted over TLS with one only), and an
  # authority that signed nothing (scripts/certs.sh).
  export POSTGRES_TLS_CERTS="$ROOT/target/services/postgres/certs"
fi
echo "[test] POSTGRES_URL=$POSTGRES_URL"
echo "[test] KAFKA_ENDPOINTS=$KAFKA_ENDPOINTS ETCD_ENDPOINTS=$ETCD_ENDPOINTS ETCD_SECURE_ENDPOINTS=$ETCD_SECURE_ENDPOINTS KAFKA_SECURE_ENDPOINTS=$KAFKA_SECURE_ENDPOINTS"

cargo build --workspace --all-targets
cargo test --workspace --no-fail-fast

# Every bench and example runs once, at its smallest, against the services above, so a broken one fails here
# rather than on the day someone measures (criterion runs each case once in test mode; our own harnesses run their
# smallest case when not given `--bench`). The figures printed are not measurements.
echo "[test] every bench once (cargo test --bench '*') and every example"
cargo test --workspace --bench '*' --no-fail-fast
cargo run -q -p procedures --example engine_cpu -- 1 1000
cargo run -q -p procedures --example engine_cpu_system -- 1 1000
fixtures=$(mktemp -d)
cargo run -q --example format1_fixtures -- "$fixtures"
rm -rf "$fixtures"
