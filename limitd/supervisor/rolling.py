"""A rolling restart: replace every capsule process, one at a time, with one that
imports the app anew, so a deploy reaches the workers without stopping the work.

For each slot in turn: start its new process (a fresh interpreter, see
``limitd.supervisor.spawn``) beside the old one; once the new one reports that its
capsule runs (its threads fetch and its first process record is written), TERM the old
one, which stops fetching at once and finishes its jobs within its timeout (what still
runs then is requeued); once the old one has exited, go on with the next slot. So at
most one process more than configured runs, and every slot but the one being replaced
always has a process fetching, as does that one: the old process stops only after the
new one runs.

A new process that fails to start (a syntax or import error in the deployed code, a
config file changed on disk, or no word within :data:`START_SECONDS`) stops the roll:
it is reaped, the processes not yet replaced keep running the code they have, and the
reason is logged. A second request while a roll runs is ignored with a log line.
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import os
import signal
from collections import deque
from typing import Protocol

from limitd import clock
from limitd.supervisor.spawn import Child, Readiness, close_ready, describe, ready_state

log = logging.getLogger("limitd.supervisor")

START_SECONDS = 60.0  # a new process that has not said it runs by then failed to start
STOP_GRACE_SECONDS = 5.0


class Host(Protocol):
    """What the roll needs from the supervisor."""

    def start_fresh(self, child: Child, *, ready: bool) -> int: ...

    def reap(self, child: Child, reason: str) -> None: ...


@dataclasses.dataclass
class Step:
    """The replacement under way: the slot, its new process, its old one."""

    slot: Child
    successor: Child
    retiring: Child | None = None
    deadline: float = 0.0
    failure: str = ""


class RollingRestart:
    """The supervisor's rolling restart: :meth:`begin` on request, :meth:`step` on every
    turn of its loop, :meth:`exited` for every process it collects."""

    def __init__(self, host: Host, stop_timeout: float) -> None:
        self.host = host
        self.stop_timeout = stop_timeout
        self._pending: deque[Child] = deque()
        self._step: Step | None = None

    @property
    def active(self) -> bool:
        return bool(self._pending) or self._step is not None

    def begin(self, slots: list[Child]) -> None:
        if self.active:
            log.warning("rolling restart requested while one runs: ignored")
            return
        log.info("rolling restart: replacing %d processes one at a time", len(slots))
        self._pending = deque(slots)

    def processes(self) -> list[Child]:
        """The processes the roll runs beside the slots' own: a new one starting, an
        old one finishing its jobs."""
        if self._step is None:
            return []
        return [p for p in (self._step.successor, self._step.retiring) if p and p.pid]

    def starting(self, slot: Child) -> bool:
        """Whether ``slot``'s new process is starting (the supervisor must not restart
        the slot meanwhile: the new process takes its place)."""
        return self._step is not None and self._step.slot is slot

    def step(self) -> None:
        if self._step is None:
            if self._pending:
                self._start_next(self._pending.popleft())
            return
        step = self._step
        if step.retiring is not None:
            if clock.monotonic() > step.deadline:
                self._kill(step.retiring, "did not stop in time")
            return
        if step.failure:
            return  # waiting for the failed new process to be collected
        state = ready_state(step.successor.ready_fd)
        if state is Readiness.READY:
            self._promote(step)
        elif state is Readiness.SILENT:
            step.failure = "it exited before its capsule ran"
        elif clock.monotonic() > step.deadline:
            step.failure = f"its capsule did not run within {START_SECONDS:.0f}s"
            self._kill(step.successor, "did not start in time")

    def exited(self, pid: int, status: int) -> bool:
        """Whether ``pid`` was one of the roll's; if so, deal with its exit."""
        step = self._step
        if step is None:
            return False
        if step.retiring is not None and step.retiring.pid == pid:
            step.retiring.pid = 0
            self.host.reap(step.retiring, f"old process of capsule {step.slot.slot} stopped")
            log.info(
                "rolling restart: old process %d of %s stopped (%s)",
                pid,
                step.slot.slot,
                describe(status),
            )
            self._next_or_done()
            return True
        if step.successor.pid == pid:
            step.successor.pid = 0
            close_ready(step.successor)
            self.host.reap(step.successor, f"new process of capsule {step.slot.slot} failed")
            self._abort(
                step, f"{step.failure or 'it exited before its capsule ran'} ({describe(status)})"
            )
            return True
        return False

    def _start_next(self, slot: Child) -> None:
        successor = dataclasses.replace(slot, pid=0, ready_fd=-1, recycling=False, crashes=0)
        self._step = Step(slot, successor, deadline=clock.monotonic() + START_SECONDS)
        successor.pid = self.host.start_fresh(successor, ready=True)
        log.info(
            "rolling restart: new process %d for %s, importing the app anew",
            successor.pid,
            slot.slot,
        )

    def _promote(self, step: Step) -> None:
        """The new process runs: it takes the slot, the old one stops gracefully."""
        slot, new = step.slot, step.successor
        close_ready(new)
        old = dataclasses.replace(slot)
        slot.pid, slot.config, slot.started, slot.crashes = new.pid, new.config, new.started, 0
        slot.fresh, slot.recycling = True, False
        if not old.pid:
            log.info("rolling restart: %s runs in new process %d", slot.slot, new.pid)
            self._next_or_done()
            return
        log.info(
            "rolling restart: %s runs in new process %d; stopping old process %d "
            "(it finishes its jobs within %.0fs)",
            slot.slot,
            new.pid,
            old.pid,
            self.stop_timeout,
        )
        step.retiring = old
        step.deadline = clock.monotonic() + self.stop_timeout + STOP_GRACE_SECONDS
        with contextlib.suppress(ProcessLookupError):
            os.kill(old.pid, signal.SIGTERM)

    def _next_or_done(self) -> None:
        self._step = None
        if not self._pending:
            log.info("rolling restart done: every process runs the app as imported anew")

    def _abort(self, step: Step, reason: str) -> None:
        left = 1 + len(self._pending)
        log.error(
            "rolling restart stopped: the new process for %s failed to start: %s; "
            "%d processes not replaced keep running the code they have",
            step.slot.slot,
            reason,
            left,
        )
        self._step = None
        self._pending.clear()

    @staticmethod
    def _kill(child: Child, why: str) -> None:
        log.error("rolling restart: process %d of %s %s: killing it", child.pid, child.slot, why)
        with contextlib.suppress(ProcessLookupError):
            os.kill(child.pid, signal.SIGKILL)
