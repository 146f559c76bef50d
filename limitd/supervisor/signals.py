"""Signal plumbing shared by the supervisor and its children.

Handlers only put the signal number on a queue (``SimpleQueue.put`` is safe inside a
handler); the main thread takes it off and acts, so no lock is ever taken inside a
handler. Signals stay blocked until the handlers are in place, so one arriving during
start-up is delivered late, never lost or handled by the default action.

Every signal an operator may send is handled or deliberately ignored with a log line,
since the default action of most (USR1, USR2, QUIT, ALRM, TTOU...) ends or stops the
process: a stray ``kill -USR2`` must not take the workers down. WINCH, URG and CONT are
left alone: their default already leaves the process running.
"""

from __future__ import annotations

import contextlib
import logging
import os
import queue
import signal
import threading
from collections.abc import Iterable
from types import FrameType

# Graceful stops. QUIT is not Sidekiq's, but how nginx, unicorn and puma are stopped.
STOP = (signal.SIGTERM, signal.SIGINT, signal.SIGQUIT)
# Sidekiq Enterprise's rolling restart: the supervisor replaces its processes.
ROLL = signal.SIGUSR2
# Nobody means these for limitd, and their default action would end (or stop) it.
IGNORED = (signal.SIGALRM, signal.SIGTTOU, signal.SIGVTALRM, signal.SIGPROF, signal.SIGIO)
# Sent to a child by the kernel when its supervisor dies (PR_SET_PDEATHSIG).
ORPHANED = signal.SIGUSR1
PR_SET_PDEATHSIG = 1
# What a capsule process handles (``launcher.py``); its supervisor handles these too.
CAPSULE_HANDLED = (
    *STOP,
    ORPHANED,
    signal.SIGTSTP,
    signal.SIGTTIN,
    signal.SIGHUP,
    ROLL,
    *IGNORED,
)
PARENT_CHECK_SECONDS = 1.0


class SignalQueue:
    """Signals received, in order, for the main loop to handle."""

    def __init__(self) -> None:
        self._queue: queue.SimpleQueue[int] = queue.SimpleQueue()
        self.stop_requested = False  # a stop is waiting: start-up may skip what is left

    def install(self, signals: Iterable[signal.Signals]) -> None:
        """Record ``signals`` from now on, then let through any that were blocked."""
        wanted = list(signals)
        for signum in wanted:
            signal.signal(signum, self._record)
        signal.pthread_sigmask(signal.SIG_UNBLOCK, wanted)

    def get(self, timeout: float | None = None) -> int | None:
        try:
            return self._queue.get(timeout=timeout)
        except queue.Empty:
            return None

    def _record(self, signum: int, frame: FrameType | None) -> None:
        if signum in STOP:
            self.stop_requested = True
        self._queue.put(signum)


def block(signals: Iterable[signal.Signals]) -> None:
    signal.pthread_sigmask(signal.SIG_BLOCK, list(signals))


def set_blocked(signals: Iterable[signal.Signals]) -> None:
    """Block exactly ``signals`` (a forked child before it runs or execs its own code)."""
    signal.pthread_sigmask(signal.SIG_SETMASK, list(signals))


def unblock(signals: Iterable[signal.Signals]) -> None:
    """Deliver what arrived while blocked, and anything after."""
    signal.pthread_sigmask(signal.SIG_UNBLOCK, list(signals))


def die_with_parent(signum: int = ORPHANED) -> None:
    """Have ``signum`` sent to this process when its parent exits: by the kernel on Linux
    (at once), and everywhere by a thread that notices the parent changed (within a
    second)."""
    parent = os.getppid()
    try:
        import ctypes

        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(PR_SET_PDEATHSIG, int(signum), 0, 0, 0)
    except (OSError, AttributeError):
        pass  # not Linux: the watchdog below is the only guard
    threading.Thread(
        target=_watch_parent, args=(parent, signum), name="limitd-parent-watch", daemon=True
    ).start()


def _watch_parent(parent: int, signum: int) -> None:
    while os.getppid() == parent:
        threading.Event().wait(PARENT_CHECK_SECONDS)
    os.kill(os.getpid(), signum)


def log_ignored(signum: int, logger: logging.Logger, hint: str = "") -> None:
    """One line for a signal received on purpose and left without effect."""
    name = signal.Signals(signum).name.removeprefix("SIG")
    logger.warning("received %s: ignored%s", name, f" ({hint})" if hint else "")


def reopen_log_files() -> None:
    """After logrotate moved the file (HUP): write to a fresh file at the same path."""
    for handler in logging.getLogger().handlers:
        if isinstance(handler, logging.FileHandler):
            with handler.lock or contextlib.nullcontext():
                handler.close()
                handler.stream = handler._open()
    logging.getLogger("limitd").info("log files reopened")
