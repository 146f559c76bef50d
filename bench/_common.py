"""Helpers shared by the benchmarks: a Redis to run against, counting the commands it
served (INFO commandstats), and timing one capsule draining a known number of jobs."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import redis as redis_py

from limitd.connection.embedded import RedisServer
from limitd.supervisor import Capsule


def command_counts(conn: redis_py.Redis) -> Counter[str]:
    """Calls served so far, per command, leaving out the INFO calls that read them."""
    stats = conn.info("commandstats")
    return Counter(
        {
            name.removeprefix("cmdstat_"): int(value["calls"])
            for name, value in stats.items()
            if name != "cmdstat_info"
        }
    )


def redis_cpu_seconds(conn: redis_py.Redis) -> float:
    """Seconds of CPU the Redis server has used (user + system): a difference over a
    run is what the run cost Redis."""
    info = conn.info("cpu")
    return float(info["used_cpu_user"]) + float(info["used_cpu_sys"])


class RoundSignal:
    """Counts units of work done, from job threads to the bench's thread; a fresh
    semaphore each round, so nothing carries over."""

    semaphore = threading.Semaphore(0)

    @classmethod
    def reset(cls) -> None:
        cls.semaphore = threading.Semaphore(0)


def wait_until(
    condition: Callable[[], object], timeout: float, what: str, poll: float = 0.05
) -> None:
    """Poll ``condition`` until it holds; RuntimeError naming ``what`` after ``timeout``."""
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise RuntimeError(f"timed out waiting for {what}")
        time.sleep(poll)


def command_calls(conn: redis_py.Redis) -> int:
    return sum(command_counts(conn).values())


@contextmanager
def bench_redis_url(url: str | None) -> Iterator[str]:
    """``url``, or the URL of a private redis-server started for the run (for benchmarks
    that hand the URL to processes they start)."""
    if url is not None:
        yield url
        return
    server = RedisServer()
    server.start()
    try:
        yield server.url
    finally:
        server.stop()


@contextmanager
def redis_for_bench(url: str | None) -> Iterator[redis_py.Redis]:
    """A client on ``url``, or on a private redis-server started for the run."""
    with bench_redis_url(url) as bench_url:
        conn = redis_py.Redis.from_url(bench_url)
        try:
            yield conn
        finally:
            conn.close()


def timed_drain(
    conn: redis_py.Redis, capsule: Capsule, done: threading.Semaphore, jobs: int
) -> tuple[float, int]:
    """Start ``capsule`` and wait until its jobs released ``done`` ``jobs`` times. Returns
    the seconds and the Redis commands that took; the capsule is left running."""
    calls = command_calls(conn)
    started = time.perf_counter()
    capsule.start()
    for _ in range(jobs):
        done.acquire()
    return time.perf_counter() - started, command_calls(conn) - calls


# The machine: CPU steal and load over a run.


def cpu_ticks() -> tuple[int, int]:
    """(steal, total) ticks of all CPUs so far, from /proc/stat; (0, 0) without it."""
    try:
        with open("/proc/stat") as stat:
            fields = [int(value) for value in stat.readline().split()[1:]]
    except (OSError, ValueError):
        return 0, 0
    # user nice system idle iowait irq softirq steal [guest guest_nice, inside user/nice]
    return (fields[7] if len(fields) > 7 else 0), sum(fields[:8])


@dataclass(frozen=True)
class MachineLoad:
    steal: float  # share of all CPU time stolen by the hypervisor over the run
    load: float  # 1-minute load average at its end

    def __str__(self) -> str:
        return f"steal {self.steal:.1%}, load {self.load:.1f}"


def machine_load(before: tuple[int, int]) -> MachineLoad:
    """Steal and load since ``before`` (a ``cpu_ticks()``): every bench prints them per run,
    so a run far off its quiet figure shows why."""
    steal, total = cpu_ticks()
    spent = total - before[1]
    return MachineLoad((steal - before[0]) / spent if spent > 0 else 0.0, os.getloadavg()[0])


# ``limitd start`` as a benchmark runs it.


@contextmanager
def limitd_started(conf: Path, env: dict[str, str]) -> Iterator[subprocess.Popen[bytes]]:
    """``limitd start conf`` (this interpreter's limitd, in the config's folder), stopped
    with TERM at the end; a capsule that outlives its supervisor is killed."""
    command = [sys.executable, "-m", "limitd.cli", "start", str(conf)]
    proc = subprocess.Popen(command, cwd=conf.parent, env=env, stdout=subprocess.DEVNULL)
    try:
        yield proc
    finally:
        stop_limitd(proc)


def stop_limitd(proc: subprocess.Popen[bytes]) -> None:
    """TERM the supervisor and wait for it and its children; KILL what outlives 60 s."""
    capsules = children(proc.pid) if proc.poll() is None else []
    proc.terminate()
    try:
        proc.wait(60)
    except subprocess.TimeoutExpired:
        print("limitd start ignored TERM for 60 s: killed", file=sys.stderr)
        proc.kill()
        proc.wait()
    for pid in capsules:
        if Path(f"/proc/{pid}").exists():
            print(f"capsule {pid} outlived its supervisor: killed", file=sys.stderr)
            os.kill(pid, signal.SIGKILL)


def children(pid: int) -> list[int]:
    """``pid``'s child processes, from /proc/<pid>/task/*/children."""
    found: list[int] = []
    for task in Path(f"/proc/{pid}/task").iterdir():
        try:
            found += [int(child) for child in (task / "children").read_text().split()]
        except OSError:
            continue
    return found


def tree_cpu_seconds(pid: int) -> float:
    """CPU (user + sys) used so far by ``pid`` and its children (a supervisor and its
    capsules): a difference over a run is what the run cost them."""
    ticks = 0
    for member in [pid, *children(pid)]:
        try:
            text = Path(f"/proc/{member}/stat").read_text()
        except OSError:
            continue  # gone meanwhile
        fields = text[text.rfind(")") + 2 :].split()
        ticks += int(fields[11]) + int(fields[12])  # utime stime
    return ticks / os.sysconf("SC_CLK_TCK")


def wait_subscribed(conn: redis_py.Redis, proc: subprocess.Popen[bytes], capsules: int) -> None:
    """Until ``capsules`` capsules listen for wake-ups (so they fetch pushes at once)."""

    def listening() -> bool:
        if proc.poll() is not None:
            raise RuntimeError(f"limitd start exited with {proc.returncode}")
        return dict(conn.pubsub_numsub("limitd:wake")).get(b"limitd:wake", 0) >= capsules

    wait_until(listening, 60, "the capsules' wake-up subscriptions")


# Charts.

PEERS_DIR = Path(__file__).resolve().parent / "peers"


def draw_bars(data: dict[str, object], png: Path) -> None:
    """A bar chart of ``data`` (bench/peers/chart.py's DATA.json: a title, the bars and
    optionally the x label), drawn by that script in the peers' venv, where matplotlib
    is installed (built first, on a machine that has none yet)."""
    if str(PEERS_DIR) not in sys.path:
        sys.path.append(str(PEERS_DIR))
    from peers_venv import ensure_peers_venv

    ensure_peers_venv()
    with tempfile.NamedTemporaryFile("w", suffix=".json", delete=False) as file:
        json.dump(data, file)
    try:
        chart = [str(PEERS_DIR / "chart.py"), file.name, str(png)]
        subprocess.run([str(PEERS_DIR / ".venv" / "bin" / "python"), *chart], check=True)
    finally:
        os.unlink(file.name)
