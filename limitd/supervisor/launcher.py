"""Runs one capsule in the foreground of this process until a signal stops it.

Signals as in Sidekiq: TERM, INT (and QUIT) stop gracefully (quiet, wait up to the
capsule's timeout, requeue what still runs); TSTP quiets; TTIN logs every thread's stack;
HUP reopens log files. USR1 means the supervisor died: requeue everything now and exit,
since nobody vouches for this process any more. USR2 (a rolling restart is the
supervisor's to run) and the signals nobody means for limitd are ignored with a log
line. Handlers only record the signal (see ``signals.py``).
"""

from __future__ import annotations

import gc
import logging
import os
import signal
import sys
import threading
import traceback
from collections.abc import Callable

from limitd.supervisor.capsule import Capsule
from limitd.supervisor.signals import (
    CAPSULE_HANDLED,
    ORPHANED,
    ROLL,
    STOP,
    SignalQueue,
    log_ignored,
    reopen_log_files,
)
from limitd.supervisor.titles import CapsuleTitle, capsule_title

log = logging.getLogger("limitd.launcher")

HANDLED_SIGNALS = CAPSULE_HANDLED
# The kernel may deliver a signal to any thread; Python runs its handler in the main
# thread only when that thread next runs bytecode, which an untimed wait on the signal
# queue would postpone forever. Waking this often bounds the delay.
SERVE_SLICE = 0.5
# The youngest generation is collected every this many container objects allocated and
# not yet freed. CPython's 700 has a capsule with 1,000 async jobs in flight collect every
# few jobs, promoting the running jobs' tasks, coroutines and futures, which the middle
# generation's collections then walk: 0.5 s of a 7 s drain of 60,000 jobs (8 us a job,
# timed with gc.callbacks). At 10,000 that drain collected 4 times; what dies young is
# freed by its reference count before a collection comes, and sync jobs, whose objects
# all die young, are collected about as rarely either way.
YOUNG_GENERATION = 10_000
CPYTHON_YOUNG_GENERATION = 700


class Launcher:
    def __init__(
        self,
        capsule: Capsule,
        *,
        titles: bool = False,
        ready: Callable[[], None] | None = None,
    ) -> None:
        """With ``titles``, the process title follows the capsule's work (for a child
        process of the supervisor; tests running capsules in-process leave it alone).
        ``ready`` is called once the capsule runs (a rolling restart waits for it)."""
        self.capsule = capsule
        self.ready = ready
        # A stop sent from afar (the dashboard) stops the supervisor, children and all,
        # as TERM to it by hand would: this child alone would just be restarted. A
        # rolling restart asked from afar is the supervisor's to run, as USR2 to it.
        capsule.on_remote_stop = lambda: os.kill(os.getppid(), signal.SIGTERM)
        capsule.on_remote_restart = lambda: os.kill(os.getppid(), ROLL)
        self.title = CapsuleTitle(self._title) if titles else None
        self._signals = SignalQueue()

    def run(self) -> int:
        """Start the capsule and serve signals until told to stop. Returns the exit code."""
        self._signals.install(HANDLED_SIGNALS)
        if self.title is not None:
            self.capsule.add_busy_listener(self.title.changed)
            self.title.start()
        # The app is imported and the capsule built: what exists now lives as long as
        # the process. Out of the collector's sight, full collections no longer walk it
        # again and again (with 1,000 async jobs in flight they run often).
        gc.freeze()
        collect_young_less_often()
        self.capsule.start()
        if self.ready is not None:
            self.ready()
        try:
            return self._serve()
        finally:
            if self.title is not None:
                self.title.stop()

    def _serve(self) -> int:
        while True:
            signum = self._signals.get(timeout=SERVE_SLICE)
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
            self.capsule.lane.log_task_stacks()  # the null lane has none to log
        elif signum == signal.SIGHUP:
            reopen_log_files()
        elif signum == ROLL:
            log_ignored(
                signum, log, f"a rolling restart: send USR2 to the supervisor, {os.getppid()}"
            )
        else:
            log_ignored(signum, log)

    def _title(self) -> str:
        config = self.capsule.config
        return capsule_title(
            config.name,
            config.tag,
            self.capsule.busy(),
            self.capsule.capacity(),
            self.capsule.order.names,
            quiet=self.capsule.record.quiet,
        )


def log_thread_stacks() -> None:
    """Every thread's current stack, for diagnosing a stuck job (TTIN)."""
    names = {thread.ident: thread.name for thread in threading.enumerate()}
    for ident, frame in sys._current_frames().items():
        stack = "".join(traceback.format_stack(frame))
        log.warning("thread %s (%s)\n%s", names.get(ident, "?"), ident, stack)


def collect_young_less_often() -> None:
    """The youngest generation's threshold at ``YOUNG_GENERATION``, unless the app set
    one of its own (then it is the app's to tune)."""
    young, middle, old = gc.get_threshold()
    if young == CPYTHON_YOUNG_GENERATION:
        gc.set_threshold(YOUNG_GENERATION, middle, old)
