"""The supervisor: forks one child process per capsule copy and keeps them alive.

It imports nothing of the app itself (the CLI did, before forking, so children share the
app's memory copy-on-write), and it never runs jobs. Its main loop:

- vouches for every live child every heartbeat period: a child stalled by a job holding
  the GIL, or stopped by SIGSTOP, still exists, so its heartbeat key stays and it is
  never reaped;
- notices a child that died (SIGCHLD), reaps that child's capsule at once (its jobs go
  back to the front of their queues, its slots are freed) and starts a new child, with
  exponential backoff for a child that keeps crashing;
- recycles a child whose memory grew past its capsule's ``max_memory_mb``: a graceful
  stop (TERM), then a fresh child;
- relays TSTP (and USR1, Sidekiq 5's quiet, as TSTP), TTIN and HUP; on TERM, INT or
  QUIT stops the children gracefully within their timeout plus a grace period, then kills
  and reaps any that remain; on USR2 replaces its children one at a time with processes
  that import the app anew (``rolling.py``); ignores, with a log line, the signals whose
  default action would end it (``signals.IGNORED``).

Its signal handlers may be installed before it exists (``limitd start`` does so first
thing, so a TERM during start-up is never the default action): what arrived meanwhile
is handled as the loop starts, and a stop then means no child is started at all.

Children get SIGUSR1 from the kernel if the supervisor dies, and exit at once.

Children are made with a plain ``os.fork`` rather than a multiprocessing context: a child
runs a capsule until it exits and reports only its exit code, so there is nothing to
pickle or pipe, and the supervisor needs exact control of signal masks (blocked across
the fork), ``waitpid`` statuses and ``os._exit`` codes, which multiprocessing's own
bookkeeping (its atexit handlers, its sentinel pipes) would get in the way of.
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import os
import signal
import uuid
from collections.abc import Callable, Sequence

import redis as redis_py

from limitd import clock
from limitd.config import CapsuleConfig, CapsuleSpec
from limitd.fetch import liveness
from limitd.supervisor.rolling import STOP_GRACE_SECONDS, RollingRestart
from limitd.supervisor.signals import (
    CAPSULE_HANDLED,
    ROLL,
    STOP,
    SignalQueue,
    log_ignored,
    reopen_log_files,
)
from limitd.supervisor.spawn import (
    Child,
    FreshStart,
    describe,
    exec_fresh,
    fork_child,
    rss_mb,
)
from limitd.supervisor.titles import set_title, supervisor_title

log = logging.getLogger("limitd.supervisor")

QUIETS = (signal.SIGTSTP, signal.SIGUSR1)  # USR1: Sidekiq 5's quiet, relayed as TSTP
RELAYED = (signal.SIGTSTP, signal.SIGTTIN, signal.SIGHUP)
HANDLED = (*CAPSULE_HANDLED, signal.SIGCHLD)
MAX_BACKOFF_SECONDS = 60.0
STABLE_SECONDS = 30.0  # a child that lived this long resets its crash backoff
ROLL_POLL_SECONDS = 0.05  # how often a new process's readiness is read during a roll

ChildMain = Callable[[CapsuleConfig], int]

__all__ = ["HANDLED", "Child", "FreshStart", "Supervisor", "rss_mb"]


class Supervisor:
    def __init__(
        self,
        specs: Sequence[CapsuleSpec],
        redis: redis_py.Redis,
        child_main: ChildMain,
        *,
        tag: str = "",
        titles: bool = True,
        signals: SignalQueue | None = None,
        fresh: FreshStart | None = None,
    ) -> None:
        """``child_main`` runs in a forked child with that child's config and returns its
        exit code. ``titles`` sets the process title (``ps`` shows tag and children).
        ``signals``: a queue already recording :data:`HANDLED` (installed early by the
        caller). ``fresh``: how to start a process that imports the app anew, for
        rolling restarts (without it, USR2 is ignored with a log line)."""
        self.redis = redis
        self.child_main = child_main
        self.tag = tag
        self.titles = titles
        self.fresh = fresh
        self.children = [
            Child(f"{spec.config.name}#{copy}", spec.config, spec.max_memory_mb)
            for spec in specs
            for copy in range(spec.processes)
        ]
        self.heartbeat_period = min(c.config.heartbeat_period for c in self.children)
        self.stop_timeout = max(c.config.timeout for c in self.children)
        self._signals = signals or SignalQueue()
        self._stopping = False
        self.roll = RollingRestart(self, self.stop_timeout)

    def run(self) -> int:
        self._signals.install(HANDLED)
        self._handle_pending()  # what arrived during start-up; a stop starts nothing
        for child in self.children:
            if not self._stopping:
                self._start(child)
        next_vouch = clock.monotonic()
        while not self._stopping:
            if clock.monotonic() >= next_vouch:
                self._vouch()
                self._check_memory()
                next_vouch = clock.monotonic() + self.heartbeat_period
            signum = self._signals.get(timeout=self._next_wait(next_vouch))
            self._handle(signum)
            self._collect_exited()
            self.roll.step()
            self._restart_due()
        return self._stop_children()

    def _handle_pending(self) -> None:
        while (signum := self._signals.get(timeout=0)) is not None:
            self._handle(signum)

    def _handle(self, signum: int | None) -> None:
        if signum is None or signum == signal.SIGCHLD:
            return
        if signum in STOP:
            log.info(
                "received %s: stopping %d children",
                signal.Signals(signum).name,
                len(self._live()),
            )
            self._stopping = True
        elif signum in QUIETS:
            log.info(
                "received %s: quieting %d children", signal.Signals(signum).name, len(self._live())
            )
            self._signal_children(signal.SIGTSTP)
        elif signum in RELAYED:
            if signum == signal.SIGHUP:
                reopen_log_files()
            self._signal_children(signum)
        elif signum == ROLL:
            self.begin_roll()
        else:
            log_ignored(signum, log, "TERM stops limitd, TSTP quiets it, USR2 restarts it")

    def begin_roll(self) -> None:
        """A rolling restart (USR2, or asked from afar through a child)."""
        if self.fresh is None:
            log.warning("received USR2: a rolling restart needs 'limitd start': ignored")
            return
        self.roll.begin(list(self.children))

    def _start(self, child: Child) -> None:
        if child.fresh:
            self.start_fresh(child, ready=False)
        else:
            self._renew(child)
            child.pid = fork_child(lambda: self.child_main(child.config), HANDLED)
            self._started(child)

    def start_fresh(self, child: Child, *, ready: bool) -> int:
        """Start ``child``'s capsule in a process that imports the app anew; its pid.
        ``ready``: keep the pipe on which it says its capsule runs (a rolling restart
        waits for that)."""
        assert self.fresh is not None
        self._renew(child)
        child.pid = exec_fresh(self.fresh, child, HANDLED, CAPSULE_HANDLED)
        if not ready:
            os.close(child.ready_fd)
            child.ready_fd = -1
        self._started(child)
        return child.pid

    def _renew(self, child: Child) -> None:
        """A new process is a new capsule: its own id, which the reaper knows it by."""
        child.config = dataclasses.replace(
            child.config,
            capsule_id=uuid.uuid4().hex,
            process_number=self.children.index(child) if child in self.children else 0,
            process_count=len(self.children),
        )

    def _started(self, child: Child) -> None:
        child.started = clock.monotonic()
        log.info(
            "started capsule %s (pid %d, id %s%s)",
            child.slot,
            child.pid,
            child.config.capsule_id,
            ", app imported anew" if child.fresh or child.ready_fd >= 0 else "",
        )
        self._vouch()
        self._show_title()

    def _live(self) -> list[Child]:
        """Every process running now: the slots' own and a rolling restart's."""
        return [c for c in self.children if c.pid] + self.roll.processes()

    def _vouch(self) -> None:
        live = [c.config.capsule_id for c in self._live()]
        try:
            liveness.vouch(self.redis, live, self.heartbeat_period)
        except redis_py.RedisError as exc:
            log.warning("could not vouch for children: %s", exc)

    def _collect_exited(self) -> None:
        while True:
            try:
                pid, status = os.waitpid(-1, os.WNOHANG)
            except ChildProcessError:
                return
            if pid == 0:
                return
            child = next((c for c in self.children if c.pid == pid), None)
            if child is not None:
                self._exited(child, status)
            elif self.roll.exited(pid, status):
                self._show_title()

    def _exited(self, child: Child, status: int) -> None:
        child.pid = 0
        # A child that died unasked may have been killed by one of its jobs: the reaper
        # charges the crash (limitd/fetch/recoveries.py). One stopped on purpose, not.
        unasked = not (child.recycling or self._stopping)
        reason = f"capsule {child.slot} exited ({describe(status)}) running the job"
        self._reap(child, reason, blame=unasked)
        self._show_title()
        if self._stopping:
            return
        if child.recycling:
            child.recycling = False
            child.restart_at = clock.monotonic()
            log.info("capsule %s recycled (%s)", child.slot, describe(status))
            return
        lived = clock.monotonic() - child.started
        child.crashes = 0 if lived >= STABLE_SECONDS else child.crashes + 1
        delay = min(MAX_BACKOFF_SECONDS, 0.5 * 2 ** max(0, child.crashes - 1))
        level = logging.ERROR if child.crashes >= 3 else logging.WARNING
        log.log(
            level,
            "capsule %s exited (%s) after %.1fs; restarting in %.1fs (%d quick crashes in a row)",
            child.slot,
            describe(status),
            lived,
            delay,
            child.crashes,
        )
        child.restart_at = clock.monotonic() + delay

    def _check_memory(self) -> None:
        for child in self.children:
            if not child.pid or child.recycling or child.max_memory_mb is None:
                continue
            used = rss_mb(child.pid)
            if used is not None and used > child.max_memory_mb:
                log.warning(
                    "capsule %s uses %.0f MB, above max_memory_mb %d: recycling it",
                    child.slot,
                    used,
                    child.max_memory_mb,
                )
                child.recycling = True
                with contextlib.suppress(ProcessLookupError):
                    os.kill(child.pid, signal.SIGTERM)

    def _show_title(self) -> None:
        if self.titles:
            live = sum(1 for child in self.children if child.pid)
            set_title(supervisor_title(self.tag, live, stopping=self._stopping))

    def reap(self, child: Child, reason: str) -> None:
        """A process of a rolling restart is gone: one the supervisor stopped, or a new
        one that failed to start before taking any job, so nobody is charged."""
        self._reap(child, reason, blame=False)

    def _reap(self, child: Child, reason: str = "", *, blame: bool = False) -> None:
        """The process is gone for sure: return its jobs now, not after its key expires;
        with ``blame``, charge the crash to them (see ``liveness.reap``)."""
        try:
            moved = liveness.retire(self.redis, child.config.capsule_id, reason, blame=blame)
            if moved:
                log.warning("requeued %d jobs of capsule %s", moved, child.slot)
        except redis_py.RedisError as exc:
            log.error("could not reap capsule %s (its heartbeat will expire): %s", child.slot, exc)

    def _restart_due(self) -> None:
        now = clock.monotonic()
        for child in self.children:
            if self._stopping or child.pid or self.roll.starting(child):
                continue
            if child.restart_at <= now:
                self._start(child)

    def _next_wait(self, next_vouch: float) -> float:
        wake_at = [next_vouch] + [c.restart_at for c in self.children if not c.pid]
        if self.roll.active:
            wake_at.append(clock.monotonic() + ROLL_POLL_SECONDS)
        return max(0.01, min(wake_at) - clock.monotonic())

    def _signal_children(self, signum: int) -> None:
        for child in self._live():
            with contextlib.suppress(ProcessLookupError):  # exited, not yet collected
                os.kill(child.pid, signum)

    def _stop_children(self) -> int:
        """TERM the children, wait for their own graceful stop, then KILL and reap."""
        self._show_title()
        self._signal_children(signal.SIGTERM)
        deadline = clock.monotonic() + self.stop_timeout + STOP_GRACE_SECONDS
        while self._live() and clock.monotonic() < deadline:
            self._signals.get(timeout=0.05)  # SIGCHLD wakes this early
            self._vouch()
            self._collect_exited()
        for child in self._live():
            log.error("capsule %s did not stop in time: killing it", child.slot)
            os.kill(child.pid, signal.SIGKILL)
            os.waitpid(child.pid, 0)
            child.pid = 0
            self._reap(child, f"capsule {child.slot} was killed: it did not stop in time")
        log.info("supervisor stopped")
        return 0
