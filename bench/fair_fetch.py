"""Fair queues against FIFO and rerouting (issue 32): how long small tenants wait behind
a flooding one, and what fairness costs the drain.

    .venv/bin/python bench/fair_fetch.py [--rounds 3] [--flood 20000] [--small 100x10]
        [--small-pace SECONDS] [--scale 1x20000,10000x2,1x100000,100000x1]
        [--processes 2] [--threads 10] [--cpu-affinity auto|none|N] [--redis URL]

Each run starts ``limitd start`` (P processes x T threads, logging at WARNING) on a
private redis-server, with one of three setups for the queue ``bench_fair``:

- ``fifo``: a plain queue;
- ``rerouting``: the job has ``fair_tenant_queues`` (100 jobs per tenant per minute,
  then ``bench_fair_throttled``), fetched ``[[bench_fair, 4], [bench_fair_throttled,
  1]]``, as the tenant fairness docs set it up;
- ``fair``: ``fair_queues: [bench_fair]`` (tenants in turn, no tenant limit).

Flood: with the workers running, one tenant enqueues ``--flood`` jobs (perform_bulk),
then ``--small`` (tenants x jobs) small tenants enqueue theirs, one perform_bulk each.
Each job records when it started (RPUSH of tenant, enqueued_at, start); the wait of a
job is its start minus its enqueued_at. Reported: the small tenants' p50 and p99 wait,
when the flooding tenant's last job started, and the whole drain (first enqueue to last
start). Two more columns tell unfairness from throughput: how long the small tenants'
pushes took (a client middleware that costs more per push spreads their arrivals, and
the workers then keep up with them), and how many of the flood's jobs started while a
small tenant had a job waiting (from the first small enqueue to the last small start):
a fair fetch starts next to none, whatever the wait the drain rate imposes.
``--small-pace S`` spreads the small tenants' pushes evenly over S seconds (tenant k
starts at k x S / tenants), so that every mode gets the same arrivals when S is longer
than the slowest mode's pushes take back to back: the waits then compare the fetches
alone, not the push paths (rerouting's middleware makes its pushes slower, which spreads
its arrivals and shortens its waits by itself).

Scale (``--scale``, tenants x jobs each): the jobs are enqueued first, then the workers
start; the steady drain (10% to 90% of the starts, by their timestamps) is compared
between fifo and fair, and between fair with many tenants and fair with one tenant
holding as many jobs in all (``1x100000`` for ``100000x1``; else the first one-tenant
shape): a fair queue's cost must not grow with its tenants, and a longer drain runs
slower for a plain queue too.

``--cpu-affinity`` sets the capsules' ``cpu_affinity`` (default: the config's default,
``auto``): with Redis on the same two cores, pinning the two capsules helps a plain
queue's drain and costs a fair queue's (docs/benchmarks.md).

Modes alternate within each round (fifo, rerouting, fair, ...); the tables give medians
over the rounds. Each run prints the machine's CPU steal and load.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import textwrap
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

import redis as redis_py
from _common import (
    bench_redis_url,
    command_calls,
    command_counts,
    cpu_ticks,
    limitd_started,
    machine_load,
    redis_cpu_seconds,
    tree_cpu_seconds,
    wait_subscribed,
    wait_until,
)

import limitd

QUEUE = "bench_fair"
STARTS = "bench:fair:starts"
MODES = ("fifo", "rerouting", "fair")

APP = textwrap.dedent("""
    import time

    import limitd
    from limitd.spec import current_payload

    def record(tenant):
        started = time.time()
        enqueued = current_payload().get("enqueued_at") or started
        limitd.redis_client().rpush("bench:fair:starts", f"{tenant} {enqueued} {started}")

    class Plain(limitd.Job, name="bench.FairPlain", queue="bench_fair", retry=False):
        def fair_tenant(self, tenant, n):
            return tenant

        def perform(self, tenant, n):
            record(tenant)

    class Rerouted(
        limitd.Job,
        name="bench.FairRerouted",
        queue="bench_fair",
        retry=False,
        fair_tenant_queues=[{"queue": "bench_fair_throttled", "threshold": 100, "per": 60}],
    ):
        def fair_tenant(self, tenant, n):
            return tenant

        def perform(self, tenant, n):
            record(tenant)
""")

CONFIG = textwrap.dedent("""
    require: [bench_fair_app]
    processes: {processes}
    concurrency: {threads}
    logging: {{level: WARNING}}
""")
# Every setup lists the throttled queue (the app defines the rerouting job, whose queue
# some capsule must fetch); only rerouting puts jobs there.
QUEUES = {
    "fifo": "queues: [bench_fair, bench_fair_throttled]\n",
    "rerouting": "queues: [[bench_fair, 4], [bench_fair_throttled, 1]]\n",
    "fair": "queues: [bench_fair, bench_fair_throttled]\nfair_queues: [bench_fair]\n",
}


@dataclass
class Starts:
    """What the jobs of a run recorded: (tenant, enqueued_at, started) each."""

    rows: list[tuple[str, float, float]]

    def waits(self, keep: Callable[[str], bool]) -> list[float]:
        return sorted(started - enqueued for tenant, enqueued, started in self.rows if keep(tenant))

    def last_start(self, keep: Callable[[str], bool]) -> float:
        return max(started for tenant, _, started in self.rows if keep(tenant))

    def flood_ahead(self) -> int:
        """Flood jobs started between the first small enqueue and the last small start."""
        small = [(enqueued, started) for t, enqueued, started in self.rows if t != "flood"]
        first = min(enqueued for enqueued, _ in small)
        last = max(started for _, started in small)
        return sum(1 for t, _, started in self.rows if t == "flood" and first <= started <= last)

    def steady_rate(self) -> float:
        """Jobs per second between the 10% and the 90% start."""
        times = sorted(started for _, _, started in self.rows)
        low, high = times[len(times) // 10], times[len(times) * 9 // 10]
        return (len(times) * 8 // 10) / (high - low) if high > low else float("nan")


@dataclass
class FloodRun:
    small_p50: float
    small_p99: float
    flood_done: float  # seconds from the first enqueue to the flood's last start
    total: float  # seconds from the first enqueue to the last start
    machine: str
    small_push: float = 0.0  # seconds the small tenants' pushes took
    flood_ahead: int = 0  # flood jobs started while a small tenant's job waited
    # What the whole drain cost per job, from the first push to the last job's end:
    # redis-server's CPU, the workers' (supervisor and capsules), Redis commands served
    # (inside the fetch script too; the pushes' and the jobs' own included).
    redis_us: float = 0.0
    worker_us: float = 0.0
    commands: float = 0.0
    lua_calls: float = 0.0  # EVALSHA calls (the fetch, its settlements, the pushes)


@dataclass
class Rows:
    flood: dict[str, list[FloodRun]] = field(default_factory=dict)
    scale: dict[tuple[str, str], list[float]] = field(default_factory=dict)


def percentile(values: list[float], share: float) -> float:
    return values[min(len(values) - 1, int(len(values) * share))]


@contextmanager
def workers(
    url: str, app_dir: Path, mode: str, args: argparse.Namespace
) -> Iterator[subprocess.Popen[bytes]]:
    """``limitd start`` in ``mode``'s setup, stopped with TERM at the end."""
    conf = app_dir / f"{mode}.yml"
    affinity = f"cpu_affinity: {args.cpu_affinity}\n" if args.cpu_affinity else ""
    config = CONFIG.format(processes=args.processes, threads=args.threads)
    conf.write_text(config + affinity + QUEUES[mode])
    with limitd_started(conf, {**os.environ, "LIMITD_REDIS_URL": url}) as proc:
        yield proc


def job_class(mode: str) -> type[limitd.Job]:
    import bench_fair_app  # type: ignore[import-not-found]

    return bench_fair_app.Rerouted if mode == "rerouting" else bench_fair_app.Plain


def lua_calls(conn: redis_py.Redis) -> int:
    counts = command_counts(conn)
    return counts["evalsha"] + counts["eval"] + counts["fcall"]


def read_starts(conn: redis_py.Redis) -> Starts:
    rows = []
    for raw in conn.lrange(STARTS, 0, -1):
        tenant, enqueued, started = raw.decode().split(" ")
        rows.append((tenant, float(enqueued), float(started)))
    return Starts(rows)


def flood_run(
    conn: redis_py.Redis, url: str, app_dir: Path, mode: str, args: argparse.Namespace
) -> FloodRun:
    conn.flushdb()
    tenants, each = args.small
    total = args.flood + tenants * each
    job = job_class(mode)
    before = cpu_ticks()
    with workers(url, app_dir, mode, args) as proc:
        wait_subscribed(conn, proc, args.processes)
        redis_before, worker_before = redis_cpu_seconds(conn), tree_cpu_seconds(proc.pid)
        calls_before, lua_before = command_calls(conn), lua_calls(conn)
        start = time.time()
        job.perform_bulk([["flood", n] for n in range(args.flood)])
        small_from = time.time()
        for tenant in range(tenants):
            pause = small_from + args.small_pace * tenant / tenants - time.time()
            if pause > 0:
                time.sleep(pause)  # the same arrivals in every mode (--small-pace)
            job.perform_bulk([[f"small{tenant:04d}", n] for n in range(each)])
        small_push = time.time() - small_from
        wait_until(lambda: conn.llen(STARTS) >= total, args.deadline, f"{total} jobs")
        worker_cpu = tree_cpu_seconds(proc.pid) - worker_before
        redis_cpu = redis_cpu_seconds(conn) - redis_before
        calls = command_calls(conn) - calls_before
        lua = lua_calls(conn) - lua_before
    starts = read_starts(conn)
    small = starts.waits(lambda t: t.startswith("small"))
    return FloodRun(
        small_p50=percentile(small, 0.50),
        small_p99=percentile(small, 0.99),
        flood_done=starts.last_start(lambda t: t == "flood") - start,
        total=starts.last_start(lambda t: True) - start,
        machine=str(machine_load(before)),
        small_push=small_push,
        flood_ahead=starts.flood_ahead(),
        redis_us=redis_cpu * 1e6 / total,
        worker_us=worker_cpu * 1e6 / total,
        commands=calls / total,
        lua_calls=lua / total,
    )


def scale_run(
    conn: redis_py.Redis, url: str, app_dir: Path, mode: str, args: argparse.Namespace
) -> float:
    conn.flushdb()
    tenants, each = args.shape
    job = job_class(mode)
    for first in range(0, tenants, 1000):
        chunk = range(first, min(first + 1000, tenants))
        job.perform_bulk([[f"t{t:06d}", n] for t in chunk for n in range(each)])
    with workers(url, app_dir, mode, args):
        wait_until(lambda: conn.llen(STARTS) >= tenants * each, args.deadline, "the drain")
    return read_starts(conn).steady_rate()


def parse_shape(text: str) -> tuple[int, int]:
    tenants, _, each = text.partition("x")
    return int(tenants.replace("_", "")), int(each or 1)


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--flood", type=int, default=20_000, help="the flooding tenant's jobs")
    parser.add_argument("--small", type=parse_shape, default=(100, 10), help="tenants x jobs")
    parser.add_argument(
        "--small-pace",
        type=float,
        default=0.0,
        help="seconds over which the small tenants' pushes are spread (0: back to back)",
    )
    parser.add_argument(
        "--scale",
        default="1x20000,10000x2,1x100000,100000x1",
        help="tenants x jobs shapes drained fifo and fair ('' for none)",
    )
    parser.add_argument("--processes", type=int, default=2)
    parser.add_argument("--threads", type=int, default=10)
    parser.add_argument(
        "--cpu-affinity", help="the capsules' cpu_affinity (default: the config's, auto)"
    )
    parser.add_argument("--deadline", type=float, default=300.0)
    parser.add_argument("--redis", help="Redis URL (default: a private redis-server)")
    args = parser.parse_args()
    args.shapes = [parse_shape(part) for part in args.scale.split(",") if part.strip()]
    return args


def report(rows: Rows, args: argparse.Namespace) -> None:
    tenants, each = args.small
    pace = f", their pushes spread over {args.small_pace:g} s" if args.small_pace else ""
    print(
        f"\nFlood: one tenant enqueues {args.flood:,} jobs, then {tenants} tenants "
        f"{each} each{pace}; limitd start {args.processes} x {args.threads}; medians of "
        f"{args.rounds} rounds\n"
    )
    print(
        "| mode | small tenants' p50 wait | p99 wait | flood's last start | whole drain "
        "| small pushes took | flood jobs started meanwhile | Redis CPU per job "
        "| worker CPU per job | Redis cmds per job |"
    )
    print("|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
    for mode in MODES:
        runs = rows.flood.get(mode, [])
        if not runs:
            continue

        def med(get: Callable[[FloodRun], float], runs: list[FloodRun] = runs) -> float:
            return statistics.median(get(run) for run in runs)

        print(
            f"| {mode} | {med(lambda r: r.small_p50) * 1000:,.1f} ms | "
            f"{med(lambda r: r.small_p99) * 1000:,.1f} ms | {med(lambda r: r.flood_done):.2f} s | "
            f"{med(lambda r: r.total):.2f} s | {med(lambda r: r.small_push) * 1000:,.0f} ms | "
            f"{med(lambda r: r.flood_ahead):,.0f} | {med(lambda r: r.redis_us):.1f} us | "
            f"{med(lambda r: r.worker_us):.0f} us | {med(lambda r: r.commands):.1f} |"
        )
    fifo = rows.flood.get("fifo")
    for mode in ("rerouting", "fair"):
        if fifo and rows.flood.get(mode):
            p99 = statistics.median(r.small_p99 for r in fifo) / statistics.median(
                r.small_p99 for r in rows.flood[mode]
            )
            drain = statistics.median(r.total for r in rows.flood[mode]) / statistics.median(
                r.total for r in fifo
            )
            print(
                f"{mode}: small tenants' p99 {p99:,.0f}x lower than fifo; "
                f"whole drain {drain:.2f}x fifo's"
            )
    if rows.scale:
        print(
            "\n| tenants x jobs | fifo steady jobs/s | fair steady jobs/s | fair / fifo | "
            "fair / fair with 1 tenant |"
        )
        print("|---|---:|---:|---:|---:|")
        for shape in args.shapes:
            fifo_rate = statistics.median(rows.scale[("fifo", repr(shape))])
            fair_rate = statistics.median(rows.scale[("fair", repr(shape))])
            one = one_tenant_rate(rows, args.shapes, shape)
            print(
                f"| {shape[0]:,} x {shape[1]} | {fifo_rate:,.0f} | {fair_rate:,.0f} | "
                f"{fair_rate / fifo_rate:.2f} | {fair_rate / one if one else float('nan'):.2f} |"
            )


def one_tenant_rate(
    rows: Rows, shapes: list[tuple[int, int]], shape: tuple[int, int]
) -> float | None:
    """The fair rate of one tenant with as many jobs as ``shape`` in all, if that shape
    ran (a longer drain runs slower, plain queues too, so tenants are compared at equal
    work), else of the first one-tenant shape; None without one."""
    jobs = shape[0] * shape[1]
    singles = [s for s in shapes if s[0] == 1]
    same = [s for s in singles if s[1] == jobs]
    chosen = same[0] if same else (singles[0] if singles else None)
    return None if chosen is None else statistics.median(rows.scale[("fair", repr(chosen))])


def main() -> None:
    args = parse_args()
    rows = Rows()
    with (
        tempfile.TemporaryDirectory(prefix="limitd-fair-bench-") as tmp,
        bench_redis_url(args.redis) as url,
    ):
        app_dir = Path(tmp)
        (app_dir / "bench_fair_app.py").write_text(APP)
        sys.path.insert(0, str(app_dir))
        conn = redis_py.Redis.from_url(url)
        limitd.set_default_client(limitd.Client(conn))
        for number in range(1, args.rounds + 1):
            for mode in MODES:
                run = flood_run(conn, url, app_dir, mode, args)
                rows.flood.setdefault(mode, []).append(run)
                print(
                    f"round {number} flood {mode:>9}: small p50 {run.small_p50 * 1000:,.0f} ms, "
                    f"p99 {run.small_p99 * 1000:,.0f} ms; flood done {run.flood_done:.2f} s, "
                    f"all {run.total:.2f} s; small pushes {run.small_push * 1000:,.0f} ms, "
                    f"flood started meanwhile {run.flood_ahead:,}; per job: Redis CPU "
                    f"{run.redis_us:.1f} us, worker CPU {run.worker_us:.0f} us, "
                    f"{run.commands:.1f} Redis cmds ({run.lua_calls:.2f} Lua); {run.machine}",
                    flush=True,
                )
            for shape in args.shapes:
                for mode in ("fifo", "fair"):
                    before = cpu_ticks()
                    args.shape = shape
                    rate = scale_run(conn, url, app_dir, mode, args)
                    rows.scale.setdefault((mode, repr(shape)), []).append(rate)
                    print(
                        f"round {number} {shape[0]:,} tenants x {shape[1]} {mode:>4}: "
                        f"{rate:,.0f} jobs/s; {machine_load(before)}",
                        flush=True,
                    )
    report(rows, args)


if __name__ == "__main__":
    main()
