#!/usr/bin/env bash
# Runs walctl from this checkout: `scripts/walctl.sh <walctl arguments>`.
# Building walctl compiles etcd's protocol files, which needs `protoc`; on a fresh Debian machine this installs it
# (package protobuf-compiler) first. Everything else comes from crates.io through cargo.
set -euo pipefail
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
if ! command -v protoc >/dev/null 2>&1; then
  echo "[walctl.sh] installing protoc (Debian package protobuf-compiler), needed to build the etcd client" >&2
  if [[ $(id -u) -eq 0 ]]; then SUDO=(); else SUDO=(sudo); fi
  export DEBIAN_FRONTEND=noninteractive
  "${SUDO[@]}" apt-get update -qq >/dev/null
  "${SUDO[@]}" apt-get install -y -qq protobuf-compiler >/dev/null
fi
exec cargo run -q --manifest-path "$ROOT/Cargo.toml" -p walctl -- "$@"
