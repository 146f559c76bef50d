"""One run of one system: enqueue N jobs (a subprocess in the system's interpreter that
times itself), then start its workers and time the drain by polling the job counter."""

from __future__ import annotations

import json
import os
import subprocess
import time
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

import redis as redis_py
from procs import exited, start_group, stop_groups
from systems.base import APPS_DIR, Context, System

COUNTER_KEY = "bench:done"  # the key apps/bench_counter.py and sidekiq_app.rb increment
POLL_SECONDS = 0.01  # the counter's sampling period: the resolution of the drain figure
LOG_TAIL = 1500


class RunFailed(Exception):
    """This system cannot finish a run (crash, deadline, wrong count): skip it."""


@dataclass(frozen=True)
class Drain:
    seconds: float  # from starting the workers until the counter read N
    first_job: float  # from starting the workers until the counter first read > 0
    polls: int = 0  # GETs of the counter this driver sent meanwhile


@dataclass(frozen=True)
class DrainResult:
    drain: Drain
    commands_per_job: float  # Redis commands served per job (inside Lua included)
    lua_per_job: float  # EVAL/EVALSHA/FCALL calls per job
    redis_cpu_us_per_job: float  # redis-server CPU time (user + sys) per job


LUA_COMMANDS = ("eval", "evalsha", "eval_ro", "evalsha_ro", "fcall", "fcall_ro")


def redis_cpu_seconds(conn: redis_py.Redis) -> float:
    """CPU the server used so far: its share of the 2 cores the workers also need."""
    cpu = conn.info("cpu")
    return float(cpu["used_cpu_user"]) + float(cpu["used_cpu_sys"])


def command_counts(conn: redis_py.Redis) -> Counter[str]:
    """Calls served so far per command (INFO commandstats; the INFO calls left out).
    The server runs one system at a time, so a difference is that system's work."""
    return Counter(
        {
            name.removeprefix("cmdstat_"): int(stats["calls"])
            for name, stats in conn.info("commandstats").items()
            if name != "cmdstat_info"
        }
    )


def system_env(url: str) -> dict[str, str]:
    """Every process of a system sees its Redis under the names each library reads."""
    env = dict(os.environ)
    env.update(BENCH_REDIS_URL=url, LIMITD_REDIS_URL=url, REDIS_URL=url)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(APPS_DIR), env.get("PYTHONPATH")]))
    env.pop("VIRTUAL_ENV", None)
    return env


def enqueue_seconds(system: System, ctx: Context, jobs: int, deadline: float) -> float:
    """Run the system's enqueue command and return the seconds it reported."""
    try:
        done = subprocess.run(
            system.enqueue_argv(ctx, jobs),
            cwd=APPS_DIR,
            env=system_env(ctx.url),
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


def drain(
    system: System, ctx: Context, conn: redis_py.Redis, jobs: int, deadline: float
) -> DrainResult:
    """Start the workers, wait until the counter reads ``jobs``, stop them (whole process
    groups), then check the counter is exactly ``jobs``: no job lost or run twice. Also
    counts the Redis commands the system sent meanwhile (start-up and stop included)."""
    log_path = ctx.tmp / f"{system.name}.log"
    env = system_env(ctx.url)
    with log_path.open("wb") as log:
        commands = system.workers(ctx)
        before, cpu_before = command_counts(conn), redis_cpu_seconds(conn)
        started = time.perf_counter()
        procs = [start_group(cmd, cwd=APPS_DIR, env=env, log=log) for cmd in commands]
        try:
            result = _wait_for_count(
                conn, procs, jobs=jobs, started=started, deadline=deadline, log_path=log_path
            )
        finally:
            stop_groups(procs)
    final = int(conn.get(COUNTER_KEY) or 0)
    if final != jobs:
        raise RunFailed(f"counter is {final} after the drain, expected exactly {jobs}")
    cpu = redis_cpu_seconds(conn) - cpu_before
    served = command_counts(conn) - before
    served["get"] -= result.polls + 1  # the driver's own reads of the counter
    lua = sum(served[name] for name in LUA_COMMANDS)
    return DrainResult(result, sum(served.values()) / jobs, lua / jobs, 1e6 * cpu / jobs)


def _wait_for_count(
    conn: redis_py.Redis,
    procs: list[subprocess.Popen[bytes]],
    *,
    jobs: int,
    started: float,
    deadline: float,
    log_path: Path,
) -> Drain:
    first_job: float | None = None
    polls = 0
    while True:
        count = int(conn.get(COUNTER_KEY) or 0)
        polls += 1
        elapsed = time.perf_counter() - started
        if count and first_job is None:
            first_job = elapsed
        if count >= jobs:
            return Drain(elapsed, first_job or elapsed, polls)
        if elapsed > deadline:
            raise RunFailed(f"deadline: {count}/{jobs} jobs after {deadline:.0f} s")
        dead = exited(procs)
        if dead is not None:
            raise RunFailed(f"worker exited with {dead.returncode}: {_tail(log_path)}")
        time.sleep(POLL_SECONDS)


def _tail(path: Path) -> str:
    return path.read_bytes()[-LOG_TAIL:].decode(errors="replace")
