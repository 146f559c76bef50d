"""What a limited-capacity job costs against a plain job: drain N units of no-op work
with one in-process capsule (limit fetch, 10 threads), in the same run.

    python bench/capacity.py [--jobs 5000] [--threads 10] [--rounds 5] [--redis URL]

- plain: N no-op ``@limitd.job`` jobs, pushed in bulk before the clock starts;
- capacity: a ``LimitedCapacityJob`` (``max_running_jobs`` = the thread count) whose
  ``perform_work`` pops one unit from an in-memory backlog of N. The clock starts
  before ``perform_with_capacity()`` pushes the first copies; each copy then claims a
  running place, does its unit, frees its place and pushes its successor, so the
  backlog drains by hand-over. A round ends when the backlog is empty and no copy is
  running or queued (the last copies' finish is inside the time).

Each round runs both kinds, the order swapping every round, so the drift of a shared
machine's speed weighs on both alike. Prints each round (jobs/s, Redis commands per
unit of work from INFO commandstats, Redis server CPU per unit), the medians, and the
median of the rounds' own capacity / plain ratios.
"""

from __future__ import annotations

import argparse
import logging
import statistics
import threading
import time
from collections import Counter
from collections.abc import Callable
from typing import Any, ClassVar

import redis as redis_py
from _common import RoundSignal, command_counts, redis_cpu_seconds, redis_for_bench

import limitd
from limitd import keys
from limitd.capacity.store import queued_key, running_key
from limitd.supervisor import Capsule, CapsuleConfig

QUEUE = "bench"
DEADLINE = 120.0  # seconds a round may take before the bench gives up
# Per kind, the sum over the measured rounds of each command's calls per unit of work.
BREAKDOWN: dict[str, Counter[str]] = {"plain": Counter(), "capacity": Counter()}


@limitd.job(name="bench.CapacityPlain", queue=QUEUE)
def plain_noop(n: int) -> None:
    RoundSignal.semaphore.release()


class Backlog:
    """Units of work kept outside limitd (as rows of a table would be), thread-safe."""

    def __init__(self) -> None:
        self.left = 0
        self.lock = threading.Lock()

    def fill(self, units: int) -> None:
        with self.lock:
            self.left = units

    def take(self) -> bool:
        with self.lock:
            if self.left == 0:
                return False
            self.left -= 1
            return True

    def count(self) -> int:
        with self.lock:
            return self.left


class CapacityNoop(limitd.LimitedCapacityJob, name="bench.CapacityNoop", queue=QUEUE):
    backlog: ClassVar[Backlog] = Backlog()
    maximum: ClassVar[int] = 10

    def perform_work(self, *args: Any) -> None:
        if self.backlog.take():
            RoundSignal.semaphore.release()

    def remaining_work_count(self, *args: Any) -> int:
        return self.backlog.count()

    def max_running_jobs(self) -> int:
        return self.maximum


def wait_for(condition: Callable[[], bool], what: str, deadline: float) -> None:
    while not condition():
        if time.perf_counter() > deadline:
            raise TimeoutError(f"round did not finish in {DEADLINE:.0f} s: {what}")
        time.sleep(0.0005)


def wait_units(units: int, deadline: float) -> None:
    for _ in range(units):
        if not RoundSignal.semaphore.acquire(timeout=max(0.0, deadline - time.perf_counter())):
            raise TimeoutError(f"round did not finish in {DEADLINE:.0f} s: units of work")


def copies_settled(conn: redis_py.Redis) -> bool:
    """No copy running or reserved, and none left in the queue."""
    name = CapacityNoop.spec.name
    return (
        conn.zcard(running_key(keys.of(conn), name)) == 0
        and conn.zcard(queued_key(keys.of(conn), name)) == 0
        and conn.llen(f"queue:{QUEUE}") == 0
    )


def one_round(conn: redis_py.Redis, jobs: int, threads: int, kind: str) -> dict[str, float]:
    conn.flushdb()
    RoundSignal.reset()
    limitd.set_default_client(limitd.Client(conn))
    if kind == "plain":
        plain_noop.perform_bulk([[i] for i in range(jobs)])
    else:
        CapacityNoop.backlog.fill(jobs)
        CapacityNoop.maximum = threads
    capsule = Capsule(CapsuleConfig(queues=[QUEUE], concurrency=threads), redis=conn)
    calls = command_counts(conn)
    redis_cpu = redis_cpu_seconds(conn)
    started = time.perf_counter()
    deadline = started + DEADLINE
    try:
        if kind == "capacity":
            CapacityNoop.perform_with_capacity()
        capsule.start()
        wait_units(jobs, deadline)
        if kind == "capacity":
            wait_for(lambda: copies_settled(conn), "copies still running or queued", deadline)
        seconds = time.perf_counter() - started
    finally:
        capsule.stop(timeout=5)
    served = command_counts(conn)
    served.subtract(calls)
    BREAKDOWN[kind].update({name: count / jobs for name, count in served.items()})
    return {
        "rate": jobs / seconds,
        "cmds": served.total() / jobs,
        "redis_us": (redis_cpu_seconds(conn) - redis_cpu) / jobs * 1e6,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--jobs", type=int, default=5_000)
    parser.add_argument("--threads", type=int, default=10)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--redis", help="Redis URL (default: a private redis-server)")
    args = parser.parse_args()
    logging.basicConfig(level=logging.WARNING)
    results: dict[str, list[dict[str, float]]] = {"plain": [], "capacity": []}
    print(f"units of work: {args.jobs}, capsule threads: {args.threads}, rounds: {args.rounds}")
    print(f"{'round':<6} {'kind':<9} {'jobs/s':>8} {'cmds/job':>9} {'redis us/job':>12}")
    with redis_for_bench(args.redis) as conn:
        for kind in results:  # warm up: scripts loaded, connections open
            one_round(conn, min(args.jobs, 500), args.threads, kind)
        for counts in BREAKDOWN.values():
            counts.clear()
        for number in range(1, args.rounds + 1):
            kinds = ("plain", "capacity") if number % 2 else ("capacity", "plain")
            for kind in kinds:
                result = one_round(conn, args.jobs, args.threads, kind)
                results[kind].append(result)
                print(
                    f"{number:<6} {kind:<9} {result['rate']:>8,.0f} {result['cmds']:>9.2f} "
                    f"{result['redis_us']:>12.1f}"
                )
        limitd.set_default_client(None)
    summary(results)
    breakdown(args.rounds)


def summary(results: dict[str, list[dict[str, float]]]) -> None:
    def median(kind: str, field: str) -> float:
        return statistics.median(r[field] for r in results[kind])

    for kind in results:
        print(
            f"median {kind}: {median(kind, 'rate'):,.0f} jobs/s, "
            f"{median(kind, 'cmds'):.2f} Redis commands/job, "
            f"{median(kind, 'redis_us'):.1f} us Redis CPU/job"
        )
    paired = statistics.median(
        c["rate"] / p["rate"] for p, c in zip(results["plain"], results["capacity"], strict=True)
    )
    of_medians = median("capacity", "rate") / median("plain", "rate")
    print(f"capacity / plain jobs/s, of the medians: {of_medians:.2f}x")
    print(f"capacity / plain jobs/s, median of the rounds' ratios: {paired:.2f}x")
    extra = median("capacity", "cmds") - median("plain", "cmds")
    print(f"a copy's extra Redis commands over a plain job: {extra:+.2f}")


def breakdown(rounds: int) -> None:
    """Calls per unit of work of each command whose count differs between the kinds
    (Lua scripts' inner commands included, as INFO commandstats counts them)."""
    plain, capacity = BREAKDOWN["plain"], BREAKDOWN["capacity"]
    print(f"{'command':<18} {'plain/job':>10} {'capacity/job':>13}")
    for name in sorted(plain.keys() | capacity.keys()):
        mine, theirs = plain[name] / rounds, capacity[name] / rounds
        if abs(theirs - mine) >= 0.05:
            print(f"{name:<18} {mine:>10.2f} {theirs:>13.2f}")


if __name__ == "__main__":
    main()
