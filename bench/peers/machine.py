"""What the figures depend on besides the code: CPU, cores, Redis, versions. Printed at
the start of a run and at the top of RESULTS.md."""

from __future__ import annotations

import importlib.metadata
import os
import platform
import subprocess
from datetime import datetime, timezone
from pathlib import Path

import redis as redis_py
from systems.base import PEERS_BIN, System
from systems.sidekiq_system import version as sidekiq_version

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
    ]
