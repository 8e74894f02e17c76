#!/usr/bin/env bash
# Instructions per value on the caller's side of the Coalescer (the client library), counted by
# callgrind: 64 callers of `counter_next` on random keys against a real AllocSvr, 20,000 values
# after a warm-up. The servers run natively; only the caller's process is under callgrind.
# docs/benchmarks/examples.md (`coal_cost`) and docs/benchmarks/counter-bench.md.
#
#   cargo build --release --workspace --bins && cargo build --release -p seqsvr-bench --example coal_cost
#   sim/bench/callgrind-coalescer.sh [coal_cost options, e.g. --callers 256 --uids]
#
# Needs valgrind (Debian: apt install valgrind). KEEP=1 keeps the dump (for callgrind_annotate).
set -euo pipefail
root=$(cd "$(dirname "$0")/../.." && pwd)
rel=${TARGET_DIR:-$root/target}/release
command -v valgrind >/dev/null || { echo "callgrind-coalescer: needs valgrind (apt install valgrind)" >&2; exit 2; }
for b in allocsvr storesvr examples/coal_cost; do
  [ -x "$rel/$b" ] || {
    echo "callgrind-coalescer: $rel/$b missing; build first:" >&2
    echo "  cargo build --release --workspace --bins && cargo build --release -p seqsvr-bench --example coal_cost" >&2
    exit 2
  }
done
work=$(mktemp -d)
if [ -z "${KEEP:-}" ]; then trap 'rm -rf "$work"' EXIT; else echo "dump in $work"; fi
# coal_cost finds the servers beside itself.
cp "$rel/examples/coal_cost" "$rel/storesvr" "$rel/allocsvr" "$work/"
values=20000
valgrind --tool=callgrind --dump-instr=no --callgrind-out-file="$work/callgrind.client.%p" \
  "$work/coal_cost" --values "$values" --dir "$work/data" "$@"
python3 "$root/sim/bench/callgrind_calls.py" --calls "$values" --top "${TOP:-30}" --one client-coalesced "$work"/callgrind.client.*.*
