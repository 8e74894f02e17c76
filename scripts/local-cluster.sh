#!/usr/bin/env bash
# Builds seqsvr-rs and runs a complete local cluster on loopback: per set, 3 StoreSvr replicas
# (one Raft group) and 2 AllocSvr nodes, each serving gRPC, HTTP/JSON and the Redis protocol
# (all three with mutual TLS under --tls). Set 0 serves every uid and keeps the cluster map; with
# --sets N, sets 1..N-1 start empty and are added to the map, ready for `seqctl move`. Data lives
# under $SEQSVR_DATA (default ./data/local-cluster). Ctrl-C stops every process it started.
#
#   ./scripts/local-cluster.sh --sets 2                     # two sets
#   ./scripts/local-cluster.sh --tls                        # mutual TLS with roles on every link
#   SEQSVR_DATA=/tmp/seq ./scripts/local-cluster.sh        # other data dir
#   SEQSVR_FRESH=1 ./scripts/local-cluster.sh              # wipe the data dir first
set -euo pipefail
cd "$(dirname "$0")/.."

SETS=1
TLS=0
while [ $# -gt 0 ]; do
  case "$1" in
    --tls) TLS=1; shift ;;
    --sets) SETS=${2:-}; shift 2 || { echo "--sets needs a number" >&2; exit 2; } ;;
    --sets=*) SETS=${1#--sets=}; shift ;;
    *) echo "unknown option $1 (only --sets N and --tls)" >&2; exit 2 ;;
  esac
done
case "$SETS" in
  [1-9]) ;;
  *) echo "--sets must be 1..9, got '$SETS'" >&2; exit 2 ;;
esac

DATA=${SEQSVR_DATA:-./data/local-cluster}
# Set s listens on these ports plus 10·s (metrics: plus 1000 more).
STORE_PORTS=(7101 7102 7103)
ALLOC_PORTS=(7201 7202)
# Each AllocSvr's HTTP/JSON, Redis-protocol and Redis Cluster front ends: its gRPC port plus these.
HTTP_OFFSET=100
RESP_OFFSET=200
CLUSTER_OFFSET=300
BIN=target/release
# Plain logs in the log files (no terminal colour codes).
export NO_COLOR=1

echo "building (release; the first build takes a few minutes)..."
cargo build --release -p storesvr -p allocsvr -p seqctl --bins

if [ "${SEQSVR_FRESH:-0}" = 1 ]; then rm -rf "$DATA"; fi
# A new cluster places counter keys by Redis hash slot, so that Redis Cluster clients reach each
# key's owner (docs/FRONTENDS.md). The placement is fixed when a cluster is set up: a data dir
# made before this script chose it (no marker) keeps SHA-256, which its StoreSvrs stored.
if [ ! -e "$DATA" ]; then mkdir -p "$DATA" && echo slots >"$DATA/key-placement"; fi
DATA=$(cd "$DATA" && pwd)
PLACEMENT=$(cat "$DATA/key-placement" 2>/dev/null || echo sha256)

# With --tls: a development CA and one certificate per role (made once, kept with the data), and
# the flags each kind of process passes.
tls_flags() { :; }
if [ "$TLS" = 1 ]; then
  CERTS="$DATA/certs"
  [ -e "$CERTS/ca.pem" ] || "$BIN/seqctl" certs --out "$CERTS" --hosts 127.0.0.1,localhost >/dev/null
  tls_flags() { echo "--tls-ca $CERTS/ca.pem --tls-cert $CERTS/$1.pem --tls-key $CERTS/$1.key"; }
fi

STORE_PIDS=()
ALLOC_PIDS=()
PIDS=()
cleanup() {
  trap - INT TERM EXIT
  echo
  echo "stopping ${#PIDS[@]} processes..."
  # AllocSvrs first and to the end (on SIGTERM they release their sections, which needs a live
  # store, so the next start need not wait out their leases), then the store.
  for pid in "${ALLOC_PIDS[@]}"; do kill -TERM "$pid" 2>/dev/null || true; done
  for pid in "${ALLOC_PIDS[@]}"; do wait "$pid" 2>/dev/null || true; done
  for pid in "${STORE_PIDS[@]}"; do kill -TERM "$pid" 2>/dev/null || true; done
  for pid in "${STORE_PIDS[@]}"; do wait "$pid" 2>/dev/null || true; done
  echo "stopped; data kept in $DATA"
}
trap cleanup INT TERM EXIT

# Starts set $1: its StoreSvr group (in $DATA/set$1 for sets above 0) and its AllocSvrs.
start_set() {
  local set=$1 dir=$DATA off=$((10 * $1)) peers="" i port extra
  [ "$set" != 0 ] && dir="$DATA/set$set"
  mkdir -p "$dir"
  for i in 1 2 3; do peers+="${peers:+,}$i=127.0.0.1:$((STORE_PORTS[i - 1] + off))"; done
  # --new-replica only when the whole group is new (no store dir yet). A restart keeps the dirs; a
  # single missing dir is a lost replica, which storesvr refuses to restart under its old id.
  local new_group=1
  for i in 1 2 3; do [ -e "$dir/store$i" ] && new_group=0; done
  for i in 1 2 3; do
    port=$((STORE_PORTS[i - 1] + off))
    extra=()
    [ "$i" = 1 ] && extra+=(--bootstrap)
    [ "$new_group" = 1 ] && extra+=(--new-replica)
    RUST_LOG=${RUST_LOG:-info,openraft=warn} "$BIN/storesvr" --node-id "$i" --set-id "$set" \
      --listen "127.0.0.1:$port" --data-dir "$dir/store$i" --peers "$peers" \
      --metrics-listen "127.0.0.1:$((port + 1000))" --key-placement "$PLACEMENT" "${extra[@]}" $(tls_flags storesvr) 2>>"$dir/store$i.log" &
    STORE_PIDS+=($!)
    PIDS+=($!)
  done
  for i in 1 2; do
    port=$((ALLOC_PORTS[i - 1] + off))
    extra=(--http-listen "127.0.0.1:$((port + HTTP_OFFSET))" --resp-listen "127.0.0.1:$((port + RESP_OFFSET))"
      --resp-cluster-listen "127.0.0.1:$((port + CLUSTER_OFFSET))")
    RUST_LOG=${RUST_LOG:-info} "$BIN/allocsvr" --node-id "$((10 * set + i))" --listen "127.0.0.1:$port" \
      --store "$peers" --metrics-listen "127.0.0.1:$((port + 1000))" "${extra[@]}" $(tls_flags allocsvr) 2>>"$dir/alloc$i.log" &
    ALLOC_PIDS+=($!)
    PIDS+=($!)
    ALLOC+="${ALLOC:+,}127.0.0.1:$port"
  done
  SET_STORES[$set]=$peers
}

ALLOC=""
SET_STORES=()
for ((s = 0; s < SETS; s++)); do start_set "$s"; done

STORE="127.0.0.1:${STORE_PORTS[0]},127.0.0.1:${STORE_PORTS[1]},127.0.0.1:${STORE_PORTS[2]}"
SEQCTL="$BIN/seqctl --alloc $ALLOC --store $STORE $(tls_flags admin)"
GRPCURL="grpcurl -plaintext"
[ "$TLS" = 1 ] && GRPCURL="grpcurl -cacert $CERTS/ca.pem -cert $CERTS/client.pem -key $CERTS/client.key"

echo "waiting for the cluster to serve..."
deadline=$((SECONDS + 60))
until $SEQCTL fetch 1 >/dev/null 2>&1; do
  if [ $SECONDS -ge $deadline ]; then
    echo "the cluster did not serve within 60 s; see the logs in $DATA" >&2
    exit 1
  fi
  for pid in "${PIDS[@]}"; do
    kill -0 "$pid" 2>/dev/null || { echo "a process exited early; see the logs in $DATA" >&2; exit 1; }
  done
  sleep 0.5
done

$SEQCTL status
echo
deadline=$((SECONDS + 60))
for ((s = 1; s < SETS; s++)); do
  # Idempotent: a restarted cluster finds the set in the map already.
  until $SEQCTL set add "$s" --stores "${SET_STORES[$s]}" >/dev/null 2>&1; do
    [ $SECONDS -ge $deadline ] && { echo "set $s could not be added to the cluster map" >&2; exit 1; }
    sleep 0.5
  done
done
if [ "$SETS" -gt 1 ]; then
  $SEQCTL sets
  echo
fi
echo "uid 42 fetched three times (each seq above the one before):"
$SEQCTL fetch 42
$SEQCTL fetch 42 | tail -n +2
$SEQCTL fetch 42 | tail -n +2
echo "three time-ordered ids (unique in the whole cluster, from any AllocSvr):"
until $SEQCTL id next 3 2>/dev/null; do
  # An AllocSvr gets its id slot within a renewal or two of the set's ids being set up.
  [ $SECONDS -ge $deadline ] && { echo "no time-ordered ids within 60 s; see the logs in $DATA" >&2; break; }
  sleep 0.2
done
HTTP="127.0.0.1:$((ALLOC_PORTS[0] + HTTP_OFFSET))"
RESP_PORT=$((ALLOC_PORTS[0] + RESP_OFFSET))
CURL="curl -s"
REDIS_CLI="redis-cli"
SCHEME=http
if [ "$TLS" = 1 ]; then
  # A client certificate: the front ends take callers whose role may take numbers.
  CURL="curl -s --cacert $CERTS/ca.pem --cert $CERTS/client.pem --key $CERTS/client.key"
  REDIS_CLI="redis-cli --tls --cacert $CERTS/ca.pem --cert $CERTS/client.pem --key $CERTS/client.key"
  SCHEME=https
fi
echo "HTTP/JSON on every AllocSvr (port +$HTTP_OFFSET), the Redis protocol too (port +$RESP_OFFSET); any one answers for every uid and counter."
echo "Redis Cluster clients (redis-cli -c, redis-py RedisCluster): port +$CLUSTER_OFFSET (keys placed by: $PLACEMENT)"
for ((s = 0; s < SETS; s++)); do
  for p in "${ALLOC_PORTS[@]}"; do
    echo "  set $s: $SCHEME://127.0.0.1:$((p + 10 * s + HTTP_OFFSET))  redis://127.0.0.1:$((p + 10 * s + RESP_OFFSET))  cluster 127.0.0.1:$((p + 10 * s + CLUSTER_OFFSET))"
  done
done
if command -v curl >/dev/null; then
  echo "\$ $CURL -X POST $SCHEME://$HTTP/v1/counter/orders/next"
  $CURL -X POST "$SCHEME://$HTTP/v1/counter/orders/next"; echo
fi
if command -v redis-cli >/dev/null; then
  echo "\$ $REDIS_CLI -p $RESP_PORT INCR orders"
  $REDIS_CLI -p "$RESP_PORT" INCR orders
fi
cat <<MSG

The cluster is serving. Data and logs: $DATA
Try:
  $SEQCTL fetch 42
  $SEQCTL get 42
  $SEQCTL batch 1 2 3 100000 4000000000
  $SEQCTL id next 5
  $SEQCTL id decode \$($SEQCTL id next)
  $SEQCTL status
  $SEQCTL --json status
  $SEQCTL sets
  $SEQCTL move --from 0 --to 1 --uids 0..200000 --dry-run     # with --sets 2 or more
  $SEQCTL move --from 0 --to 1 --uids 0..200000
  $SEQCTL ledger create invoices --hold 60s                        # a ledger: numbers with no gaps
  $SEQCTL ledger reserve invoices --holder till-1                  # 1, held until confirmed or released
  $SEQCTL ledger confirm invoices 1 INV-0001
  $SEQCTL ledger gaps invoices --format csv                        # every voided number, reason, who, when
  $CURL -X POST $SCHEME://$HTTP/v1/seq/42/next
  $CURL -X POST '$SCHEME://$HTTP/v1/counter/orders/reserve?count=100'
  $CURL -X POST '$SCHEME://$HTTP/v1/ids?count=3'
  $CURL -X POST $SCHEME://$HTTP/v1/ledger/invoices/reserve -d '{"holder":"web"}'
  $REDIS_CLI -p $RESP_PORT INCR u:42                              # uid 42; any other name is a counter
  $REDIS_CLI -p $RESP_PORT INCRBY orders 100
  $REDIS_CLI -p $RESP_PORT NEXTID
  $REDIS_CLI -c -p $((ALLOC_PORTS[0] + CLUSTER_OFFSET)) INCR orders                # Redis Cluster: -MOVED to the owner
  $REDIS_CLI -p $((ALLOC_PORTS[0] + CLUSTER_OFFSET)) CLUSTER SLOTS
  $GRPCURL -d '{"uid": 42}' 127.0.0.1:${ALLOC_PORTS[0]} seqsvr.v1.AllocService/FetchNextSeq
  $GRPCURL -d '{"key": "aW52b2ljZXM=", "from": 1, "count": 10}' 127.0.0.1:${ALLOC_PORTS[0]} seqsvr.v1.LedgerService/Show
  $GRPCURL 127.0.0.1:${STORE_PORTS[0]} seqsvr.v1.StoreService/Status
Metrics: http://127.0.0.1:$((STORE_PORTS[0] + 1000))/metrics (StoreSvr), http://127.0.0.1:$((ALLOC_PORTS[0] + 1000))/metrics (AllocSvr)

Press Ctrl-C to stop every process.
MSG
wait
