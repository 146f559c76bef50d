"""Ruby Sidekiq (Debian's ruby-sidekiq, 6.4 OSS): 1 and 2 ``sidekiq`` processes with
concurrency 10, logging at WARN. Enqueued by a Ruby script with
``Sidekiq::Client.push_bulk``; skipped when ruby or the gem is missing."""

from __future__ import annotations

import functools
import shutil
import subprocess
from collections.abc import Callable

from systems.base import APPS_DIR, QUEUE, Context, System

THREADS = 10


def enqueue_command(ctx: Context, jobs: int) -> list[str]:
    return ["ruby", str(APPS_DIR / "sidekiq_push.rb"), str(jobs)]


def workers(processes: int) -> Callable[[Context], list[list[str]]]:
    def commands(ctx: Context) -> list[list[str]]:
        command = ["sidekiq", "-r", str(APPS_DIR / "sidekiq_app.rb")]
        command += ["-c", str(THREADS), "-q", QUEUE, "-e", "production"]
        return [command] * processes

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


SYSTEMS = [
    System(
        name=f"sidekiq-{processes}",
        settings=(
            f"Ruby Sidekiq, {processes} process{'es' if processes > 1 else ''} x "
            f"concurrency {THREADS}, logger WARN"
        ),
        enqueue_api="Ruby Sidekiq::Client.push_bulk, 1000 per call",
        workers=workers(processes),
        enqueue_command=enqueue_command,
        missing=missing,
    )
    for processes in (1, 2)
]
