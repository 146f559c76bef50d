"""What the limit fetch costs next to the basic fetch, as users run it, and how it
behaves when idle.

    .venv/bin/python bench/limit_fetch.py [--jobs 20000] [--processes 2] [--threads 10]
        [--rounds 3] [--pushes 200] [--idle-seconds 10] [--deadline 120]
        [--skip-in-process] [--redis URL]

1. Drain through ``limitd start``: the project venv's ``limitd start`` runs as a
   subprocess (P capsule processes x T threads, logging at WARNING), once with ``fetch:
   basic`` and once with ``fetch: limit`` and ``limits: {bench: 1000}`` (above P x T, so
   the limit is checked and never binds; no process limit is set). N jobs are enqueued
   first (``perform_bulk``, 1,000 per LPUSH); each does one Redis INCR through
   ``limitd.redis_client()``, the job of the peer benchmark
   (bench/peers/apps/limitd_app.py). The two fetches are alternated for several rounds
   (basic, limit, basic, limit, ...) because the machine is noisy. The drain machinery
   is bench/peers/measure.py: the job counter is read every 10 ms and the figures are
   taken over the steady window, from 10% to 90% of the jobs (start-up and tail left
   out): jobs/s, the CPU of every process of the ``limitd start`` session per job,
   redis-server CPU per job, and Redis commands per job (commands run inside Lua
   included, with the Lua calls per job). Prints each round, then the median (min-max)
   of each fetch and the ratio limit/basic of the medians.
1b. In-process capsule, no-Redis job (not how users run it): the same comparison with one
   ``Capsule`` object in this process draining jobs that only release a semaphore (the
   limit fetch with a limit and a process limit of 1,000 here). It isolates the fetch
   from process start-up and the job's round trip; --skip-in-process leaves it out.
2. Pickup latency: one job pushed to an idle limit-fetch capsule (in this process), from
   just before ``perform_async`` to the job's first line, repeated; the capsule settles
   idle again between pushes. Prints p50 and p99.
3. Idle load: Redis commands per second the same capsule sends while it has no work
   (its idle poll, the heartbeat every 15 s and the scheduled poller), with the busiest
   commands.
4. Many queues: microseconds per fetch-and-settle call, one thread, when the capsule
   lists 1 queue and when it lists 200 limited queues with the work in the last one.

Without --redis it starts a private redis-server, so nothing else shares the server and
the command counts and Redis CPU are limitd's alone. With --redis the benchmark deletes
and rewrites the keys of its queues (``bench``, ``bench_limit``, ``bench_many_*``) and
the ``bench:done`` counter, and other clients of that server count in its figures.
"""

from __future__ import annotations

import argparse
import logging
import queue
import statistics
import sys
import tempfile
import threading
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import redis as redis_py
from _common import bench_redis_url, command_counts, timed_drain

import limitd
from limitd import keys
from limitd.fetch.limit import LimitFetch
from limitd.queues import limits as queue_limits
from limitd.queues.order import QueueOrder
from limitd.supervisor import Capsule, CapsuleConfig

# The `limitd start` driver of the peer benchmark and its job module, imported from
# their directories as bench/peers/run.py does.
PEERS_DIR = Path(__file__).resolve().parent / "peers"
sys.path[:0] = [str(PEERS_DIR), str(PEERS_DIR / "apps")]

import limitd_app  # noqa: E402
import measure  # noqa: E402
from systems import limitd_system  # noqa: E402
from systems.base import Context, System, project_python  # noqa: E402

QUEUE = "bench_limit"
# The peers' never-binding limit: above any --threads used here, the checks run, never bind.
UNBINDING_LIMIT = limitd_system.LIMIT
FETCHES = ("basic", "limit")
SETTLE_SECONDS = 0.02  # pause after a job is acked, before the next push: part of protocol
WAIT_TIMEOUT = 10.0
STOP_TIMEOUT = 5.0
START_QUEUE = limitd_system.QUEUE  # the peers' queue, the one limitd_app's job is on

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


# Part 1: `limitd start` subprocesses, a job that does one INCR.


def start_system(fetch: str, processes: int, threads: int) -> System:
    """The peers' limitd system for any process and thread count (theirs are 1 or 2
    processes x 10 threads)."""
    limits = f", limits {{{START_QUEUE}: {UNBINDING_LIMIT}}}" if fetch == "limit" else ""
    return System(
        name=f"limitd-{fetch}-{processes}x{threads}",
        settings=f"limitd start, {processes} x {threads} threads, fetch: {fetch}{limits}",
        enqueue_api=f"perform_bulk, {limitd_system.BULK} per LPUSH",
        workers=limitd_system.workers(processes, fetch, threads=threads),
        app="limitd_app",
        python=project_python(),
        missing=limitd_system.missing,
    )


def start_round(
    conn: redis_py.Redis, ctx: Context, system: System, jobs: int, deadline: float
) -> measure.Drain:
    """Enqueue ``jobs`` INCR jobs on an empty queue, then let ``limitd start`` drain them."""
    reset_queue(conn, START_QUEUE)
    conn.delete(measure.COUNTER_KEY)
    limitd_app.noop.perform_bulk([[i] for i in range(jobs)], batch_size=limitd_system.BULK)
    return measure.drain(system, ctx, conn, jobs, deadline)


def steady_or_whole(drain: measure.Drain) -> measure.Window:
    """The steady window; the whole drain if it was too short to have one."""
    return drain.steady or drain.whole


def round_line(number: int, fetch: str, drain: measure.Drain) -> str:
    w = steady_or_whole(drain)
    part = "steady" if drain.steady else "whole (no steady window)"
    return (
        f"round {number} {fetch:<6} {part} {w.rate:>7,.0f} jobs/s, worker CPU "
        f"{w.worker_cpu_us_per_job:>4.0f} us/job, Redis CPU {w.redis_cpu_us_per_job:>3.0f} "
        f"us/job, {w.commands_per_job:.2f} cmds/job ({w.lua_per_job:.2f} Lua); whole drain "
        f"{drain.whole.rate:,.0f} jobs/s, first job after {drain.first_job:.2f} s"
    )


def start_rounds(
    conn: redis_py.Redis, url: str, args: argparse.Namespace
) -> dict[str, list[measure.Drain]]:
    """basic, limit, basic, limit, ...: both see the same drift of a noisy machine."""
    systems = {f: start_system(f, args.processes, args.threads) for f in FETCHES}
    reason = systems["limit"].missing()
    if reason:
        raise SystemExit(reason)
    results: dict[str, list[measure.Drain]] = {fetch: [] for fetch in FETCHES}
    with tempfile.TemporaryDirectory(prefix="limitd-limit-fetch-") as tmp:
        ctx = Context(url=url, tmp=Path(tmp))
        for number in range(1, args.rounds + 1):
            for fetch in FETCHES:
                try:
                    drained = start_round(conn, ctx, systems[fetch], args.jobs, args.deadline)
                except measure.RunFailed as exc:
                    raise SystemExit(f"round {number} {fetch}: {exc}") from exc
                results[fetch].append(drained)
                print(round_line(number, fetch, drained), flush=True)
    return results


def spread(values: list[float], fmt: str = ",.0f") -> str:
    """median (min-max): a few rounds on a noisy machine."""
    low, mid, high = min(values), statistics.median(values), max(values)
    return f"{mid:{fmt}} ({low:{fmt}}-{high:{fmt}})"


def start_row(fetch: str, drains: list[measure.Drain]) -> str:
    windows = [steady_or_whole(d) for d in drains]
    rates = spread([w.rate for w in windows])
    worker = statistics.median(w.worker_cpu_us_per_job for w in windows)
    redis_cpu = statistics.median(w.redis_cpu_us_per_job for w in windows)
    commands = statistics.median(w.commands_per_job for w in windows)
    lua = statistics.median(w.lua_per_job for w in windows)
    return f"{fetch:<7} {rates:<28} {worker:>13.0f} {redis_cpu:>12.0f} {commands:>9.2f} ({lua:.2f})"


def start_report(results: dict[str, list[measure.Drain]], args: argparse.Namespace) -> None:
    print(
        f"\n1. drain through limitd start, {args.processes} processes x {args.threads} threads, "
        f"{args.jobs:,} jobs each doing one INCR, rounds: {args.rounds} (steady window "
        "10%-90%, medians)"
    )
    print(
        f"{'fetch':<7} {'steady jobs/s (min-max)':<28} {'worker us/job':>13} "
        f"{'redis us/job':>12} {'cmds/job (Lua)':>15}"
    )
    for fetch in FETCHES:
        print(start_row(fetch, results[fetch]))
    rates = {f: statistics.median(steady_or_whole(d).rate for d in results[f]) for f in FETCHES}
    print(f"ratio limit/basic of the medians: {rates['limit'] / rates['basic']:.2f}")


# Part 1b and parts 2-4: one Capsule object in this process.


def capsule_config(fetch: str, threads: int) -> CapsuleConfig:
    if fetch == "basic":
        return CapsuleConfig(queues=[QUEUE], concurrency=threads, fetch="basic")
    return CapsuleConfig(
        queues=[QUEUE],
        concurrency=threads,
        limits={QUEUE: UNBINDING_LIMIT},
        process_limits={QUEUE: UNBINDING_LIMIT},
    )


def reset_queue(conn: redis_py.Redis, name: str) -> None:
    """Empty the queue and forget its limits, pause and busy count (a shared --redis may
    hold values from an earlier run; the capsule writes its configured limits back)."""
    pipe = conn.pipeline(transaction=False)
    pipe.delete(keys.of(conn).queue(name))
    for hash_key in (keys.of(conn).LIMITS, keys.of(conn).PROCESS_LIMITS, keys.of(conn).BUSY):
        pipe.hdel(hash_key, name)
    pipe.srem(keys.of(conn).PAUSED, name)
    pipe.execute()


def drain_round(conn: redis_py.Redis, fetch: str, jobs: int, threads: int) -> DrainRound:
    reset_queue(conn, QUEUE)
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
            print(
                f"in-process round {number} {fetch:<6} {result.rate:>8,.0f} jobs/s",
                flush=True,
            )
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
    reset_queue(conn, QUEUE)
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
    conn.lpush(keys.of(conn).queue(names[-1]), *[b'{"class":"X","args":[]}'] * fetches)
    fetch = LimitFetch(conn, QueueOrder(names), "bench-many")
    started = time.perf_counter()
    units: list = []
    for _ in range(fetches):
        units = fetch.take(1, units)
    elapsed = time.perf_counter() - started
    fetch.settle(units)
    return elapsed / fetches * 1e6


def drain_row(fetch: str, rounds: list[DrainRound]) -> str:
    rates = spread([r.rate for r in rounds])
    commands = statistics.median(r.commands_per_job for r in rounds)
    return f"{fetch:<7} {rates:<32} {commands:>14.3f}"


def in_process_report(results: dict[str, list[DrainRound]], args: argparse.Namespace) -> None:
    print(
        f"\n1b. in-process capsule, no-Redis job: not how users run it ({args.threads} "
        f"threads of this process, {args.jobs:,} jobs that only release a semaphore; limit "
        f"fetch with limit and process limit {UNBINDING_LIMIT}; whole drain)"
    )
    print(f"{'fetch':<7} {'drain jobs/s (median, min-max)':<32} {'redis cmds/job':>14}")
    for fetch in FETCHES:
        print(drain_row(fetch, results[fetch]))
    ratio = statistics.median(r.rate for r in results["limit"]) / statistics.median(
        r.rate for r in results["basic"]
    )
    print(f"ratio limit/basic of the medians, in-process: {ratio:.2f}")


def percentile_ms(values: list[float], percent: int) -> float:
    return statistics.quantiles(values, n=100, method="inclusive")[percent - 1] * 1000


def idle_report(
    latencies: list[float], idle: Counter[str], idle_seconds: float, costs: tuple[float, float]
) -> None:
    print(
        f"\n2. pickup latency ({len(latencies)} pushes to an idle in-process capsule): "
        f"p50 {percentile_ms(latencies, 50):.1f} ms, p99 {percentile_ms(latencies, 99):.1f} ms"
        " (target p50 < 5 ms)"
    )
    rate = sum(idle.values()) / idle_seconds
    print(
        f"3. idle redis load: {rate:.1f} commands/s per capsule over {idle_seconds:g} s "
        "(poll every 0.4-0.5 s + heartbeat every 15 s)"
    )
    print("  the heartbeat adds a few commands every 15 s, the scheduled poller every 2.5-7.5 s")
    busiest = ", ".join(f"{name} {n / idle_seconds:.1f}/s" for name, n in idle.most_common(8))
    print(f"  by command: {busiest}")
    one, many = costs
    print(
        f"4. fetch cost, job in the last queue: {one:.0f} us with 1 queue, {many:.0f} us with "
        f"200 limited queues"
    )


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--jobs", type=int, default=20_000, help="jobs per drain (20000)")
    parser.add_argument(
        "--processes", type=int, default=2, help="limitd start capsule processes (2)"
    )
    parser.add_argument("--threads", type=int, default=10, help="threads per capsule (10)")
    parser.add_argument("--rounds", type=int, default=3, help="drains of each fetch (3)")
    parser.add_argument("--pushes", type=int, default=200, help="pickup latency pushes (200)")
    parser.add_argument("--idle-seconds", type=float, default=10.0)
    parser.add_argument(
        "--deadline", type=float, default=120.0, help="seconds per limitd start drain (120)"
    )
    parser.add_argument(
        "--skip-in-process", action="store_true", help="leave out the in-process drain (1b)"
    )
    parser.add_argument("--redis", help="Redis URL (default: a private redis-server)")
    args = parser.parse_args()
    if args.processes * args.threads >= UNBINDING_LIMIT:
        parser.error(f"processes x threads must stay under the limit {UNBINDING_LIMIT}")
    if args.pushes < 2:
        parser.error("--pushes must be at least 2 (the latency is given as p50 and p99)")
    return args


def main() -> None:
    args = parse_args()
    logging.basicConfig(level=logging.WARNING)
    print(
        f"jobs: {args.jobs}, rounds: {args.rounds}; limitd start: {args.processes} processes "
        f"x {args.threads} threads, limits {{{START_QUEUE}: {UNBINDING_LIMIT}}}",
        flush=True,
    )
    with bench_redis_url(args.redis) as url, redis_py.Redis.from_url(url) as conn:
        limitd.set_default_client(limitd.Client(conn))
        started = start_rounds(conn, url, args)
        start_report(started, args)
        if not args.skip_in_process:
            in_process = drain_rounds(conn, args.jobs, args.threads, args.rounds)
            in_process_report(in_process, args)
        latencies, idle = run_idle_capsule(conn, args.threads, args.pushes, args.idle_seconds)
        costs = (fetch_cost(conn, 1), fetch_cost(conn, 200))
    idle_report(latencies, idle, args.idle_seconds, costs)


if __name__ == "__main__":
    main()
