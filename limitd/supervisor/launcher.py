"""Runs one capsule in the foreground of this process until a signal stops it.

Signals as in Sidekiq: TERM and INT stop gracefully (quiet, wait up to the capsule's
timeout, requeue what still runs); TSTP quiets; TTIN logs every thread's stack. USR1
means the supervisor died: requeue everything now and exit, since nobody vouches for
this process any more. Handlers only record the signal (see ``signals.py``).
"""

from __future__ import annotations

import logging
import signal
import sys
import threading
import traceback

from limitd.supervisor.capsule import Capsule
from limitd.supervisor.signals import ORPHANED, STOP, SignalQueue

log = logging.getLogger("limitd.launcher")

HANDLED_SIGNALS = (*STOP, ORPHANED, signal.SIGTSTP, signal.SIGTTIN)


class Launcher:
    def __init__(self, capsule: Capsule) -> None:
        self.capsule = capsule
        self._signals = SignalQueue()

    def run(self) -> int:
        """Start the capsule and serve signals until told to stop. Returns the exit code."""
        self._signals.install(HANDLED_SIGNALS)
        self.capsule.start()
        while True:
            signum = self._signals.get()
            if signum in STOP:
                log.info("received %s: stopping", signal.Signals(signum).name)
                self.capsule.stop()
                return 0
            if signum == ORPHANED:
                log.error("supervisor gone: requeueing running jobs and exiting")
                self.capsule.stop(timeout=0, grace=0)
                return 0
            if signum is not None:
                self._handle(signum)

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
