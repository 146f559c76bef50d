"""Benchmark limitd against its peers (Celery, RQ, Dramatiq, arq, huey, saq, Ruby
Sidekiq) on one private redis-server: enqueue N no-op jobs, then time the workers
draining them, alternating the systems run after run because the machine is noisy.

    .venv/bin/python bench/peers/run.py [--jobs 20000] [--runs 3] [--systems a,b] [--quick]
        [--compare OTHER_CHECKOUT] [--out DIR]

Each job increments a Redis counter; a drain is timed from starting the system's worker
processes (start-up included, as for an operator) until the counter reads N, and the
counter must then be exactly N. The steady drain is the part between 10% and 90% of the
jobs, over which the workers' CPU, redis-server's CPU and the Redis commands are also
taken per job. Each system has its own database on the server, flushed
before and after each run. Writes RESULTS.md and drain.png beside this file (--quick
prints only, unless --out is given). The peers live in bench/peers/.venv, created from
requirements.txt on first use.

``--compare DIR`` measures a change to limitd against another checkout of it (a ``git
worktree add DIR <commit>`` of an older commit, say; its package is ``DIR/limitd``): each
limitd system selected also runs as a twin named ``NAME@other``, the same in every way
but that its enqueue and worker processes import limitd from DIR (put first on their
PYTHONPATH; checked once at start, and shown on the twin's settings line). A twin runs
right after its original in every round, and which of the two goes first swaps round by
round, so both see the same machine. After the table come, for each pair, the ratio this
/ other of the steady drain and of the worker CPU per job by round, and their medians
(also in RESULTS.md, where the twins are extra rows). The other systems run once a round.
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
from measure import RunFailed, drain, enqueue_seconds, system_env
from peers_venv import ensure_peers_venv
from report import Baseline, Outcome
from systems import all_systems
from systems.base import APPS_DIR, PEERS_BIN, PEERS_DIR, Context, System
from systems.limitd_system import OTHER, twin

from limitd.connection.embedded import RedisServer

# The benches' shared helpers (bench/_common.py), beside this folder.
sys.path.append(str(Path(__file__).resolve().parent.parent))

from _common import cpu_ticks, draw_bars, machine_load

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
    parser.add_argument(
        "--compare",
        type=Path,
        metavar="DIR",
        help=f"another limitd checkout's root: each limitd system also runs as NAME{OTHER}, "
        "importing limitd from DIR/limitd, right after its original (the two swap order "
        "each round); prints this / other per round and the median",
    )
    args = parser.parse_args()
    if args.quick:
        args.jobs, args.runs = 500, 1
    args.deadline = args.deadline or (60.0 if args.quick else 120.0)
    args.ceiling_calls = args.ceiling_calls or (20_000 if args.quick else 200_000)
    if args.out is None and not args.quick:
        args.out = PEERS_DIR
    if args.compare is not None:
        args.compare = args.compare.resolve()
        package = args.compare / "limitd" / "__init__.py"
        if not package.is_file():
            parser.error(f"--compare {args.compare}: no limitd package there ({package} not found)")
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


def limitd_origin(system: System) -> Path:
    """Where ``system``'s processes import limitd from: its interpreter, with the
    environment and directory its workers get, imports ``limitd.cli`` as the ``limitd``
    script does and prints ``limitd.__file__``."""
    code = "import limitd.cli, limitd; print(limitd.__file__)"
    done = subprocess.run(
        [str(system.python), "-c", code],
        cwd=APPS_DIR,
        env=system_env("redis://127.0.0.1:1/0", system.pythonpath),  # never dialled
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    if done.returncode != 0:
        raise SystemExit(f"{system.name}: importing limitd failed: {done.stderr[-1500:]}")
    return Path(done.stdout.strip().splitlines()[-1]).resolve()


def with_twins(systems: list[System], root: Path) -> list[System]:
    """Each limitd system followed by its twin importing limitd from ``root``; the twins'
    import is checked to come from there."""
    expected = root / "limitd" / "__init__.py"
    chosen: list[System] = []
    for system in systems:
        chosen.append(system)
        if system.name.startswith("limitd"):
            other = twin(system, root, str(expected))
            origin = limitd_origin(other)
            if origin != expected:
                raise SystemExit(f"{other.name} imports limitd from {origin}, not {expected}")
            chosen.append(other)
    return chosen


def pairs_of(outcomes: list[Outcome]) -> list[tuple[Outcome, Outcome]]:
    """Each limitd system's outcome with its twin's (--compare)."""
    named = {o.system.name: o for o in outcomes}
    return [(o, named[o.system.name + OTHER]) for o in outcomes if o.system.name + OTHER in named]


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


def one_run(
    outcome: Outcome, server: RedisServer, db: int, tmp: Path, deadline: float, *, run: int
) -> str:
    """Enqueue and drain once (run number ``run``) on a flushed database; record the
    figures; return a line."""
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
    outcome.rounds.append(run)
    return line + (
        f"; steady {steady.rate:>6,.0f}/s: worker CPU {steady.worker_cpu_us_per_job:.0f} "
        f"us/job, Redis CPU {steady.redis_cpu_us_per_job:.0f} us/job, "
        f"{steady.commands_per_job:.1f} cmds/job ({steady.lua_per_job:.2f} Lua)"
    )


def run_order(outcomes: list[Outcome], run: int) -> list[Outcome]:
    """This run's order: the systems' order, each --compare twin right after its
    original in odd runs and right before it in even ones."""
    order: list[Outcome] = []
    for this, other in zip(outcomes, [*outcomes[1:], None], strict=True):
        if this.system.name.endswith(OTHER):
            continue
        if other is not None and other.system.name == this.system.name + OTHER:
            order.extend([this, other] if run % 2 else [other, this])
        else:
            order.append(this)
    return order


def run_all(systems: list[System], server: RedisServer, args: argparse.Namespace) -> list[Outcome]:
    """Runs in alternation (A B C A B C ...); a system that fails once is dropped."""
    outcomes = [Outcome(system, system.jobs_per_run(args.jobs)) for system in systems]
    if len(outcomes) >= DATABASES:
        raise SystemExit(f"{len(outcomes)} systems, but only {DATABASES - 1} databases")
    dbs = {id(outcome): db for db, outcome in enumerate(outcomes, start=1)}
    width = max((len(s.name) for s in systems), default=0)
    with tempfile.TemporaryDirectory(prefix="limitd-peers-") as tmp:
        for run in range(1, args.runs + 1):
            for outcome in run_order(outcomes, run):
                if outcome.error:
                    continue
                label = f"run {run}/{args.runs} {outcome.system.name:<{max(width, 15)}}"
                try:
                    before = cpu_ticks()
                    db = dbs[id(outcome)]
                    line = one_run(outcome, server, db, Path(tmp), args.deadline, run=run)
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
    draw_bars(report.chart_data(outcomes, title), png)


def main() -> None:
    args = parse_args()
    ensure_peers_venv()
    systems, skipped = select(args.systems)
    if args.compare is not None:
        systems = with_twins(systems, args.compare)
    started = time.monotonic()
    server = BenchRedis()
    server.start()
    try:
        with redis_py.Redis.from_url(url_for(server, 0)) as conn:
            lines = machine.describe(
                conn, systems, jobs=args.jobs, runs=args.runs, deadline=args.deadline
            )
        if args.compare is not None:
            lines.append(
                f"- Compared with: the limitd package of {args.compare} (the `{OTHER}` rows), "
                "each twin run next to its original, the two swapping order every run"
            )
        print("\n".join(lines), flush=True)
        baseline = measure_baseline(server, args.ceiling_calls)
        print("\n".join(report.baseline_section(baseline)[4:]), flush=True)
        outcomes = run_all(systems, server, args)
    finally:
        server.stop()
    print(report.results_table(outcomes, baseline.ceiling.get("pipelined_1_client")))
    peers = report.peer_lines(outcomes)
    print("\n".join(peers))
    compared = report.compare_lines(pairs_of(outcomes))
    if compared:
        print("\n".join(compared))
    print(f"total {time.monotonic() - started:.0f} s")
    if args.out:
        args.out.mkdir(parents=True, exist_ok=True)
        text = report.markdown(lines, outcomes, baseline, skipped, compared, peers=peers)
        (args.out / "RESULTS.md").write_text(text)
        draw_chart(outcomes, args.out / "drain.png")
        print(f"wrote {args.out / 'RESULTS.md'} and {args.out / 'drain.png'}")
    sys.exit(1 if any(o.error for o in outcomes) else 0)


if __name__ == "__main__":
    main()
