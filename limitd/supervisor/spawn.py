"""How the supervisor makes a capsule process: forked, or forked then re-executed.

A plain fork is the usual way: the supervisor imported the app before forking, so a
child shares that memory copy-on-write and starts at once. It also shares the code: a
fork made after a deploy still runs the modules the supervisor imported at start. A
rolling restart needs processes that import the app anew, so for those the fork execs a
fresh Python (:class:`FreshStart`: the command and the settings it needs to rebuild its
configuration), which reports on a pipe when its capsule runs.

Signals the child will handle stay blocked across the fork (and the exec), so one sent
to a child still starting waits for the child's own handlers instead of reaching the
copy of the supervisor's it inherited, or the default action of a fresh interpreter.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import signal
import sys
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from enum import Enum
from pathlib import Path
from typing import Any

from limitd.config import CapsuleConfig
from limitd.supervisor.signals import block, die_with_parent, set_blocked, unblock

log = logging.getLogger("limitd.supervisor")

EX_SOFTWARE = 70
FRESH_ENV = "LIMITD_FRESH_CAPSULE"  # JSON: what a re-executed child needs to know
READY = b"R"


@dataclass
class Child:
    """One capsule copy: the config it runs, and its current process, if any.
    ``fresh``: its processes import the app anew (it was replaced in a rolling restart,
    so a fork of the supervisor would bring back the old code)."""

    slot: str
    config: CapsuleConfig
    max_memory_mb: int | None = None
    pid: int = 0
    started: float = 0.0
    crashes: int = 0
    restart_at: float = 0.0
    recycling: bool = False
    fresh: bool = False
    ready_fd: int = -1  # read end of the readiness pipe of a process still starting


@dataclass(frozen=True)
class FreshStart:
    """A process that imports the app anew: ``command`` runs ``limitd.commands.fresh``,
    which rebuilds the configuration from ``settings`` (JSON-able: the files, the
    command-line flags, the Redis URL, a digest of the supervisor's configuration)."""

    command: list[str]
    settings: Mapping[str, Any] = field(default_factory=dict)


def fork_child(run: Callable[[], int], handled: Iterable[signal.Signals]) -> int:
    """Fork a child that runs ``run`` and exits with its code; the child's pid."""
    parent = os.getpid()
    handled = list(handled)
    block(handled)
    pid = os.fork()
    if pid == 0:
        code = EX_SOFTWARE
        try:
            signal.signal(signal.SIGCHLD, signal.SIG_DFL)
            signal.pthread_sigmask(signal.SIG_UNBLOCK, [signal.SIGCHLD])
            die_with_parent()
            if os.getppid() == parent:  # else the supervisor died before prctl
                code = run()
        except BaseException:
            log.exception("capsule process crashed")
        finally:
            os._exit(code)
    unblock(handled)
    return pid


def exec_fresh(
    fresh: FreshStart,
    child: Child,
    handled: Iterable[signal.Signals],
    child_handled: Iterable[signal.Signals],
) -> int:
    """Fork, then exec ``fresh.command`` for ``child``'s capsule; its pid. The new
    process writes :data:`READY` on a pipe once its capsule runs: ``child.ready_fd`` is
    the read end (non-blocking, see :func:`ready_state`)."""
    read_end, write_end = os.pipe()
    os.set_blocking(read_end, False)
    env = dict(os.environ)
    env[FRESH_ENV] = json.dumps(
        {
            **fresh.settings,
            "capsule": child.config.name,
            "capsule_id": child.config.capsule_id,
            "process_number": child.config.process_number,
            "process_count": child.config.process_count,
            "ready_fd": write_end,
            "supervisor": os.getpid(),
        }
    )
    handled, child_handled = list(handled), list(child_handled)
    block(handled)
    pid = os.fork()
    if pid == 0:
        try:
            os.close(read_end)
            os.set_inheritable(write_end, True)
            set_blocked(child_handled)  # until the new process's own handlers are set
            die_with_parent()  # the kernel's part survives the exec
            os.execve(fresh.command[0], fresh.command, env)
        finally:
            os._exit(EX_SOFTWARE)
    unblock(handled)
    os.close(write_end)
    child.ready_fd = read_end
    return pid


class Readiness(Enum):
    STARTING = "starting"
    READY = "ready"
    SILENT = "silent"  # closed its end without saying ready: it failed or exits


def ready_state(fd: int) -> Readiness:
    try:
        data = os.read(fd, 1)
    except BlockingIOError:
        return Readiness.STARTING
    return Readiness.READY if data == READY else Readiness.SILENT


def close_ready(child: Child) -> None:
    if child.ready_fd >= 0:
        with contextlib.suppress(OSError):
            os.close(child.ready_fd)
        child.ready_fd = -1


def report_ready(fd: int) -> None:
    """In the new process: its capsule runs (threads fetching, first record written)."""
    with contextlib.suppress(OSError):
        os.write(fd, READY)
        os.close(fd)


def python_command(module: str) -> list[str]:
    """The command that runs ``module`` with this interpreter and its flags."""
    return [sys.executable, *_interpreter_flags(), "-m", module]


def _interpreter_flags() -> list[str]:
    flags = []
    for name, value in sys._xoptions.items():
        flags += ["-X", name if value is True else f"{name}={value}"]
    return flags + [f"-W{option}" for option in sys.warnoptions]


def rss_mb(pid: int) -> float | None:
    """Resident memory of a process in MB (Linux /proc), or None if unknown."""
    try:
        pages = int(Path(f"/proc/{pid}/statm").read_text().split()[1])
    except (OSError, ValueError, IndexError):
        return None
    return pages * os.sysconf("SC_PAGE_SIZE") / 1024 / 1024


def describe(status: int) -> str:
    if os.WIFSIGNALED(status):
        return f"killed by {signal.Signals(os.WTERMSIG(status)).name}"
    return f"exit code {os.waitstatus_to_exitcode(status)}"
