"""What batch membership costs: drain N no-op jobs in one batch versus without a
batch, in the same run, with one in-process capsule.

    python bench/batches.py [--jobs 20000] [--threads 10] [--rounds 5] [--redis URL]

Each round drains once plain and once in a batch, the order swapping every round
(plain-batch, batch-plain, ...), so the slow drift of a shared machine's speed (seen at
+-40% over minutes here) weighs on both kinds alike. Prints each round (with Redis
commands and Redis server CPU per job), the median drain of each kind and two ratios
(batch / plain, target >= 0.8): of the medians, and the median of each round's own
ratio, which compares drains run seconds apart and so cancels most of the drift. A
batch round ends when the batch's success callback has been enqueued, so the last
job's bookkeeping is inside the time. Enqueue is timed too.
"""

from __future__ import annotations

import argparse
import logging
import statistics
import threading
import time

import redis as redis_py
from _common import command_calls, redis_cpu_seconds, redis_for_bench, timed_drain

import limitd
from limitd.supervisor import Capsule, CapsuleConfig

done = threading.Semaphore(0)


@limitd.job(name="bench.BatchNoop", queue="bench")
def noop(n: int) -> None:
    done.release()


@limitd.job(name="bench.BatchDone", queue="bench_callbacks")
def finished(status: dict, options: dict) -> None: ...


def one_round(conn: redis_py.Redis, jobs: int, threads: int, in_batch: bool) -> dict[str, float]:
    conn.flushdb()
    limitd.set_default_client(limitd.Client(conn))
    started = time.perf_counter()
    batch = limitd.Batch("bench").on("success", finished) if in_batch else None
    if batch is not None:
        with batch.jobs():
            noop.perform_bulk([[i] for i in range(jobs)])
    else:
        noop.perform_bulk([[i] for i in range(jobs)])
    enqueue_s = time.perf_counter() - started
    capsule = Capsule(CapsuleConfig(queues=["bench"], concurrency=threads), redis=conn)
    calls = command_calls(conn)
    redis_cpu = redis_cpu_seconds(conn)
    started = time.perf_counter()
    timed_drain(conn, capsule, done, jobs)
    while batch is not None and conn.llen("queue:bench_callbacks") == 0:
        time.sleep(0.0005)  # the last jobs' bookkeeping, then the callback
    drain_s = time.perf_counter() - started
    drain_calls = command_calls(conn) - calls
    redis_us = (redis_cpu_seconds(conn) - redis_cpu) / jobs * 1e6
    capsule.stop(timeout=5)
    return {
        "enqueue": jobs / enqueue_s,
        "drain": jobs / drain_s,
        "cmds": drain_calls / jobs,
        "redis_us": redis_us,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--jobs", type=int, default=20_000)
    parser.add_argument("--threads", type=int, default=10)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--redis", help="Redis URL (default: a private redis-server)")
    args = parser.parse_args()
    logging.basicConfig(level=logging.WARNING)
    results: dict[str, list[dict[str, float]]] = {"plain": [], "batch": []}
    print(f"jobs: {args.jobs}, capsule threads: {args.threads}, rounds: {args.rounds}")
    print(
        f"{'round':<6} {'kind':<6} {'enqueue/s':>10} {'drain/s':>9} {'cmds/job':>9} "
        f"{'redis us/job':>12}"
    )
    with redis_for_bench(args.redis) as conn:
        for number in range(1, args.rounds + 1):
            kinds = ("plain", "batch") if number % 2 else ("batch", "plain")
            for kind in kinds:
                result = one_round(conn, args.jobs, args.threads, kind == "batch")
                results[kind].append(result)
                print(
                    f"{number:<6} {kind:<6} {result['enqueue']:>10,.0f} "
                    f"{result['drain']:>9,.0f} {result['cmds']:>9.2f} {result['redis_us']:>12.1f}"
                )
    drains = {kind: [r["drain"] for r in rs] for kind, rs in results.items()}
    medians = {kind: statistics.median(values) for kind, values in drains.items()}
    paired = statistics.median(b / p for p, b in zip(drains["plain"], drains["batch"], strict=True))
    print(f"median drain: plain {medians['plain']:,.0f} jobs/s, batch {medians['batch']:,.0f}")
    print(f"batch / plain, of the medians: {medians['batch'] / medians['plain']:.2f}x")
    print(f"batch / plain, median of the rounds' ratios: {paired:.2f}x (target >= 0.8x)")


if __name__ == "__main__":
    main()
