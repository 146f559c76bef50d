"""Where a draining capsule's time goes (issue 33): py-spy samples one ``limitd start``
capsule while it drains jobs, and this prints the share of each part of a job's path
and writes a flame graph.

    .venv/bin/python bench/profile_capsule.py [--work noop|async] [--seconds 8]
        [--jobs 200000] [--queues 1] [--all-threads] [--loop uvloop]
        [--svg docs/img/capsule-flame.svg]

``--work noop`` (the default): the peers' no-op job (bench/peers/apps/limitd_app.py, an
INCR through ``limitd.redis_client()``), one capsule process of 10 threads on the limit
fetch with a non-binding limit, as ``limitd-1`` in bench/peers/run.py. ``--work async``:
bench/async_apps' job that awaits 100 ms, ``async_concurrency: 1000``, as
``limitd-async`` in bench/async_io.py. ``--queues N`` (noop only) lists N queues
instead of one, each with the same non-binding limit, and spreads the jobs evenly over
them, as bench/fetch_scale.py does: where the capsule's time goes when each fetch call
meets many shallow queues (issue 32).

The jobs are enqueued first; once the capsule has run some, py-spy (``pip install
py-spy``; not a dependency of limitd) samples it for ``--seconds`` at 250 Hz. By default
it samples only the thread holding the GIL (``--gil``): a capsule of ten threads runs
one at a time, so that is where its Python time goes; ``--all-threads`` samples every
thread that is not idle instead. Printed: the capsule's CPU per job over the window
(from /proc, py-spy's own reads included), the share of samples per part of the path
(the first rule of ``PARTS`` that a sample's stack matches), and the lines most often on
top of the stack. The flame graph is an SVG drawn here from the same samples, coloured
by part.
"""

from __future__ import annotations

import argparse
import html
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import redis as redis_py

HERE = Path(__file__).resolve().parent
sys.path[:0] = [str(HERE), str(HERE / "peers" / "apps"), str(HERE / "async_apps")]

from _common import children, limitd_started, wait_until  # noqa: E402

from limitd.connection.embedded import RedisServer  # noqa: E402

COUNTER_KEY = "bench:done"  # bench/peers/apps/bench_counter.py's, which both jobs count in
RATE = 250  # samples a second
WORK_CONFIG = {
    "noop": (
        "require: [limitd_app]\nqueues: [bench]\nconcurrency: 10\nprocesses: 1\n"
        "fetch: limit\nlimits: {bench: 1000}\n"
    ),
    "async": (
        "require: [limitd_io_app]\nqueues: [io]\nconcurrency: 10\nprocesses: 1\n"
        "async_concurrency: 1000\n"
    ),
}

LANE_METHODS = ("take_fetched", "submit", "_take_inbox", "_start", "_run", "_slot_freed")

# A sample belongs to the first part whose test matches its stack (frame names, root
# first). Names are "Class.method (file)" as py-spy gives them.
Test = Callable[[list[str]], bool]


def has(*names: str) -> Test:
    return lambda stack: any(frame.startswith(names) for frame in stack)


def on_top(*names: str) -> Test:
    return lambda stack: bool(stack) and stack[-1].startswith(names)


PARTS: list[tuple[str, Test]] = [
    ("the job itself (its INCR, its await)", has("noop ", "wait_io ")),
    ("the fetch call: its arguments, the round trip, the reply", has("LimitFetch.take ")),
    ("decoding the payload", has("parse (limitd/payload.py", "JobExecutor._admit ")),
    ("server middleware and the executor around the job", has("ServerChain.", "JobExecutor.")),
    (
        "the async lane: handing jobs to the loop, starting and ending their tasks",
        has(*(f"AsyncLane.{name} " for name in LANE_METHODS)),
    ),
    ("handing fetched jobs to waiting processors", has("Dispatcher._serve ")),
    ("a processor waiting for its lock (woken with a job)", on_top("Dispatcher._wait ")),
    (
        "the dispatch: passing the next call on (the yield), waiting, its bookkeeping",
        has("Dispatcher."),
    ),
    # asyncio's loop is Python; uvloop's is C, on top in the loop thread's own frame.
    (
        "the event loop: tasks, timers, callbacks",
        lambda stack: (
            has("BaseEventLoop.", "Handle._run ")(stack) or on_top("AsyncLane._run_loop ")(stack)
        ),
    ),
]
OTHER = "everything else"
COLOURS = [
    "#e8743b",
    "#3b8ee8",
    "#9b59b6",
    "#2ecc71",
    "#f1c40f",
    "#e74c3c",
    "#1abc9c",
    "#34495e",
    "#95a5a6",
    "#d35400",
]


@dataclass
class Profile:
    """py-spy's raw samples: stacks (root first, ``name (file)`` frames) and counts."""

    stacks: Counter[tuple[str, ...]] = field(default_factory=Counter)
    tops: Counter[str] = field(default_factory=Counter)  # "name (file:line)" on top

    @property
    def total(self) -> int:
        return sum(self.stacks.values())

    @classmethod
    def read(cls, path: Path) -> Profile:
        profile = cls()
        for line in path.read_text().splitlines():
            stack, _, count = line.rpartition(" ")
            if not stack:
                continue
            frames = [short(frame) for frame in stack.split(";")[1:]]  # [0]: the thread
            if not frames:
                continue
            profile.stacks[tuple(re.sub(r":\d+\)$", ")", f) for f in frames)] += int(count)
            profile.tops[frames[-1]] += int(count)
        return profile

    def parts(self) -> Counter[str]:
        shares: Counter[str] = Counter()
        for stack, count in self.stacks.items():
            shares[part_of(list(stack))] += count
        return shares


def short(frame: str) -> str:
    """A frame without the site-packages and checkout prefixes of its file."""
    return re.sub(r"\(/\S*?/(site-packages|work/main|bench/[a-z_]+)/", "(", frame)


def part_of(stack: list[str]) -> str:
    for label, test in PARTS:
        if test(stack):
            return label
    return OTHER


# The flame graph.

WIDTH, ROW = 1200, 17


def flame_svg(profile: Profile, title: str) -> str:
    """An SVG flame graph: a frame's width is its share of the samples; callers below."""
    tree: dict = {}  # frame -> [samples, callees, the parts of its samples]
    for stack, count in profile.stacks.items():
        node, part = tree, part_of(list(stack))
        for frame in stack:
            entry = node.setdefault(frame, [0, {}, Counter()])
            entry[0] += count
            entry[2][part] += count
            node = entry[1]
    depth = max((len(stack) for stack in profile.stacks), default=1)
    height = (depth + 3) * ROW
    colour = {label: COLOURS[i % len(COLOURS)] for i, (label, _) in enumerate(PARTS)}
    colour[OTHER] = "#bbbbbb"
    shared = "#dddddd"  # a frame whose samples fall in several parts (the threads' base)
    rects: list[str] = []
    scale = WIDTH / max(1, profile.total)

    def draw(node: dict, x: float, level: int) -> None:
        for frame, (count, kids, parts) in sorted(node.items()):
            width = count * scale
            label = next(iter(parts)) if len(parts) == 1 else "several parts"
            if width >= 0.3:
                y = height - (level + 2) * ROW
                tip = html.escape(f"{frame}: {100 * count / profile.total:.1f}% ({label})")
                text = html.escape(frame[: int(width / 7)]) if width > 35 else ""
                rects.append(
                    f'<g><title>{tip}</title><rect x="{x:.1f}" y="{y}" width="{width:.1f}" '
                    f'height="{ROW - 1}" fill="{colour.get(label, shared)}"/>'
                    f'<text x="{x + 3:.1f}" y="{y + ROW - 5}">{text}</text></g>'
                )
            draw(kids, x, level + 1)
            x += width

    draw(tree, 0.0, 0)
    shares = profile.parts()
    present = [label for label in colour if shares[label]]  # the legend: parts sampled
    legend = "".join(
        f'<rect x="{10 + 600 * (i % 2)}" y="{24 + ROW * (i // 2)}" width="10" height="10" '
        f'fill="{colour[label]}"/><text x="{24 + 600 * (i % 2)}" y="{33 + ROW * (i // 2)}">'
        f"{html.escape(label)}</text>"
        for i, label in enumerate(present)
    )
    top = 30 + ROW * ((len(present) + 1) // 2)
    return (
        f'<svg xmlns="http://www.w3.org/2000/svg" width="{WIDTH}" height="{height + top}" '
        f'font-family="monospace" font-size="11">'
        f'<text x="10" y="15" font-size="13">{html.escape(title)}</text>{legend}'
        f'<g transform="translate(0,{top})">{"".join(rects)}</g></svg>\n'
    )


# The run.


def py_spy() -> str:
    found = shutil.which("py-spy") or str(Path(sys.executable).parent / "py-spy")
    if not Path(found).exists():
        sys.exit("py-spy not found: pip install py-spy (into this venv)")
    return found


def queue_config(count: int) -> str:
    """The noop work's config over ``count`` queues (fetch_scale.py's names), each with
    the non-binding limit of the one-queue config."""
    import fetch_scale

    names = fetch_scale.queue_names(count)
    limits = ", ".join(f"{name}: 1000" for name in names)
    return (
        WORK_CONFIG["noop"]
        .replace("queues: [bench]", f"queues: [{', '.join(names)}]")
        .replace("limits: {bench: 1000}", f"limits: {{{limits}}}")
    )


def enqueue(url: str, work: str, jobs: int, queues: int) -> None:
    import limitd

    limitd.set_default_client(limitd.Client(redis_py.Redis.from_url(url)))
    if queues > 1:
        import fetch_scale

        fetch_scale.enqueue(fetch_scale.queue_names(queues), jobs)
    elif work == "noop":
        import limitd_app

        limitd_app.noop.perform_bulk([[i] for i in range(jobs)], batch_size=1000)
    else:
        import limitd_io_app

        limitd_io_app.wait_io.perform_bulk([[i] for i in range(jobs)], batch_size=1000)


def cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def profile_capsule(args: argparse.Namespace, raw: Path) -> tuple[float, float]:
    """Run the drain and sample it into ``raw``: the capsule's CPU per job (us) and the
    jobs a second over the window."""
    server = RedisServer()
    server.start()
    try:
        conn = redis_py.Redis.from_url(server.url)
        enqueue(server.url, args.work, args.jobs, args.queues)
        with tempfile.TemporaryDirectory() as tmp:
            conf = Path(tmp) / "profile.yml"
            conf.write_text(
                f"redis:\n  url: {server.url}\nlogging:\n  level: WARNING\n"
                + (queue_config(args.queues) if args.queues > 1 else WORK_CONFIG[args.work])
                + (f"async_loop: {args.loop}\n" if args.loop != "asyncio" else "")
            )
            env = dict(os.environ, BENCH_REDIS_URL=server.url)
            # (A PYTHONPATH given, a checkout of another commit say, stays first.)
            env["PYTHONPATH"] = os.pathsep.join(
                [*env.get("PYTHONPATH", "").split(os.pathsep), *sys.path[:3]]
            ).strip(os.pathsep)
            with limitd_started(conf, env) as proc:
                wait_until(
                    lambda: int(conn.get(COUNTER_KEY) or 0) > args.jobs // 20, 120, "the first jobs"
                )
                [capsule] = children(proc.pid)
                done, cpu = int(conn.get(COUNTER_KEY) or 0), cpu_seconds(capsule)
                started = time.monotonic()
                command = [
                    py_spy(),
                    "record",
                    "--pid",
                    str(capsule),
                    "--rate",
                    str(RATE),
                    "--duration",
                    str(args.seconds),
                    "--format",
                    "raw",
                    "--nonblocking",
                    "-o",
                    str(raw),
                ]
                if not args.all_threads:
                    command.append("--gil")
                subprocess.run(command, check=True, capture_output=True)
                done = int(conn.get(COUNTER_KEY) or 0) - done
                cpu = cpu_seconds(capsule) - cpu
                window = time.monotonic() - started
        if int(conn.get(COUNTER_KEY) or 0) >= args.jobs:
            print("warning: the jobs ran out during the window; raise --jobs", file=sys.stderr)
        return 1e6 * cpu / max(1, done), done / window
    finally:
        server.stop()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--work", choices=sorted(WORK_CONFIG), default="noop")
    parser.add_argument("--seconds", type=int, default=8, help="sampling window (8)")
    parser.add_argument("--jobs", type=int, default=200_000, help="jobs enqueued (200000)")
    parser.add_argument("--all-threads", action="store_true", help="not only the GIL's")
    parser.add_argument(
        "--loop", choices=("asyncio", "uvloop"), default="asyncio", help="async_loop (asyncio)"
    )
    parser.add_argument(
        "--queues", type=int, default=1, help="noop jobs spread over this many queues (1)"
    )
    parser.add_argument("--svg", type=Path, help="write the flame graph here")
    parser.add_argument("--raw", type=Path, help="keep py-spy's raw samples here")
    args = parser.parse_args()
    if args.queues > 1 and args.work != "noop":
        parser.error("--queues is for --work noop")
    raw = args.raw or Path(tempfile.gettempdir()) / f"limitd-profile-{os.getpid()}.txt"
    started = time.time()
    cpu_per_job, rate = profile_capsule(args, raw)
    profile = Profile.read(raw)
    if not args.raw:
        raw.unlink()
    what = "every busy thread" if args.all_threads else "the thread holding the GIL"
    spread = f" over {args.queues:,} queues" if args.queues > 1 else ""
    print(
        f"{args.work}{spread}: {rate:,.0f} jobs/s over the window, capsule CPU {cpu_per_job:.0f} "
        f"us/job; {profile.total} samples of {what}"
    )
    print("\n| part of the path | share |\n|---|---:|")
    for label, count in profile.parts().most_common():
        print(f"| {label} | {100 * count / profile.total:.0f}% |")
    print("\n| on top of the stack | share |\n|---|---:|")
    for frame, count in profile.tops.most_common(10):
        print(f"| `{frame}` | {100 * count / profile.total:.1f}% |")
    if args.svg:
        title = (
            f"limitd capsule, {args.work} jobs, {what}: {profile.total} samples, {rate:,.0f} jobs/s"
        )
        args.svg.write_text(flame_svg(profile, title))
        print(f"\nflame graph: {args.svg}")
    print(f"whole run: {time.time() - started:.0f} s")


if __name__ == "__main__":
    main()
