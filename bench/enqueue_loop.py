"""Enqueue speed, limitd against Ruby Sidekiq, on the same private redis-server.

    .venv/bin/python bench/enqueue_loop.py [--jobs 20000] [--rounds 3] [--redis URL]

Four ways of enqueuing N no-op jobs to the queue ``bench``:

- limitd loop: ``noop.perform_async(i)`` in a Python loop, one job (one round trip) per
  call, ``noop`` being bench/peers/apps/limitd_app.py's ``bench.Noop`` job, through a
  default client on ``redis.Redis.from_url(url)``;
- limitd bulk: ``noop.perform_bulk(args, batch_size=1000)``;
- Sidekiq loop: ``NoopJob.perform_async(i)`` in a Ruby loop (Sidekiq::Client, one job
  per call), NoopJob being bench/peers/apps/sidekiq_app.rb's;
- Sidekiq bulk: ``Sidekiq::Client.push_bulk`` with chunks of 1,000 args.

Each measurement is a fresh process (this script with ``--child``, or
bench/peers/apps/sidekiq_enqueue_loop.rb, which reads REDIS_URL). It imports (requires)
everything, builds the bulk argument list and makes its first connection (a PING)
before the clock starts, times the enqueue calls alone with a monotonic clock, and
prints ``{"seconds": ...}`` as JSON on its last stdout line, which this script reads.
The database is flushed before each measurement; after it, LLEN of ``queue:bench`` (the
same key for both systems) must be N.

Within each round every way runs once per system, the two systems alternated (limitd
first in even rounds, Sidekiq first in odd ones). Each run prints its time and the
machine's CPU steal (from /proc/stat, over the run, child start-up included) and 1-minute
load average; the table gives medians, with min-max, over the rounds, and the ratio of
limitd's median time to Sidekiq's (above 1: limitd is slower).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import redis as redis_py
from _common import bench_redis_url, cpu_ticks, machine_load

BENCH_DIR = Path(__file__).resolve().parent
APPS_DIR = BENCH_DIR / "peers" / "apps"
RUBY_HELPER = APPS_DIR / "sidekiq_enqueue_loop.rb"
QUEUE_KEY = "queue:bench"
BULK = 1000
CHILD_TIMEOUT = 300.0

WAYS = ("loop", "bulk")
SYSTEMS = ("limitd", "sidekiq")
WAY_LABELS = {
    "loop": "perform_async, 1 job per call",
    "bulk": f"perform_bulk / push_bulk, {BULK:,} per call",
}
SYSTEM_LABELS = {"limitd": "limitd", "sidekiq": "Sidekiq"}


# The child: one measurement of limitd, in its own process.


def limitd_child(way: str, jobs: int, url: str) -> None:
    """Enqueue ``jobs`` limitd jobs ``way`` and print the seconds the calls took."""
    sys.path.insert(0, str(APPS_DIR))  # limitd_app imports bench_counter from there
    import limitd_app  # type: ignore[import-not-found]

    import limitd

    client = limitd.Client(redis_py.Redis.from_url(url))
    limitd.set_default_client(client)
    client.redis.ping()
    bulk_args = [[i] for i in range(jobs)] if way == "bulk" else []
    started = time.perf_counter()
    if way == "loop":
        for i in range(jobs):
            limitd_app.noop.perform_async(i)
    else:
        limitd_app.noop.perform_bulk(bulk_args, batch_size=BULK)
    seconds = time.perf_counter() - started
    print(json.dumps({"seconds": seconds}))


# The parent: one measurement in a fresh process, then the rounds.


@dataclass(frozen=True)
class Run:
    seconds: float
    machine: str


def child_command(system: str, way: str, jobs: int, url: str) -> list[str]:
    if system == "limitd":
        script = str(Path(__file__).resolve())
        return [sys.executable, script, "--child", way, "--jobs", str(jobs), "--redis", url]
    return ["ruby", str(RUBY_HELPER), way, str(jobs)]


def run_child(command: list[str], url: str) -> float:
    """Run one measurement process and return the seconds on its last stdout line."""
    env = {**os.environ, "REDIS_URL": url}
    done = subprocess.run(
        command, capture_output=True, text=True, env=env, timeout=CHILD_TIMEOUT, check=False
    )
    lines = done.stdout.strip().splitlines()
    if done.returncode != 0 or not lines:
        raise RuntimeError(f"{command} exited with {done.returncode}:\n{done.stderr[-2000:]}")
    return float(json.loads(lines[-1])["seconds"])


def measure(conn: redis_py.Redis, url: str, system: str, way: str, jobs: int) -> Run:
    conn.flushdb()
    before = cpu_ticks()
    seconds = run_child(child_command(system, way, jobs, url), url)
    machine = str(machine_load(before))
    queued = conn.llen(QUEUE_KEY)
    if queued != jobs:
        raise RuntimeError(f"{system} {way}: {QUEUE_KEY} holds {queued} jobs, not {jobs}")
    return Run(seconds, machine)


def round_order(round_index: int) -> list[tuple[str, str]]:
    """(way, system) pairs of one round: each way once per system, systems alternated."""
    systems = SYSTEMS if round_index % 2 == 0 else SYSTEMS[::-1]
    return [(way, system) for way in WAYS for system in systems]


def run_rounds(url: str, jobs: int, rounds: int) -> dict[tuple[str, str], list[float]]:
    times: dict[tuple[str, str], list[float]] = {pair: [] for pair in round_order(0)}
    conn = redis_py.Redis.from_url(url)
    try:
        for round_index in range(rounds):
            for way, system in round_order(round_index):
                run = measure(conn, url, system, way, jobs)
                times[way, system].append(run.seconds)
                print(
                    f"round {round_index + 1}/{rounds}  {way:4}  {system:7}  "
                    f"{run.seconds:7.3f} s  {jobs / run.seconds:>9,.0f} jobs/s  "
                    f"{1e6 * run.seconds / jobs:6.1f} us/job  ({run.machine})",
                    flush=True,
                )
        conn.flushdb()
    finally:
        conn.close()
    return times


# The report.


def time_rows(times: dict[tuple[str, str], list[float]], jobs: int) -> list[str]:
    rows = [
        "| way | system | median s | min-max s | jobs/s (median) | us/job (median) |",
        "|---|---|---:|---:|---:|---:|",
    ]
    for way in WAYS:
        for system in SYSTEMS:
            values = times[way, system]
            median = statistics.median(values)
            rows.append(
                f"| {WAY_LABELS[way]} | {SYSTEM_LABELS[system]} | {median:.3f} "
                f"| {min(values):.3f}-{max(values):.3f} | {jobs / median:,.0f} "
                f"| {1e6 * median / jobs:.1f} |"
            )
    return rows


def ratio_rows(times: dict[tuple[str, str], list[float]]) -> list[str]:
    """limitd's time over Sidekiq's: of the medians, and per round (min-max)."""
    rows = [
        "| way | limitd/Sidekiq time (medians) | per round, min-max |",
        "|---|---:|---:|",
    ]
    for way in WAYS:
        ours, theirs = times[way, "limitd"], times[way, "sidekiq"]
        per_round = [a / b for a, b in zip(ours, theirs, strict=True)]
        ratio = statistics.median(ours) / statistics.median(theirs)
        rows.append(
            f"| {WAY_LABELS[way]} | {ratio:.2f} | {min(per_round):.2f}-{max(per_round):.2f} |"
        )
    return rows


def versions(url: str) -> str:
    conn = redis_py.Redis.from_url(url)
    try:
        server = conn.info("server")["redis_version"]
    finally:
        conn.close()
    probe = subprocess.run(
        ["ruby", "-e", 'require "sidekiq"; print Sidekiq::VERSION'],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    sidekiq = probe.stdout.strip() or "?"
    python = ".".join(str(part) for part in sys.version_info[:3])
    return f"redis-server {server}, Python {python}, Ruby Sidekiq {sidekiq}"


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--jobs", type=int, default=20_000, help="jobs per measurement")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument(
        "--redis", help="Redis URL, flushed before each run (default: a private redis-server)"
    )
    parser.add_argument("--child", choices=WAYS, help=argparse.SUPPRESS)
    return parser.parse_args(argv)


def main() -> None:
    args = parse_args()
    if args.child:
        limitd_child(args.child, args.jobs, args.redis)
        return
    with bench_redis_url(args.redis) as url:
        print(f"{args.jobs:,} jobs per run, {args.rounds} rounds; {versions(url)}")
        times = run_rounds(url, args.jobs, args.rounds)
    print()
    print("\n".join(time_rows(times, args.jobs)))
    print()
    print("\n".join(ratio_rows(times)))


if __name__ == "__main__":
    main()
