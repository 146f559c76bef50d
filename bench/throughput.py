"""Throughput of the core path: bulk enqueue, then drain with one in-process capsule.

    python bench/throughput.py [--jobs 20000] [--threads 10] [--redis URL]

Prints enqueue and drain rates (jobs/s) and Redis commands per job for each phase,
read from INFO commandstats before and after. Without --redis it starts a private
redis-server, so nothing else shares the server during the run.
"""

from __future__ import annotations

import argparse
import logging
import threading
import time

import redis as redis_py
from _common import command_calls, redis_for_bench, timed_drain

import limitd
from limitd.supervisor import Capsule, CapsuleConfig

done = threading.Semaphore(0)


@limitd.job(name="bench.Noop", queue="bench")
def noop(n: int) -> None:
    done.release()


def measure(conn: redis_py.Redis, jobs: int, threads: int) -> dict[str, float]:
    conn.delete("queue:bench")
    limitd.set_default_client(limitd.Client(conn))
    calls = command_calls(conn)
    started = time.perf_counter()
    noop.perform_bulk([[i] for i in range(jobs)])
    enqueue_s = time.perf_counter() - started
    enqueue_calls = command_calls(conn) - calls

    capsule = Capsule(CapsuleConfig(queues=["bench"], concurrency=threads), redis=conn)
    drain_s, drain_calls = timed_drain(conn, capsule, done, jobs)
    capsule.stop(timeout=5)
    return {
        "enqueue_rate": jobs / enqueue_s,
        "enqueue_cmds": enqueue_calls / jobs,
        "drain_rate": jobs / drain_s,
        "drain_cmds": drain_calls / jobs,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--jobs", type=int, default=20_000)
    parser.add_argument("--threads", type=int, default=10)
    parser.add_argument("--redis", help="Redis URL (default: a private redis-server)")
    args = parser.parse_args()
    logging.basicConfig(level=logging.WARNING)
    with redis_for_bench(args.redis) as conn:
        result = measure(conn, args.jobs, args.threads)
    print(f"jobs: {args.jobs}, capsule threads: {args.threads}")
    print(f"{'phase':<8} {'jobs/s':>10} {'redis cmds/job':>15}")
    print(f"{'enqueue':<8} {result['enqueue_rate']:>10,.0f} {result['enqueue_cmds']:>15.3f}")
    print(f"{'drain':<8} {result['drain_rate']:>10,.0f} {result['drain_cmds']:>15.3f}")


if __name__ == "__main__":
    main()
