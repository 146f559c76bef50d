"""What the per-process job metrics cost per job: drain N no-op jobs with one
in-process capsule (limit fetch, 10 threads) and the default server chain, and with
the same chain plus :class:`limitd.metrics.jobs.JobMetrics` in front (as
``limitd.metrics.process.ProcessMetrics`` prepends it), in the same run.

    python bench/job_metrics.py [--jobs 20000] [--threads 10] [--rounds 7] [--redis URL]

Each round drains once without and once with the middleware, the order swapping every
round, so the drift of a shared machine's speed weighs on both alike. Jobs are pushed
in bulk before the clock starts; a round ends when every job has run. Prints each round
(jobs/s, and microseconds of this process's CPU per job from ``time.process_time``:
the capsule's threads, the main thread only waits), the medians, and the median of the
rounds' own with / without ratios. Last, the middleware's own cost measured alone
(``__call__`` and ``settled`` in a loop on one thread, no capsule), the figure the
drain's noise hides. No HTTP server is started: scraping is not per job.
"""

from __future__ import annotations

import argparse
import logging
import statistics
import time

import redis as redis_py
from _common import RoundSignal, redis_for_bench
from prometheus_client import CollectorRegistry

import limitd
from limitd.metrics.jobs import JobMetrics
from limitd.middleware.defaults import default_server_chain
from limitd.supervisor import Capsule, CapsuleConfig

QUEUE = "bench"
DEADLINE = 120.0  # seconds a round may take before the bench gives up
KINDS = ("default", "metrics")


@limitd.job(name="bench.MetricsNoop", queue=QUEUE)
def noop(n: int) -> None:
    RoundSignal.semaphore.release()


def capsule_for(conn: redis_py.Redis, threads: int, kind: str) -> Capsule:
    chain = default_server_chain(conn)
    if kind == "metrics":
        chain.prepend(JobMetrics(CollectorRegistry()))  # a fresh registry each round
    config = CapsuleConfig(queues=[QUEUE], concurrency=threads)
    return Capsule(config, redis=conn, middleware=chain)


def one_round(conn: redis_py.Redis, jobs: int, threads: int, kind: str) -> dict[str, float]:
    conn.flushdb()
    RoundSignal.reset()
    limitd.set_default_client(limitd.Client(conn))
    noop.perform_bulk([[i] for i in range(jobs)])
    capsule = capsule_for(conn, threads, kind)
    cpu = time.process_time()
    started = time.perf_counter()
    deadline = started + DEADLINE
    try:
        capsule.start()
        for _ in range(jobs):
            if not RoundSignal.semaphore.acquire(timeout=max(0.0, deadline - time.perf_counter())):
                raise TimeoutError(f"round did not finish in {DEADLINE:.0f} s")
        seconds = time.perf_counter() - started
        cpu_s = time.process_time() - cpu
    finally:
        capsule.stop(timeout=5)
    return {"rate": jobs / seconds, "cpu_us": cpu_s / jobs * 1e6}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--jobs", type=int, default=20_000)
    parser.add_argument("--threads", type=int, default=10)
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--redis", help="Redis URL (default: a private redis-server)")
    args = parser.parse_args()
    logging.basicConfig(level=logging.WARNING)
    results: dict[str, list[dict[str, float]]] = {kind: [] for kind in KINDS}
    print(f"jobs: {args.jobs}, capsule threads: {args.threads}, rounds: {args.rounds}")
    print(f"{'round':<6} {'chain':<8} {'jobs/s':>8} {'cpu us/job':>11}")
    with redis_for_bench(args.redis) as conn:
        for kind in KINDS:  # warm up: scripts loaded, connections open
            one_round(conn, min(args.jobs, 1_000), args.threads, kind)
        for number in range(1, args.rounds + 1):
            for kind in KINDS if number % 2 else KINDS[::-1]:
                result = one_round(conn, args.jobs, args.threads, kind)
                results[kind].append(result)
                print(f"{number:<6} {kind:<8} {result['rate']:>8,.0f} {result['cpu_us']:>11.1f}")
        limitd.set_default_client(None)
    summary(results)
    print(f"JobMetrics alone, one thread, no Redis: {direct_cost():.2f} us per job")


def summary(results: dict[str, list[dict[str, float]]]) -> None:
    def median(kind: str, field: str) -> float:
        return statistics.median(r[field] for r in results[kind])

    for kind in KINDS:
        print(
            f"median {kind}: {median(kind, 'rate'):,.0f} jobs/s, "
            f"{median(kind, 'cpu_us'):.1f} us CPU/job"
        )
    pairs = list(zip(results["default"], results["metrics"], strict=True))
    rate_ratio = statistics.median(m["rate"] / d["rate"] for d, m in pairs)
    cpu_extra = statistics.median(m["cpu_us"] - d["cpu_us"] for d, m in pairs)
    print(f"metrics / default jobs/s, median of the rounds' ratios: {rate_ratio:.3f}x")
    print(f"metrics - default CPU per job, median of the rounds' differences: {cpu_extra:+.1f} us")


def direct_cost(calls: int = 100_000) -> float:
    """Microseconds per job of the middleware by itself: ``__call__`` around a no-op
    and ``settled``, on one thread, beside the same loop without it (subtracted)."""
    metrics = JobMetrics(CollectorRegistry())
    payload = {"class": noop.spec.name, "jid": "0" * 24, "queue": QUEUE, "args": [0]}

    def nothing() -> None:
        return None

    started = time.perf_counter()
    for _ in range(calls):
        nothing()
    floor = time.perf_counter() - started
    started = time.perf_counter()
    for _ in range(calls):
        metrics(noop.spec, payload, QUEUE, nothing)
        metrics.settled(noop.spec, payload, QUEUE, "done", None)
    return (time.perf_counter() - started - floor) / calls * 1e6


if __name__ == "__main__":
    main()
