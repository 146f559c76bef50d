"""What one limit-fetch call costs Redis, without capsules around it (issue 32).

    .venv/bin/python bench/fetch_call.py [--queues 1,10000] [--jobs 20000] [--want 5]
        [--rounds 5] [--compare OTHER_CHECKOUT] [--fair TENANTS] [--redis URL]

Two fetches (two capsules' worth, one thread) share N limited queues holding --jobs
jobs spread evenly, and take turns: each call settles the jobs its previous call took
and takes up to --want more, until the queues are empty, as two busy capsules'
dispatchers do, each on its own connection as a dispatcher's (``own_connection``).
Reported per queue count: the script's Redis time per call (INFO commandstats, EVALSHA
usec) and per job, the commands it runs inside per job, redis-server's CPU per job (user
+ sys), and this process's CPU per job: what building the calls, sending them and
reading their replies costs the capsule's side. No worker threads and no network wait
blur them, so a change to ``limit_fetch.lua`` or to how a call is built shows here when
a full drain (bench/fetch_scale.py) is too noisy to tell.

``--fair T`` makes every queue fair (``make_fair``) and names T tenants in turn in its
jobs: what the fair fetch adds to a call (T = 1: one tenant alone, a flood's drain).

``--compare DIR`` runs the same measure with the limitd package of another checkout (a
``git worktree`` of an older commit, say) in alternate rounds, and prints the ratio per
round and its median: each measure runs in its own process with ``PYTHONPATH=DIR``.
Without --redis it starts a private redis-server; with --redis it FLUSHALLs that one.

``--callgrind`` runs that private redis-server under valgrind's callgrind and reports
the instructions Redis ran for the drain (counters zeroed just before it, dumped just
after): the same figure to a fraction of a percent run after run, whatever else the
machine does, where the timings above swing by a tenth or more. Redis runs about fifty
times slower under it, so use a few thousand jobs (``--jobs 2000 --rounds 1``).
``--keep-dumps DIR`` keeps callgrind's dumps there (one per measure, in order) for
``callgrind_annotate``, to see which functions the instructions went to.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import redis as redis_py

HERE = Path(__file__).resolve()
ROOT = HERE.parent.parent
CALLGRIND_OUT = os.path.join(tempfile.gettempdir(), "limitd-fetch-call.callgrind")


def fill(conn: redis_py.Redis, names: list[str], jobs: int, tenants: int = 0) -> None:
    """``jobs`` spread evenly over the queues ``names``, each limited (1,000); with
    ``tenants``, the queues are fair and their jobs name that many tenants in turn, with
    ``fair_tenant`` as the first key, as limitd's client writes it."""
    from limitd import keys
    from limitd.queues import limits

    k = keys.of(conn)
    per_queue = max(1, jobs // len(names))
    pipe = conn.pipeline(transaction=False)
    for name in names:
        payloads = []
        for i in range(per_queue):
            job = {"fair_tenant": f"t{i % tenants}"} if tenants else {}
            job.update({"class": "Noop", "args": [i], "queue": name, "jid": f"{name}-{i}"})
            # compact, as limitd's client writes them (limitd.codec)
            payloads.append(json.dumps(job, separators=(",", ":")))
        pipe.sadd(k.QUEUES, name)
        pipe.lpush(k.queue(name), *payloads)
    pipe.execute()
    for name in names:
        limits.set_limit(conn, name, 1_000)
    if tenants:
        from limitd.fair_queues.admin import make_fair

        for name in names:
            make_fair(name, redis=conn)


def measure_one(
    url: str, count: int, jobs: int, want: int, callgrind: int | None = None, *, tenants: int = 0
) -> dict[str, float]:
    """In this process, with whatever ``limitd`` it imports: one drain by two fetches;
    ``callgrind``: the pid of the valgrind running the server, to count its instructions."""
    from _common import command_counts, redis_cpu_seconds

    from limitd.connection import own_connection
    from limitd.fetch.factory import limit_fetch
    from limitd.queues.order import QueueOrder

    conn = redis_py.Redis.from_url(url)
    conn.flushall()
    names = [f"q{i:05d}" for i in range(count)]
    fill(conn, names, jobs, tenants)
    fetches = [limit_fetch(conn, QueueOrder(names), f"bench-{n}") for n in range(2)]
    own = [own_connection(conn) for _ in fetches]  # each its own, as each dispatcher has
    for fetch in fetches:
        fetch.wake_handlers()  # as a capsule does: one re-check of every queue first
        fetch.maintain(list, reap=False)  # and its first heartbeat, as it starts
        # The re-check (an EXISTS per queue with jobs) runs before a capsule's first
        # call, once: made here, before the measure, or 10,000 queues' worth of it would
        # count as per-job cost. What it found is added to the index by the first call.
        assert fetch.index is not None
        fetch.index.restore(fetch.index.take_hints(conn))
    held: list[list] = [[], []]
    if callgrind is not None:
        counted = Callgrind(callgrind)
    conn.config_resetstat()
    cpu, client_cpu = redis_cpu_seconds(conn), time.process_time()
    done = 0
    while True:
        took = False
        for n, fetch in enumerate(fetches):
            units = fetch.take(want, held[n], conn=own[n])
            done += len(held[n])
            held[n] = units
            took = took or bool(units)
        if not took:
            break
    client_used = time.process_time() - client_cpu
    used = redis_cpu_seconds(conn) - cpu
    instructions = counted.instructions() if callgrind is not None else 0
    stats = conn.info("commandstats")  # the fetch is an FCALL where Redis has functions
    script = stats.get("cmdstat_fcall") or stats["cmdstat_evalsha"]
    served = command_counts(conn)
    inner = sum(served.values()) - served["fcall"] - served["evalsha"] - served["config"]
    return {
        "jobs": done,
        "calls": script["calls"],
        "us_per_call": script["usec"] / script["calls"],
        "us_per_job": script["usec"] / done,
        "commands_per_job": inner / done,
        "redis_cpu_us_per_job": 1e6 * used / done,
        "client_cpu_us_per_job": 1e6 * client_used / done,
        "instructions_per_call": instructions / script["calls"],
        "instructions_per_job": instructions / done,
    }


class Callgrind:
    """The instructions a redis-server under callgrind runs from now on: the counters
    are zeroed here and dumped by ``instructions``, which reads the dump's total."""

    def __init__(self, pid: int) -> None:
        self.pid = pid
        self.out = Path(f"{CALLGRIND_OUT}.{pid}")
        subprocess.run(["callgrind_control", "-z", str(pid)], check=True, capture_output=True)

    def instructions(self) -> int:
        before = set(self.out.parent.glob(f"{self.out.name}.*"))
        subprocess.run(["callgrind_control", "-d", str(self.pid)], check=True, capture_output=True)
        [dump] = set(self.out.parent.glob(f"{self.out.name}.*")) - before
        for text in dump.read_text().splitlines():
            if text.startswith("summary:"):
                return int(text.split()[1])
        raise RuntimeError(f"no summary line in {dump}")


@contextmanager
def callgrind_redis(keep: str | None = None) -> Iterator[tuple[str, int]]:
    """A private redis-server under callgrind: its URL and valgrind's pid (valgrind
    runs it in its own process); ``keep``: a folder its dumps are moved to at the end."""
    from limitd.connection.embedded import RedisServer

    class CallgrindRedis(RedisServer):
        def command(self) -> list[str]:
            tool = ["valgrind", "--tool=callgrind", f"--callgrind-out-file={CALLGRIND_OUT}.%p"]
            return [*tool, *super().command()]

    server = CallgrindRedis()
    server.start()
    assert server.process is not None
    pid = server.process.pid
    try:
        yield server.url, pid
    finally:
        server.stop()
        for dump in Path(CALLGRIND_OUT).parent.glob(f"{Path(CALLGRIND_OUT).name}.{pid}*"):
            if keep:
                Path(keep).mkdir(parents=True, exist_ok=True)
                dump.rename(Path(keep) / dump.name)
            else:
                dump.unlink()


def run_in(root: Path, url: str, count: int, args: argparse.Namespace) -> dict[str, float]:
    """``measure_one`` in a fresh process importing limitd from ``root``."""
    env = dict(os.environ, PYTHONPATH=str(root))
    command = [sys.executable, str(HERE), "--one", str(count), "--url", url]
    command += ["--jobs", str(args.jobs), "--want", str(args.want), "--fair", str(args.fair)]
    if args.callgrind_pid is not None:
        command += ["--callgrind-pid", str(args.callgrind_pid)]
    out = subprocess.run(command, env=env, check=True, capture_output=True, text=True).stdout
    return json.loads(out)


def line(label: str, figures: dict[str, float]) -> str:
    counted = ""
    if figures["instructions_per_call"]:
        counted = (
            f", Redis ran {figures['instructions_per_call']:,.0f} instructions/call, "
            f"{figures['instructions_per_job']:,.0f}/job"
        )
    return (
        f"{label}: {figures['us_per_call']:6.0f} us/call, {figures['us_per_job']:5.1f} us/job "
        f"in the script, {figures['commands_per_job']:.2f} commands/job inside, Redis CPU "
        f"{figures['redis_cpu_us_per_job']:5.1f} us/job ({figures['calls']:.0f} calls), "
        f"this process's CPU {figures['client_cpu_us_per_job']:5.1f} us/job{counted}"
    )


def compare(url: str, args: argparse.Namespace) -> None:
    roots = {"this": ROOT}
    if args.compare:
        roots["other"] = Path(args.compare).resolve()
    for count in args.queues:
        per_root: dict[str, list[dict[str, float]]] = {label: [] for label in roots}
        for number in range(1, args.rounds + 1):
            labels = list(roots) if number % 2 else list(roots)[::-1]  # swap who goes first
            for label in labels:
                figures = run_in(roots[label], url, count, args)
                per_root[label].append(figures)
                print(line(f"{count:>6} queues, round {number}, {label:>5}", figures), flush=True)
        for label, runs in per_root.items():
            if args.callgrind:
                counted = statistics.median(run["instructions_per_call"] for run in runs)
                print(f"{count:>6} queues, {label}: {counted:,.0f} instructions/call")
            median = statistics.median(run["us_per_call"] for run in runs)
            cpu = statistics.median(run["redis_cpu_us_per_job"] for run in runs)
            print(
                f"{count:>6} queues, {label}: median {median:.0f} us/call, "
                f"Redis CPU {cpu:.1f} us/job"
            )
        if args.compare and args.callgrind:
            this, other = (
                statistics.median(run["instructions_per_call"] for run in per_root[label])
                for label in ("this", "other")
            )
            print(f"{count:>6} queues: this / other, instructions per call: {this / other:.3f}")
        if args.compare:
            print_ratios(count, per_root, "us_per_call", "per call")
            print_ratios(count, per_root, "client_cpu_us_per_job", "this process's CPU per job")


def print_ratios(
    count: int, per_root: dict[str, list[dict[str, float]]], figure: str, what: str
) -> None:
    """this / other of one figure, round by round, and their median."""
    ratios = [
        this[figure] / other[figure]
        for this, other in zip(per_root["this"], per_root["other"], strict=True)
    ]
    print(
        f"{count:>6} queues: this / other, {what}, by round "
        f"{', '.join(f'{r:.2f}' for r in ratios)}; median {statistics.median(ratios):.2f}"
    )


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument(
        "--queues",
        type=lambda text: [int(part) for part in text.split(",")],
        default=[1, 10_000],
        help="queue counts (1,10000)",
    )
    parser.add_argument("--jobs", type=int, default=20_000, help="jobs per measure (20000)")
    parser.add_argument("--want", type=int, default=5, help="jobs a call takes at most (5)")
    parser.add_argument("--rounds", type=int, default=5, help="rounds per queue count (5)")
    parser.add_argument("--compare", help="another checkout's root, run in alternate rounds")
    parser.add_argument(
        "--fair", type=int, default=0, help="make the queues fair, with this many tenants (0)"
    )
    parser.add_argument("--redis", help="Redis URL (default: a private redis-server)")
    parser.add_argument(
        "--callgrind", action="store_true", help="count Redis's instructions (valgrind)"
    )
    parser.add_argument("--keep-dumps", help="with --callgrind: keep its dumps in this folder")
    parser.add_argument("--one", type=int, help=argparse.SUPPRESS)  # a child's measure
    parser.add_argument("--callgrind-pid", type=int, help=argparse.SUPPRESS)
    parser.add_argument("--url", help=argparse.SUPPRESS)
    return parser.parse_args()


def main() -> None:
    args = parse_args()
    if args.one is not None:
        figures = measure_one(
            args.url, args.one, args.jobs, args.want, args.callgrind_pid, tenants=args.fair
        )
        print(json.dumps(figures))
        return
    sys.path.insert(0, str(ROOT))
    sys.path.insert(0, str(HERE.parent))
    from _common import bench_redis_url

    started = time.perf_counter()
    if args.callgrind:
        with callgrind_redis(args.keep_dumps) as (url, pid):
            args.callgrind_pid = pid
            compare(url, args)
    else:
        with bench_redis_url(args.redis) as url:
            compare(url, args)
    print(f"whole run: {time.perf_counter() - started:.0f} s")


if __name__ == "__main__":
    main()
