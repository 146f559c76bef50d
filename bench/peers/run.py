"""Benchmark limitd against its peers (Celery, RQ, Dramatiq, arq, huey, saq, Ruby
Sidekiq) on one private redis-server: enqueue N no-op jobs, then time the workers
draining them, alternating the systems run after run because the machine is noisy.

    .venv/bin/python bench/peers/run.py [--jobs 20000] [--runs 3] [--systems a,b] [--quick]

Each job increments a Redis counter; a drain is timed from starting the system's worker
processes (start-up included, as for an operator) until the counter reads N, and the
counter must then be exactly N. The steady drain is the part between 10% and 90% of the
jobs, over which the workers' CPU, redis-server's CPU and the Redis commands are also
taken per job. Each system has its own database on the server, flushed
before and after each run. Writes RESULTS.md and drain.png beside this file (--quick
prints only, unless --out is given). The peers live in bench/peers/.venv, created from
requirements.txt on first use.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import machine
import redis as redis_py
import report
from measure import RunFailed, drain, enqueue_seconds
from peers_venv import ensure_peers_venv
from report import Baseline, Outcome
from systems import all_systems
from systems.base import PEERS_BIN, PEERS_DIR, Context, System

from limitd.connection.embedded import RedisServer

# The benches' shared helpers (bench/_common.py), beside this folder.
sys.path.append(str(Path(__file__).resolve().parent.parent))

from _common import cpu_ticks, machine_load

DATABASES = 32  # 0 for the baseline, then one per system


class BenchRedis(RedisServer):
    """limitd's private redis-server (no persistence), with room for more databases."""

    def command(self) -> list[str]:
        return [*super().command(), "--databases", str(DATABASES)]


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--jobs", type=int, default=20_000, help="jobs per run (20000)")
    parser.add_argument("--runs", type=int, default=3, help="runs per system (3)")
    parser.add_argument("--systems", help="comma-separated subset, e.g. limitd-1,celery-prefork")
    parser.add_argument("--quick", action="store_true", help="smoke run: 500 jobs, 1 run")
    parser.add_argument("--deadline", type=float, help="seconds per enqueue or drain (120)")
    parser.add_argument("--ceiling-calls", type=int, help="EVALSHA calls per ceiling (200000)")
    parser.add_argument("--out", type=Path, help="where RESULTS.md and drain.png go")
    args = parser.parse_args()
    if args.quick:
        args.jobs, args.runs = 500, 1
    args.deadline = args.deadline or (60.0 if args.quick else 120.0)
    args.ceiling_calls = args.ceiling_calls or (20_000 if args.quick else 200_000)
    if args.out is None and not args.quick:
        args.out = PEERS_DIR
    return args


def select(names: str | None) -> tuple[list[System], list[str]]:
    """The systems asked for (all by default) that can run here, and a line for each
    one that cannot (printed, and kept for RESULTS.md)."""
    known = all_systems()
    wanted = [n.strip() for n in names.split(",")] if names else [s.name for s in known]
    unknown = sorted(set(wanted) - {s.name for s in known})
    if unknown:
        raise SystemExit(f"unknown systems {unknown}; known: {[s.name for s in known]}")
    chosen, skipped = [], []
    for system in (s for s in known if s.name in wanted):
        reason = system.missing()
        if reason:
            skipped.append(f"SKIPPED {system.name}: {reason}")
            print(skipped[-1], flush=True)
        else:
            chosen.append(system)
    return chosen, skipped


def url_for(server: RedisServer, db: int) -> str:
    return f"redis://127.0.0.1:{server.port}/{db}"


def _ceiling_script(python: Path | str, server: RedisServer, *options: str) -> dict:
    out = subprocess.run(
        [str(python), str(PEERS_DIR / "ceiling.py"), url_for(server, 0), *options],
        capture_output=True,
        text=True,
        check=True,
        timeout=600,
    )
    return json.loads(out.stdout)


def measure_baseline(server: RedisServer, calls: int) -> Baseline:
    """The Lua-call ceiling (from the peers' venv), and one INCR round trip through each
    venv's client, on database 0."""
    ceiling = _ceiling_script(PEERS_BIN / "python", server, "--calls", str(calls))
    incr_us = {}
    clients = (
        ("project venv", sys.executable, ()),
        ("project venv", sys.executable, ("--pinned",)),
        ("peers' venv", PEERS_BIN / "python", ()),
    )
    for venv, python, pinned in clients:
        timed = _ceiling_script(python, server, "--calls", str(calls), "--incr-only", *pinned)
        incr_us[f"{venv} ({timed['client']})"] = timed["incr_us"]
    return Baseline(ceiling, incr_us)


def one_run(outcome: Outcome, server: RedisServer, db: int, tmp: Path, deadline: float) -> str:
    """Enqueue and drain once on a flushed database; record the figures; return a line."""
    jobs = outcome.jobs
    ctx = Context(url=url_for(server, db), tmp=tmp)
    conn = redis_py.Redis.from_url(ctx.url)
    try:
        conn.flushdb()
        seconds = enqueue_seconds(outcome.system, ctx, jobs, deadline)
        measured = drain(outcome.system, ctx, conn, jobs, deadline)
    finally:
        conn.flushdb()
        conn.close()
    whole, steady = measured.whole, measured.steady
    outcome.enqueue.append(jobs / seconds)
    outcome.drain.append(whole.rate)
    outcome.first_job.append(measured.first_job)
    outcome.commands_whole.append(whole.commands_per_job)
    line = (
        f"{jobs:>6,} jobs: enqueue {jobs / seconds:>7,.0f}/s, whole drain {whole.rate:>6,.0f}/s "
        f"({whole.seconds:.2f} s, first job {measured.first_job:.2f} s, worker CPU "
        f"{whole.worker_cpu_us_per_job:.0f} us/job, {whole.commands_per_job:.1f} cmds/job)"
    )
    if steady is None:
        return line + "; steady: - (10% and 90% seen at the same poll)"
    outcome.steady.append(steady.rate)
    outcome.commands.append(steady.commands_per_job)
    outcome.lua.append(steady.lua_per_job)
    outcome.redis_cpu.append(steady.redis_cpu_us_per_job)
    outcome.worker_cpu.append(steady.worker_cpu_us_per_job)
    return line + (
        f"; steady {steady.rate:>6,.0f}/s: worker CPU {steady.worker_cpu_us_per_job:.0f} "
        f"us/job, Redis CPU {steady.redis_cpu_us_per_job:.0f} us/job, "
        f"{steady.commands_per_job:.1f} cmds/job ({steady.lua_per_job:.2f} Lua)"
    )


def run_all(systems: list[System], server: RedisServer, args: argparse.Namespace) -> list[Outcome]:
    """Runs in alternation (A B C A B C ...); a system that fails once is dropped."""
    outcomes = [Outcome(system, system.jobs_per_run(args.jobs)) for system in systems]
    with tempfile.TemporaryDirectory(prefix="limitd-peers-") as tmp:
        for run in range(1, args.runs + 1):
            for db, outcome in enumerate(outcomes, start=1):
                if outcome.error:
                    continue
                label = f"run {run}/{args.runs} {outcome.system.name:<15}"
                try:
                    before = cpu_ticks()
                    line = one_run(outcome, server, db, Path(tmp), args.deadline)
                    print(f"{label} {line}; {machine_load(before)}", flush=True)
                except RunFailed as exc:
                    outcome.error = f"run {run}: {exc}"
                    print(f"{label} ERROR {exc} (skipped from now on)", flush=True)
    return outcomes


def draw_chart(outcomes: list[Outcome], png: Path) -> None:
    """drain.png, drawn in the peers' venv (matplotlib lives there)."""
    runs = len(max((o.steady for o in outcomes), key=len, default=[]))
    title = (
        f"steady drain (10%-90% of the jobs) of no-op jobs, median of {runs} runs; "
        f"{machine.cpu_model()}, {os.cpu_count()} cores"
    )
    with tempfile.NamedTemporaryFile("w", suffix=".json", delete=False) as data:
        json.dump(report.chart_data(outcomes, title), data)
    try:
        chart = [str(PEERS_DIR / "chart.py"), data.name, str(png)]
        subprocess.run([str(PEERS_BIN / "python"), *chart], check=True)
    finally:
        os.unlink(data.name)


def main() -> None:
    args = parse_args()
    ensure_peers_venv()
    systems, skipped = select(args.systems)
    started = time.monotonic()
    server = BenchRedis()
    server.start()
    try:
        with redis_py.Redis.from_url(url_for(server, 0)) as conn:
            lines = machine.describe(
                conn, systems, jobs=args.jobs, runs=args.runs, deadline=args.deadline
            )
        print("\n".join(lines), flush=True)
        baseline = measure_baseline(server, args.ceiling_calls)
        print("\n".join(report.baseline_section(baseline)[4:]), flush=True)
        outcomes = run_all(systems, server, args)
    finally:
        server.stop()
    print(report.results_table(outcomes, baseline.ceiling.get("pipelined_1_client")))
    print(f"total {time.monotonic() - started:.0f} s")
    if args.out:
        args.out.mkdir(parents=True, exist_ok=True)
        (args.out / "RESULTS.md").write_text(report.markdown(lines, outcomes, baseline, skipped))
        draw_chart(outcomes, args.out / "drain.png")
        print(f"wrote {args.out / 'RESULTS.md'} and {args.out / 'drain.png'}")
    sys.exit(1 if any(o.error for o in outcomes) else 0)


if __name__ == "__main__":
    main()
