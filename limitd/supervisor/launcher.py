"""Runs one capsule in the foreground of this process until a signal stops it.

Signals as in Sidekiq: TERM and INT stop gracefully (quiet, wait up to the capsule's
timeout, requeue what still runs); TSTP quiets; TTIN logs every thread's stack. Handlers
only record the signal number; the main loop acts on it, so no lock is ever taken inside
a signal handler.
"""

from __future__ import annotations

import logging
import queue
import signal
import sys
import threading
import traceback
from types import FrameType

from limitd.supervisor.capsule import Capsule

log = logging.getLogger("limitd.launcher")

STOP_SIGNALS = (signal.SIGTERM, signal.SIGINT)
HANDLED_SIGNALS = (*STOP_SIGNALS, signal.SIGTSTP, signal.SIGTTIN)


class Launcher:
    def __init__(self, capsule: Capsule) -> None:
        self.capsule = capsule
        self._signals: queue.SimpleQueue[int] = queue.SimpleQueue()

    def run(self) -> int:
        """Start the capsule and serve signals until told to stop. Returns the exit code."""
        for handled in HANDLED_SIGNALS:
            signal.signal(handled, self._record)
        self.capsule.start()
        while True:
            signum = self._signals.get()
            if signum in STOP_SIGNALS:
                log.info("received %s: stopping", signal.Signals(signum).name)
                self.capsule.stop()
                return 0
            self._handle(signum)

    def _record(self, signum: int, frame: FrameType | None) -> None:
        self._signals.put(signum)  # SimpleQueue.put is safe to call from a handler

    def _handle(self, signum: int) -> None:
        if signum == signal.SIGTSTP:
            log.info("received TSTP: quiet, no new jobs will start")
            self.capsule.quiet()
        elif signum == signal.SIGTTIN:
            log_thread_stacks()


def log_thread_stacks() -> None:
    """Every thread's current stack, for diagnosing a stuck job (TTIN)."""
    names = {thread.ident: thread.name for thread in threading.enumerate()}
    for ident, frame in sys._current_frames().items():
        stack = "".join(traceback.format_stack(frame))
        log.warning("thread %s (%s)\n%s", names.get(ident, "?"), ident, stack)
