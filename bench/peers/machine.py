"""What the figures depend on besides the code: CPU, cores, Redis, versions. Printed at
the start of a run and at the top of RESULTS.md."""

from __future__ import annotations

import importlib.metadata
import os
import platform
import subprocess
import time
from datetime import datetime, timezone
from pathlib import Path

import redis as redis_py
from systems.base import PEERS_BIN, System
from systems.sidekiq_system import version as sidekiq_version

# Hand-offs a wake-up probe times (each way of a pipe round trip counts one).
WAKEUP_ROUNDS = 5_000
HALT_POLL = Path("/sys/module/haltpoll/parameters/guest_halt_poll_ns")

PEER_PACKAGES = ["celery", "kombu", "rq", "dramatiq", "arq", "huey", "saq", "redis", "hiredis"]


def cpu_model() -> str:
    for line in Path("/proc/cpuinfo").read_text().splitlines():
        if line.startswith("model name"):
            return line.split(":", 1)[1].strip()
    return platform.processor() or "unknown"


def peer_versions() -> str:
    """Read in the peers' venv, where they are installed."""
    code = (
        "import importlib.metadata as m, sys\n"
        "print(', '.join(f'{n} {m.version(n)}' for n in sys.argv[1:]))"
    )
    out = subprocess.run(
        [str(PEERS_BIN / "python"), "-c", code, *PEER_PACKAGES],
        capture_output=True,
        text=True,
        check=True,
    )
    return out.stdout.strip()


def ruby_version() -> str:
    out = subprocess.run(["ruby", "-v"], capture_output=True, text=True, check=False)
    return out.stdout.split("(")[0].strip()


def versions(systems: list[System]) -> str:
    """limitd, the peers' packages, and Ruby Sidekiq when it runs."""
    line = (
        f"limitd {importlib.metadata.version('limitd')} (project venv, redis-py "
        f"{redis_py.__version__}); peers' venv: {peer_versions()}"
    )
    if any(s.name.startswith("sidekiq") for s in systems):
        line += f"; Ruby Sidekiq {sidekiq_version()} ({ruby_version()})"
    return line


def _pong(read_fd: int, write_fd: int, cpu: int, rounds: int) -> None:
    """The far end of the probe: answer each byte, on CPU ``cpu``."""
    os.sched_setaffinity(0, {cpu})
    for _ in range(rounds):
        os.read(read_fd, 1)
        os.write(write_fd, b"x")


def wakeup_us(cpus: tuple[int, int], rounds: int = WAKEUP_ROUNDS) -> float:
    """Microseconds to wake a sleeping process: two processes pass a byte back and forth
    through pipes, each blocked in read until the other writes, pinned to ``cpus``.

    Every job system here sleeps and wakes around each job or call (a worker thread
    waiting for its reply, a lock handed to the next thread), and what one wake-up costs
    is a property of the machine, not of the code: on a virtual machine whose idle vCPUs
    halt at once (guest halt polling off), waking a process on the other CPU goes
    through the hypervisor and can cost ten times a wake-up on the same CPU. Printed
    with every run beside the steal and the load: one of the things about a machine
    that moves every system's figures (not the only one: see the thirteenth session on
    docs/benchmarks.md)."""
    to_far, from_near = os.pipe()
    to_near, from_far = os.pipe()
    pid = os.fork()
    if pid == 0:  # pragma: no cover - the child process
        try:
            _pong(to_far, from_far, cpus[1], rounds + 1)
        finally:
            os._exit(0)
    before = os.sched_getaffinity(0)
    try:
        os.sched_setaffinity(0, {cpus[0]})
        os.write(from_near, b"x")  # the first round wakes both up, untimed
        os.read(to_near, 1)
        started = time.perf_counter()
        for _ in range(rounds):
            os.write(from_near, b"x")
            os.read(to_near, 1)
        return 1e6 * (time.perf_counter() - started) / (2 * rounds)
    finally:
        os.sched_setaffinity(0, before)
        os.waitpid(pid, 0)
        for fd in (to_far, from_near, to_near, from_far):
            os.close(fd)


def wakeups() -> str:
    """The wake-up probe across two CPUs and on one, and the guest halt polling (see
    ``wakeup_us``)."""
    cpus = sorted(os.sched_getaffinity(0))
    across = f"{wakeup_us((cpus[0], cpus[-1])):.1f} us across CPUs, " if len(cpus) > 1 else ""
    line = f"{across}{wakeup_us((cpus[0], cpus[0])):.1f} us on one CPU"
    if HALT_POLL.exists():
        line += f"; guest halt polling {HALT_POLL.read_text().strip()} ns"
    return line + f"; kernel {platform.release()}"


def describe(
    conn: redis_py.Redis, systems: list[System], *, jobs: int, runs: int, deadline: float
) -> list[str]:
    """Markdown bullet lines describing this run's machine and parameters."""
    redis_version = conn.info("server")["redis_version"]
    return [
        f"- Date: {datetime.now(timezone.utc):%Y-%m-%d %H:%M} UTC",
        f"- CPU: {cpu_model()}, {os.cpu_count()} cores; Python {platform.python_version()}",
        f"- Redis: redis-server {redis_version}, private to the run (no persistence), "
        "one database per system, FLUSHDB before and after each run",
        f"- Jobs per run: {jobs:,} (fewer where the table says so); runs per system: {runs}, "
        f"alternated (A B C ... A B C ...); deadline {deadline:.0f} s per enqueue or drain",
        f"- Versions: {versions(systems)}",
        f"- Waking a sleeping process (a pipe ping-pong, bench/peers/machine.py): {wakeups()}",
    ]
