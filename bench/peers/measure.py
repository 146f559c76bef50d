"""One run of one system: enqueue N jobs (a subprocess in the system's interpreter that
times itself), then start its workers and time the drain by polling the job counter,
with the Redis and worker CPU and the Redis commands over the whole drain and over its
steady part (10% to 90% of the jobs)."""

from __future__ import annotations

import json
import math
import os
import subprocess
import time
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import redis as redis_py
from procs import exited, start_group, stop_groups, worker_cpu_seconds
from systems.base import APPS_DIR, Context, System

COUNTER_KEY = "bench:done"  # the key apps/bench_counter.py and sidekiq_app.rb increment
POLL_SECONDS = 0.01  # the counter's sampling period: the resolution of the drain figure
LOG_TAIL = 1500
STEADY_FROM, STEADY_TO = 0.1, 0.9  # the steady window, as shares of the jobs done


class RunFailed(Exception):
    """This system cannot finish a run (crash, deadline, wrong count): skip it."""


@dataclass(frozen=True)
class Snapshot:
    """The counters at one moment of a drain, read right after one poll of the job
    counter; the difference of two is what the system did in between."""

    seconds: float  # since the workers were started
    count: int  # jobs done by then
    polls: int  # GETs of the job counter the driver had sent by then
    commands: Counter[str]  # INFO commandstats calls
    command_usec: Counter[str]  # INFO commandstats usec: server time per command
    redis_cpu: float  # redis-server CPU seconds (user + sys)
    worker_cpu: float  # CPU seconds of every process of the workers' sessions


@dataclass(frozen=True)
class Window:
    """What a system did between two snapshots, per job done meanwhile."""

    jobs: int
    seconds: float
    commands_per_job: float  # Redis commands served per job (inside Lua included)
    lua_per_job: float  # EVAL/EVALSHA/FCALL calls per job
    redis_cpu_us_per_job: float  # redis-server CPU time (user + sys) per job
    worker_cpu_us_per_job: float  # the workers' CPU time (user + sys) per job
    busiest: tuple[tuple[str, float], ...] = ()  # the most-served commands, calls per job
    # The commands that took the most server time, us per job. A Lua call's time holds
    # that of the commands it ran, which are also counted under their own names.
    costliest: tuple[tuple[str, float], ...] = ()

    @property
    def rate(self) -> float:
        return self.jobs / self.seconds


@dataclass(frozen=True)
class Drain:
    seconds: float  # from starting the workers until the counter read N
    first_job: float  # from starting the workers until the counter first read > 0
    whole: Window  # from starting the workers until the counter read N
    steady: Window | None  # from 10% to 90% of the jobs; None if seen at the same poll


LUA_COMMANDS = ("eval", "evalsha", "eval_ro", "evalsha_ro", "fcall", "fcall_ro")


def redis_cpu_seconds(conn: redis_py.Redis) -> float:
    """CPU the server used so far: its share of the 2 cores the workers also need."""
    cpu = conn.info("cpu")
    return float(cpu["used_cpu_user"]) + float(cpu["used_cpu_sys"])


def command_stats(conn: redis_py.Redis) -> tuple[Counter[str], Counter[str]]:
    """Calls served so far and the server time they took (us), per command (INFO
    commandstats; the INFO calls left out). The server runs one system at a time, so a
    difference is that system's work."""
    calls: Counter[str] = Counter()
    usec: Counter[str] = Counter()
    for name, stats in conn.info("commandstats").items():
        if name != "cmdstat_info":
            calls[name.removeprefix("cmdstat_")] = int(stats["calls"])
            usec[name.removeprefix("cmdstat_")] = int(stats["usec"])
    return calls, usec


def command_counts(conn: redis_py.Redis) -> Counter[str]:
    """Calls served so far per command (see ``command_stats``)."""
    return command_stats(conn)[0]


def system_env(url: str, first: Sequence[Path] = ()) -> dict[str, str]:
    """Every process of a system sees its Redis under the names each library reads, and
    the job modules on PYTHONPATH, after the directories ``first`` (a system's
    ``pythonpath``: another checkout's limitd, for run.py --compare)."""
    env = dict(os.environ)
    env.update(BENCH_REDIS_URL=url, LIMITD_REDIS_URL=url, REDIS_URL=url)
    path = [*map(str, first), str(APPS_DIR), env.get("PYTHONPATH")]
    env["PYTHONPATH"] = os.pathsep.join(filter(None, path))
    env.pop("VIRTUAL_ENV", None)
    return env


def enqueue_seconds(system: System, ctx: Context, jobs: int, deadline: float) -> float:
    """Run the system's enqueue command and return the seconds it reported."""
    try:
        done = subprocess.run(
            system.enqueue_argv(ctx, jobs),
            cwd=APPS_DIR,
            env=system_env(ctx.url, system.pythonpath),
            capture_output=True,
            text=True,
            timeout=deadline,
            check=False,
        )
    except subprocess.TimeoutExpired as exc:
        raise RunFailed(f"enqueue did not finish in {deadline:.0f} s") from exc
    if done.returncode != 0:
        raise RunFailed(f"enqueue exited {done.returncode}: {done.stderr[-LOG_TAIL:]}")
    return float(json.loads(done.stdout.strip().splitlines()[-1])["seconds"])


def drain(system: System, ctx: Context, conn: redis_py.Redis, jobs: int, deadline: float) -> Drain:
    """Start the workers, wait until the counter reads ``jobs``, stop them (whole process
    groups), then check the counter is exactly ``jobs``: no job lost or run twice.
    Snapshots of the Redis and worker counters are taken at the start, when the counter
    first reads 10% and 90% of ``jobs`` (the steady window, start-up and the tail left
    out) and when it reads ``jobs``, all before the workers are stopped."""
    log_path = ctx.tmp / f"{system.name}.log"
    env = system_env(ctx.url, system.pythonpath)
    with log_path.open("wb") as log:
        commands = system.workers(ctx)
        procs: list[subprocess.Popen[bytes]] = []
        start = _snapshot(conn, procs, seconds=0.0, count=0, polls=0)
        started = time.perf_counter()
        procs.extend(start_group(cmd, cwd=APPS_DIR, env=env, log=log) for cmd in commands)
        try:
            first_job, marks = _wait_for_count(
                conn, procs, jobs=jobs, started=started, deadline=deadline, log_path=log_path
            )
        finally:
            stop_groups(procs)
    final = int(conn.get(COUNTER_KEY) or 0)
    if final != jobs:
        raise RunFailed(f"counter is {final} after the drain, expected exactly {jobs}")
    low, high, end = marks
    whole = window(start, end)
    if whole is None:
        raise RunFailed("the drain took no measurable time")
    return Drain(end.seconds, first_job, whole, window(low, high))


def window(a: Snapshot, b: Snapshot) -> Window | None:
    """The figures per job between two snapshots (None when no job ran in between)."""
    done, seconds = b.count - a.count, b.seconds - a.seconds
    if done <= 0 or seconds <= 0:
        return None
    served = b.commands - a.commands
    served["get"] -= b.polls - a.polls  # the driver's own reads of the counter
    lua = sum(served[name] for name in LUA_COMMANDS)
    return Window(
        jobs=done,
        seconds=seconds,
        commands_per_job=sum(served.values()) / done,
        lua_per_job=lua / done,
        redis_cpu_us_per_job=1e6 * (b.redis_cpu - a.redis_cpu) / done,
        worker_cpu_us_per_job=1e6 * (b.worker_cpu - a.worker_cpu) / done,
        busiest=tuple((name, n / done) for name, n in served.most_common(6) if n > 0),
        costliest=tuple(
            (name, us / done)
            for name, us in (b.command_usec - a.command_usec).most_common(8)
            if us > 0
        ),
    )


def _snapshot(
    conn: redis_py.Redis,
    procs: list[subprocess.Popen[bytes]],
    *,
    seconds: float,
    count: int,
    polls: int,
) -> Snapshot:
    calls, usec = command_stats(conn)
    return Snapshot(
        seconds=seconds,
        count=count,
        polls=polls,
        commands=calls,
        command_usec=usec,
        redis_cpu=redis_cpu_seconds(conn),
        worker_cpu=worker_cpu_seconds(procs),
    )


def _wait_for_count(
    conn: redis_py.Redis,
    procs: list[subprocess.Popen[bytes]],
    *,
    jobs: int,
    started: float,
    deadline: float,
    log_path: Path,
) -> tuple[float, list[Snapshot]]:
    """Poll the counter until it reads ``jobs``; return when it first read > 0 and the
    snapshots taken when it first reached 10%, 90% and 100% of ``jobs`` (one snapshot
    stands for several marks passed at the same poll)."""
    thresholds = [math.ceil(STEADY_FROM * jobs), math.ceil(STEADY_TO * jobs), jobs]
    marks: list[Snapshot] = []
    first_job: float | None = None
    polls = 0
    while True:
        count = int(conn.get(COUNTER_KEY) or 0)
        polls += 1
        elapsed = time.perf_counter() - started
        if count and first_job is None:
            first_job = elapsed
        passed = sum(1 for mark in thresholds[len(marks) :] if count >= mark)
        if passed:
            snap = _snapshot(conn, procs, seconds=elapsed, count=count, polls=polls)
            marks.extend([snap] * passed)
        if count >= jobs:
            return first_job or elapsed, marks
        if elapsed > deadline:
            raise RunFailed(f"deadline: {count}/{jobs} jobs after {deadline:.0f} s")
        dead = exited(procs)
        if dead is not None:
            raise RunFailed(f"worker exited with {dead.returncode}: {_tail(log_path)}")
        time.sleep(POLL_SECONDS)


def _tail(path: Path) -> str:
    return path.read_bytes()[-LOG_TAIL:].decode(errors="replace")
