"""Signal plumbing shared by the supervisor and its children.

Handlers only put the signal number on a queue (``SimpleQueue.put`` is safe inside a
handler); the main thread takes it off and acts, so no lock is ever taken inside a
handler. Signals stay blocked until the handlers are in place, so one arriving during
start-up is delivered late, never lost or handled by the default action.
"""

from __future__ import annotations

import queue
import signal
from collections.abc import Iterable
from types import FrameType

STOP = (signal.SIGTERM, signal.SIGINT)
# Sent to a child by the kernel when its supervisor dies (PR_SET_PDEATHSIG).
ORPHANED = signal.SIGUSR1
PR_SET_PDEATHSIG = 1


class SignalQueue:
    """Signals received, in order, for the main loop to handle."""

    def __init__(self) -> None:
        self._queue: queue.SimpleQueue[int] = queue.SimpleQueue()

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
        self._queue.put(signum)


def block(signals: Iterable[signal.Signals]) -> None:
    signal.pthread_sigmask(signal.SIG_BLOCK, list(signals))


def die_with_parent(signum: int = ORPHANED) -> None:
    """Ask the kernel to send ``signum`` to this process when its parent exits (Linux)."""
    try:
        import ctypes

        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(PR_SET_PDEATHSIG, int(signum), 0, 0, 0)
    except (OSError, AttributeError):  # not Linux: the child's watchdog covers it
        pass
