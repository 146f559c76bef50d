"""What a rate limit costs the limit fetch: one in-process capsule drains the same no-op
jobs with no rate limit anywhere, with a rate limit on another queue only (its queue
pays one HGET per fetch call), and with a rate limit on its own queue that never binds
(1,000,000/second), in rotating order each round.

    python bench/limiters_fetch.py [--jobs 20000] [--rounds 5] [--threads 10] [--redis URL]

Prints the median drain rate of each case, and each case's ratio to "none" as the
median of the rounds' own ratios (drains seconds apart, which cancels most of this
machine's drift). ``fetch_rows()`` returns the same rows for ``bench/limiters.py``.
"""

from __future__ import annotations

import argparse
import logging
import statistics
import threading

import redis as redis_py
from _common import redis_for_bench, timed_drain

import limitd
from limitd import keys
from limitd.api import Queue
from limitd.supervisor import Capsule, CapsuleConfig

QUEUE = "bench_rate"
NON_BINDING = "1000000/second"
CASES = ("none", "other queue", "own queue")

done = threading.Semaphore(0)


@limitd.job(name="bench.RateNoop", queue=QUEUE)
def noop(n: int) -> None:
    done.release()


def _prepare(conn: redis_py.Redis, case: str) -> dict[str, str]:
    """Redis as the case wants it; returns the capsule's configured rate limits."""
    conn.delete(
        keys.of(conn).RATE_LIMITS, keys.of(conn).rate_state(QUEUE), keys.of(conn).queue(QUEUE)
    )
    if case == "other queue":
        Queue("elsewhere", conn).rate_limit = NON_BINDING
    if case == "own queue":
        Queue(QUEUE, conn).rate_limit = NON_BINDING  # in force before the first fetch
        return {QUEUE: NON_BINDING}
    return {}


def drain_rate(conn: redis_py.Redis, case: str, jobs: int, threads: int) -> float:
    """Jobs per second for one drain of ``jobs`` no-op jobs."""
    rates = _prepare(conn, case)
    noop.perform_bulk([[i] for i in range(jobs)])
    config = CapsuleConfig(queues=[QUEUE], concurrency=threads, rate_limits=rates)
    capsule = Capsule(config, redis=conn)
    seconds, _ = timed_drain(conn, capsule, done, jobs)
    capsule.stop(timeout=5)
    return jobs / seconds


def fetch_rows(
    jobs: int = 20_000, rounds: int = 5, threads: int = 10, url: str | None = None
) -> list[tuple[str, float]]:
    """(measure, value) rows: the median drain rate of each case, then each rate-limited
    case's median ratio to "none" over the rounds."""
    results: dict[str, list[float]] = {case: [] for case in CASES}
    with redis_for_bench(url) as conn:
        limitd.set_default_client(limitd.Client(conn))
        try:
            drain_rate(conn, "none", min(jobs, 2_000), threads)  # warm up: scripts, imports
            for round_number in range(rounds):
                shift = round_number % len(CASES)
                for case in CASES[shift:] + CASES[:shift]:
                    results[case].append(drain_rate(conn, case, jobs, threads))
        finally:
            limitd.set_default_client(None)
    rows = [
        (f"drain jobs/s, rate limit: {case} (median of {rounds})", statistics.median(rates))
        for case, rates in results.items()
    ]
    for case in CASES[1:]:
        ratios = [a / b for a, b in zip(results[case], results["none"], strict=True)]
        rows.append((f"ratio {case} / none (median of round ratios)", statistics.median(ratios)))
    return rows


def print_rows(rows: list[tuple[str, float]]) -> None:
    width = max(len(name) for name, _ in rows)
    for name, value in rows:
        shown = f"{value:.3f}" if name.startswith("ratio") else f"{value:,.0f}"
        print(f"{name:<{width}}  {shown:>10}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--jobs", type=int, default=20_000)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--threads", type=int, default=10)
    parser.add_argument("--redis", help="Redis URL (default: a private redis-server)")
    args = parser.parse_args()
    logging.basicConfig(level=logging.WARNING)
    print(f"jobs: {args.jobs} per drain, capsule threads: {args.threads}, rounds: {args.rounds}")
    print_rows(fetch_rows(args.jobs, args.rounds, args.threads, args.redis))


if __name__ == "__main__":
    main()
