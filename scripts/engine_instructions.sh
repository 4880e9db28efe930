#!/usr/bin/env bash
# Instructions per procedure of the engine and of the same writes without it, counted by callgrind:
#   scripts/engine_instructions.sh [STEPS] [SHAPE] [N1] [N2] [BINARY]
# runs the `engine_cpu` example's two halves apart (ENGINE_CPU_ONLY=engine, then writes), each with N1 and then N2
# procedures (defaults 1984 and 9984, multiples of 64) after its 20,000 to warm up, and divides the difference of
# the counts by N2 - N1: start, warm-up and stop cancel out. SHAPE is `waves` (default) or `one`. The count does not
# move with the machine's load, unlike the CPU time `engine_cpu` prints, but it leaves out the kernel's work (thread
# wake-ups, page faults) and the cost of cache misses: it shows the instructions a change saves, not its whole
# effect. BINARY defaults to this checkout's release build of the example (built first); pass another build's to
# compare two. Needs valgrind (Debian package valgrind); a 1-step run takes about a minute.
set -euo pipefail
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
STEPS=${1:-1}
SHAPE=${2:-waves}
N1=${3:-1984}
N2=${4:-9984}
BINARY=${5:-}
if ! command -v valgrind >/dev/null 2>&1; then
  echo "[engine_instructions.sh] valgrind is missing: apt-get install valgrind" >&2
  exit 1
fi
if (( N2 <= N1 )); then
  echo "[engine_instructions.sh] N2 ($N2) must be larger than N1 ($N1)" >&2
  exit 1
fi
if [[ -z $BINARY ]]; then
  cargo build -q --release --manifest-path "$ROOT/Cargo.toml" -p procedures --example engine_cpu
  BINARY="$ROOT/target/release/examples/engine_cpu"
fi
count() { # HALF N: the instructions callgrind counted for that half's run
  ENGINE_CPU_ONLY=$1 valgrind --tool=callgrind --callgrind-out-file=/dev/null "$BINARY" "$STEPS" "$2" "$SHAPE" 2>&1 |
    sed -n 's/.*Collected : \([0-9]*\).*/\1/p'
}
per_procedure() { # HALF
  local low high
  low=$(count "$1" "$N1")
  high=$(count "$1" "$N2")
  if [[ -z $low || -z $high ]]; then
    echo "[engine_instructions.sh] callgrind gave no count for the $1 half of $BINARY" >&2
    exit 1
  fi
  echo $(( (high - low) / (N2 - N1) ))
}
engine=$(per_procedure engine)
writes=$(per_procedure writes)
ratio=$(awk -v e="$engine" -v w="$writes" 'BEGIN { printf "%.3f", e / w }')
echo "$STEPS step(s), $SHAPE: engine $engine instructions per procedure, the same writes $writes; engine / writes $ratio"
