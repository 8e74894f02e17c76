#!/usr/bin/env bash
# Instructions per call of the AllocSvr and of the bare echo, counted by callgrind: NextIds(1),
# FetchNextSeq, a 100-uid batch, a CounterBatch of 30 keys (KEYS=N for another size), and a
# pipeline of 16 Redis-protocol INCRs against redis-server's own count; one caller. For the same
# binaries the counts repeat whatever else the machine is doing, so a change to the serving path
# too small for alloc-bench's noise still shows here, down to the function. docs/benchmarks/examples.md
# ("Instructions per call").
#
#   cargo build --release --workspace --bins && cargo build --release -p seqsvr-bench --example call_cost
#   sim/bench/callgrind-calls.sh [CALLS]      # 2000 per case and server by default; about 2 minutes
#   KEYS=1000 sim/bench/callgrind-calls.sh 200
#
# Needs valgrind (Debian: apt install valgrind). KEEP=1 keeps the dumps (for callgrind_annotate).
set -euo pipefail
root=$(cd "$(dirname "$0")/../.." && pwd)
rel=${TARGET_DIR:-$root/target}/release
calls=${1:-2000}
command -v valgrind >/dev/null || { echo "callgrind-calls: needs valgrind (apt install valgrind)" >&2; exit 2; }
for b in allocsvr storesvr ids-bench examples/call_cost; do
  [ -x "$rel/$b" ] || {
    echo "callgrind-calls: $rel/$b missing; build first:" >&2
    echo "  cargo build --release --workspace --bins && cargo build --release -p seqsvr-bench --example call_cost" >&2
    exit 2
  }
done
work=$(mktemp -d)
if [ -z "${KEEP:-}" ]; then trap 'rm -rf "$work"' EXIT; else echo "dumps in $work"; fi
# call_cost starts the servers it finds beside itself: the StoreSvrs as they are, the AllocSvr and
# the echo (ids-bench --serve-echo) through wrappers that run them under callgrind.
cp "$rel/examples/call_cost" "$rel/storesvr" "$work/"
for b in allocsvr ids-bench; do
  printf '#!/bin/sh\nexec valgrind --tool=callgrind --dump-instr=no --callgrind-out-file=%s/callgrind.%s.%%p %s "$@"\n' \
    "$work" "$b" "$rel/$b" > "$work/$b"
  chmod +x "$work/$b"
done
# redis-server, when installed, is the resp16 case's baseline: under callgrind through a wrapper
# found first on PATH.
if redis=$(command -v redis-server); then
  mkdir -p "$work/bin"
  printf '#!/bin/sh\nexec valgrind --tool=callgrind --dump-instr=no --callgrind-out-file=%s/callgrind.redis.%%p %s "$@"\n' \
    "$work" "$redis" > "$work/bin/redis-server"
  chmod +x "$work/bin/redis-server"
  export PATH="$work/bin:$PATH"
fi
"$work/call_cost" --calls "$calls" --keys "${KEYS:-30}" --dir "$work/data"
python3 "$root/sim/bench/callgrind_calls.py" --calls "$calls" "$work"/callgrind.*.*.*
