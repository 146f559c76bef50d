"""Ruby Sidekiq (Debian's ruby-sidekiq, 6.4 OSS): 1 and 2 ``sidekiq`` processes with
concurrency 10, logging at WARN. Enqueued by a Ruby script with
``Sidekiq::Client.push_bulk``; skipped when ruby or the gem is missing.
``sidekiq-pinned-N`` starts process k under ``taskset -c`` on the k-th CPU this driver
may use, as limitd's ``cpu_affinity: 1`` places its capsules (limitd-pinned-N): Ruby's
threads pass its GVL to one another as CPython's pass the GIL. ``sidekiq-yjit-N`` runs
the same processes with Ruby's JIT on (``ruby --yjit``; Debian's Ruby 3.1 has it, off by
default): Sidekiq at its fastest on this Ruby, so that a ratio against it is not a ratio
against an interpreter left slow."""

from __future__ import annotations

import functools
import os
import shutil
import subprocess
from collections.abc import Callable

from systems.base import APPS_DIR, QUEUE, Context, System

THREADS = 10


def enqueue_command(ctx: Context, jobs: int) -> list[str]:
    return ["ruby", str(APPS_DIR / "sidekiq_push.rb"), str(jobs)]


def workers(
    processes: int, pinned: bool = False, yjit: bool = False
) -> Callable[[Context], list[list[str]]]:
    def commands(ctx: Context) -> list[list[str]]:
        sidekiq = ["ruby", "--yjit", shutil.which("sidekiq") or "sidekiq"] if yjit else ["sidekiq"]
        command = [*sidekiq, "-r", str(APPS_DIR / "sidekiq_app.rb")]
        command += ["-c", str(THREADS), "-q", QUEUE, "-e", "production"]
        if not pinned:
            return [command] * processes
        cpus = sorted(os.sched_getaffinity(0))
        return [["taskset", "-c", str(cpus[k % len(cpus)]), *command] for k in range(processes)]

    return commands


@functools.cache
def missing() -> str | None:
    """Ruby, the sidekiq command and the gem must all be there."""
    if not shutil.which("ruby") or not shutil.which("sidekiq"):
        return "ruby or sidekiq not installed (apt-get install -y ruby-sidekiq)"
    probe = subprocess.run(
        ["ruby", "-e", "require 'sidekiq'"], capture_output=True, check=False, timeout=60
    )
    if probe.returncode != 0:
        return "the sidekiq gem does not load (apt-get install -y ruby-sidekiq)"
    return None


def version() -> str:
    out = subprocess.run(
        ["ruby", "-e", "require 'sidekiq'; print Sidekiq::VERSION"],
        capture_output=True,
        text=True,
        check=False,
        timeout=60,
    )
    return out.stdout.strip() or "?"


def sidekiq_system(processes: int, variant: str = "", note: str = "", **options: bool) -> System:
    """Sidekiq with ``processes`` processes; ``variant`` names it (sidekiq-<variant>-N),
    ``note`` ends its settings line, ``options`` go to :func:`workers`."""
    return System(
        name=f"sidekiq-{variant}-{processes}" if variant else f"sidekiq-{processes}",
        settings=(
            f"Ruby Sidekiq, {processes} process{'es' if processes > 1 else ''} x "
            f"concurrency {THREADS}, logger WARN{note}"
        ),
        enqueue_api="Ruby Sidekiq::Client.push_bulk, 1000 per call",
        workers=workers(processes, **options),
        enqueue_command=enqueue_command,
        missing=missing,
    )


SYSTEMS = (
    [sidekiq_system(processes) for processes in (1, 2)]
    + [
        sidekiq_system(processes, "pinned", ", process k under taskset -c on CPU k", pinned=True)
        for processes in (1, 2)
    ]
    + [sidekiq_system(processes, "yjit", ", ruby --yjit", yjit=True) for processes in (1, 2)]
)
