"""Load through seqsvr's front ends from Python, for sim/e2e/tests/fronts.rs.

Usage: fronts.py SECONDS SEED HTTP_ADDRS RESP_ADDRS NAMES   (comma-separated lists)

Calls random AllocSvrs with the standard library's HTTP client and, when it is installed, the
`redis` package (single commands and pipelines, RESP2 and RESP3). Prints one JSON line per
value: {"client", "name", "start", "end", "value"} with CLOCK_MONOTONIC nanoseconds, or
{"client", "name", "error"} for a call that gave no value. Stops by itself after SECONDS.
"""

import json
import random
import sys
import time
import urllib.error
import urllib.parse
import urllib.request

secs, seed = float(sys.argv[1]), int(sys.argv[2])
http_addrs, resp_addrs, names = (a.split(",") for a in sys.argv[3:6])
rnd = random.Random(seed)

try:
    import redis
except ImportError:
    redis = None
print(json.dumps({"redis_py": redis.__version__ if redis else None}), flush=True)


def now():
    return time.clock_gettime_ns(time.CLOCK_MONOTONIC)


def record(client, name, start, end, value):
    print(json.dumps({"client": client, "name": name, "start": start, "end": end, "value": value}))


def failed(client, name, why):
    print(json.dumps({"client": client, "name": name, "error": str(why)[:200]}))


def http_next(name):
    addr = rnd.choice(http_addrs)
    if name.startswith("u:"):
        path = "/v1/seq/%s/next" % name[2:]
    else:
        path = "/v1/counter/%s/next" % urllib.parse.quote(name, safe="")
    start = now()
    try:
        req = urllib.request.Request("http://%s%s" % (addr, path), method="POST")
        with urllib.request.urlopen(req, timeout=5) as r:
            body = json.load(r)
        record("py-http", name, start, now(), int(body.get("seq", body.get("value"))))
    except urllib.error.HTTPError as e:
        failed("py-http", name, "%s %s" % (e.code, e.read()[:200]))
    except OSError as e:
        failed("py-http", name, e)


connections = {}


def redis_conn():
    addr = rnd.choice(resp_addrs)
    if addr not in connections:
        host, port = addr.rsplit(":", 1)
        connections[addr] = redis.Redis(
            host=host, port=int(port), protocol=rnd.choice([2, 3]), socket_timeout=5
        )
    return addr, connections[addr]


def redis_single(name):
    addr, c = redis_conn()
    start = now()
    try:
        value = c.incr(name)
        record("py-redis", name, start, now(), int(value))
    except redis.exceptions.ConnectionError as e:
        connections.pop(addr, None)
        failed("py-redis", name, e)
    except redis.exceptions.RedisError as e:
        failed("py-redis", name, e)


def redis_pipeline(transaction):
    """A pipeline, or redis-py's default pipeline, which is a MULTI/EXEC transaction."""
    addr, c = redis_conn()
    batch = rnd.sample(names, 3) * rnd.choice([1, 2])
    client = "py-redis-multi" if transaction else "py-redis-pipe"
    pipe = c.pipeline(transaction=transaction)
    for n in batch:
        pipe.incr(n)
    start = now()
    try:
        values = pipe.execute(raise_on_error=False)
    except redis.exceptions.ConnectionError as e:
        connections.pop(addr, None)
        failed(client, batch[0], e)
        return
    except redis.exceptions.RedisError as e:
        failed(client, batch[0], e)
        return
    end = now()
    for n, v in zip(batch, values):
        if isinstance(v, Exception):
            failed(client, n, v)
        else:
            record(client, n, start, end, int(v))


deadline = time.monotonic() + secs
while time.monotonic() < deadline:
    mode = rnd.randrange(4) if redis else 0
    if mode == 0:
        http_next(rnd.choice(names))
    elif mode == 1:
        redis_single(rnd.choice(names))
    else:
        redis_pipeline(transaction=mode == 3)
sys.stdout.flush()
