"""How the limit fetch's cost grows with the number of queues a capsule lists (issue 32).

    .venv/bin/python bench/fetch_scale.py [--queues 1,10,100,1000,10000] [--jobs 20000]
        [--processes 2] [--threads 10] [--rounds 3] [--order strict|random]
        [--index on|off|both] [--sidekiq] [--chart OUT.png]
        [--max-seconds 60] [--idle-seconds 5] [--idle-warmup 1] [--deadline 300]
        [--redis URL]

For each queue count N, ``limitd start`` (the project venv's: P capsule processes x T
threads, ``fetch: limit``, logging at WARNING) runs on a generated YAML config that lists
N queues (``bench_scale_00000``, ...; no weights, so Sidekiq's strict order, unless
``--order random`` gives each a weight of 1) and sets ``limits:`` to 1,000 on every one
of them: above P x T, so every limit is checked and none binds. ``--index`` runs the
fetch with its ready index (``ready_index: true``, the default: it looks only at queues
that may have work), without it (``ready_index: false``: every listed queue on every
call, as before issue 32), or both, alternated within each round (the default).
``--sidekiq`` adds Ruby Sidekiq 6.4 (Debian's ruby-sidekiq; P processes of concurrency
T, ``-q`` for every queue, in the listed order: its fetch BRPOPs every queue each time)
draining the same jobs, pushed by limitd's client under the class ``NoopJob`` of
bench/peers/apps/sidekiq_app.rb (the same INCR), alternated with limitd's rows.

1. Drain: the jobs are enqueued first, spread evenly (round robin) over the N queues
   with ``perform_bulk`` (``noop.set(queue=...)``, 1,000 per LPUSH): the peers' job,
   one Redis INCR (bench/peers/apps/limitd_app.py). The drain is timed by
   bench/peers/measure.py: the job counter is read every 10 ms and the figures are
   taken over the steady window, 10% to 90% of the jobs (start-up and tail left out):
   jobs/s, redis-server CPU per job (INFO cpu, user + sys; the table also gives it as a
   multiple of the first queue count's), the CPU of every process
   of the ``limitd start`` session per job, and Redis commands per job (those run inside
   the Lua fetch included), with the Lua calls (fetch calls) per job.
2. Idle: the same config started again with every queue empty; once every capsule has
   subscribed to the wake-up channel and --idle-warmup seconds passed, the Redis
   commands served over --idle-seconds (inside Lua included) per capsule per second,
   the Lua calls among them (idle polls, one per capsule every 0.4-0.5 s), and
   redis-server's CPU per capsule. The process record's refresh (every 5 s) falls in
   the window; the heavier heartbeat runs at start and then every 15 s, so a window
   that ends less than 15 s after the start (the default one) leaves it out. It checks
   that the configured limits are still in Redis (a few keys; it rewrites them only
   after Redis lost them). With the index, each idle poll also sweeps index_sweep (50)
   queues a second since the last sweep for pushes that publish no wake-up, in one
   EXISTS of all their keys while they are empty: one command a poll, whatever the
   queue count.

Queue counts are alternated within each round (1, 10, 100, ..., 1, 10, 100, ...)
because the machine is noisy; with --rounds > 1 the table gives medians (min-max for the
rate). Time cap: a queue count whose drain took longer than --max-seconds (many queues
drain slowly) is not drained again in later rounds, so its row has fewer drains (the
table says how many); its idle load is still measured every round. (On the 2-core
machine on 2026-11-28 a drain at 10,000 queues took 86 s, so the default run drains it
once and takes about 4.5 minutes in all.) A drain that does
not finish within --deadline seconds is reported as failed and the run goes on. Each
drain and idle run prints the machine's CPU steal and load average over it.

Without --redis it starts a private redis-server, so the command counts and Redis CPU
are limitd's alone. With --redis the benchmark deletes and rewrites the keys of its
queues (``bench_scale_*``) and the ``bench:done`` counter, and other clients of that
server count in its figures.
"""

from __future__ import annotations

import argparse
import math
import os
import statistics
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import redis as redis_py
from _common import (
    MachineLoad,
    bench_redis_url,
    command_counts,
    cpu_ticks,
    draw_bars,
    machine_load,
    redis_cpu_seconds,
)

import limitd
from limitd import keys

# The `limitd start` driver of the peer benchmark and its job module, imported from
# their directories as bench/peers/run.py and bench/limit_fetch.py do.
PEERS_DIR = Path(__file__).resolve().parent / "peers"
sys.path[:0] = [str(PEERS_DIR), str(PEERS_DIR / "apps")]

import limitd_app  # noqa: E402
import machine  # noqa: E402
import measure  # noqa: E402
import procs  # noqa: E402
from systems import limitd_system, sidekiq_system  # noqa: E402
from systems.base import APPS_DIR, PROJECT_BIN, Context, System, project_python  # noqa: E402

PREFIX = "bench_scale_"
# The peers' never-binding limit: above any processes x threads used here.
UNBINDING_LIMIT = limitd_system.LIMIT
BULK = limitd_system.BULK
ORDERS = ("strict", "random")
FETCH_LABELS = {"index": "ready index", "scan": "scan every queue", "sidekiq": "Ruby Sidekiq"}
CHART_NAMES = {"index": "limitd", "scan": "scan", "sidekiq": "sidekiq"}
READY_TIMEOUT = 60.0  # seconds for `limitd start` to subscribe, at 10,000 queues too
LUA = measure.LUA_COMMANDS


def plural(count: int) -> str:
    return f"{count:,} queue{'s' if count != 1 else ''}"


def queue_names(count: int) -> list[str]:
    return [f"{PREFIX}{i:05d}" for i in range(count)]


# The config and the system: the peers' limitd config, with N queues and N limits.


def config_text(url: str, names: list[str], args: argparse.Namespace, index: bool) -> str:
    """The peers' ``limitd start`` config (limitd_system.CONFIG) listing ``names``, in
    the strict order or each with a weight of 1 (random order), each with the limit;
    ``index``: the fetch uses its ready index (else it checks every queue each call)."""
    listed = names if args.order == "strict" else [f"[{name}, 1]" for name in names]
    text = limitd_system.CONFIG.format(
        url=url,
        app="limitd_app",
        queue=", ".join(listed),
        threads=args.threads,
        processes=args.processes,
        fetch="limit",
    )
    limits = ", ".join(f"{name}: {UNBINDING_LIMIT}" for name in names)
    return text + f"limits: {{{limits}}}\nready_index: {str(index).lower()}\n"


def scale_system(count: int, args: argparse.Namespace, fetch: str) -> System:
    """The system a row drains: limitd with or without its ready index, or Sidekiq."""
    if fetch == "sidekiq":
        return sidekiq_scale_system(count, args)
    return limitd_scale_system(count, args, index=fetch == "index")


def limitd_scale_system(count: int, args: argparse.Namespace, *, index: bool) -> System:
    names = queue_names(count)

    def commands(ctx: Context) -> list[list[str]]:
        config = ctx.tmp / f"fetch-scale-{count}-{'index' if index else 'scan'}.yml"
        config.write_text(config_text(ctx.url, names, args, index))
        return [[str(PROJECT_BIN / "limitd"), "start", str(config)]]

    return System(
        name=f"limitd-limit-{count}-queues-{'index' if index else 'scan'}",
        settings=(
            f"limitd start, {args.processes} x {args.threads} threads, fetch: limit, "
            f"{count} queues ({args.order}), limit {UNBINDING_LIMIT} on each, "
            f"ready_index: {str(index).lower()}"
        ),
        enqueue_api=f"perform_bulk per queue, {BULK} per LPUSH",
        workers=commands,
        app="limitd_app",
        python=project_python(),
        missing=limitd_system.missing,
    )


def sidekiq_scale_system(count: int, args: argparse.Namespace) -> System:
    """Ruby Sidekiq's workers (bench/peers/systems/sidekiq_system.py) listing the N
    queues in order, each one ``-q``: Sidekiq's strict order."""
    queues = [part for name in queue_names(count) for part in ("-q", name)]

    def commands(ctx: Context) -> list[list[str]]:
        command = ["sidekiq", "-r", str(APPS_DIR / "sidekiq_app.rb"), "-e", "production"]
        return [[*command, "-c", str(args.threads), *queues]] * args.processes

    return System(
        name=f"sidekiq-{count}-queues",
        settings=(
            f"Ruby Sidekiq {sidekiq_system.version()}, {args.processes} x concurrency "
            f"{args.threads}, {count} queues (strict)"
        ),
        enqueue_api=f"limitd perform_bulk of NoopJob per queue, {BULK} per LPUSH",
        workers=commands,
        missing=sidekiq_system.missing,
    )


# Sidekiq's job, as limitd's client pushes it: Ruby runs NoopJob#perform (the same INCR).
@limitd.job(name="NoopJob")
def sidekiq_noop(i: int) -> None:
    raise RuntimeError("run by Ruby Sidekiq, not by limitd")


def reset(conn: redis_py.Redis, names: list[str]) -> None:
    """Empty the queues and forget their limits, pause and busy counts (a shared --redis
    may hold values from an earlier run; each capsule writes its limits back), and the
    job counter."""
    k = keys.of(conn)
    pipe = conn.pipeline(transaction=False)
    pipe.delete(*(k.queue(name) for name in names), measure.COUNTER_KEY)
    for hash_key in (k.LIMITS, k.PROCESS_LIMITS, k.BUSY):
        pipe.hdel(hash_key, *names)
    pipe.srem(k.PAUSED, *names)
    pipe.srem(k.QUEUES, *names)
    pipe.execute()


def enqueue(names: list[str], jobs: int, job: Any = limitd_app.noop) -> None:
    """``jobs`` INCR jobs of ``job``, job i on queue i mod N: the same number on every
    queue (one more on the first ``jobs mod N``)."""
    args_of: list[list[list[int]]] = [[] for _ in names]
    for i in range(jobs):
        args_of[i % len(names)].append([i])
    for name, args_list in zip(names, args_of, strict=True):
        if args_list:
            job.set(queue=name).perform_bulk(args_list, batch_size=BULK)


# One drain and one idle run.


@dataclass(frozen=True)
class DrainRun:
    jobs: int
    drain: measure.Drain
    machine: MachineLoad

    @property
    def window(self) -> measure.Window:
        """The steady window; the whole drain if it was too short to have one."""
        return self.drain.steady or self.drain.whole


@dataclass(frozen=True)
class IdleRun:
    seconds: float
    capsules: int
    commands: Counter[str]
    redis_cpu: float  # seconds
    machine: MachineLoad

    @property
    def commands_per_second(self) -> float:
        """Per capsule, commands run inside Lua included."""
        return sum(self.commands.values()) / self.seconds / self.capsules

    @property
    def lua_per_second(self) -> float:
        """Per capsule: the idle fetch calls (polls)."""
        return sum(self.commands[name] for name in LUA) / self.seconds / self.capsules

    @property
    def redis_cpu_share(self) -> float:
        """redis-server CPU per capsule, as a share of one core."""
        return self.redis_cpu / self.seconds / self.capsules


def drain_once(conn: redis_py.Redis, ctx: Context, row: Row, args: argparse.Namespace) -> DrainRun:
    count, jobs = row.count, args.jobs
    names = queue_names(count)
    reset(conn, queue_names(max(args.queues)))
    enqueue(names, jobs, sidekiq_noop if row.fetch == "sidekiq" else limitd_app.noop)
    before = cpu_ticks()
    drained = measure.drain(scale_system(count, args, row.fetch), ctx, conn, jobs, args.deadline)
    return DrainRun(jobs, drained, machine_load(before))


def wait_until(condition: Callable[[], bool], what: str, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise measure.RunFailed(f"gave up waiting for {what} after {timeout:.0f} s")
        time.sleep(0.05)


def ready(conn: redis_py.Redis, fetch: str) -> int:
    """Workers ready for work: capsules listening for wake-ups, or Sidekiq processes
    that registered (its ``processes`` set; no capsule of limitd runs then)."""
    if fetch == "sidekiq":
        return int(conn.scard("processes"))
    return subscribers(conn)


def subscribers(conn: redis_py.Redis) -> int:
    """Connections listening for wake-ups: one per capsule once it can take pushes."""
    counts = dict(conn.pubsub_numsub(keys.WAKE_CHANNEL))
    return int(counts.get(keys.WAKE_CHANNEL.encode(), 0))


def idle_once(conn: redis_py.Redis, ctx: Context, row: Row, args: argparse.Namespace) -> IdleRun:
    """``limitd start`` on the same config with every queue empty: what it asks of Redis
    per second, once started (process groups as measure.drain starts them)."""
    reset(conn, queue_names(max(args.queues)))
    if row.fetch == "sidekiq":
        conn.delete("processes")  # left by earlier systems: ready() counts Sidekiq's own
    system = scale_system(row.count, args, row.fetch)
    log_path = ctx.tmp / f"{system.name}-idle.log"
    with log_path.open("wb") as log:
        started = [
            procs.start_group(cmd, cwd=APPS_DIR, env=measure.system_env(ctx.url), log=log)
            for cmd in system.workers(ctx)
        ]
        try:
            wait_until(
                lambda: ready(conn, row.fetch) >= args.processes,
                "the workers to be ready",
                READY_TIMEOUT,
            )
            time.sleep(args.idle_warmup)
            if procs.exited(started) is not None:
                raise measure.RunFailed(f"limitd start exited: {log_path.read_text()[-1500:]}")
            before_ticks, commands, cpu = cpu_ticks(), command_counts(conn), redis_cpu_seconds(conn)
            began = time.perf_counter()
            time.sleep(args.idle_seconds)
            served = command_counts(conn) - commands
            used = redis_cpu_seconds(conn) - cpu
            seconds = time.perf_counter() - began
            load = machine_load(before_ticks)
        finally:
            procs.stop_groups(started)
    return IdleRun(seconds, args.processes, served, used, load)


# Rounds: every queue count in each round.


@dataclass
class Row:
    count: int
    fetch: str  # "index" (ready_index on), "scan" (off) or "sidekiq"
    drains: list[DrainRun]
    idles: list[IdleRun]
    failed: str | None = None
    capped: bool = False  # drained in fewer rounds: a drain took over --max-seconds

    @property
    def label(self) -> str:
        return f"{plural(self.count)}, {self.fetch}"


def drain_line(number: int, label: str, run: DrainRun) -> str:
    w = run.window
    part = "steady" if run.drain.steady else "whole (no steady window)"
    busiest = ", ".join(f"{name} {n:.2f}" for name, n in w.busiest)
    costliest = ", ".join(f"{name} {us:.1f}" for name, us in w.costliest)
    return (
        f"round {number} {label:>20}: {run.jobs:,} jobs, {part} {w.rate:>7,.0f} jobs/s, "
        f"Redis CPU {w.redis_cpu_us_per_job:>5.0f} us/job, worker CPU "
        f"{w.worker_cpu_us_per_job:>5.0f} us/job, {w.commands_per_job:.1f} cmds/job "
        f"({w.lua_per_job:.2f} Lua; {busiest}); server time per job, us: {costliest}; "
        f"whole drain {run.drain.seconds:.1f} s, "
        f"first job after {run.drain.first_job:.2f} s; {run.machine}"
    )


def idle_line(number: int, label: str, run: IdleRun) -> str:
    busiest = ", ".join(
        f"{name} {n / run.seconds / run.capsules:,.1f}" for name, n in run.commands.most_common(3)
    )
    return (
        f"round {number} {label:>20} idle: {run.commands_per_second:,.1f} cmds/s per "
        f"capsule ({run.lua_per_second:.1f} Lua; {busiest}), Redis CPU "
        f"{run.redis_cpu_share:.1%} of a core per capsule; {run.machine}"
    )


def one_count(
    conn: redis_py.Redis, ctx: Context, row: Row, number: int, args: argparse.Namespace
) -> None:
    """Round ``number`` of one queue count: its drain (unless it failed or was capped
    before), then its idle load."""
    if row.failed is None and not row.capped:
        try:
            run = drain_once(conn, ctx, row, args)
        except measure.RunFailed as exc:
            row.failed = f"drain failed: {exc}"
            print(f"round {number} {row.label:>20}: {row.failed}", flush=True)
        else:
            row.drains.append(run)
            print(drain_line(number, row.label, run), flush=True)
            if run.drain.seconds > args.max_seconds and number < args.rounds:
                row.capped = True
                print(
                    f"  its drain took {run.drain.seconds:.0f} s > --max-seconds "
                    f"{args.max_seconds:g}: not drained again in later rounds",
                    flush=True,
                )
    try:
        idle = idle_once(conn, ctx, row, args)
    except measure.RunFailed as exc:
        print(f"round {number} {row.label:>20} idle: failed: {exc}", flush=True)
    else:
        row.idles.append(idle)
        print(idle_line(number, row.label, idle), flush=True)


def run_rounds(conn: redis_py.Redis, url: str, args: argparse.Namespace) -> list[Row]:
    reason = limitd_system.missing() or (
        sidekiq_system.missing() if "sidekiq" in args.fetches else None
    )
    if reason:
        raise SystemExit(reason)
    rows = [Row(count, fetch, [], []) for count in args.queues for fetch in args.fetches]
    with tempfile.TemporaryDirectory(prefix="limitd-fetch-scale-") as tmp:
        ctx = Context(url=url, tmp=Path(tmp))
        for number in range(1, args.rounds + 1):
            for row in rows:
                one_count(conn, ctx, row, number, args)
    reset(conn, queue_names(max(args.queues)))
    return rows


# The table.


def spread(values: list[float], fmt: str = ",.0f") -> str:
    """median (min-max) when there are several values."""
    mid = statistics.median(values)
    if len(values) == 1:
        return f"{mid:{fmt}}"
    return f"{mid:{fmt}} ({min(values):{fmt}}-{max(values):{fmt}})"


def median_rate(row: Row) -> float | None:
    return statistics.median(r.window.rate for r in row.drains) if row.drains else None


def median_redis_cpu(row: Row) -> float | None:
    """Redis CPU per job over the steady window, median of the row's drains."""
    if not row.drains:
        return None
    return statistics.median(r.window.redis_cpu_us_per_job for r in row.drains)


def drain_cells(row: Row, base: float | None, base_cpu: float | None) -> list[str]:
    if not row.drains:
        return ["-", "-", row.failed or "not run", "-", "-", "-", "-", "-"]
    windows = [r.window for r in row.drains]
    rate = statistics.median(w.rate for w in windows)
    cpu = median_redis_cpu(row) or 0.0
    drains = f"{len(windows)}" + (" (capped)" if row.capped else "")
    if row.failed:
        drains += " (then failed)"
    return [
        f"{row.drains[0].jobs:,}",
        drains,
        spread([w.rate for w in windows]),
        f"{rate / base:.2f}x" if base else "-",
        f"{cpu:,.1f}",
        f"{cpu / base_cpu:.2f}x" if base_cpu else "-",
        f"{statistics.median(w.worker_cpu_us_per_job for w in windows):,.0f}",
        f"{statistics.median(w.commands_per_job for w in windows):,.1f} "
        f"({statistics.median(w.lua_per_job for w in windows):.2f})",
    ]


def idle_cells(row: Row) -> list[str]:
    if not row.idles:
        return ["-", "-", "-"]
    return [
        spread([i.commands_per_second for i in row.idles], ",.1f"),
        f"{statistics.median(i.lua_per_second for i in row.idles):.1f}",
        f"{statistics.median(i.redis_cpu_share for i in row.idles):.2%}",
    ]


def report(rows: list[Row], args: argparse.Namespace) -> None:
    base_row = rows[0]
    base_rows = {row.fetch: row for row in reversed(rows) if row.count == base_row.count}
    bases = {fetch: median_rate(row) for fetch, row in base_rows.items()}
    base_cpus = {fetch: median_redis_cpu(row) for fetch, row in base_rows.items()}
    print(
        f"\nlimit fetch vs queue count: limitd start, {args.processes} processes x "
        f"{args.threads} threads, limit {UNBINDING_LIMIT} on every queue (never binds), "
        f"{args.order} order, jobs spread evenly over the queues, each one INCR; steady "
        f"window 10%-90% of the jobs; rounds: {args.rounds} (medians, min-max for the "
        f"rate); idle: {args.idle_seconds:g} s per round, with all queues empty\n"
    )
    header = [
        "queues",
        "fetch",
        "jobs",
        "drains",
        "steady jobs/s",
        f"vs {plural(base_row.count)} (same fetch)",
        "Redis CPU us/job",
        f"Redis CPU vs {plural(base_row.count)}",
        "worker CPU us/job",
        "Redis cmds/job (Lua)",
        "idle cmds/s per capsule",
        "idle polls/s per capsule",
        "idle Redis CPU per capsule",
    ]
    print("| " + " | ".join(header) + " |")
    print("|" + "|".join("---:" for _ in header) + "|")
    for row in rows:
        cells = [
            f"{row.count:,}",
            FETCH_LABELS[row.fetch],
            *drain_cells(row, bases.get(row.fetch), base_cpus.get(row.fetch)),
            *idle_cells(row),
        ]
        print("| " + " | ".join(cells) + " |")
    print(
        "\nPer job: over the steady drain, the job's own INCR included, the enqueue left "
        "out. Idle: commands run inside the Lua poll counted (scan: an LLEN per queue), "
        "Redis CPU as a share of one core; the heartbeat (at start, then every 15 s) is "
        "left out of an idle window that ends within 15 s of the start: with the index its "
        "sweep adds one EXISTS per idle poll (of up to 50 queues a second)."
    )
    if any(row.capped for row in rows):
        print(
            f"(capped): that queue count's drain took over --max-seconds "
            f"{args.max_seconds:g} s, so it was drained in round 1 only (time cap)."
        )


def draw_chart(rows: list[Row], png: Path, args: argparse.Namespace) -> None:
    """The steady drains as bars (median, min-max), one per queue count and fetch, drawn
    by the peers' chart script in their venv (matplotlib lives there): the ready index
    in limitd's colour, the scan in another."""
    bars = []
    for row in rows:
        if not row.drains:
            continue
        rates = [r.window.rate for r in row.drains]
        name = f"{CHART_NAMES[row.fetch]}: {plural(row.count)}"
        bars.append(
            {"name": name, "median": statistics.median(rates), "min": min(rates), "max": max(rates)}
        )
    explained = {
        "index": "limitd: the ready index",
        "scan": "scan: every queue at every fetch (ready_index: false)",
        "sidekiq": "sidekiq: Ruby Sidekiq 6.4, BRPOP over every queue",
    }
    title = (
        f"steady drain vs queues listed, {args.processes} x {args.threads} threads\n"
        + "; ".join(explained[fetch] for fetch in args.fetches)
    )
    draw_bars({"title": title, "systems": bars}, png)
    print(f"chart: {png}")


def parse_queues(text: str) -> list[int]:
    try:
        counts = [int(part.replace("_", "")) for part in text.split(",") if part.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected counts like 1,10,100, got {text!r}") from None
    if not counts or min(counts) < 1:
        raise argparse.ArgumentTypeError("queue counts must be at least 1")
    return counts


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument(
        "--queues",
        type=parse_queues,
        default=parse_queues("1,10,100,1000,10000"),
        help="queue counts, in the order run (1,10,100,1000,10000)",
    )
    parser.add_argument("--jobs", type=int, default=20_000, help="jobs per drain (20000)")
    parser.add_argument("--processes", type=int, default=2, help="capsule processes (2)")
    parser.add_argument("--threads", type=int, default=10, help="threads per capsule (10)")
    parser.add_argument("--rounds", type=int, default=3, help="rounds over all counts (3)")
    parser.add_argument("--order", choices=ORDERS, default="strict", help="queue order")
    parser.add_argument(
        "--index",
        choices=("on", "off", "both"),
        default="both",
        help="the fetch's ready index: on, off (scan every queue each call) or both, "
        "alternated (both)",
    )
    parser.add_argument(
        "--sidekiq", action="store_true", help="also drain with Ruby Sidekiq (ruby-sidekiq)"
    )
    parser.add_argument(
        "--max-seconds",
        type=float,
        default=60.0,
        help="a queue count whose drain took longer is drained in no later round (60)",
    )
    parser.add_argument("--idle-seconds", type=float, default=5.0, help="idle window per round (5)")
    parser.add_argument(
        "--idle-warmup",
        type=float,
        default=1.0,
        help="seconds between the capsules' subscribing and the idle window (1)",
    )
    parser.add_argument(
        "--deadline", type=float, default=300.0, help="seconds per drain before it fails (300)"
    )
    parser.add_argument("--redis", help="Redis URL (default: a private redis-server)")
    parser.add_argument(
        "--chart", type=Path, help="also draw the drains as a PNG (bench/peers/.venv needed)"
    )
    args = parser.parse_args()
    args.fetches = {"on": ["index"], "off": ["scan"], "both": ["index", "scan"]}[args.index]
    if args.sidekiq:
        args.fetches.append("sidekiq")
    if args.processes * args.threads >= UNBINDING_LIMIT:
        parser.error(f"processes x threads must stay under the limit {UNBINDING_LIMIT}")
    if args.jobs < 10 or args.rounds < 1 or args.idle_seconds <= 0:
        parser.error("--jobs must be at least 10, --rounds at least 1, --idle-seconds > 0")
    return args


def main() -> None:
    args = parse_args()
    print(
        f"{datetime.now(timezone.utc):%Y-%m-%d %H:%M} UTC; {machine.cpu_model()}, "
        f"{os.cpu_count()} cores; queues {','.join(map(str, args.queues))}; jobs {args.jobs:,}; "
        f"rounds {args.rounds}; limitd start {args.processes} x {args.threads} threads",
        flush=True,
    )
    sparse = [n for n in args.queues if n > args.jobs]
    if sparse:
        print(f"note: at {sparse} queues there are fewer jobs than queues: some stay empty")
    with bench_redis_url(args.redis) as url, redis_py.Redis.from_url(url) as conn:
        print(f"redis-server {conn.info('server')['redis_version']} at {url}", flush=True)
        limitd.set_default_client(limitd.Client(conn))
        started = time.perf_counter()
        rows = run_rounds(conn, url, args)
    report(rows, args)
    if args.chart:
        draw_chart(rows, args.chart, args)
    print(f"\nwhole run: {math.ceil(time.perf_counter() - started)} s")


if __name__ == "__main__":
    main()
