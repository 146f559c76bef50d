"""Async jobs that wait on I/O (issue 19): how fast one worker process drains jobs that
each wait 100 ms, as limitd async jobs on the capsule's event loop, as limitd sync jobs on
threads, on arq and saq, and on BullMQ (Node).

    .venv/bin/python bench/async_io.py [--jobs 20000] [--rounds 3] [--systems a,b]
        [--round-seconds 30] [--calibration-jobs 2000] [--deadline 90] [--quick]

The work: every job waits 100 ms (``asyncio.sleep(0.1)`` in async jobs, ``time.sleep(0.1)``
in sync ones), standing in for an HTTP call, and counts itself done (``--work wait``, the
default: counted in the worker and added to a Redis counter every 5 ms, see
bench/async_apps/tally.py, and bench/async_apps/bullmq/worker.js the same way in Node;
``--work wait+incr``: the job INCRs the counter itself through its system's own Redis
client, asyncio for the Python async ones, ioredis for BullMQ). The jobs are enqueued
before the workers start (the enqueue is not timed), then one worker process drains them:

- ``limitd-async``: ``limitd start``, ``processes: 1``, ``async_concurrency: 1000`` (jobs
  on the loop at once), ``concurrency: 10`` processor threads fetching for it;
  ``limitd-async-10000`` the same with ``async_concurrency: 10000``;
  ``limitd-async-uvloop-1000`` and ``limitd-async-uvloop-10000`` the same two with
  ``async_loop: uvloop`` (the ``uvloop`` extra);
- ``limitd-sync-10`` and ``limitd-sync-100``: ``limitd start``, ``processes: 1``, the same
  work as sync jobs on 10 and 100 threads;
- ``arq`` (``max_jobs=1000``) and ``saq`` (``concurrency=1000``), one worker process each,
  from the peers' venv (bench/peers/.venv, built from bench/peers/requirements.txt);
- ``bullmq``: one Node process running one BullMQ ``Worker`` with ``concurrency: 1000``
  (bench/async_apps/bullmq/worker.js), the jobs added by ``Queue.addBulk``, 1,000 a call,
  with ``removeOnComplete: true`` and BullMQ's defaults otherwise (``removeOnFail``
  unset: a failed job would be kept); ``bullmq-10000`` the same with ``concurrency:
  10000``. A BullMQ Worker fetches jobs one at a time (a round trip each) until it holds
  ``concurrency`` of them before it runs the first, so bullmq-10000's first job is done
  seconds after it starts: the steady window leaves that ramp out, the round lines give
  the whole drain and when the first job was done. BullMQ and ioredis are pinned in
  bench/async_apps/bullmq/package.json and its
  package-lock.json; ``npm ci`` installs them there on first use (again when the lock
  file changed). Without node (>= 20) or, for that install, npm, both are reported as
  unavailable and the other systems run.

A system's jobs per round is --jobs, or fewer so that a round lasts at most about
--round-seconds: no more than its ceiling (slots / 0.1 s jobs a second) would drain in
that time (3,000 for the 10-thread system), and no more than the rate of a first,
calibration drain of --calibration-jobs would (that drain is also the system's warm-up
and is not reported with the rounds); the output says which were scaled and why. All run
against one private
redis-server (never port 6379), flushed before each drain, alternating the systems round
by round because the machine is noisy. The drain machinery is bench/peers/measure.py:
the counter is read every 10 ms, and the figures are the steady window from 10% to 90% of
the jobs: jobs/s, worker CPU per job (user + sys of the worker's whole process tree, from
/proc; for BullMQ the node process) and redis-server CPU per job. Prints each round, then
per system the median (min-max), and the ratio of limitd-async's median to each other
system's, but for bullmq-10000 that of limitd-async-10000 (as many jobs in flight).

The workers import limitd as this process does: from the working tree, or from a fixed
commit while the tree is being edited, e.g.
``git archive HEAD | tar -x -C /tmp/snap`` then ``PYTHONPATH=/tmp/snap`` in front of the
command (the header prints where limitd came from).
"""

from __future__ import annotations

import argparse
import functools
import hashlib
import json
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import redis as redis_py

import limitd
from limitd.connection.embedded import RedisServer
from limitd.job import JobFunction

BENCH_DIR = Path(__file__).resolve().parent
ASYNC_APPS_DIR = BENCH_DIR / "async_apps"
PEERS_DIR = BENCH_DIR / "peers"
sys.path[:0] = [str(PEERS_DIR), str(PEERS_DIR / "apps"), str(ASYNC_APPS_DIR)]

import limitd_io_app  # noqa: E402
import measure  # noqa: E402
from _common import cpu_ticks, machine_load  # noqa: E402
from peers_venv import ensure_peers_venv  # noqa: E402
from systems.base import APPS_DIR, PEERS_BIN, PROJECT_BIN, Context, System  # noqa: E402

WAIT_SECONDS = limitd_io_app.WAIT_SECONDS
ASYNC_SLOTS = 1000
MANY_SLOTS = 10_000  # the lane at scale: its ceiling is 100,000 jobs/s
ASYNC_PROCESSORS = 10  # limitd-async's processor threads, fetching for the loop
BULK = 1000  # limitd jobs per LPUSH when enqueueing
TARGET_RATE = 5000.0  # jobs/s limitd-async should reach
REFERENCE = "limitd-async"
PEERS = ("arq", "saq", "bullmq")
# A system's ratio is limitd-async's median over its own, or that of the limitd system
# named here, which has as many jobs in flight.
PAIRED = {"bullmq-10000": "limitd-async-10000"}
BULLMQ_DIR = ASYNC_APPS_DIR / "bullmq"
BULLMQ_MODULES = BULLMQ_DIR / "node_modules"
BULLMQ_STAMP = BULLMQ_MODULES / ".limitd-bench-lock.sha256"  # package-lock.json's hash
NODE_MAJOR = 20  # ioredis 6 needs Node >= 20

LIMITD_CONFIG = """\
redis:
  url: {url}
logging:
  level: WARNING
require: [limitd_io_app]
queues: [{queue}]
processes: 1
concurrency: {threads}
"""


@dataclass(frozen=True)
class IoSystem:
    """One system under test: how to enqueue its jobs and start its one worker."""

    name: str
    settings: str
    slots: int  # jobs in flight at once: the drain can reach slots / WAIT_SECONDS jobs/s
    workers: Callable[[Context], list[list[str]]]
    enqueue: Callable[[Context, int], None]
    peer: bool = False  # runs from the peers' venv
    unavailable: Callable[[], str | None] = lambda: None  # why it cannot run here

    def ceiling(self) -> float:
        return self.slots / WAIT_SECONDS

    def jobs(self, wanted: int, round_seconds: float) -> int:
        """``wanted``, or fewer when even a drain at the ceiling would outlast a round."""
        return min(wanted, int(self.ceiling() * round_seconds))

    def drain_system(self) -> System:
        """The shape bench/peers/measure.py drains (it starts ``workers``)."""
        return System(name=self.name, settings=self.settings, enqueue_api="-", workers=self.workers)


def limitd_workers(
    threads: int, async_slots: int | None, loop: str = "asyncio"
) -> Callable[[Context], list[list[str]]]:
    """``limitd start`` on a YAML config written for the run."""

    def commands(ctx: Context) -> list[list[str]]:
        text = LIMITD_CONFIG.format(url=ctx.url, queue=limitd_io_app.QUEUE, threads=threads)
        if async_slots is not None:
            text += f"async_concurrency: {async_slots}\n"
        if loop != "asyncio":  # (unset otherwise: a checkout older than the key runs too)
            text += f"async_loop: {loop}\n"
        config = ctx.tmp / f"async-io-{threads}-{async_slots}-{loop}.yml"
        config.write_text(text)
        return [[str(PROJECT_BIN / "limitd"), "start", str(config)]]

    return commands


def limitd_enqueue(job: JobFunction) -> Callable[[Context, int], None]:
    """The bulk path, from this process (the driver runs in the project's venv)."""

    def enqueue(ctx: Context, jobs: int) -> None:
        with redis_py.Redis.from_url(ctx.url) as conn:
            limitd.set_default_client(limitd.Client(conn))
            job.perform_bulk([[i] for i in range(jobs)], batch_size=BULK)

    return enqueue


def run_enqueue(command: list[str], ctx: Context) -> None:
    """An enqueue command of a peer, with the environment the workers get; it must have
    finished before the drain starts."""
    try:
        done = subprocess.run(
            command,
            cwd=APPS_DIR,
            env=measure.system_env(ctx.url),
            capture_output=True,
            text=True,
            timeout=600,
            check=False,
        )
    except subprocess.TimeoutExpired as exc:
        raise measure.RunFailed("enqueue did not finish in 600 s") from exc
    if done.returncode != 0:
        raise measure.RunFailed(f"enqueue exited {done.returncode}: {done.stderr[-1500:]}")


def peer_enqueue(name: str) -> Callable[[Context, int], None]:
    """bench/async_apps/enqueue_io.py in the peers' venv."""

    def enqueue(ctx: Context, jobs: int) -> None:
        command = [str(PEERS_BIN / "python"), str(ASYNC_APPS_DIR / "enqueue_io.py"), name]
        run_enqueue([*command, str(jobs)], ctx)

    return enqueue


def arq_workers(ctx: Context) -> list[list[str]]:
    return [[str(PEERS_BIN / "python"), str(ASYNC_APPS_DIR / "arq_io_app.py")]]


def saq_workers(ctx: Context) -> list[list[str]]:
    return [[str(PEERS_BIN / "saq"), "saq_io_app.settings"]]


def bullmq_pins() -> str:
    """The versions package.json pins, for the settings line."""
    pinned = json.loads((BULLMQ_DIR / "package.json").read_text())["dependencies"]
    return f"BullMQ {pinned['bullmq']} (ioredis {pinned['ioredis']})"


def node() -> str:
    return shutil.which("node") or "node"


def bullmq_workers(concurrency: int) -> Callable[[Context], list[list[str]]]:
    """One node process (the session leader measure reads the worker CPU of)."""

    def commands(ctx: Context) -> list[list[str]]:
        worker = str(BULLMQ_DIR / "worker.js")
        return [[node(), worker, str(concurrency), measure.COUNTER_KEY]]

    return commands


def bullmq_enqueue(ctx: Context, jobs: int) -> None:
    run_enqueue([node(), str(BULLMQ_DIR / "enqueue.js"), str(jobs)], ctx)


def node_missing() -> str | None:
    """Why this node cannot run the BullMQ apps, if it cannot."""
    found = shutil.which("node")
    if found is None:
        return f"node not found on PATH (BullMQ's apps need Node.js >= {NODE_MAJOR} and npm)"
    try:
        version = subprocess.run(
            [found, "--version"], capture_output=True, text=True, timeout=60, check=False
        ).stdout.strip()
    except (OSError, subprocess.TimeoutExpired) as exc:
        return f"{found} --version failed: {exc}"
    major = re.match(r"v(\d+)\.", version)
    if major is None or int(major.group(1)) < NODE_MAJOR:
        return f"{found} is {version or 'of unknown version'}; BullMQ's apps need >= {NODE_MAJOR}"
    return None


@functools.cache
def bullmq_unavailable() -> str | None:
    """Node must be there; bench/async_apps/bullmq/node_modules is installed with
    ``npm ci`` from the committed package-lock.json when it is missing or was built
    from another lock file (the stamp holds the lock file's hash), so a checkout runs
    with one command. None when BullMQ can run."""
    reason = node_missing()
    if reason:
        return reason
    wanted = hashlib.sha256((BULLMQ_DIR / "package-lock.json").read_bytes()).hexdigest()
    installed = (BULLMQ_MODULES / "bullmq" / "package.json").exists()
    if installed and BULLMQ_STAMP.exists() and BULLMQ_STAMP.read_text() == wanted:
        return None
    by_hand = f"run by hand: cd {BULLMQ_DIR} && npm ci"
    npm = shutil.which("npm")
    if npm is None:
        return f"npm not found on PATH, needed to install BullMQ into {BULLMQ_MODULES}"
    print(f"installing BullMQ into {BULLMQ_MODULES} (npm ci) ...", flush=True)
    try:
        done = subprocess.run(
            [npm, "ci", "--no-audit", "--no-fund"],
            cwd=BULLMQ_DIR,
            capture_output=True,
            text=True,
            timeout=600,
            check=False,
        )
    except (OSError, subprocess.TimeoutExpired) as exc:
        return f"npm ci failed ({exc}); {by_hand}"
    if done.returncode != 0:
        return f"npm ci exited {done.returncode}: {done.stderr[-1500:]}; {by_hand}"
    BULLMQ_STAMP.write_text(wanted)
    return None


def async_name(slots: int, loop: str) -> str:
    """limitd-async (the reference), limitd-async-10000, limitd-async-uvloop-N."""
    if loop != "asyncio":
        return f"limitd-async-{loop}-{slots}"
    return REFERENCE if slots == ASYNC_SLOTS else f"limitd-async-{slots}"


def all_systems() -> list[IoSystem]:
    return [
        *(
            IoSystem(
                name=async_name(slots, loop),
                settings=(
                    f"limitd start, 1 process, async_concurrency {slots}, "
                    + (f"async_loop {loop}, " if loop != "asyncio" else "")
                    + f"concurrency {ASYNC_PROCESSORS} (processor threads fetching)"
                ),
                slots=slots,
                workers=limitd_workers(ASYNC_PROCESSORS, slots, loop=loop),
                enqueue=limitd_enqueue(limitd_io_app.wait_io),
            )
            for loop in ("asyncio", "uvloop")
            for slots in (ASYNC_SLOTS, MANY_SLOTS)
        ),
        *(
            IoSystem(
                name=f"limitd-sync-{threads}",
                settings=f"limitd start, 1 process, sync jobs, concurrency {threads} threads",
                slots=threads,
                workers=limitd_workers(threads, None),
                enqueue=limitd_enqueue(limitd_io_app.wait_io_sync),
            )
            for threads in (10, 100)
        ),
        IoSystem(
            name="arq",
            settings="1 worker process, max_jobs 1000, keep_result 0, poll_delay 0.05 s",
            slots=1000,
            workers=arq_workers,
            enqueue=peer_enqueue("arq"),
            peer=True,
        ),
        IoSystem(
            name="saq",
            settings="1 worker process (saq, no --workers), concurrency 1000, ttl=-1",
            slots=1000,
            workers=saq_workers,
            enqueue=peer_enqueue("saq"),
            peer=True,
        ),
        *(
            IoSystem(
                name="bullmq" if concurrency == ASYNC_SLOTS else f"bullmq-{concurrency}",
                settings=(
                    f"1 Node process, {bullmq_pins()} Worker, concurrency {concurrency}; "
                    "jobs added by addBulk, 1000 a call, with "
                    "removeOnComplete: true, removeOnFail unset (default: failed jobs "
                    "kept); other options default (lockDuration 30 s, stalledInterval "
                    "30 s, events stream maxLen 10000)"
                ),
                slots=concurrency,
                workers=bullmq_workers(concurrency),
                enqueue=bullmq_enqueue,
                unavailable=bullmq_unavailable,
            )
            for concurrency in (ASYNC_SLOTS, MANY_SLOTS)
        ),
    ]


def select(names: str | None) -> list[IoSystem]:
    known = all_systems()
    if not names:
        return known
    wanted = [n.strip() for n in names.split(",") if n.strip()]
    unknown = sorted(set(wanted) - {s.name for s in known})
    if unknown:
        raise SystemExit(f"unknown systems {unknown}; known: {[s.name for s in known]}")
    return [s for s in known if s.name in wanted]


@dataclass
class Outcome:
    system: IoSystem
    jobs: int
    drains: list[measure.Drain]
    error: str | None = None
    scaled_by: str | None = None  # why it runs fewer than --jobs
    unavailable: str | None = None  # why it cannot run here (then it is not run)

    def windows(self) -> list[measure.Window]:
        return [d.steady or d.whole for d in self.drains]

    def median_rate(self) -> float | None:
        windows = self.windows()
        return statistics.median(w.rate for w in windows) if windows else None


def one_round(
    outcome: Outcome, conn: redis_py.Redis, ctx: Context, deadline: float
) -> measure.Drain:
    conn.flushdb()
    try:
        outcome.system.enqueue(ctx, outcome.jobs)
        return measure.drain(outcome.system.drain_system(), ctx, conn, outcome.jobs, deadline)
    finally:
        conn.flushdb()


def round_line(number: int, rounds: int, outcome: Outcome, drain: measure.Drain) -> str:
    w = drain.steady or drain.whole
    part = "steady" if drain.steady else "whole (no steady window)"
    return (
        f"round {number}/{rounds} {outcome.system.name:<16} {outcome.jobs:>6,} jobs: {part} "
        f"{w.rate:>7,.0f} jobs/s, worker CPU {w.worker_cpu_us_per_job:>5.0f} us/job, Redis "
        f"CPU {w.redis_cpu_us_per_job:>4.0f} us/job, {w.commands_per_job:.1f} cmds/job; "
        f"whole drain {drain.whole.seconds:.1f} s, first job after {drain.first_job:.2f} s"
    )


def calibrate(
    outcome: Outcome, conn: redis_py.Redis, ctx: Context, args: argparse.Namespace
) -> None:
    """A short first drain (also a warm-up, not reported with the rounds) to size the
    rounds: a system that drains at R jobs/s runs at most R x --round-seconds jobs, so a
    slow one does not stretch a round to minutes."""
    system = outcome.system
    trial = Outcome(system, min(outcome.jobs, args.calibration_jobs, int(system.ceiling() * 3)), [])
    drained = one_round(trial, conn, ctx, args.deadline)
    rate = (drained.steady or drained.whole).rate
    fits = int(rate * args.round_seconds)
    if fits < outcome.jobs:
        outcome.jobs = max(trial.jobs, fits // 100 * 100)
        outcome.scaled_by = f"calibration drained {rate:,.0f} jobs/s"
    print(
        f"calibration {system.name:<16} {trial.jobs:>6,} jobs: {rate:>7,.0f} jobs/s -> "
        f"{outcome.jobs:,} jobs a round",
        flush=True,
    )


def run_rounds(
    outcomes: list[Outcome], conn: redis_py.Redis, url: str, args: argparse.Namespace
) -> None:
    """A calibration drain of each system, then A B C ... A B C ...: every system sees
    the same drift of a noisy machine; a system that fails once is dropped from the
    later rounds."""
    with tempfile.TemporaryDirectory(prefix="limitd-async-io-") as tmp:
        ctx = Context(url=url, tmp=Path(tmp))
        for outcome in outcomes:
            if outcome.unavailable:
                continue
            try:
                calibrate(outcome, conn, ctx, args)
            except measure.RunFailed as exc:
                outcome.error = f"calibration: {exc}"
                print(f"calibration {outcome.system.name:<16} ERROR {exc}", flush=True)
        for number in range(1, args.rounds + 1):
            for outcome in outcomes:
                if outcome.error or outcome.unavailable:
                    continue
                ticks = cpu_ticks()
                try:
                    drained = one_round(outcome, conn, ctx, args.deadline)
                except measure.RunFailed as exc:
                    outcome.error = f"round {number}: {exc}"
                    print(
                        f"round {number}/{args.rounds} {outcome.system.name:<16} ERROR {exc}",
                        flush=True,
                    )
                    continue
                outcome.drains.append(drained)
                # The machine's steal and load over the round: a round far off the
                # others says why.
                line = round_line(number, args.rounds, outcome, drained)
                print(f"{line}; {machine_load(ticks)}", flush=True)


def spread(values: list[float]) -> str:
    return f"{statistics.median(values):,.0f} ({min(values):,.0f}-{max(values):,.0f})"


def reference_of(name: str) -> str:
    """The limitd system whose median a system's ratio is taken against."""
    return PAIRED.get(name, REFERENCE)


def summary_row(outcome: Outcome, rates: dict[str, float | None]) -> str:
    name = outcome.system.name
    windows = outcome.windows()
    if outcome.unavailable:
        return f"{name:<16} {'-':>6}  unavailable: {outcome.unavailable}"
    if not windows:
        return f"{name:<16} {outcome.jobs:>6,}  failed: {outcome.error}"
    rate = statistics.median(w.rate for w in windows)
    worker = statistics.median(w.worker_cpu_us_per_job for w in windows)
    redis_cpu = statistics.median(w.redis_cpu_us_per_job for w in windows)
    reference = rates.get(reference_of(name))
    ratio = f"{reference / rate:.2f}x" if reference and name != reference_of(name) else "-"
    note = f"  (failed {outcome.error})" if outcome.error else ""
    return (
        f"{name:<16} {outcome.jobs:>6,} {outcome.system.ceiling():>8,.0f} "
        f"{spread([w.rate for w in windows]):<26} {worker:>9.0f} {redis_cpu:>9.0f} "
        f"{ratio:>10}{note}"
    )


def target_lines(outcomes: list[Outcome]) -> list[str]:
    """Target: limitd-async >= 5,000 jobs/s and ahead of arq, saq and bullmq; then the
    other pairs of PAIRED, compared the same way (not part of the target)."""
    rates = {o.system.name: o.median_rate() for o in outcomes}
    reference = rates.get(REFERENCE)
    lines = []
    if reference is None:
        lines.append(f"target: {REFERENCE} has no figure, nothing to check")
    else:
        verdict = "met" if reference >= TARGET_RATE else "NOT met"
        lines.append(
            f"target {REFERENCE} >= {TARGET_RATE:,.0f} jobs/s: {reference:,.0f}, {verdict}"
        )
        for peer in PEERS:
            theirs = rates.get(peer)
            if theirs is None:
                lines.append(f"target ahead of {peer}: no figure for {peer}")
                continue
            lines.append(versus(f"target ahead of {peer}", reference, theirs, "met"))
    for peer, ours in PAIRED.items():
        mine, theirs = rates.get(ours), rates.get(peer)
        if mine is None or theirs is None:
            if peer in rates or ours in rates:
                lines.append(f"{ours} against {peer}: no figure for one of them")
            continue
        lines.append(versus(f"{ours} against {peer}", mine, theirs, "ahead"))
    return lines


def versus(label: str, mine: float, theirs: float, verdict: str) -> str:
    """``label``: both rates, their ratio, and ``verdict`` (or "NOT " it when behind)."""
    said = verdict if mine > theirs else f"NOT {verdict}"
    return f"{label}: {mine:,.0f} against {theirs:,.0f} jobs/s ({mine / theirs:.2f}x), {said}"


def report(outcomes: list[Outcome], args: argparse.Namespace) -> None:
    print(
        f"\njobs that wait {WAIT_SECONDS * 1000:.0f} ms (work: {args.work}), one worker process, "
        f"{args.rounds} rounds alternated; steady window 10%-90% of the jobs, medians"
    )
    for outcome in outcomes:
        print(f"  {outcome.system.name}: {outcome.system.settings}")
    scaled = [o for o in outcomes if o.jobs < args.jobs and not o.unavailable]
    for outcome in scaled:
        print(
            f"  {outcome.system.name} ran {outcome.jobs:,} jobs a round, not {args.jobs:,}, "
            f"to keep a round under ~{args.round_seconds:g} s: {outcome.scaled_by}"
        )
    print(
        f"{'system':<16} {'jobs':>6} {'ceiling':>8} {'steady jobs/s (min-max)':<26} "
        f"{'worker us':>9} {'redis us':>9} {'async/this':>10}"
    )
    rates = {o.system.name: o.median_rate() for o in outcomes}
    for outcome in outcomes:
        print(summary_row(outcome, rates))
    print(
        f"(ceiling: slots / 0.1 s; worker and Redis CPU per job; async/this: {REFERENCE}'s "
        "median over this system's, "
        + ", ".join(f"{peer}'s: {ours}'s over it" for peer, ours in PAIRED.items())
        + ")"
    )
    print("\n".join(target_lines(outcomes)))


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--jobs", type=int, default=20_000, help="jobs per drain (20000)")
    parser.add_argument("--rounds", type=int, default=3, help="drains of each system (3)")
    parser.add_argument(
        "--systems", help=f"comma-separated subset of {[s.name for s in all_systems()]}"
    )
    parser.add_argument(
        "--round-seconds",
        type=float,
        default=30.0,
        help="fewer jobs for a system whose ceiling would need longer (30)",
    )
    parser.add_argument("--deadline", type=float, default=90.0, help="seconds per drain (90)")
    parser.add_argument(
        "--calibration-jobs",
        type=int,
        default=2000,
        help="jobs of the first drain that sizes each system's rounds (2000)",
    )
    parser.add_argument(
        "--quick",
        action="store_true",
        help="smoke run: 2,000 jobs, 1 round, 5 s rounds, 500-job calibration",
    )
    parser.add_argument(
        "--work",
        choices=("wait", "wait+incr"),
        default="wait",
        help="wait: the job only waits, done-counts are batched (default); wait+incr: "
        "each job also INCRs a counter through its system's own Redis client",
    )
    args = parser.parse_args()
    if args.quick:
        args.jobs, args.rounds, args.round_seconds = 2000, 1, 5.0
        args.calibration_jobs = min(args.calibration_jobs, 500)
    return args


def main() -> None:
    args = parse_args()
    systems = select(args.systems)
    if any(s.peer for s in systems):
        ensure_peers_venv()
    unavailable = {s.name: s.unavailable() for s in systems}
    for name, reason in unavailable.items():
        if reason:
            print(f"UNAVAILABLE {name}: {reason}", flush=True)
    # Every process the drain starts finds the job modules here (measure.system_env puts
    # bench/peers/apps, for bench_counter, in front of this).
    os.environ["PYTHONPATH"] = os.pathsep.join(
        filter(None, [str(ASYNC_APPS_DIR), os.environ.get("PYTHONPATH")])
    )
    os.environ["BENCH_WORK"] = args.work  # read by bench/async_apps/tally.py
    outcomes = []
    for system in systems:
        outcome = Outcome(system, system.jobs(args.jobs, args.round_seconds), [])
        outcome.unavailable = unavailable[system.name]
        if outcome.jobs < args.jobs:
            outcome.scaled_by = f"its ceiling is {system.ceiling():,.0f} jobs/s"
        outcomes.append(outcome)
    started = time.monotonic()
    server = RedisServer()
    server.start()
    try:
        with redis_py.Redis.from_url(server.url) as conn:
            version = conn.info("server")["redis_version"]
            print(
                f"redis-server {version} on port {server.port} (private); {len(systems)} "
                f"systems, {args.rounds} rounds, up to {args.jobs:,} jobs each; limitd "
                f"{limitd.__version__} from {Path(limitd.__file__).parent}",
                flush=True,
            )
            run_rounds(outcomes, conn, server.url, args)
    finally:
        server.stop()
    report(outcomes, args)
    print(f"total {time.monotonic() - started:.0f} s")
    sys.exit(1 if any(o.error for o in outcomes) else 0)


if __name__ == "__main__":
    main()
