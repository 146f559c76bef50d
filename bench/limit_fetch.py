"""What the limit fetch costs next to the basic fetch, and how it behaves when idle.

    .venv/bin/python bench/limit_fetch.py [--jobs 20000] [--threads 10] [--rounds 3]
        [--pushes 200] [--idle-seconds 10] [--redis URL]

1. Drain: N no-op jobs drained by one in-process capsule, with the basic fetch (BRPOP)
   and with the limit fetch (a limit and a process limit on the queue, both above the
   concurrency, so they never bind), alternated for several rounds because the machine
   is noisy. Prints median and min-max jobs/s of each, the ratio limit/basic of the
   medians, and Redis commands per job (INFO commandstats).
2. Pickup latency: one job pushed to an idle limit-fetch capsule, from just before
   ``perform_async`` to the job's first line, repeated; the capsule settles idle again
   between pushes. Prints p50 and p99.
3. Idle load: Redis commands per second the same capsule sends while it has no work
   (its idle poll, the heartbeat every 15 s and the scheduled poller), with the busiest
   commands.
4. Many queues: microseconds per fetch-and-settle call, one thread, when the capsule
   lists 1 queue and when it lists 200 limited queues with the work in the last one.

Without --redis it starts a private redis-server, so nothing else shares the server and
the command counts are the capsule's alone.
"""

from __future__ import annotations

import argparse
import logging
import queue
import statistics
import threading
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass

import redis as redis_py
from _common import command_counts, redis_for_bench, timed_drain

import limitd
from limitd import keys
from limitd.fetch import LimitFetch, QueueOrder
from limitd.fetch import limits as queue_limits
from limitd.supervisor import Capsule, CapsuleConfig

QUEUE = "bench_limit"
UNBINDING_LIMIT = 1000  # above any --threads used here: the limit checks run, never bind
FETCHES = ("basic", "limit")
SETTLE_SECONDS = 0.02  # pause after a job is acked, before the next push: part of protocol
WAIT_TIMEOUT = 10.0
STOP_TIMEOUT = 5.0

done = threading.Semaphore(0)
starts: queue.SimpleQueue[float] = queue.SimpleQueue()


@limitd.job(name="bench.LimitFetchNoop", queue=QUEUE)
def noop(n: int) -> None:
    done.release()


@limitd.job(name="bench.PickupProbe", queue=QUEUE)
def probe() -> None:
    starts.put(time.perf_counter())  # processors are threads of this process


@dataclass(frozen=True)
class DrainRound:
    rate: float  # jobs/s
    commands_per_job: float


def capsule_config(fetch: str, threads: int) -> CapsuleConfig:
    if fetch == "basic":
        return CapsuleConfig(queues=[QUEUE], concurrency=threads, fetch="basic")
    return CapsuleConfig(
        queues=[QUEUE],
        concurrency=threads,
        limits={QUEUE: UNBINDING_LIMIT},
        process_limits={QUEUE: UNBINDING_LIMIT},
    )


def reset_queue(conn: redis_py.Redis) -> None:
    """Empty the queue and forget its limits, pause and busy count (a shared --redis may
    hold values from an earlier run; the capsule writes its configured limits back)."""
    pipe = conn.pipeline(transaction=False)
    pipe.delete(keys.queue(QUEUE))
    for hash_key in (keys.LIMITS, keys.PROCESS_LIMITS, keys.BUSY):
        pipe.hdel(hash_key, QUEUE)
    pipe.srem(keys.PAUSED, QUEUE)
    pipe.execute()


def drain_round(conn: redis_py.Redis, fetch: str, jobs: int, threads: int) -> DrainRound:
    reset_queue(conn)
    noop.perform_bulk([[i] for i in range(jobs)])
    capsule = Capsule(capsule_config(fetch, threads), redis=conn)
    seconds, calls = timed_drain(conn, capsule, done, jobs)
    capsule.stop(timeout=STOP_TIMEOUT)
    return DrainRound(jobs / seconds, calls / jobs)


def drain_rounds(
    conn: redis_py.Redis, jobs: int, threads: int, rounds: int
) -> dict[str, list[DrainRound]]:
    """basic, limit, basic, limit, ...: both see the same drift of a noisy machine."""
    results: dict[str, list[DrainRound]] = {fetch: [] for fetch in FETCHES}
    for number in range(1, rounds + 1):
        for fetch in FETCHES:
            result = drain_round(conn, fetch, jobs, threads)
            results[fetch].append(result)
            print(f"round {number} {fetch:<6} {result.rate:>8,.0f} jobs/s", flush=True)
    return results


def wait_until(condition: Callable[[], bool], what: str) -> None:
    deadline = time.monotonic() + WAIT_TIMEOUT
    while not condition():
        if time.monotonic() > deadline:
            raise TimeoutError(f"gave up waiting for {what}")
        time.sleep(0.001)


def settle(capsule: Capsule) -> None:
    """Idle again: no job running, and the threads woken with it back at the gate."""
    wait_until(lambda: capsule.busy() == 0, "the capsule to finish its job")
    time.sleep(SETTLE_SECONDS)


def subscribed(conn: redis_py.Redis) -> bool:
    """Whether a capsule listens for wake-ups (before that, a push waits for a poll)."""
    counts = dict(conn.pubsub_numsub(keys.WAKE_CHANNEL))
    return int(counts.get(keys.WAKE_CHANNEL.encode(), 0)) > 0


def pickup_latencies(capsule: Capsule, pushes: int) -> list[float]:
    """Seconds from just before each push to the start of its job."""
    latencies: list[float] = []
    for _ in range(pushes):
        pushed = time.perf_counter()
        probe.perform_async()
        latencies.append(starts.get(timeout=WAIT_TIMEOUT) - pushed)
        settle(capsule)
    return latencies


def idle_commands(conn: redis_py.Redis, seconds: float) -> Counter[str]:
    before = command_counts(conn)
    time.sleep(seconds)
    return command_counts(conn) - before


def run_idle_capsule(
    conn: redis_py.Redis, threads: int, pushes: int, idle_seconds: float
) -> tuple[list[float], Counter[str]]:
    """Parts 2 and 3, on one limit-fetch capsule with default poll range and heartbeat."""
    reset_queue(conn)
    capsule = Capsule(capsule_config("limit", threads), redis=conn)
    capsule.start()
    try:
        wait_until(lambda: subscribed(conn), "the wake-up subscription")
        settle(capsule)
        latencies = pickup_latencies(capsule, pushes)
        return latencies, idle_commands(conn, idle_seconds)
    finally:
        capsule.stop(timeout=STOP_TIMEOUT)


def fetch_cost(conn: redis_py.Redis, queue_count: int, fetches: int = 2000) -> float:
    """Microseconds per fetch (settling the previous job in the same call) when only the
    last of ``queue_count`` limited queues has jobs: the fetch's worst case."""
    names = [f"bench_many_{i:03d}" for i in range(queue_count)]
    for name in names:
        queue_limits.set_limit(conn, name, UNBINDING_LIMIT)
    conn.lpush(keys.queue(names[-1]), *[b'{"class":"X","args":[]}'] * fetches)
    fetch = LimitFetch(conn, QueueOrder(names), "bench-many")
    started = time.perf_counter()
    unit = None
    for _ in range(fetches):
        unit = fetch.try_retrieve(unit)
    elapsed = time.perf_counter() - started
    fetch.try_retrieve(unit)
    return elapsed / fetches * 1e6


def drain_row(fetch: str, rounds: list[DrainRound]) -> str:
    rates = [r.rate for r in rounds]
    spread = f"{statistics.median(rates):,.0f} ({min(rates):,.0f}-{max(rates):,.0f})"
    commands = statistics.median(r.commands_per_job for r in rounds)
    return f"{fetch:<7} {spread:<32} {commands:>14.3f}"


def percentile_ms(values: list[float], percent: int) -> float:
    return statistics.quantiles(values, n=100, method="inclusive")[percent - 1] * 1000


def report(
    results: dict[str, list[DrainRound]],
    latencies: list[float],
    idle: Counter[str],
    idle_seconds: float,
    costs: tuple[float, float],
) -> None:
    print(f"{'fetch':<7} {'drain jobs/s (median, min-max)':<32} {'redis cmds/job':>14}")
    for fetch in FETCHES:
        print(drain_row(fetch, results[fetch]))
    ratio = statistics.median(r.rate for r in results["limit"]) / statistics.median(
        r.rate for r in results["basic"]
    )
    print(f"ratio limit/basic: {ratio:.2f} (target >= 0.9)")
    print(
        f"pickup latency ({len(latencies)} pushes to an idle capsule): "
        f"p50 {percentile_ms(latencies, 50):.1f} ms, p99 {percentile_ms(latencies, 99):.1f} ms"
        " (target p50 < 5 ms)"
    )
    rate = sum(idle.values()) / idle_seconds
    print(
        f"idle redis load: {rate:.1f} commands/s per capsule over {idle_seconds:g} s "
        "(poll every 0.4-0.5 s + heartbeat every 15 s)"
    )
    print("  the heartbeat adds a few commands every 15 s, the scheduled poller every 2.5-7.5 s")
    busiest = ", ".join(f"{name} {n / idle_seconds:.1f}/s" for name, n in idle.most_common(8))
    print(f"  by command: {busiest}")
    one, many = costs
    print(
        f"fetch cost, job in the last queue: {one:.0f} us with 1 queue, {many:.0f} us with "
        f"200 limited queues"
    )


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--jobs", type=int, default=20_000)
    parser.add_argument("--threads", type=int, default=10)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--pushes", type=int, default=200)
    parser.add_argument("--idle-seconds", type=float, default=10.0)
    parser.add_argument("--redis", help="Redis URL (default: a private redis-server)")
    return parser.parse_args()


def main() -> None:
    args = parse_args()
    logging.basicConfig(level=logging.WARNING)
    print(
        f"jobs: {args.jobs}, capsule threads: {args.threads}, rounds: {args.rounds}; "
        f"limit fetch with limit {UNBINDING_LIMIT} and process limit {UNBINDING_LIMIT}",
        flush=True,
    )
    with redis_for_bench(args.redis) as conn:
        limitd.set_default_client(limitd.Client(conn))
        results = drain_rounds(conn, args.jobs, args.threads, args.rounds)
        latencies, idle = run_idle_capsule(conn, args.threads, args.pushes, args.idle_seconds)
        costs = (fetch_cost(conn, 1), fetch_cost(conn, 200))
    report(results, latencies, idle, args.idle_seconds, costs)


if __name__ == "__main__":
    main()
