"""redis-py's RedisCluster against seqsvr's Redis Cluster ports, for sim/e2e/tests/redis_cluster.rs.

Usage: redis_cluster.py MODE SECONDS SEED CLUSTER_ADDRS NAMES   (comma-separated lists)

MODE `load`: INCRs of random names for SECONDS through one RedisCluster client (it reads the slot
map with CLUSTER SLOTS, sends each key to its slot's node and follows -MOVED), and its cluster
pipelines. MODE `steady`: a fresh client INCRs every name SECONDS times over (a count here).
Both then print which port the client's slot map sends each name to: {"homes": {name: port}}.
Prints one JSON line per value: {"client", "name", "start", "end", "value"} with CLOCK_MONOTONIC
nanoseconds, or {"client", "name", "error"} for a call that gave no value.
"""

import json
import random
import sys
import time

import redis
from redis.cluster import ClusterNode, RedisCluster

mode, secs, seed = sys.argv[1], float(sys.argv[2]), int(sys.argv[3])
addrs, names = (a.split(",") for a in sys.argv[4:6])
rnd = random.Random(seed)
print(json.dumps({"redis_py": redis.__version__}), flush=True)


def now():
    return time.clock_gettime_ns(time.CLOCK_MONOTONIC)


def record(client, name, start, end, value):
    print(json.dumps({"client": client, "name": name, "start": start, "end": end, "value": value}))


def failed(client, name, why):
    print(json.dumps({"client": client, "name": name, "error": str(why)[:200]}))


def connect():
    nodes = [ClusterNode(a.rsplit(":", 1)[0], int(a.rsplit(":", 1)[1])) for a in addrs]
    return RedisCluster(startup_nodes=nodes, socket_timeout=5, socket_connect_timeout=2)


def incr(rc, client, name):
    start = now()
    try:
        value = rc.incr(name)
    except Exception as e:  # noqa: BLE001 - every failure is reported, none hidden
        failed(client, name, "%s: %s" % (type(e).__name__, e))
        time.sleep(0.05)
        return
    record(client, name, start, now(), value)


def pipeline(rc):
    # Distinct names: a cluster pipeline sends each node its keys in one round trip.
    batch = rnd.sample(names, 4)
    pipe = rc.pipeline()
    for n in batch:
        pipe.incr(n)
    start = now()
    try:
        values = pipe.execute(raise_on_error=False)
    except Exception as e:  # noqa: BLE001
        for n in batch:
            failed("py-cluster-pipe", n, "%s: %s" % (type(e).__name__, e))
        time.sleep(0.05)
        return
    end = now()
    for n, v in zip(batch, values):
        if isinstance(v, int):
            record("py-cluster-pipe", n, start, end, v)
        else:
            failed("py-cluster-pipe", n, v)


rc = connect()
if mode == "load":
    until = time.monotonic() + secs
    while time.monotonic() < until:
        if rnd.random() < 0.8:
            incr(rc, "py-cluster", rnd.choice(names))
        else:
            pipeline(rc)
elif mode == "steady":
    for _ in range(int(secs)):
        for n in names:
            incr(rc, "py-cluster-steady", n)
else:
    sys.exit("unknown mode %s" % mode)
# Where the client's slot map sends each key now (after the load: as the -MOVED answers and
# refreshes during the move and the kill left it).
print(json.dumps({"homes": {n: rc.get_node_from_key(n).port for n in names}}))
sys.stdout.flush()
