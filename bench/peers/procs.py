"""Worker processes, each the leader of its own process group, so that stopping a system
also stops every process it forked (prefork children, work horses, capsules)."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import time
from pathlib import Path
from typing import IO

GRACE_SECONDS = 5.0


def start_group(
    command: list[str], *, cwd: Path, env: dict[str, str], log: IO[bytes]
) -> subprocess.Popen[bytes]:
    """Start ``command`` in a new session (its pid is the group id)."""
    return subprocess.Popen(
        command, cwd=cwd, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True
    )


def _signal_group(proc: subprocess.Popen[bytes], signum: int) -> None:
    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, signum)


def stop_groups(procs: list[subprocess.Popen[bytes]]) -> None:
    """TERM every group, give the leaders a few seconds, then KILL the groups whatever
    happened: nothing started by a run may outlive it."""
    for proc in procs:
        _signal_group(proc, signal.SIGTERM)
    deadline = time.monotonic() + GRACE_SECONDS
    for proc in procs:
        with contextlib.suppress(subprocess.TimeoutExpired):
            proc.wait(max(0.0, deadline - time.monotonic()))
    for proc in procs:
        _signal_group(proc, signal.SIGKILL)
        proc.wait()


def exited(procs: list[subprocess.Popen[bytes]]) -> subprocess.Popen[bytes] | None:
    """A worker that exited on its own (a crash), if any."""
    return next((proc for proc in procs if proc.poll() is not None), None)
