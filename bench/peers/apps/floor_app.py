"""The floor worker: the least a Python worker can do per job on the payloads limitd
enqueues, so the benchmark shows how far a job system is from it. T threads, each
looping BRPOP on limitd's queue list, ``json.loads`` of the payload, a dict lookup of
the function its ``class`` names and a call with its ``args``. No acknowledgement, no
retries, no framework: a job taken is lost if the process dies. Exits on SIGTERM.

    python floor_app.py [--threads 10]

Runs in the project venv, with BENCH_REDIS_URL set and apps/ on PYTHONPATH. Its BRPOP and
its job's INCR go through the client limitd's bench job counts with
(``limitd.pinned``: redis-py, one connection per thread), so the floor pays what limitd's
job pays for a command and no more.
"""

from __future__ import annotations

import argparse
import json
import signal
import sys
import threading
import traceback
from collections.abc import Callable
from typing import Any

import redis
from bench_counter import COUNTER_KEY, QUEUE, redis_url

from limitd.connection.pinned import pinned

QUEUE_KEY = f"queue:{QUEUE}"  # limitd.keys.queue(QUEUE): where perform_bulk LPUSHes
BRPOP_SECONDS = 1  # how long a thread waits before it looks at the stop flag again


CLIENT = pinned(redis.Redis.from_url(redis_url()))


def noop(i: int) -> None:
    CLIENT.incr(COUNTER_KEY)


JOBS: dict[str, Callable[..., Any]] = {"bench.Noop": noop}  # limitd_app's job name


def run_one(raw: bytes) -> None:
    """Decode one payload and call its function; a failure is printed and dropped."""
    try:
        payload = json.loads(raw)
        JOBS[payload["class"]](*payload["args"])
    except Exception:  # no retries: report it and go on with the next job
        traceback.print_exc(file=sys.stderr)


def loop(conn: redis.Redis, stop: threading.Event) -> None:
    """One thread: take jobs from the right of the list until told to stop."""
    while not stop.is_set():
        popped = conn.brpop([QUEUE_KEY], timeout=BRPOP_SECONDS)
        if popped is not None:
            run_one(popped[1])


def main() -> None:
    parser = argparse.ArgumentParser(description="BRPOP + json.loads + call, no framework")
    parser.add_argument("--threads", type=int, default=10)
    threads = parser.parse_args().threads
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda signum, frame: stop.set())
    # Each thread BRPOPs and INCRs on the one connection it keeps.
    workers = [
        threading.Thread(target=loop, args=(CLIENT, stop), name=f"floor-{n}", daemon=True)
        for n in range(threads)
    ]
    for worker in workers:
        worker.start()
    stop.wait()
    for worker in workers:
        worker.join(BRPOP_SECONDS + 1)


if __name__ == "__main__":
    main()
