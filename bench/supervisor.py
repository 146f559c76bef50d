"""Drain throughput of ``limitd start`` itself: the supervisor, its forked capsule
processes and their threads, at 1, 2 and 4 processes.

    .venv/bin/python bench/supervisor.py [--jobs 20000] [--threads 10] [--processes 1 2 4]

For each process count: push N no-op jobs in bulk, start ``limitd start -p P -c T`` as
a subprocess, and time from its start until every job ran (each job increments a Redis
counter, read until it reaches N), then stop it with TERM. Start-up (forking, connecting)
is inside the time, as it is for an operator. Without --redis it starts a private
redis-server.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import textwrap
import time
from pathlib import Path

import redis as redis_py
from _common import redis_for_bench

import limitd

APP = textwrap.dedent("""
    import limitd
    from limitd.client import default_client

    @limitd.job(name="bench.SupervisorNoop", queue="bench")
    def noop(n):
        default_client().redis.incr("bench:done")
""")
POLL_SECONDS = 0.01
TIMEOUT_SECONDS = 600


def drain_seconds(
    conn: redis_py.Redis, url: str, app_dir: Path, *, processes: int, threads: int, jobs: int
) -> float:
    conn.delete("queue:bench", "bench:done")
    limitd.Client(conn).push_bulk(
        {"class": "bench.SupervisorNoop", "queue": "bench"}, [[i] for i in range(jobs)]
    )
    env = {**os.environ, "LIMITD_REDIS_URL": url}
    command = [
        sys.executable,
        "-m",
        "limitd.cli",
        "start",
        "-r",
        "bench_app",
        "-q",
        "bench",
        "-p",
        str(processes),
        "-c",
        str(threads),
    ]
    started = time.perf_counter()
    proc = subprocess.Popen(
        command, cwd=app_dir, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
    )
    try:
        while int(conn.get("bench:done") or 0) < jobs:
            if time.perf_counter() - started > TIMEOUT_SECONDS or proc.poll() is not None:
                raise RuntimeError(f"drain with {processes} processes did not finish")
            time.sleep(POLL_SECONDS)  # sampling the counter: the resolution of the figure
        return time.perf_counter() - started
    finally:
        proc.terminate()
        proc.wait(60)


def url_of(conn: redis_py.Redis) -> str:
    """The URL of the private server, for the worker subprocesses."""
    kwargs = conn.connection_pool.connection_kwargs
    return f"redis://{kwargs['host']}:{kwargs['port']}/{kwargs.get('db', 0)}"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--jobs", type=int, default=20_000)
    parser.add_argument("--threads", type=int, default=10)
    parser.add_argument("--processes", type=int, nargs="+", default=[1, 2, 4])
    parser.add_argument("--redis", help="Redis URL (default: a private redis-server)")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp, redis_for_bench(args.redis) as conn:
        app_dir = Path(tmp)
        (app_dir / "bench_app.py").write_text(APP)
        url = args.redis or url_of(conn)
        print(f"jobs: {args.jobs}, threads per process: {args.threads}")
        print(f"{'processes':>9} {'seconds':>8} {'jobs/s':>8}")
        for processes in args.processes:
            seconds = drain_seconds(
                conn, url, app_dir, processes=processes, threads=args.threads, jobs=args.jobs
            )
            print(f"{processes:>9} {seconds:>8.2f} {args.jobs / seconds:>8,.0f}", flush=True)


if __name__ == "__main__":
    main()
