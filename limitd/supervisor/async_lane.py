"""The capsule's event loop, where its async jobs run.

Most background jobs wait on the network. A thread per waiting job caps a process at its
thread count; a task per job on one event loop does not. So a capsule whose app defines
``async def`` jobs runs a loop in one more thread, and its processors, which fetch every
job as before, hand async jobs to it instead of running them. Fetching, limits and
reliability stay the processors' and the fetch's: an async job sits in the same
in-progress list as any other until the loop settles it.

- ``async_concurrency`` slots bound the jobs on the loop. The thread that made a fetch call
  gives the loop the async jobs it fetched in one batch (``take_fetched``); others reach it
  through a processor (``submit``), which waits for room before it fetches again.
- A job with no free slot is *parked*: fetched and decoded, it starts on the loop's thread
  the moment a job ends, with no thread woken to pass it on. A tenth of the slots may wait
  so (1 at least, ``FETCH_AHEAD`` at most): enough to keep a busy loop fed between fetch
  calls, few enough not to hoard jobs that other capsules could run.
- While every job fetched lately was async (``loop_only``), the capsule fetches for the
  loop alone, as much as it has room for, and not one job per idle processor, which would
  only wait for a slot in that processor's hands (a thread woken per slot freed: two
  context switches and a fetch call per job at 1,000 jobs in flight). A full loop with a
  full park fetches nothing more.
- Every job the lane holds (waiting for a slot, running, or finishing) is in ``held``,
  so the heartbeat never takes one for an orphan.
- A stop cancels the tasks still running at the deadline once the capsule has requeued
  their jobs; a cancelled job records nothing.
- A job that ended goes to ``finish`` (the capsule's dispatch, ``limitd.fetch.Dispatch``),
  as it would from a processor.
- Without async jobs the capsule has a :class:`NullLane`: the same questions, answered
  "nothing", so the capsule never asks whether it has a lane.
- A job that blocks the loop (a sync call in async code) stalls every job on it. A watch
  thread warns, naming the job and the line it is on, when the loop has not turned for
  ``block_warning`` seconds, unless the whole process was held up meanwhile (see
  ``blocked_for``).
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import logging
import sys
import threading
import time
import traceback
from collections import deque
from dataclasses import dataclass
from typing import Any

from limitd import clock
from limitd.config import CapsuleConfig
from limitd.fetch import Dispatch
from limitd.fetch.basic import UnitOfWork
from limitd.payload import Payload, describe_job
from limitd.spec import JobSpec
from limitd.supervisor.executor import JobExecutor

log = logging.getLogger("limitd.async")

DEFAULT_ASYNC_CONCURRENCY = 100
DEFAULT_BLOCK_WARNING = 1.0
SLOT_WAIT = 0.5
FETCH_AHEAD = 50  # jobs a fetch call may take for the loop beyond the threads' own
ACTIVE_SECONDS = 1.0  # a processor waiting for a slot looks up this often to see a stop


@dataclass(eq=False, slots=True)
class _Entry:
    """One async job the lane holds."""

    unit: UnitOfWork
    payload: Payload
    spec: JobSpec
    since: float = 0.0  # when its task started
    task: asyncio.Task[None] | None = None

    def describe(self) -> str:
        """The job, as logs name it (its task is not named: a name per job costs a
        format on the loop's thread for what only a warning reads)."""
        return f"{self.payload.get('class')} jid={self.payload.get('jid')}"


class AsyncLane:
    """Runs a capsule's async jobs on an event loop of its own (see the module)."""

    def __init__(
        self,
        executor: JobExecutor,
        dispatch: Dispatch,
        size: int,
        *,
        name: str = "default",
        block_warning: float = DEFAULT_BLOCK_WARNING,
        loop: str = "asyncio",
    ) -> None:
        self.executor = executor
        self._loop_kind = loop
        self.dispatch = dispatch
        self.size = size
        self._parked: deque[_Entry] = deque()  # fetched, waiting for a slot (see module)
        self._park = max(1, min(FETCH_AHEAD, size // 10))  # parked at most
        self._block_warning = block_warning
        # Free slots, and the jobs posted to the loop, under one lock: a processor takes
        # a slot and posts in one step, the loop frees slots as jobs end.
        # (The loop's thread takes the lock itself, not through the Condition, whose
        # Python-level enter and exit it would pay for every job that ends.)
        self._room_lock = threading.Lock()
        self._room = threading.Condition(self._room_lock)
        self._free = size
        self._waiting = 0  # processors waiting for a slot: only then is a free one told
        self._inbox: list[_Entry] = []
        self._woken = False
        self._last_post = 0.0
        self._mixed_at = 0.0  # when a fetch last brought a job the loop did not take
        self._entries: dict[int, _Entry] = {}  # id(unit) -> entry; written by both sides
        self._abandoned = threading.Event()  # hard stop: start nothing more
        self._stopped = threading.Event()
        self._name = name
        # Made by ``start``: a capsule that is only drained never opens a loop to close.
        self._loop: asyncio.AbstractEventLoop
        self._started = 0  # jobs running on the loop (not those waiting for a slot)
        # None until the loop's first beat: a loop thread that has not yet run (a slow
        # start on a busy machine) is not a blocked loop.
        self._pulse: float | None = None
        self._thread = threading.Thread(
            target=self._run_loop, name=f"limitd-{name}-async", daemon=True
        )
        self._watch = threading.Thread(
            target=self._watch_loop, name=f"limitd-{name}-async-watch", daemon=True
        )

    def start(self) -> None:
        self._loop = new_loop(self._loop_kind)
        # Middleware without ``acall`` hold a worker thread per running job (see
        # ``ServerChain.ainvoke``): the default pool of a few threads would cap the lane.
        self._loop.set_default_executor(
            concurrent.futures.ThreadPoolExecutor(
                self.size + 4, f"limitd-{self._name}-async-worker"
            )
        )
        self._thread.start()
        self._watch.start()

    def submit(self, unit: UnitOfWork, payload: Payload, spec: JobSpec) -> None:
        """From a processor thread: run this async job on the loop as soon as a slot is
        free. After a hard stop nothing starts (the job was requeued with the others)."""
        entry = _Entry(unit, payload, spec)
        self._entries[id(unit)] = entry
        started = False
        try:
            with self._room:
                while not self._room_left() and not self._abandoned.is_set():
                    self._waiting += 1
                    try:
                        self._room.wait(SLOT_WAIT)
                    finally:
                        self._waiting -= 1
                if self._abandoned.is_set():
                    return
                wake = self._post([entry])
            started = True
            if wake:  # the first of a batch: later ones find the loop already woken
                self._loop.call_soon_threadsafe(self._take_inbox)
        finally:
            if not started:
                self._entries.pop(id(unit), None)

    def take_fetched(self, units: list[UnitOfWork]) -> list[UnitOfWork]:
        """From the thread that made a fetch call (the dispatch's ``spill``): give the loop
        the async jobs among ``units`` it has room for (a free slot, else a place among
        the parked), all with one wake-up of the loop, and return the others for the
        processors: sync jobs, any job that is not plainly runnable (see
        ``JobExecutor.async_job``), and any that found no room. Never waits: the caller
        fetches for the whole capsule."""
        found: list[_Entry] = []
        others: list[UnitOfWork] = []
        for unit in units:
            job = self.executor.async_job(unit)
            if job is None:
                others.append(unit)
            else:
                found.append(_Entry(unit, *job))
        if others:
            self._mixed_at = clock.monotonic()
        if not found:
            return others
        with self._room:
            room = 0 if self._abandoned.is_set() else min(self._room_left(), len(found))
            posted = found[:room]
            for entry in posted:
                self._entries[id(entry.unit)] = entry
            wake = self._post(posted) if posted else False
        if wake:
            self._loop.call_soon_threadsafe(self._take_inbox)
        return others + [entry.unit for entry in found[room:]]

    def _post(self, entries: list[_Entry]) -> bool:
        """Under ``_room``, with room for each of ``entries``: a free slot (started by the
        loop's next ``_take_inbox``), else a place among the parked. True when the loop
        must be woken for them."""
        slotted = min(self._free, len(entries))
        self._free -= slotted
        self._inbox.extend(entries[:slotted])
        self._parked.extend(entries[slotted:])
        self._last_post = clock.monotonic()
        wake = slotted > 0 and not self._woken
        self._woken = self._woken or slotted > 0
        return wake

    def _room_left(self) -> int:
        """Under ``_room`` (or as a hint): free slots and free places among the parked."""
        return self._free + max(0, self._park - len(self._parked))

    def loop_only(self) -> bool:
        """Whether the fetch should take jobs for the loop alone (see the module): it has
        taken async jobs in the last second, and no other kind for as long."""
        now = clock.monotonic()
        return now - self._last_post <= ACTIVE_SECONDS < now - self._mixed_at

    def room_to_fetch(self) -> int:
        """How many more jobs the fetch may take for the loop: its free slots and free
        places among the parked, at most ``FETCH_AHEAD``, and none unless it took an
        async job in the last second (a capsule whose jobs are all sync now fetches only
        for its threads)."""
        if clock.monotonic() - self._last_post > ACTIVE_SECONDS:
            return 0
        return min(self._room_left(), FETCH_AHEAD)  # posted jobs' room is taken already

    def held(self) -> list[UnitOfWork]:
        """Every unit the lane holds in Redis (see the module docstring)."""
        return [entry.unit for entry in list(self._entries.values())]

    def running(self) -> list[tuple[UnitOfWork, float]]:
        """The jobs on the loop and when each started, for the process record."""
        return [(e.unit, e.since) for e in list(self._entries.values()) if e.task is not None]

    def busy(self) -> int:
        """Jobs running on the loop."""
        return self._started

    def holding(self) -> int:
        """Jobs the lane holds: running, or handed over and waiting for a slot."""
        return len(self._entries)

    def holds(self, unit: UnitOfWork) -> bool:
        return id(unit) in self._entries

    def abandon(self) -> list[UnitOfWork]:
        """Hard stop, step one: start nothing more and return every held job, for the
        capsule to requeue before :meth:`cancel` ends the tasks. The parked jobs are let
        go here: they have no task to end."""
        self._abandoned.set()
        held = self.held()
        with self._room:
            parked, self._parked = self._parked, deque()
            self._room.notify_all()
        for entry in parked:
            self._entries.pop(id(entry.unit), None)
        return held

    def cancel(self) -> None:
        """Hard stop, step two: cancel the running tasks (their jobs were requeued)."""
        if self._thread.is_alive():
            self._loop.call_soon_threadsafe(self._cancel_all)

    def stop(self, timeout: float) -> None:
        """Stop the loop once its tasks ended (or ``timeout`` passed), then close it."""
        deadline = clock.monotonic() + timeout
        while self._entries and clock.monotonic() < deadline:
            self._stopped.wait(0.01)
        self._stopped.set()
        if not self._thread.is_alive():
            return  # never started: no loop was made
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(max(0.0, deadline - clock.monotonic()) + 1.0)
        self._watch.join(1.0)

    def log_task_stacks(self) -> None:
        """Each running async job's stack (TTIN), as the threads' stacks are logged."""
        for entry in list(self._entries.values()):
            task = entry.task
            if task is None:
                continue
            stack = "".join(coroutine_stack(task.get_coro()).format())
            log.warning("async task %s\n%s", entry.describe(), stack or "(not started)\n")

    # -- on the loop --------------------------------------------------------------

    def _run_loop(self) -> None:
        asyncio.set_event_loop(self._loop)
        self._loop.call_soon(self._beat)
        try:
            self._loop.run_forever()
        finally:
            self._loop.run_until_complete(self._loop.shutdown_default_executor())
            self._loop.close()

    def _beat(self) -> None:
        """The loop's pulse, read by the watch thread."""
        self._pulse = clock.monotonic()
        if not self._stopped.is_set():
            self._loop.call_later(self._block_warning / 4, self._beat)

    def _take_inbox(self) -> None:
        with self._room_lock:
            entries, self._inbox = self._inbox, []
            self._woken = False
        for entry in entries:
            self._start(entry)

    def _start(self, entry: _Entry) -> None:
        """On the loop's thread: run the job of ``entry`` (its slot is taken)."""
        entry.since = clock.now()
        entry.task = self._loop.create_task(self._run(entry))
        self._started += 1  # only the loop's thread writes it

    async def _run(self, entry: _Entry) -> None:
        unit = entry.unit
        try:
            await self.executor.execute_async(unit, entry.payload, entry.spec)
            if unit.give_back is not None:  # back in line: a round trip, off the loop
                await asyncio.to_thread(self.dispatch.finish, unit)
            else:
                self.dispatch.finish(unit)  # the same end as a processor's job
        except asyncio.CancelledError:
            pass  # a hard stop requeued it: nothing to record
        except Exception as exc:
            await self._requeue(unit, exc)
        finally:
            self._started -= 1
            self._entries.pop(id(unit), None)
            self._slot_freed()

    def _slot_freed(self) -> None:
        """On the loop's thread, as a job ends: its slot goes to the first parked job,
        started here at once, else back to the free slots; a processor waiting for room
        is told there is some."""
        with self._room_lock:  # the Condition's own lock: notify below may use it
            # (After a hard stop the parked jobs are requeued, not started.)
            start = bool(self._parked) and not self._abandoned.is_set()
            following = self._parked.popleft() if start else None
            if following is None:
                self._free += 1
            if self._waiting:
                self._room.notify()
        if following is not None:
            self._start(following)

    async def _requeue(self, unit: UnitOfWork, error: Exception) -> None:
        """Its outcome could not be recorded: requeue it (counted as a recovery) rather
        than lose it. If that fails too, it stays in progress, and the heartbeat requeues
        it as an orphan once the lane no longer holds it."""
        log.error(
            "could not record the outcome of an async job (%s queue=%s); requeueing it",
            describe_job(unit.job),
            unit.queue,
            exc_info=error,
        )
        try:
            reason = f"{type(error).__name__}: {error}"
            await asyncio.to_thread(self.dispatch.requeue, unit, reason=reason)
        except Exception:
            log.exception("requeue failed; the heartbeat will recover %s", describe_job(unit.job))

    def _cancel_all(self) -> None:
        for entry in list(self._entries.values()):
            if entry.task is not None:
                entry.task.cancel()

    # -- the watch thread -----------------------------------------------------------

    def _watch_loop(self) -> None:
        warned_at: float | None = None
        ticked, cpu_then = clock.monotonic(), self._loop_cpu()
        while not self._stopped.wait(self._block_warning / 4):
            now, pulse, cpu = clock.monotonic(), self._pulse, self._loop_cpu()
            # The loop's thread ran for at least half the time since the last look (a
            # job holding it, in Python or in C), or its CPU time cannot be read.
            busy = cpu is None or cpu_then is None or cpu - cpu_then >= (now - ticked) / 2
            late = blocked_for(now, pulse, ticked, self._block_warning, loop_busy=busy)
            ticked, cpu_then = now, cpu
            if late is None or warned_at == pulse:
                continue
            warned_at = pulse  # once per stall
            self._warn_blocked(late)

    def _loop_cpu(self) -> float | None:
        """CPU seconds the loop's thread has used (Linux and other POSIX systems), else
        None."""
        ident = self._thread.ident
        try:
            return time.clock_gettime(time.pthread_getcpuclockid(ident))  # type: ignore[arg-type]
        except (AttributeError, OSError, TypeError):
            return None

    def _warn_blocked(self, late: float) -> None:
        task = asyncio.current_task(self._loop)
        frame = sys._current_frames().get(self._thread.ident or 0)
        where = "".join(traceback.format_stack(frame, limit=-3)) if frame is not None else ""
        log.warning(
            "event loop blocked for %.1fs by %s: a sync call in an async job stalls every "
            "job on the loop (move it to a thread: await asyncio.to_thread(...))\n%s",
            late,
            self._job_of(task),
            where,
        )

    def _job_of(self, task: asyncio.Task[Any] | None) -> str:
        """The job a task of the loop runs, as logs name it."""
        if task is None:
            return "no job (limitd's own code)"
        for entry in list(self._entries.values()):
            if entry.task is task:
                return entry.describe()
        return task.get_name()


def blocked_for(
    now: float, pulse: float | None, ticked: float, threshold: float, *, loop_busy: bool = True
) -> float | None:
    """How long the loop has been blocked, as the watch thread sees it at ``now``, or None
    if that is not a blocked loop: the loop has not beaten yet (a slow start), it beat
    within ``threshold`` seconds, or the watch thread itself (last awake at ``ticked``,
    due again a quarter of ``threshold`` later) overslept by half of it while the loop's
    thread was not busy either: then the whole process was held up (a busy machine, a
    paused VM), not the loop by a job. A job blocking the loop in a sleep leaves the
    watch thread on time; one holding the GIL in C code keeps the loop's thread busy."""
    if pulse is None:
        return None
    late = now - pulse
    overslept = now - ticked - threshold / 4
    if late < threshold or (overslept >= threshold / 2 and not loop_busy):
        return None
    return late


class NullLane:
    """The lane of a capsule without async jobs: holds nothing, runs nothing."""

    size = 0

    def start(self) -> None:
        """No loop to start."""

    def room_to_fetch(self) -> int:
        return 0

    def held(self) -> list[UnitOfWork]:
        return []

    def running(self) -> list[tuple[UnitOfWork, float]]:
        return []

    def busy(self) -> int:
        return 0

    def holding(self) -> int:
        return 0

    def holds(self, unit: UnitOfWork) -> bool:
        return False

    def abandon(self) -> list[UnitOfWork]:
        return []

    def cancel(self) -> None:
        """No task to cancel."""

    def stop(self, timeout: float) -> None:
        """No loop to stop."""

    def log_task_stacks(self) -> None:
        """No task to show."""


def new_loop(kind: str) -> asyncio.AbstractEventLoop:
    """A new event loop: asyncio's, or with ``async_loop: uvloop`` libuv's, whose timers
    and callbacks are C where asyncio's are Python (a job awaiting a timer costs the
    loop about a third less CPU; see the docs' benchmarks)."""
    if kind == "uvloop":
        import uvloop  # the config checked it is installed

        return uvloop.new_event_loop()
    return asyncio.new_event_loop()


def build_lane(
    config: CapsuleConfig, executor: JobExecutor, dispatch: Dispatch
) -> AsyncLane | NullLane:
    """The event loop for async jobs, when the app has any (or the config sized it),
    with the executor told to hand them to it; else the null lane."""
    size = config.async_concurrency
    if size is None and executor.jobs.has_async():
        size = DEFAULT_ASYNC_CONCURRENCY
    if size is None:
        return NullLane()
    lane = AsyncLane(
        executor,
        dispatch,
        size,
        name=config.name,
        block_warning=config.async_block_warning,
        loop=config.async_loop,
    )
    executor.hand_off = lane.submit
    dispatch.extra = lane.room_to_fetch
    dispatch.spill = lane.take_fetched
    dispatch.loop_only = lane.loop_only
    bridged = executor.chain.without_acall()
    if bridged:
        log.warning(
            "server middleware without acall() run async jobs on a worker thread each: %s",
            ", ".join(bridged),
        )
    return lane


def coroutine_stack(coro: object) -> traceback.StackSummary:
    """Where a suspended coroutine waits, outermost first, down the chain of what each
    awaits. (A task's own ``print_stack`` shows only the outermost coroutine, which here
    is always the lane's wrapper, never the job's line.)"""
    frames = []
    while coro is not None:
        frame = getattr(coro, "cr_frame", None) or getattr(coro, "gi_frame", None)
        if frame is not None:
            frames.append((frame, frame.f_lineno))
        coro = getattr(coro, "cr_await", None) or getattr(coro, "gi_yieldfrom", None)
    return traceback.StackSummary.extract(frames)
