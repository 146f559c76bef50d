"""What the wake-ups of live pushes cost the capsules that hear them.

    .venv/bin/python bench/wakeups.py [--jobs 40000] [--processes 2] [--rounds 3]
        [--messages 50000] [--wakeup-rate 10000] [--queues 1] [--compare DIR]
        [--chart OUT.png] [--skip-listener] [--redis URL]

Every ``perform_async`` publishes a wake-up on ``limitd:wake``, and every capsule
process hears every one, whichever queues it serves. The peer benchmarks enqueue their
jobs before the workers start, so they never see that cost; this one does.

1. The listener alone, in this process: ``--messages`` wake-ups published, then read
   by redis-py's ``PubSub.get_message`` (what the listener used before) and by limitd's
   ``Subscription`` (``limitd/connection/subscription.py``), CPU per message of the
   reading thread (``time.thread_time``), alternated, medians.
2. Wake-ups heard by busy capsules: ``--jobs`` jobs are pushed with ``perform_bulk``,
   then ``limitd start`` (``--processes`` x 10 threads, the peers' limit-fetch config,
   bench/peers/apps/limitd_app.py's job, which INCRs a counter) drains them, once with
   nothing else going on (``quiet``) and once while this process publishes wake-ups
   at ``--wakeup-rate`` a second (``woken``), naming the queue, or with ``--queues N``
   naming in turn it and N - 1 empty queues the capsules also list: what a stream of live
   pushes brings every capsule process, whether or not it has a processor idle. (Made
   by pipelined PUBLISH so that the publisher costs the two cores little, unlike a
   ``perform_async`` loop fast enough to keep up.) Measured from the start of the drain
   to the last job: the drain's rate, the CPU of every capsule process per job, and
   the difference per wake-up heard (per capsule process).
   With ``--compare DIR`` each round also runs both with the limitd package of another
   checkout (on the capsules' PYTHONPATH), right after this checkout's, the order
   swapped every round.

Prints each run (with the machine's CPU steal and load), then medians per case;
``--chart`` draws the drains as bars (drawn by bench/peers/chart.py in the peers' venv,
where matplotlib is installed).
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections import defaultdict
from dataclasses import dataclass
from pathlib import Path

import redis as redis_py
from _common import bench_redis_url, cpu_ticks, draw_bars, machine_load, wait_until

from limitd.connection.subscription import Subscription

# The peer benchmark's process helpers and job module, from their directories as
# bench/fetch_scale.py imports them.
PEERS_DIR = Path(__file__).resolve().parent / "peers"
APPS_DIR = PEERS_DIR / "apps"
sys.path[:0] = [str(PEERS_DIR), str(APPS_DIR)]

import procs  # noqa: E402
from measure import system_env  # noqa: E402

CHANNEL = "limitd:wake"
COUNTER = "bench:done"  # bench_counter.COUNTER_KEY
DEADLINE = 300.0

CONFIG = """\
redis:
  url: {url}
logging:
  level: WARNING
require: [limitd_app]
queues: [{queues}]
concurrency: 10
processes: {processes}
fetch: limit
limits: {{bench: 1000}}
"""

# Pushes the backlog before a drain: perform_bulk, one wake-up per 1,000 jobs.
PUSHER = [
    sys.executable,
    "-c",
    "import sys, redis, limitd, limitd_app\n"
    "limitd.set_default_client(limitd.Client(redis.Redis.from_url(sys.argv[1])))\n"
    "limitd_app.noop.perform_bulk([[i] for i in range(int(sys.argv[2]))], batch_size=1000)\n",
]

# 1. The listener alone.


def publish(url: str, count: int) -> None:
    pipe = redis_py.Redis.from_url(url).pipeline(transaction=False)
    for i in range(count):
        pipe.publish(CHANNEL, f"q{i % 10_000:05d}")
        if i % 1000 == 999:
            pipe.execute()
    pipe.execute()


def read_with_pubsub(url: str, count: int) -> float:
    """CPU seconds per message read through redis-py's PubSub, as the listener did."""
    pubsub = redis_py.Redis.from_url(url).pubsub(ignore_subscribe_messages=True)
    pubsub.subscribe(CHANNEL)
    while pubsub.get_message(timeout=1.0) is None and not pubsub.subscribed:
        pass
    publish(url, count)
    got, started = 0, time.thread_time()
    while got < count:
        message = pubsub.get_message(timeout=1.0)
        if message and message["type"] == "message":
            message["channel"].decode("utf-8", "replace")
            message["data"].decode("utf-8", "replace")
            got += 1
    spent = time.thread_time() - started
    pubsub.close()
    return spent / count


def read_with_subscription(url: str, count: int) -> float:
    """CPU seconds per message read through limitd's Subscription."""
    subscription = Subscription(redis_py.Redis.from_url(url), [CHANNEL])
    publish(url, count)
    got, started = 0, time.thread_time()
    while got < count:
        for channel, data in subscription.read(1.0):
            channel.decode("utf-8", "replace")
            data.decode("utf-8", "replace")
            got += 1
    spent = time.thread_time() - started
    subscription.close()
    return spent / count


def listener_alone(url: str, args: argparse.Namespace) -> None:
    results: dict[str, list[float]] = defaultdict(list)
    readers = {"redis-py PubSub": read_with_pubsub, "limitd Subscription": read_with_subscription}
    for number in range(args.rounds):
        order = list(readers.items())
        for name, reader in order if number % 2 == 0 else order[::-1]:
            per_message = reader(url, args.messages)
            results[name].append(per_message)
            print(f"round {number + 1}  {name:20s} {per_message * 1e6:6.2f} us CPU per message")
    for name, values in results.items():
        print(f"  {name:20s} median {statistics.median(values) * 1e6:6.2f} us per message")


# 2. Wake-ups heard by busy capsules.


@dataclass(frozen=True)
class Run:
    drain_rate: float
    capsule_us: float  # CPU of every capsule process per job
    heard: float  # wake-ups each capsule process heard per job


def drain_run(url: str, args: argparse.Namespace, mode: str, other: Path | None) -> Run:
    conn = redis_py.Redis.from_url(url)
    conn.flushdb()
    push = [*PUSHER, url, str(args.jobs)]
    subprocess.run(push, cwd=APPS_DIR, env=system_env(url), check=True)
    with tempfile.TemporaryDirectory(prefix="limitd-wakeups-") as tmp:
        conf = Path(tmp) / "wakeups.yml"
        queues = ", ".join(["bench", *other_queues(args.queues)])
        conf.write_text(CONFIG.format(url=url, processes=args.processes, queues=queues))
        with (Path(tmp) / "limitd.log").open("wb") as log:
            command = [sys.executable, "-m", "limitd.cli", "start", str(conf)]
            env = system_env(url, [other] if other else [])
            capsules = procs.start_group(command, cwd=APPS_DIR, env=env, log=log)
            try:
                return measured_drain(conn, capsules, args, mode)
            finally:
                procs.stop_groups([capsules])


def measured_drain(
    conn: redis_py.Redis, capsules: subprocess.Popen[bytes], args: argparse.Namespace, mode: str
) -> Run:
    """From the first job on, with wake-ups published meanwhile when ``woken``."""
    wait_until(lambda: subscribed(conn) >= args.processes, 60, "the subscriptions")
    wait_until(lambda: counted(conn) > 0, 60, "the first job")
    cpu, done = procs.worker_cpu_seconds([capsules]), counted(conn)
    started = time.monotonic()
    stop, published = threading.Event(), [0]
    names = ["bench", *other_queues(args.queues)]
    publisher = threading.Thread(
        target=publish_at, args=(conn, args.wakeup_rate, names, stop, published)
    )
    if mode == "woken":
        publisher.start()
    try:
        wait_until(lambda: counted(conn) >= args.jobs, DEADLINE, "the drain", poll=0.01)
    finally:
        stop.set()
        if publisher.is_alive():
            publisher.join()
    seconds = time.monotonic() - started
    cpu = procs.worker_cpu_seconds([capsules]) - cpu
    measured = args.jobs - done
    return Run(measured / seconds, cpu / measured * 1e6, published[0] / measured)


def counted(conn: redis_py.Redis) -> int:
    return int(conn.get(COUNTER) or 0)


def other_queues(count: int) -> list[str]:
    """The empty queues the capsules list beside ``bench`` (``--queues`` in all)."""
    return [f"other{n:05d}" for n in range(1, count)]


def publish_at(
    conn: redis_py.Redis,
    rate: float,
    names: list[str],
    stop: threading.Event,
    published: list[int],
) -> None:
    """Publish wake-ups at ``rate`` a second, 50 per round trip, naming ``names`` in
    turn (a busy queue's pushes, or pushes spread over many queues)."""
    pipe = conn.pipeline(transaction=False)
    started = time.monotonic()
    turn = 0
    while not stop.is_set():
        for _ in range(50):
            pipe.publish(CHANNEL, names[turn % len(names)])
            turn += 1
        pipe.execute()
        published[0] += 50
        ahead = published[0] / rate - (time.monotonic() - started)
        if ahead > 0:
            stop.wait(ahead)


def subscribed(conn: redis_py.Redis) -> int:
    return int(dict(conn.pubsub_numsub(CHANNEL)).get(CHANNEL.encode(), 0))


def wake_ups_heard(url: str, args: argparse.Namespace) -> None:
    checkouts: list[tuple[str, Path | None]] = [("this", None)]
    if args.compare:
        checkouts.append(("other", Path(args.compare).resolve()))
    results: dict[tuple[str, str], list[Run]] = defaultdict(list)
    for number in range(args.rounds):
        for mode in ("quiet", "woken"):
            order = checkouts if number % 2 == 0 else checkouts[::-1]
            for name, root in order:
                before = cpu_ticks()
                run = drain_run(url, args, mode, root)
                results[(mode, name)].append(run)
                load = machine_load(before)
                print(f"round {number + 1}  {mode:5s} {name:5s}: {run_line(run)}; {load}")
    print()
    for name, _ in checkouts:
        quiet, woken = (median_run(results[(mode, name)]) for mode in ("quiet", "woken"))
        extra = (woken.capsule_us - quiet.capsule_us) / woken.heard if woken.heard else 0.0
        print(f"  quiet {name:5s} median: {run_line(quiet)}")
        print(f"  woken {name:5s} median: {run_line(woken)}")
        print(f"        {name:5s}: {extra:.1f} us of capsule CPU per wake-up heard by each process")
    if args.chart:
        draw_chart(results, Path(args.chart), args)


def draw_chart(
    results: dict[tuple[str, str], list[Run]], png: Path, args: argparse.Namespace
) -> None:
    """Each drain as a bar (median, min-max): this checkout's in limitd's colour."""
    labels = {"quiet": "quiet", "woken": f"{args.wakeup_rate:,.0f} wake-ups/s"}
    bars = []
    for (mode, name), runs in results.items():
        rates = [run.drain_rate for run in runs]
        who = "limitd" if name == "this" else "before (--compare)"
        bars.append(
            {
                "name": f"{who}: {labels[mode]}",
                "median": statistics.median(rates),
                "min": min(rates),
                "max": max(rates),
            }
        )
    named = "the busy queue" if args.queues == 1 else f"{args.queues:,} queues in turn"
    data = {
        "title": f"{args.jobs:,} jobs, limitd start {args.processes} x 10, wake-ups naming {named}",
        "xlabel": "drain, first job to last, jobs/s (median of rounds; bars: min-max)",
        "systems": bars,
    }
    draw_bars(data, png)
    print(f"chart: {png}")


def median_run(runs: list[Run]) -> Run:
    return Run(*(statistics.median(getattr(r, f) for r in runs) for f in Run.__dataclass_fields__))


def run_line(run: Run) -> str:
    return (
        f"drain {run.drain_rate:7,.0f} jobs/s, capsules {run.capsule_us:5.1f} us CPU/job, "
        f"{run.heard:4.2f} wake-ups heard per job"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--jobs", type=int, default=40_000)
    parser.add_argument("--processes", type=int, default=2)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--messages", type=int, default=50_000)
    parser.add_argument("--wakeup-rate", type=float, default=10_000.0, help="per second")
    parser.add_argument(
        "--queues",
        type=int,
        default=1,
        help="queues the capsules list (the others empty) and the wake-ups name in turn",
    )
    parser.add_argument("--compare", help="another checkout's root, alternated with this one")
    parser.add_argument("--chart", help="draw the drains into this PNG")
    parser.add_argument("--redis", help="Redis URL (default: a private redis-server)")
    parser.add_argument("--skip-listener", action="store_true", help="leave out part 1")
    args = parser.parse_args()
    with bench_redis_url(args.redis) as url:
        if not args.skip_listener:
            print("1. The listener alone")
            thread = threading.Thread(target=listener_alone, args=(url, args))
            thread.start()
            thread.join()
        print(f"\n2. {args.jobs:,} jobs, limitd start {args.processes} x 10")
        wake_ups_heard(url, args)


if __name__ == "__main__":
    main()
