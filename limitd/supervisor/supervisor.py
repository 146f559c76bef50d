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
- relays TSTP and TTIN, and on TERM/INT stops the children gracefully within their
  timeout plus a grace period, then kills and reaps any that remain.

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
from dataclasses import dataclass
from pathlib import Path

import redis as redis_py

from limitd import clock
from limitd.config import CapsuleConfig, CapsuleSpec
from limitd.supervisor import liveness
from limitd.supervisor.signals import (
    STOP,
    SignalQueue,
    block,
    die_with_parent,
    reopen_log_files,
    unblock,
)
from limitd.supervisor.titles import set_title, supervisor_title

log = logging.getLogger("limitd.supervisor")

RELAYED = (signal.SIGTSTP, signal.SIGTTIN, signal.SIGHUP)
HANDLED = (*STOP, *RELAYED, signal.SIGCHLD)
STOP_GRACE_SECONDS = 5.0
MAX_BACKOFF_SECONDS = 60.0
STABLE_SECONDS = 30.0  # a child that lived this long resets its crash backoff
EX_SOFTWARE = 70

ChildMain = Callable[[CapsuleConfig], int]


@dataclass
class Child:
    """One capsule copy: the config it runs, and its current process, if any."""

    slot: str
    config: CapsuleConfig
    max_memory_mb: int | None = None
    pid: int = 0
    started: float = 0.0
    crashes: int = 0
    restart_at: float = 0.0
    recycling: bool = False


class Supervisor:
    def __init__(
        self,
        specs: Sequence[CapsuleSpec],
        redis: redis_py.Redis,
        child_main: ChildMain,
        *,
        tag: str = "",
        titles: bool = True,
    ) -> None:
        """``child_main`` runs in a forked child with that child's config and returns its
        exit code. ``titles`` sets the process title (``ps`` shows tag and children)."""
        self.redis = redis
        self.child_main = child_main
        self.tag = tag
        self.titles = titles
        self.children = [
            Child(f"{spec.config.name}#{copy}", spec.config, spec.max_memory_mb)
            for spec in specs
            for copy in range(spec.processes)
        ]
        self.heartbeat_period = min(c.config.heartbeat_period for c in self.children)
        self.stop_timeout = max(c.config.timeout for c in self.children)
        self._signals = SignalQueue()
        self._stopping = False

    def run(self) -> int:
        block(HANDLED)
        self._signals.install(HANDLED)
        for child in self.children:
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
            self._restart_due()
        return self._stop_children()

    def _handle(self, signum: int | None) -> None:
        if signum in STOP:
            log.info(
                "received %s: stopping %d children", signal.Signals(signum).name, len(self.children)
            )
            self._stopping = True
        elif signum in RELAYED:
            if signum == signal.SIGHUP:
                reopen_log_files()
            self._signal_children(signum)

    def _start(self, child: Child) -> None:
        child.config = dataclasses.replace(
            child.config,
            capsule_id=uuid.uuid4().hex,
            process_number=self.children.index(child),
        )
        parent = os.getpid()
        # Blocked across the fork: a signal for the new child must wait for the child's
        # own handlers (its launcher unblocks them), not reach the copy of ours it inherits.
        block(HANDLED)
        pid = os.fork()
        if pid == 0:  # the child
            code = EX_SOFTWARE
            try:
                signal.signal(signal.SIGCHLD, signal.SIG_DFL)
                signal.pthread_sigmask(signal.SIG_UNBLOCK, [signal.SIGCHLD])
                die_with_parent()
                if os.getppid() == parent:  # else the supervisor died before prctl
                    code = self.child_main(child.config)
            except BaseException:
                log.exception("capsule %s crashed", child.slot)
            finally:
                os._exit(code)
        unblock(HANDLED)
        child.pid, child.started = pid, clock.monotonic()
        log.info("started capsule %s (pid %d, id %s)", child.slot, pid, child.config.capsule_id)
        self._vouch()
        self._show_title()

    def _vouch(self) -> None:
        live = [c.config.capsule_id for c in self.children if c.pid]
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

    def _exited(self, child: Child, status: int) -> None:
        child.pid = 0
        self._reap(child, f"capsule {child.slot} exited ({_describe(status)}) running the job")
        self._show_title()
        if self._stopping:
            return
        if child.recycling:
            child.recycling = False
            child.restart_at = clock.monotonic()
            log.info("capsule %s recycled (%s)", child.slot, _describe(status))
            return
        lived = clock.monotonic() - child.started
        child.crashes = 0 if lived >= STABLE_SECONDS else child.crashes + 1
        delay = min(MAX_BACKOFF_SECONDS, 0.5 * 2 ** max(0, child.crashes - 1))
        level = logging.ERROR if child.crashes >= 3 else logging.WARNING
        log.log(
            level,
            "capsule %s exited (%s) after %.1fs; restarting in %.1fs (%d quick crashes in a row)",
            child.slot,
            _describe(status),
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

    def _reap(self, child: Child, reason: str = "") -> None:
        """The process is gone for sure: return its jobs now, not after its key expires."""
        try:
            moved = liveness.retire(self.redis, child.config.capsule_id, reason)
            if moved:
                log.warning("requeued %d jobs of capsule %s", moved, child.slot)
        except redis_py.RedisError as exc:
            log.error("could not reap capsule %s (its heartbeat will expire): %s", child.slot, exc)

    def _restart_due(self) -> None:
        now = clock.monotonic()
        for child in self.children:
            if not child.pid and not self._stopping and child.restart_at <= now:
                self._start(child)

    def _next_wait(self, next_vouch: float) -> float:
        wake_at = [next_vouch] + [c.restart_at for c in self.children if not c.pid]
        return max(0.01, min(wake_at) - clock.monotonic())

    def _signal_children(self, signum: int) -> None:
        for child in self.children:
            if child.pid:
                with contextlib.suppress(ProcessLookupError):  # exited, not yet collected
                    os.kill(child.pid, signum)

    def _stop_children(self) -> int:
        """TERM the children, wait for their own graceful stop, then KILL and reap."""
        self._show_title()
        self._signal_children(signal.SIGTERM)
        deadline = clock.monotonic() + self.stop_timeout + STOP_GRACE_SECONDS
        while any(c.pid for c in self.children) and clock.monotonic() < deadline:
            self._signals.get(timeout=0.05)  # SIGCHLD wakes this early
            self._vouch()
            self._collect_exited()
        for child in self.children:
            if child.pid:
                log.error("capsule %s did not stop in time: killing it", child.slot)
                os.kill(child.pid, signal.SIGKILL)
                os.waitpid(child.pid, 0)
                child.pid = 0
                self._reap(child, f"capsule {child.slot} was killed: it did not stop in time")
        log.info("supervisor stopped")
        return 0


def rss_mb(pid: int) -> float | None:
    """Resident memory of a process in MB (Linux /proc), or None if unknown."""
    try:
        pages = int(Path(f"/proc/{pid}/statm").read_text().split()[1])
    except (OSError, ValueError, IndexError):
        return None
    return pages * os.sysconf("SC_PAGE_SIZE") / 1024 / 1024


def _describe(status: int) -> str:
    if os.WIFSIGNALED(status):
        return f"killed by {signal.Signals(os.WTERMSIG(status)).name}"
    return f"exit code {os.waitstatus_to_exitcode(status)}"
