"""Scheduled jobs on time: lateness of scheduled jobs, and the idle Redis load of the
scheduled poller, with ``scheduled_poll: due`` (the default) and ``interval`` (Sidekiq's
random polling, as limitd did before).

    .venv/bin/python bench/scheduled.py [--jobs 1000] [--spread 30] [--supervisors 3]

For each mode, on a private redis-server started for the run: start ``--supervisors``
separate ``limitd start`` subprocesses (one capsule process each, 10 threads), wait
until the pollers are past their start-up wait, then

1. measure the idle load: INFO commandstats deltas over ``--idle`` seconds with nothing
   scheduled, per process: all commands (heartbeats, the dispatcher's idle re-checks...)
   and the poller's reads of ``schedule`` and ``retry`` (ZRANGE / ZRANGEBYSCORE);
2. schedule ``--jobs`` jobs due at random times over ``--spread`` seconds, each pushed
   (``perform_at``, one push per job, as an app does) between 0.2 and 5 s before it is
   due, so that pollers asleep until a later job must be woken by the announcement;
3. each job writes how late it started (its start time minus its scheduled time) to a
   Redis list; print p50 / p99 / max once all have run.

With ``--burst N`` (e.g. 100000: "send the reminders at 9:00"), also: N jobs all due at
the same instant, scheduled in bulk a few seconds ahead (as ``push_bulk`` with ``at``
writes them), run by ``--burst-supervisors`` (2) supervisors x 10 threads in ``due``
mode; print how late the first, median, p99 and last of them started. The target is the
last within 5 s of the due time, which needs the pollers to move due jobs faster than
the capsules run them. Each job pushes its own lateness (one round trip, as the peers'
jobs INCR). ``--burst-work async`` makes the job ``async def`` (for the modes' jobs
too; ``--modes`` with nothing after it runs the burst alone): run on each capsule's
event loop (``async_concurrency: 1000`` in the burst), it keeps its lateness in the
process and one thread pushes them in batches, so what is timed is the scheduling and
the dispatch. ``--burst-rounds R`` runs R bursts in a row, each on fresh processes, and
prints each round with the machine's steal and load over it, then the medians.
"""

from __future__ import annotations

import argparse
import os
import random
import statistics
import subprocess
import sys
import tempfile
import textwrap
import time
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import redis as redis_py
from _common import command_counts, cpu_ticks, machine_load, redis_for_bench, wait_until

import limitd
from limitd import keys
from limitd.supervisor.poller import INITIAL_WAIT

APP = textwrap.dedent("""
    import time

    import limitd

    @limitd.job(name="bench.Lateness", queue="sched", retry=False)
    def lateness(at):
        started = time.time()
        limitd.redis_client().rpush("bench:lateness", repr(started - at))
""")
# ``--burst-work async``: the same job as ``async def``, run on the capsule's event loop.
# It keeps its lateness in the process, and one thread per process pushes what came in
# every 5 ms (as bench/async_apps' jobs count themselves done): the figure is then the
# scheduling and the dispatch, not an asyncio Redis client's cost per call.
ASYNC_APP = textwrap.dedent("""
    import collections, os, threading, time

    import redis

    import limitd

    _late, _started_in = collections.deque(), [0]

    def _report():
        client = redis.Redis.from_url(os.environ["LIMITD_REDIS_URL"])
        while True:
            time.sleep(0.005)
            # popleft and append are atomic: what the loop adds meanwhile waits its turn
            batch = [_late.popleft() for _ in range(len(_late))]
            if batch:
                client.rpush("bench:lateness", *batch)

    @limitd.job(name="bench.Lateness", queue="sched", retry=False)
    async def lateness(at):
        _late.append(repr(time.time() - at))
        if _started_in[0] != os.getpid():  # one reporter per capsule process
            _started_in[0] = os.getpid()
            threading.Thread(target=_report, daemon=True).start()
""")
CONFIG = textwrap.dedent("""
    require: [bench_scheduled_app]
    queues: [sched]
    concurrency: 10
    scheduled_poll: {mode}
    logging: {{level: WARNING}}
""")
ASYNC_SLOTS = 1000  # async_concurrency for --burst-work async
MODES = ("interval", "due")
SETTLE_SECONDS = INITIAL_WAIT + 5 + 1  # past every poller's start-up wait (10-15 s)
POLLER_READS = ("zrange", "zrangebyscore")


@dataclass
class Result:
    mode: str
    lateness_ms: list[float]
    idle_commands: float  # per second per process, all commands
    idle_reads: float  # per second per process, reads of schedule and retry
    # A burst only: seconds after the due time at which the schedule held none of it
    # any more (every job moved to its queue), and the drain rate in between.
    moved_after: float | None = None
    machine: str = ""  # steal and load over the run (a burst's)

    def percentile(self, fraction: float) -> float:
        ordered = sorted(self.lateness_ms)
        return ordered[min(len(ordered) - 1, int(fraction * len(ordered)))]


@contextmanager
def supervisors(url: str, app_dir: Path, mode: str, count: int, extra: str = "") -> Iterator[None]:
    """``count`` separate ``limitd start`` subprocesses, stopped with TERM at the end."""
    conf = app_dir / f"{mode}.yml"
    conf.write_text(CONFIG.format(mode=mode) + extra)
    env = {**os.environ, "LIMITD_REDIS_URL": url}
    command = [sys.executable, "-m", "limitd.cli", "start", str(conf)]
    procs = [
        subprocess.Popen(command, cwd=app_dir, env=env, stdout=subprocess.DEVNULL)
        for _ in range(count)
    ]
    try:
        yield
    finally:
        for proc in procs:
            proc.terminate()
        for proc in procs:
            proc.wait(60)


def idle_load(conn: redis_py.Redis, seconds: float, processes: int) -> tuple[float, float]:
    """Commands per second per process over a quiet ``seconds``: all, and poller reads."""
    before = command_counts(conn)
    time.sleep(seconds)  # the quiet period being measured
    delta = command_counts(conn) - before
    reads = sum(delta[name] for name in POLLER_READS)
    per = seconds * processes
    return sum(delta.values()) / per, reads / per


def schedule_jobs(conn: redis_py.Redis, jobs: int, spread: float, rng: random.Random) -> None:
    """Push each job at a random moment 0.2-5 s before it is due, in push order."""
    client = limitd.Client(conn)
    start = time.time() + 5
    plan = []
    for _ in range(jobs):
        at = start + rng.uniform(0, spread)
        plan.append((at - rng.uniform(0.2, 5), at))
    for push_at, at in sorted(plan):
        delay = push_at - time.time()
        if delay > 0:
            time.sleep(delay)  # pushing at the planned moment, as an app would
        client.push({"class": "bench.Lateness", "args": [at], "queue": "sched", "at": at})


def run_mode(
    conn: redis_py.Redis, url: str, app_dir: Path, mode: str, args: argparse.Namespace
) -> Result:
    conn.flushall()
    with supervisors(url, app_dir, mode, args.supervisors):
        wait_until(lambda: conn.scard("processes") == args.supervisors, 60, "the processes")
        time.sleep(SETTLE_SECONDS)  # every poller past its start-up wait
        idle_commands, idle_reads = idle_load(conn, args.idle, args.supervisors)
        schedule_jobs(conn, args.jobs, args.spread, random.Random(args.seed))
        wait_until(lambda: conn.llen("bench:lateness") == args.jobs, 120, "every job")
        lateness = [float(v) * 1000 for v in conn.lrange("bench:lateness", 0, -1)]
    return Result(mode, lateness, idle_commands, idle_reads)


def run_burst(conn: redis_py.Redis, url: str, app_dir: Path, args: argparse.Namespace) -> Result:
    """``args.burst`` jobs due at one instant (see the module docstring)."""
    conn.flushall()
    before = cpu_ticks()
    extra = f"async_concurrency: {ASYNC_SLOTS}\n" if args.burst_work == "async" else ""
    with supervisors(url, app_dir, "due", args.burst_supervisors, extra):
        wait_until(lambda: conn.scard("processes") == args.burst_supervisors, 60, "the processes")
        time.sleep(SETTLE_SECONDS)  # every poller past its start-up wait
        client = limitd.Client(conn)
        due = time.time() + args.burst_lead
        item = {"class": "bench.Lateness", "queue": "sched", "at": due}
        client.push_bulk(item, [[due] for _ in range(args.burst)], batch_size=5000)
        if time.time() > due:
            raise RuntimeError(f"scheduling took longer than --burst-lead {args.burst_lead} s")
        moved_after = watch_moves(conn, due, args.burst)
        wait_until(lambda: conn.llen("bench:lateness") == args.burst, 600, "every burst job")
        lateness = [float(v) * 1000 for v in conn.lrange("bench:lateness", 0, -1)]
    return Result(f"burst {args.burst}", lateness, 0.0, 0.0, moved_after, str(machine_load(before)))


def watch_moves(conn: redis_py.Redis, due: float, jobs: int) -> float:
    """Poll the schedule (every 20 ms) until the pollers have moved every job out of it:
    the seconds after ``due`` that took. Beside the last job's lateness it tells a burst
    bound by the moves (late by about as long) from one bound by the capsules' drain."""
    key = keys.of(conn).SCHEDULE
    deadline = time.monotonic() + 600
    while conn.zcard(key) > 0:
        if time.monotonic() > deadline:
            raise RuntimeError(f"the pollers moved fewer than {jobs} jobs in 600 s")
        time.sleep(0.02)  # polling a count, not waiting for luck: the loop ends on it
    return time.time() - due


# The burst table's columns after the round: heading and width.
BURST_COLUMNS = (
    ("first ms", 10),
    ("p50 ms", 10),
    ("p99 ms", 10),
    ("last ms", 10),
    ("moved by ms", 13),
    ("jobs/s", 10),
)


def _cells(texts: Iterable[str]) -> str:
    return "".join(
        f"{text:>{width}}" for text, (_, width) in zip(texts, BURST_COLUMNS, strict=True)
    )


def report_burst(bursts: list[Result], args: argparse.Namespace) -> None:
    """One line per round (with the round's steal and load), then the medians."""
    print(
        f"\n{args.burst} jobs due at one instant, {args.burst_supervisors} supervisors x 1 "
        f"process x 10 threads, scheduled_poll: due, {args.burst_work} jobs"
        + (f" (async_concurrency: {ASYNC_SLOTS})" if args.burst_work == "async" else "")
    )
    print(f"{'round':>6}" + _cells(name for name, _ in BURST_COLUMNS) + "  machine")
    rows = [burst_figures(burst) for burst in bursts]
    for number, (row, burst) in enumerate(zip(rows, bursts, strict=True), 1):
        print(f"{number:>6}" + _cells(f"{value:.0f}" for value in row) + f"  {burst.machine}")
    if len(bursts) > 1:
        medians = (statistics.median(column) for column in zip(*rows, strict=True))
        print(f"{'median':>6}" + _cells(f"{value:.0f}" for value in medians))
    print(
        "jobs/s: the rate from the first start to the last; 'moved by': when the schedule "
        "was empty (every job in its queue)"
    )


def burst_figures(burst: Result) -> list[float]:
    """A round's figures, in the order of ``BURST_COLUMNS``."""
    late = sorted(burst.lateness_ms)
    span = (late[-1] - late[0]) / 1000
    return [
        late[0],
        burst.percentile(0.5),
        burst.percentile(0.99),
        late[-1],
        1000 * (burst.moved_after or 0),
        len(late) / span if span > 0 else 0.0,
    ]


def report(results: list[Result], args: argparse.Namespace) -> None:
    print(
        f"{args.jobs} jobs over {args.spread:.0f} s, {args.supervisors} supervisors x 1 "
        f"process x 10 threads; idle measured over {args.idle:.0f} s"
    )
    print(
        f"{'scheduled_poll':<15}{'p50 ms':>9}{'p99 ms':>9}{'max ms':>9}{'mean ms':>9}"
        f"{'idle cmd/s/proc':>17}{'idle reads/s/proc':>19}"
    )
    for r in results:
        print(
            f"{r.mode:<15}{r.percentile(0.5):>9.1f}{r.percentile(0.99):>9.1f}"
            f"{max(r.lateness_ms):>9.1f}{statistics.fmean(r.lateness_ms):>9.1f}"
            f"{r.idle_commands:>17.2f}{r.idle_reads:>19.3f}"
        )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--jobs", type=int, default=1000)
    parser.add_argument("--spread", type=float, default=30.0, help="seconds")
    parser.add_argument("--supervisors", type=int, default=3)
    parser.add_argument("--idle", type=float, default=30.0, help="quiet seconds measured")
    parser.add_argument("--modes", nargs="*", choices=MODES, default=list(MODES))
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--burst", type=int, default=0, help="jobs due at one instant (0: none)")
    parser.add_argument("--burst-supervisors", type=int, default=2)
    parser.add_argument("--burst-rounds", type=int, default=1, help="bursts in a row (medians)")
    parser.add_argument(
        "--burst-lead", type=float, default=10.0, help="seconds between scheduling and due"
    )
    parser.add_argument(
        "--burst-work",
        choices=("sync", "async"),
        default="sync",
        help="the burst's job: a sync function on the threads, or async def on the loop",
    )
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp, redis_for_bench(None) as conn:
        app_dir = Path(tmp)
        (app_dir / "bench_scheduled_app.py").write_text(
            ASYNC_APP if args.burst_work == "async" else APP
        )
        kwargs = conn.connection_pool.connection_kwargs
        url = f"redis://{kwargs['host']}:{kwargs['port']}/0"  # the private server
        results = [run_mode(conn, url, app_dir, mode, args) for mode in args.modes]
        bursts = [
            run_burst(conn, url, app_dir, args)
            for _ in range(args.burst_rounds if args.burst else 0)
        ]
    if results:
        report(results, args)
    if bursts:
        report_burst(bursts, args)


if __name__ == "__main__":
    main()
