"""The processors' lifecycle: a capsule's manager, in Sidekiq's terms.

It spawns ``concurrency`` processor threads, replaces one that dies while the capsule
runs (a crash in one job never shrinks the capsule), quiets them, waits for them until
one monotonic deadline, and at a hard shutdown requeues the jobs still running *before*
abandoning their threads: it is worse to lose a job than to run it twice. It also
answers what the threads (and the event loop beside them) are running, for the process
record and the heartbeat.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable

from limitd import clock
from limitd.fetch import Dispatch
from limitd.fetch.basic import UnitOfWork
from limitd.supervisor.async_lane import AsyncLane, NullLane
from limitd.supervisor.executor import JobExecutor
from limitd.supervisor.heartbeat import WorkItem
from limitd.supervisor.processor import Processor

log = logging.getLogger("limitd.capsule")

JOIN_POLL_SECONDS = 0.05


class Processors:
    """A capsule's processor threads, fed by ``dispatch``, with ``lane`` for async jobs."""

    def __init__(
        self,
        size: int,
        dispatch: Dispatch,
        executor: JobExecutor,
        lane: AsyncLane | NullLane,
        *,
        name: str = "default",
        on_busy: Callable[[], None] | None = None,
    ) -> None:
        self.size = size
        self.dispatch = dispatch
        self.executor = executor
        self.lane = lane
        self.name = name
        self.on_busy = on_busy
        self._processors: set[Processor] = set()
        self._lock = threading.Lock()
        self._stopping = False

    def start(self) -> None:
        with self._lock:
            for index in range(self.size):
                self._spawn(index)

    def quiet(self) -> None:
        """Each thread finishes its job and takes no other."""
        with self._lock:
            self._stopping = True
            processors = list(self._processors)
        for processor in processors:
            processor.terminate()

    def count(self) -> int:
        """Processor threads still running (0 once a quiet capsule has finished)."""
        with self._lock:
            return len(self._processors)

    def busy(self) -> int:
        """Jobs running on the threads, counted without listing them."""
        with self._lock:
            return sum(1 for p in self._processors if self._runs_here(p.current))

    def work(self) -> list[WorkItem]:
        """What each thread runs, then each job on the loop, for the process record."""
        threads = [
            WorkItem(str(p.ident), unit.queue, unit.job, p.current_since)
            for p in self._list()
            if (unit := p.current) is not None and self._runs_here(unit)
        ]
        tasks = [
            WorkItem(f"async-{index}", unit.queue, unit.job, since)
            for index, (unit, since) in enumerate(self.lane.running())
        ]
        return threads + tasks

    def held(self) -> list[UnitOfWork]:
        """Every unit the threads and the loop hold (the dispatch's are apart)."""
        return [unit for p in self._list() for unit in p.held()] + self.lane.held()

    def wait(self, deadline: float) -> None:
        """Until every processor has left and the loop has no job (or the deadline)."""
        while clock.monotonic() < deadline:
            with self._lock:
                if not self._processors and not self.lane.holding():
                    return
            threading.Event().wait(JOIN_POLL_SECONDS)

    def hard_shutdown(self, grace: float) -> int:
        """Requeue the jobs still running, then interrupt only the threads running them.
        Idle threads are left to notice the stop when their take returns: one that
        takes a job (even one just requeued) hands it back itself, whereas interrupting
        it could land between its take and that hand-back and lose the job. Returns how
        many jobs were requeued."""
        remaining = self._list()
        running = [(p, unit) for p in remaining if (unit := p.current) is not None]
        ours = {id(unit) for _, unit in running}  # a processor waiting for a loop slot
        on_loop = [u for u in self.lane.abandon() if id(u) not in ours]
        if running or on_loop:
            self.dispatch.requeue([unit for _, unit in running] + on_loop)
            log.warning("timeout reached: requeued %d unfinished jobs", len(running) + len(on_loop))
        self.lane.cancel()
        for processor, _ in running:
            processor.kill()
        self._join(remaining, {p for p, _ in running}, grace)
        return len(running) + len(on_loop)

    def _join(self, remaining: list[Processor], killed: set[Processor], grace: float) -> None:
        """Idle threads leave within one take; those interrupted need their job's next
        bytecode, which a job blocked in C code delays."""
        idle_until = clock.monotonic() + self.dispatch.block_seconds + 1
        killed_until = clock.monotonic() + grace
        for processor in remaining:
            until = killed_until if processor in killed else idle_until
            processor.join(max(0.0, until - clock.monotonic()))

    def _runs_here(self, unit: UnitOfWork | None) -> bool:
        """A processor's unit is its running job, unless it handed it to the loop and
        waits for a slot (not running anywhere yet)."""
        return unit is not None and not self.lane.holds(unit)

    def _list(self) -> list[Processor]:
        with self._lock:
            return list(self._processors)

    def _spawn(self, index: int) -> None:
        processor = Processor(
            index,
            self.dispatch,
            self.executor,
            self._exited,
            capsule=self.name,
            on_busy=self.on_busy,
        )
        self._processors.add(processor)
        processor.start()

    def _exited(self, processor: Processor) -> None:
        """Processors leave the set themselves; one that died while the capsule runs is
        replaced."""
        with self._lock:
            self._processors.discard(processor)
            if not self._stopping:
                log.error("processor %d died unexpectedly; starting a new one", processor.index)
                self._spawn(processor.index)
