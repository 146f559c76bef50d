"""A capsule process's resident memory, idle and with many async jobs in flight: what an
``async_concurrency`` of 10,000 costs in RAM.

    .venv/bin/python bench/capsule_memory.py [--jobs 10000] [--slots 10000] [--hold 3.0]

One run on a private redis-server (never port 6379): ``limitd start`` with ``processes:
1``, ``concurrency: 10`` (processor threads fetching for the loop) and
``async_concurrency: --slots``, on queue ``bench_mem``, with a temporary app whose async
job ``bench.Hold`` waits ``--hold`` seconds (``asyncio.sleep``). The capsule is the
supervisor's child whose process title holds "limitd capsule"; its memory is VmRSS from
/proc/<pid>/status (resident pages, including those it still shares copy-on-write with
the supervisor it was forked from).

1. idle: 2 s after the capsule subscribed to wake-ups, before any job;
2. busy: ``--jobs`` jobs enqueued with perform_bulk while the capsule runs, then the
   capsule's VmRSS and the jobs in flight sampled every 50 ms until all are done. Each
   job counts its start and its end in the capsule process; a thread there writes both
   counts to Redis (one MSET every 10 ms, through ``limitd.redis_client()``), so the jobs
   make no Redis call of their own and hold no connection while they wait;
3. after: 2 s after the last job finished.

Prints a markdown table: VmRSS of the capsule and of the supervisor idle, at the capsule's
peak, when the most jobs were in flight, and after, with the kernel's VmHWM (peak RSS)
as a check on the 50 ms sampling; then the memory per job in flight, (peak - idle) / the
most jobs in flight seen, in KiB, and the same from the VmRSS sampled when the most jobs
were in flight (the peak can come later, as the jobs finish).
"""

from __future__ import annotations

import argparse
import math
import os
import subprocess
import sys
import tempfile
import textwrap
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import redis as redis_py
from _common import bench_redis_url, children, limitd_started, wait_subscribed, wait_until

import limitd

ASYNC_APPS_DIR = Path(__file__).resolve().parent / "async_apps"  # reporter.py
QUEUE = "bench_mem"
APP_MODULE = "bench_mem_app"
STARTED_KEY = "bench:mem:started"
DONE_KEY = "bench:mem:done"
PROCESSORS = 10
SETTLE_SECONDS = 2.0
POLL_SECONDS = 0.05
BULK = 1000

APP = textwrap.dedent(f"""
    import asyncio
    import os

    import limitd
    from reporter import Reporter

    HOLD_SECONDS = float(os.environ["BENCH_HOLD_SECONDS"])
    REPORT_EVERY = 0.01

    count = Reporter(
        limitd.redis_client,
        lambda conn, now, _: conn.mset(
            {{"{STARTED_KEY}": now["started"], "{DONE_KEY}": now["done"]}}
        ),
        REPORT_EVERY,
        "started",
        "done",
    ).count


    @limitd.job(name="bench.Hold", queue="{QUEUE}")
    async def hold(i):
        count("started")
        await asyncio.sleep(HOLD_SECONDS)
        count("done")
""")

CONFIG = textwrap.dedent("""
    redis:
      url: {url}
    logging:
      level: WARNING
    require: [{module}]
    queues: [{queue}]
    processes: 1
    concurrency: {threads}
    async_concurrency: {slots}
""")


@dataclass
class Sample:
    """VmRSS of the capsule and the supervisor, in KiB."""

    capsule: int
    supervisor: int


@dataclass
class Busy:
    """What the 50 ms sampling saw while the jobs ran."""

    peak_rss: int = 0  # the capsule's highest VmRSS, KiB
    most_in_flight: int = 0
    rss_at_most: int = 0  # the capsule's VmRSS when most_in_flight was seen, KiB
    samples: int = 0
    enqueue_seconds: float = 0.0
    drain_seconds: float = 0.0

    def record(self, rss: int, in_flight: int) -> None:
        self.samples += 1
        self.peak_rss = max(self.peak_rss, rss)
        if in_flight > self.most_in_flight or (
            in_flight == self.most_in_flight and rss > self.rss_at_most
        ):
            self.most_in_flight, self.rss_at_most = in_flight, rss


def status_kib(pid: int, field: str) -> int:
    """A ``kB`` field of /proc/<pid>/status (VmRSS, VmHWM)."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith(f"{field}:"):
            return int(line.split()[1])
    raise RuntimeError(f"no {field} in /proc/{pid}/status")


def command_line(pid: int) -> str:
    try:
        raw = Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return ""
    return raw.replace(b"\0", b" ").decode(errors="replace")


def find_capsule(supervisor: subprocess.Popen[bytes]) -> int:
    """The supervisor's child titled "limitd capsule ..." (setproctitle rewrites the
    command line once the capsule runs)."""
    found: list[int] = []

    def titled() -> bool:
        if supervisor.poll() is not None:
            raise RuntimeError(f"limitd start exited with {supervisor.returncode}")
        found[:] = [p for p in children(supervisor.pid) if "limitd capsule" in command_line(p)]
        return bool(found)

    wait_until(titled, 60, "the capsule process")
    if len(found) != 1:
        raise RuntimeError(f"expected one capsule, found {found}")
    return found[0]


@contextmanager
def workers(url: str, app_dir: Path, args: argparse.Namespace) -> Iterator[subprocess.Popen[bytes]]:
    """``limitd start`` on the run's config, stopped with TERM at the end."""
    conf = app_dir / "mem.yml"
    conf.write_text(
        CONFIG.format(url=url, module=APP_MODULE, queue=QUEUE, threads=PROCESSORS, slots=args.slots)
    )
    env = {**os.environ, "LIMITD_REDIS_URL": url, "BENCH_HOLD_SECONDS": str(args.hold)}
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ASYNC_APPS_DIR), env.get("PYTHONPATH")]))
    with limitd_started(conf, env) as proc:
        yield proc


def sample(capsule: int, supervisor: int) -> Sample:
    return Sample(capsule=status_kib(capsule, "VmRSS"), supervisor=status_kib(supervisor, "VmRSS"))


def counts(conn: redis_py.Redis) -> tuple[int, int]:
    """Jobs started and jobs done, as the capsule last wrote them."""
    started, done = conn.mget(STARTED_KEY, DONE_KEY)
    return int(started or 0), int(done or 0)


def run_jobs(conn: redis_py.Redis, capsule: int, args: argparse.Namespace) -> Busy:
    """Enqueue the jobs, then sample until the capsule counted all of them done."""
    import bench_mem_app  # type: ignore[import-not-found]

    busy = Busy()
    began = time.monotonic()
    bench_mem_app.hold.perform_bulk([[i] for i in range(args.jobs)], batch_size=BULK)
    busy.enqueue_seconds = time.monotonic() - began
    deadline = began + args.hold * math.ceil(args.jobs / args.slots) + 120
    while True:
        started, done = counts(conn)
        busy.record(status_kib(capsule, "VmRSS"), started - done)
        if done >= args.jobs:
            break
        if time.monotonic() > deadline:
            raise RuntimeError(f"timed out: {done:,} of {args.jobs:,} jobs done")
        time.sleep(POLL_SECONDS)
    busy.drain_seconds = time.monotonic() - began
    return busy


def mib(kib: int) -> str:
    return f"{kib / 1024:,.1f}"


def report(idle: Sample, busy: Busy, after: Sample, hwm: int, args: argparse.Namespace) -> None:
    print(
        f"\nlimitd start, 1 process, concurrency {PROCESSORS}, async_concurrency "
        f"{args.slots:,}; {args.jobs:,} async jobs each holding {args.hold:g} s; enqueue "
        f"{busy.enqueue_seconds:.2f} s, all done after {busy.drain_seconds:.2f} s; "
        f"{busy.samples} samples\n"
    )
    print("| state | capsule VmRSS (MiB) | supervisor VmRSS (MiB) | jobs in flight |")
    print("|---|---:|---:|---:|")
    print(f"| idle | {mib(idle.capsule)} | {mib(idle.supervisor)} | 0 |")
    print(f"| peak (sampled) | {mib(busy.peak_rss)} | - | - |")
    print(f"| most jobs in flight | {mib(busy.rss_at_most)} | - | {busy.most_in_flight:,} |")
    print(f"| after (+{SETTLE_SECONDS:g} s) | {mib(after.capsule)} | {mib(after.supervisor)} | 0 |")
    print(f"| capsule VmHWM (kernel's peak) | {mib(hwm)} | - | - |")
    if busy.most_in_flight:
        per_job = (busy.peak_rss - idle.capsule) / busy.most_in_flight
        print(
            f"\nper job in flight: ({mib(busy.peak_rss)} - {mib(idle.capsule)} MiB) / "
            f"{busy.most_in_flight:,} = {per_job:.2f} KiB"
        )
        at_most = (busy.rss_at_most - idle.capsule) / busy.most_in_flight
        print(
            f"per job, at the most in flight: ({mib(busy.rss_at_most)} - {mib(idle.capsule)} "
            f"MiB) / {busy.most_in_flight:,} = {at_most:.2f} KiB"
        )
    else:
        print("\nno job was seen in flight: no per-job figure")


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--jobs", type=int, default=10_000)
    parser.add_argument("--slots", type=int, default=10_000, help="async_concurrency")
    parser.add_argument("--hold", type=float, default=3.0, help="seconds each job waits")
    return parser.parse_args()


def main() -> None:
    args = parse_args()
    print(f"limitd {limitd.__file__}, python {sys.version.split()[0]}", flush=True)
    with (
        tempfile.TemporaryDirectory(prefix="limitd-mem-bench-") as tmp,
        bench_redis_url(None) as url,
    ):
        app_dir = Path(tmp)
        (app_dir / f"{APP_MODULE}.py").write_text(APP)
        sys.path[:0] = [str(app_dir), str(ASYNC_APPS_DIR)]  # the app imports reporter
        os.environ["BENCH_HOLD_SECONDS"] = str(args.hold)  # the app reads it on import
        conn = redis_py.Redis.from_url(url)
        limitd.set_default_client(limitd.Client(conn))
        with workers(url, app_dir, args) as supervisor:
            wait_subscribed(conn, supervisor, 1)
            capsule = find_capsule(supervisor)
            time.sleep(SETTLE_SECONDS)
            idle = sample(capsule, supervisor.pid)
            print(f"idle: capsule {mib(idle.capsule)} MiB (pid {capsule})", flush=True)
            busy = run_jobs(conn, capsule, args)
            time.sleep(SETTLE_SECONDS)
            after = sample(capsule, supervisor.pid)
            hwm = status_kib(capsule, "VmHWM")
        conn.close()
    report(idle, busy, after, hwm, args)


if __name__ == "__main__":
    main()
