#!/usr/bin/env bash
# Multi-host rehearsal on one machine: a two-set cluster (per set 3 StoreSvrs and 2 AllocSvrs)
# plus a load/check client, every process in its own network namespace with its own address on
# one bridge, as if each were a separate host. Every server binds 0.0.0.0:7000 (the same port on
# every "host") and advertises its bridge address, so nothing can lean on loopback or on distinct
# ports. Faults are cut at the bridge (nftables, bridge family, in the switch namespace): a
# partition of one host (both directions) and one-way cuts, each healed after a while, under load
# from the client namespace; a move of a uid range from set 0 to set 1 runs under the same load.
# Then `sim load` judges the recorded history (P1 sweep, P4, P5, P6, one set at a time, liveness).
#
#   sudo scripts/netns-cluster.sh                   # builds the debug binaries if BIN_DIR is unset
#   BIN_DIR=target/debug scripts/netns-cluster.sh --duration 60
#   ALLOC_EXTRA=--unsafe-skip-lease-wait scripts/netns-cluster.sh   # a negative control: must FAIL
#
# Needs root, iproute2 and nft (Debian: apt-get install nftables). Addresses: 10.77.0.0/24, only
# inside the namespaces this script creates (named nsr<pid>-…). Every namespace (and with the
# switch namespace the bridge) is deleted and every process it started is stopped at the end, on
# Ctrl-C and on SIGTERM. Exit code: 0 every promise held, 1 a violation or a server crashed,
# 2 bad usage or a missing tool, 3 the rehearsal itself failed. Logs and the history stay in $OUT.
set -euo pipefail
cd "$(dirname "$0")/.."

DURATION=50
while [ $# -gt 0 ]; do
  case "$1" in
    --duration) DURATION=${2:-}; shift 2 || { echo "--duration needs seconds" >&2; exit 2; } ;;
    -h | --help) sed -n '2,20p' "$0"; exit 0 ;;
    *) echo "unknown option $1 (only --duration SECS)" >&2; exit 2 ;;
  esac
done
case "$DURATION" in
  [4-9][0-9] | [1-5][0-9][0-9]) ;;
  *) echo "--duration must be 40..599 seconds (the faults need 40), got '$DURATION'" >&2; exit 2 ;;
esac

[ "$(id -u)" = 0 ] || { echo "netns-cluster: needs root (network namespaces)" >&2; exit 2; }
for tool in ip nft; do
  command -v "$tool" >/dev/null || { echo "netns-cluster: $tool not found (apt-get install iproute2 nftables)" >&2; exit 2; }
done

if [ -z "${BIN_DIR:-}" ]; then
  echo "building the debug binaries..."
  cargo build -p storesvr -p allocsvr -p seqctl -p sim --bins
  BIN_DIR=target/debug
fi
BIN_DIR=$(cd "$BIN_DIR" && pwd)
for b in storesvr allocsvr seqctl sim; do
  [ -x "$BIN_DIR/$b" ] || { echo "netns-cluster: $BIN_DIR/$b missing (cargo build --bins)" >&2; exit 2; }
done
OUT=${OUT:-$(mktemp -d "${TMPDIR:-/tmp}/netns-cluster.XXXXXX")}
mkdir -p "$OUT"
OUT=$(cd "$OUT" && pwd)
export NO_COLOR=1

NET=10.77.0
PORT=7000
P="nsr$$"           # namespace prefix: this run's namespaces only
SW="$P-sw"          # the switch: a bridge and the fault rules
UID_LIMIT=2000000   # 20 sections of 100,000: a short run still touches every section
# Extra flags for every StoreSvr / AllocSvr (the negative controls, e.g. --unsafe-skip-lease-wait).
read -r -a STORE_EXTRA <<<"${STORE_EXTRA:-}"
read -r -a ALLOC_EXTRA <<<"${ALLOC_EXTRA:-}"
# host name -> last octet of its address
declare -A IP=([s0-store1]=11 [s0-store2]=12 [s0-store3]=13 [s0-alloc1]=21 [s0-alloc2]=22
  [s1-store1]=31 [s1-store2]=32 [s1-store3]=33 [s1-alloc1]=41 [s1-alloc2]=42 [client]=100)

NAMESPACES=()
STORE_PIDS=()
ALLOC_PIDS=()
OTHER_PIDS=()

# Stops every process (AllocSvrs first: on SIGTERM they release their sections, which needs a live
# store), then deletes every namespace; runs once, on exit, Ctrl-C or SIGTERM.
# shellcheck disable=SC2329 # called by the EXIT trap
cleanup() {
  local rc=$?
  trap - EXIT INT TERM
  set +e
  echo "netns-cluster: stopping ${#ALLOC_PIDS[@]} AllocSvrs, ${#STORE_PIDS[@]} StoreSvrs, ${#OTHER_PIDS[@]} others"
  for pid in "${OTHER_PIDS[@]}"; do kill -TERM "$pid" 2>/dev/null; done
  stop_pids 10 "${ALLOC_PIDS[@]}"
  stop_pids 10 "${STORE_PIDS[@]}"
  stop_pids 2 "${OTHER_PIDS[@]}"
  # Anything still running inside one of this run's namespaces (a process a failed step left).
  for ns in "${NAMESPACES[@]}"; do
    for pid in $(ip netns pids "$ns" 2>/dev/null); do kill -KILL "$pid" 2>/dev/null; done
  done
  for ns in "${NAMESPACES[@]}"; do ip netns del "$ns" 2>/dev/null; done
  echo "netns-cluster: removed ${#NAMESPACES[@]} namespaces; logs and history in $OUT"
  exit "$rc"
}
trap cleanup EXIT
trap 'exit 130' INT
trap 'exit 143' TERM

# stop_pids GRACE PID...: SIGTERM, wait up to GRACE seconds, then SIGKILL what is left.
# shellcheck disable=SC2329 # called by cleanup
stop_pids() {
  local grace=$1 pid deadline
  shift
  for pid in "$@"; do kill -TERM "$pid" 2>/dev/null; done
  deadline=$((SECONDS + grace))
  for pid in "$@"; do
    while kill -0 "$pid" 2>/dev/null && [ "$SECONDS" -lt "$deadline" ]; do sleep 0.1; done
    kill -KILL "$pid" 2>/dev/null
    wait "$pid" 2>/dev/null
  done
}

addr() { echo "$NET.${IP[$1]}"; }
ns() { echo "$P-$1"; }
# Runs a command in a host's namespace. Not for background servers: `fn &` forks a subshell, so
# $! would be the subshell's pid, not the server's; those call `ip netns exec` directly (it execs).
in_ns() { local n; n=$(ns "$1"); shift; ip netns exec "$n" "$@"; }

# The switch: one namespace holding the bridge every host is plugged into.
make_switch() {
  ip netns add "$SW"
  NAMESPACES+=("$SW")
  ip -n "$SW" link set lo up
  ip -n "$SW" link add br0 type bridge
  ip -n "$SW" link set br0 up
}

# A host: its own namespace, eth0 with its address, cabled to the bridge by a veth pair.
make_host() {
  local name=$1 n port
  n=$(ns "$name")
  port="p${IP[$name]}"
  ip netns add "$n"
  NAMESPACES+=("$n")
  ip -n "$SW" link add "$port" type veth peer name eth0 netns "$n"
  ip -n "$SW" link set "$port" master br0 up
  ip -n "$n" addr add "$(addr "$name")/24" dev eth0
  ip -n "$n" link set eth0 up
  ip -n "$n" link set lo up
}

# The fault table of the switch: rules in its bridge forward chain drop frames between hosts.
block() {
  local rule=$1
  ip netns exec "$SW" nft add rule bridge seqfault cut "$rule"
}
heal() {
  ip netns exec "$SW" nft flush chain bridge seqfault cut
}

# Peers of set $1: ID=ADDR for its three StoreSvrs.
peers_of() {
  local s=$1 i out=""
  for i in 1 2 3; do out+="${out:+,}$i=$(addr "s$s-store$i"):$PORT"; done
  echo "$out"
}

start_set() {
  local s=$1 i name extra
  for i in 1 2 3; do
    name="s$s-store$i"
    extra=(--new-replica "${STORE_EXTRA[@]}")
    [ "$i" = 1 ] && extra+=(--bootstrap)
    ip netns exec "$(ns "$name")" env RUST_LOG=info,openraft=warn "$BIN_DIR/storesvr" --node-id "$i" --set-id "$s" \
      --listen "0.0.0.0:$PORT" --metrics-listen "0.0.0.0:9100" --data-dir "$OUT/$name" \
      --peers "$(peers_of "$s")" --uid-limit "$UID_LIMIT" "${extra[@]}" >"$OUT/$name.log" 2>&1 &
    STORE_PIDS+=($!)
  done
  for i in 1 2; do
    name="s$s-alloc$i"
    ip netns exec "$(ns "$name")" env RUST_LOG=info "$BIN_DIR/allocsvr" --node-id "$((10 * s + i))" \
      --listen "0.0.0.0:$PORT" --advertise "$(addr "$name"):$PORT" --store "$(peers_of "$s")" \
      --metrics-listen "0.0.0.0:9100" "${ALLOC_EXTRA[@]}" >"$OUT/$name.log" 2>&1 &
    ALLOC_PIDS+=($!)
  done
}

all_alive() {
  local pid
  for pid in "${STORE_PIDS[@]}" "${ALLOC_PIDS[@]}"; do kill -0 "$pid" 2>/dev/null || return 1; done
}

# until_ok DEADLINE_SECS WHAT CMD...: retries CMD every half second until it succeeds.
until_ok() {
  local deadline=$((SECONDS + $1)) what=$2
  shift 2
  until "$@" >/dev/null 2>&1; do
    all_alive || { echo "netns-cluster: a server exited early; see $OUT/*.log" >&2; exit 3; }
    [ $SECONDS -lt $deadline ] || { echo "netns-cluster: $what within $1 s failed; see $OUT" >&2; exit 3; }
    sleep 0.5
  done
}

now_ns() { date +%s%N; }
EVENTS=()
# fault_for SECS KIND TARGET RULE...: applies the rules, waits, heals, records the event.
fault_for() {
  local secs=$1 kind=$2 target=$3 start rule
  shift 3
  start=$(now_ns)
  for rule in "$@"; do block "$rule"; done
  echo "netns-cluster: $(date +%T) $kind $target for ${secs}s"
  sleep "$secs"
  heal
  EVENTS+=("fault $kind $target $start $(now_ns)")
  echo "netns-cluster: $(date +%T) healed"
}

echo "netns-cluster: namespaces $P-*, bridge br0 in $SW, hosts on $NET.0/24, output in $OUT"
make_switch
for h in "${!IP[@]}"; do make_host "$h"; done
ip netns exec "$SW" nft add table bridge seqfault
ip netns exec "$SW" nft add chain bridge seqfault cut '{ type filter hook forward priority 0; }'

start_set 0
start_set 1
ALL_ALLOC="$(addr s0-alloc1):$PORT,$(addr s0-alloc2):$PORT,$(addr s1-alloc1):$PORT,$(addr s1-alloc2):$PORT"
S0="$(addr s0-store1):$PORT,$(addr s0-store2):$PORT,$(addr s0-store3):$PORT"
seqctl() { in_ns client "$BIN_DIR/seqctl" --alloc "$ALL_ALLOC" --store "$S0" "$@"; }

until_ok 60 "serving uid 1 from the client host" seqctl fetch 1
until_ok 30 "adding set 1 to the cluster map" seqctl set add 1 --stores "$(peers_of 1)"
seqctl sets

echo "netns-cluster: load for ${DURATION}s from the client host"
ip netns exec "$(ns client)" "$BIN_DIR/sim" load --alloc "$ALL_ALLOC" --duration "${DURATION}s" --seed "${SEED:-$$}" \
  --uid-limit "$UID_LIMIT" --history "$OUT/history.jsonl" --events "$OUT/events" >"$OUT/load.out" 2>&1 &
LOAD_PID=$!
OTHER_PIDS+=("$LOAD_PID")
T0=$SECONDS
until_ok 60 "the load's first pass over every section" grep -q "every section served" "$OUT/load.out"

# A move under load: sections [0, 4) go from set 0 to set 1.
start=$(now_ns)
seqctl --timeout-ms 30000 move --from 0 --to 1 --uids 0..400000 2>"$OUT/move.err" || {
  cat "$OUT/move.err" >&2
  echo "netns-cluster: the move failed" >&2
  exit 3
}
op=$(sed -n 's/^move \([0-9]*\): sections \[\([0-9]*\), \([0-9]*\)).*/\1 \2 \3/p' "$OUT/move.err")
read -r op sb se <<<"$op"
EVENTS+=("move $op 0 1 $sb $se $start $(now_ns)")
echo "netns-cluster: $(date +%T) move $op of sections [$sb, $se) to set 1 done"

# The faults, spaced so that each heals (and the set recovers) before the next.
# The status's first "leader_id" is the set's (the members' own views come later).
leader=$(seqctl --json status | grep -o '"leader_id":[0-9]*' | head -n 1 | cut -d: -f2)
leader=${leader:-1}
sleep 2
fault_for 8 partition "s0-store$leader(leader)" "ip saddr $(addr "s0-store$leader") drop" \
  "ip daddr $(addr "s0-store$leader") drop"
sleep 4
fault_for 8 partition s0-alloc2 "ip saddr $(addr s0-alloc2) drop" "ip daddr $(addr s0-alloc2) drop"
sleep 4
# A stale owner: s1-alloc1 cannot reach its StoreSvrs (no renewals arrive), clients still reach it.
fault_for 8 one-way "s1-alloc1->s1-stores" \
  "ip saddr $(addr s1-alloc1) ip daddr { $(addr s1-store1), $(addr s1-store2), $(addr s1-store3) } drop"
# The load reads the events after its duration: write them (atomically) before it ends.
printf '%s\n' "${EVENTS[@]}" >"$OUT/events.tmp"
mv "$OUT/events.tmp" "$OUT/events"
[ $((SECONDS - T0)) -lt "$DURATION" ] || echo "netns-cluster: warning: the faults outlasted the load" >&2

rc=0
wait "$LOAD_PID" || rc=$?
OTHER_PIDS=()
cat "$OUT/load.out"
if ! all_alive; then
  echo "netns-cluster: CRASH: a server exited during the run; see $OUT/*.log" >&2
  rc=1
fi
if grep -l panicked "$OUT"/s*.log 2>/dev/null; then
  echo "netns-cluster: PANIC in the logs above" >&2
  rc=1
fi
case $rc in
  0) echo "netns-cluster: PASS" ;;
  1) echo "netns-cluster: FAIL" ;;
  *) echo "netns-cluster: the load could not run (exit $rc); see $OUT/load.out" ;;
esac
exit "$rc"
