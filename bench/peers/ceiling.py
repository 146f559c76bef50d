"""The ceiling of this machine's Redis for a fetch-like call: how many EVALSHA calls per
second of a tiny script (RPOP a job, INCR a counter) the server answers, pipelined from
one client and from 2 client processes, and with one round trip per call. A worker that
spends one Lua call per job cannot drain faster than this.

    python bench/peers/ceiling.py REDIS_URL [--calls 200000]

Prints the three rates as JSON. run.py runs it in the peers' venv (redis-py with
hiredis, the fastest Python client there) on a database of its own. With --incr-only it
times plain INCR round trips instead; run.py runs that in both venvs, to compare the
cost of a call through each venv's client.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import time
from typing import Any

import redis

SCRIPT = "local job = redis.call('RPOP', KEYS[1]) redis.call('INCR', KEYS[2]) return job"
KEYS = ("ceiling:queue", "ceiling:done")
BATCH = 100  # calls per pipeline
PAYLOAD = b'{"class":"bench.Noop","args":[1],"jid":"0123456789abcdef01234567"}'


def fill(conn: redis.Redis, count: int) -> None:
    """Enough jobs in the list that every RPOP finds one, as a real fetch would."""
    conn.delete(*KEYS)
    for start in range(0, count, 1000):
        conn.lpush(KEYS[0], *([PAYLOAD] * min(1000, count - start)))


def pipelined(url: str, calls: int) -> tuple[float, float]:
    """Send ``calls`` EVALSHA in pipelines of BATCH; return (start, end) monotonic."""
    conn = redis.Redis.from_url(url)
    sha = conn.script_load(SCRIPT)
    started = time.monotonic()
    for _ in range(calls // BATCH):
        pipe = conn.pipeline(transaction=False)
        for _ in range(BATCH):
            pipe.evalsha(sha, 2, *KEYS)
        pipe.execute()
    return started, time.monotonic()


def round_trips(url: str, calls: int) -> float:
    """Calls per second with one round trip each, as a worker without pipelining."""
    conn = redis.Redis.from_url(url)
    sha = conn.script_load(SCRIPT)
    started = time.monotonic()
    for _ in range(calls):
        conn.evalsha(sha, 2, *KEYS)
    return calls / (time.monotonic() - started)


def _client(url: str, calls: int, barrier: Any, out: Any) -> None:
    """One client process: start with the others, report its (start, end)."""
    barrier.wait()
    out.put(pipelined(url, calls))


def parallel(url: str, clients: int, calls: int) -> float:
    """Total calls per second of ``clients`` processes, each pipelining ``calls``."""
    ctx = multiprocessing.get_context("fork")
    barrier, out = ctx.Barrier(clients), ctx.Queue()
    procs = [ctx.Process(target=_client, args=(url, calls, barrier, out)) for _ in range(clients)]
    for proc in procs:
        proc.start()
    spans = [out.get(timeout=600) for _ in procs]
    for proc in procs:
        proc.join()
    return clients * calls / (max(end for _, end in spans) - min(start for start, _ in spans))


def incr_round_trip_us(url: str, calls: int, *, pinned: bool = False) -> float:
    """Microseconds per INCR from one thread, one round trip each: the client's cost
    per call plus the loopback, which every job here pays once for its counter. With
    ``pinned``, through the client limitd gives jobs (``limitd.redis_client()``)."""
    conn = redis.Redis.from_url(url)
    if pinned:
        from limitd.connection.pinned import pinned as pin  # the project venv only

        conn = pin(conn)
    conn.incr(KEYS[1])
    started = time.monotonic()
    for _ in range(calls):
        conn.incr(KEYS[1])
    return 1e6 * (time.monotonic() - started) / calls


def client_name() -> str:
    from redis.utils import HIREDIS_AVAILABLE

    return f"redis-py {redis.__version__}" + (" + hiredis" if HIREDIS_AVAILABLE else "")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("url")
    parser.add_argument("--calls", type=int, default=200_000)
    parser.add_argument("--incr-only", action="store_true", help="only time INCR round trips")
    parser.add_argument("--pinned", action="store_true", help="... through limitd.pinned")
    args = parser.parse_args()
    conn = redis.Redis.from_url(args.url)
    if args.incr_only:
        us = incr_round_trip_us(args.url, args.calls // 10, pinned=args.pinned)
        name = client_name() + (", limitd.redis_client()" if args.pinned else "")
        print(json.dumps({"incr_us": us, "client": name}))
        conn.flushdb()
        return
    rates = {}
    fill(conn, args.calls)
    rates["pipelined_1_client"] = parallel(args.url, 1, args.calls)
    fill(conn, args.calls)
    rates["pipelined_2_clients"] = parallel(args.url, 2, args.calls // 2)
    fill(conn, args.calls // 10)
    rates["round_trip_1_client"] = round_trips(args.url, args.calls // 10)
    conn.flushdb()
    print(json.dumps(rates))


if __name__ == "__main__":
    main()
