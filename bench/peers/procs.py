"""Worker processes, each the leader of its own process group, so that stopping a system
also stops every process it forked (prefork children, work horses, capsules), and the
CPU all of them used can be read by session id."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import time
from pathlib import Path
from typing import IO

GRACE_SECONDS = 5.0
CLOCK_TICKS = os.sysconf("SC_CLK_TCK")  # the unit of the CPU times in /proc/<pid>/stat


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


def _stat_fields(pid: str) -> list[str] | None:
    """The fields of /proc/<pid>/stat after the command name, so field n (1-based, as in
    proc(5)) is at index n - 3. The name is cut at the last ')' because it may itself
    hold spaces and parentheses. None when the process is gone (or /proc is not there)."""
    try:
        text = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    return text[text.rfind(")") + 2 :].split()


def worker_cpu_seconds(procs: list[subprocess.Popen[bytes]]) -> float:
    """CPU (user + sys) used so far by every process of the workers' sessions: each
    command is a session leader, so its pid is the session id of everything it forked
    (capsules, prefork children). Each member's cutime/cstime adds its children that
    already exited and were waited for (a reaped process is no longer in /proc, so
    nothing is counted twice). Call it before the groups are stopped."""
    leaders = {str(proc.pid) for proc in procs}
    ticks = 0
    try:
        pids = [name for name in os.listdir("/proc") if name.isdigit()]
    except OSError:
        return 0.0
    for pid in pids:
        fields = _stat_fields(pid)
        if fields is None or len(fields) < 15 or fields[3] not in leaders:
            continue
        ticks += sum(int(field) for field in fields[11:15])  # utime stime cutime cstime
    return ticks / CLOCK_TICKS
