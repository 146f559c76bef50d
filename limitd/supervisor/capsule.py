"""A capsule: N processor threads sharing one fetch (through one dispatcher for the limit
fetch), plus the poller and the heartbeat.

This is the unit the supervisor runs in each child process; tests and scripts can also
run it in-process. Lifecycle (Sidekiq's verbs): ``start``; ``quiet`` (finish current
jobs, take no new ones); ``stop(timeout)`` (quiet, wait until one monotonic deadline,
then give unfinished jobs back to their queues *before* abandoning their threads: it is
worse to lose a job than to run it twice); ``drain`` (run in the calling thread until
the queues are empty: deterministic, for tests and one-off scripts).

The Sidekiq process record is rewritten every ``record_period`` (5 s). Every heartbeat
marks the capsule alive, writes the record too, re-applies configured limits where Redis
has none (after a flush, say), reaps capsules that stopped beating (unless its own beats
failed lately: ``liveness.ReapGate``), requeues jobs this capsule holds in Redis but no
thread runs (a fetch whose reply was lost), and flushes the job counters, which its
``StatsFlusher`` otherwise writes a second after jobs end.
"""

from __future__ import annotations

import importlib
import logging
import threading
from collections import Counter
from collections.abc import Callable, Sequence

import redis as redis_py

from limitd import clock, keys
from limitd.config import CapsuleConfig
from limitd.fetch.basic import BasicFetch, UnitOfWork
from limitd.fetch.dispatcher import Dispatcher
from limitd.fetch.limit import QUIET_SECONDS, LimitFetch
from limitd.fetch.order import QueueOrder
from limitd.fetch.wakeup import IdleGate, WakeupListener
from limitd.locate import app_location, connect_to
from limitd.middleware.chain import ServerChain
from limitd.middleware.defaults import default_server_chain
from limitd.retry import RetryHandler
from limitd.supervisor import liveness
from limitd.supervisor.async_lane import DEFAULT_ASYNC_CONCURRENCY, AsyncLane
from limitd.supervisor.executor import JobExecutor
from limitd.supervisor.heartbeat import (
    Heartbeat,
    ProcessRecord,
    WorkItem,
    new_identity,
    process_info,
)
from limitd.supervisor.poller import ScheduledPoller
from limitd.supervisor.processor import Processor
from limitd.supervisor.stats import JobStats, StatsFlusher

log = logging.getLogger("limitd.capsule")

KILL_GRACE_SECONDS = 3.0
JOIN_POLL_SECONDS = 0.05


class Capsule:
    def __init__(
        self,
        config: CapsuleConfig | None = None,
        *,
        redis: redis_py.Redis | None = None,
        middleware: ServerChain | None = None,
    ) -> None:
        self.config = config or CapsuleConfig()
        import_app(self.config.require)
        self.redis = (
            redis
            if redis is not None
            else connect_to(app_location(), max_connections=self.config.concurrency + 8)
        )
        self.id = self.config.capsule_id
        self.order = QueueOrder(self.config.queues)
        self.gate = IdleGate(self.config.poll_range)
        self.fetch = self._build_fetch()
        # Limit fetch: one call at a time for every waiting processor (see its module).
        self.dispatcher = (
            Dispatcher(self.fetch, self.gate) if isinstance(self.fetch, LimitFetch) else None
        )
        self.stats = JobStats()
        retry = RetryHandler(self.redis, self.config.dead_set, self.config.death_handlers)
        chain = middleware if middleware is not None else default_server_chain(self.redis)
        self.executor = JobExecutor(
            retry, chain, self.stats, max_recoveries=self.config.max_recoveries
        )
        self.lane = self._build_lane()
        self.poller = ScheduledPoller(
            self.redis,
            poll_interval_average=self.config.poll_interval_average,
            average_scheduled_poll_interval=self.config.average_scheduled_poll_interval,
            mode=self.config.scheduled_poll,
        )
        self.identity = new_identity(self.id)
        self.reap_gate = liveness.ReapGate(self.config.heartbeat_period)
        self.flusher = StatsFlusher(self.stats, self.redis)
        self.record = ProcessRecord(
            self.identity,
            process_info(self.config, self.order.weights, self.lane.size if self.lane else 0),
            self.work,
            ttl=liveness.EXPIRY_PERIODS * self.config.heartbeat_period,
        )
        self.heartbeat = Heartbeat(
            self.beat,
            self.config.heartbeat_period,
            refresh=self._write_record,
            refresh_period=self.config.record_period,
        )
        # One subscription for the dispatcher's wake-ups and the poller's due times.
        channels = self.poller.channels()
        if self.dispatcher is not None:
            channels[keys.WAKE_CHANNEL] = self._on_wake
        self.wakeup = WakeupListener(self.redis, channels)
        self._processors: set[Processor] = set()
        self._lock = threading.Lock()
        self._stopping = False
        # Set when ``stop`` has retired the capsule: a stop asked from afar runs on a
        # thread of its own, and whoever embeds the capsule may need to know it is over.
        self.stopped = threading.Event()
        self._busy_listeners: list[Callable[[], None]] = []
        self.on_remote_stop: Callable[[], None] = self._stop_in_background
        # A rolling restart asked from afar: only a supervisor can run one.
        self.on_remote_restart: Callable[[], None] = lambda: log.error(
            "rolling restart requested from afar (USR2), but no supervisor runs this capsule"
        )

    @property
    def limited(self) -> bool:
        return isinstance(self.fetch, LimitFetch)

    def start(self) -> None:
        if self.lane is not None:
            self.lane.start()
        self.heartbeat.start()
        self.flusher.start()
        if self.dispatcher is not None:
            self.dispatcher.start()
        if self.wakeup.handlers:
            self.wakeup.start()
            if isinstance(self.fetch, LimitFetch) and self.fetch.per_queue:
                self.fetch.quiet_seconds = QUIET_SECONDS  # wake-ups name queues with news
        with self._lock:
            for index in range(self.config.concurrency):
                self._spawn(index)
        self.poller.start()
        log.info(
            "capsule %s (%s) started: %d threads, queues %s (%s), %s fetch",
            self.config.name,
            self.id,
            self.config.concurrency,
            ", ".join(self.order.names),
            self.order.mode,
            self.config.fetch,
        )

    def beat(self) -> None:
        """One heartbeat: see the module docstring. Liveness first: it is kept even when
        Redis refuses the other writes, which then close the reap gate."""
        try:
            if self.limited:
                liveness.vouch(self.redis, [self.id], self.config.heartbeat_period)
            self._write_record()
        except redis_py.RedisError:
            self.reap_gate.failed()
            raise
        self.reap_gate.succeeded()
        if isinstance(self.fetch, LimitFetch):
            self.config.limit_settings.apply_defaults(self.redis)
            if self.reap_gate.open():
                liveness.reap_dead(self.redis)
            self.fetch.recover_orphans(self._held())
        self.stats.flush(self.redis)

    def _write_record(self) -> None:
        """The process record, and a signal an operator sent from afar: ``TSTP`` quiets
        this capsule, ``TERM`` calls ``on_remote_stop`` (by default, a graceful stop of
        this capsule; under a supervisor, the supervisor's TERM, as if sent by hand);
        ``USR2`` calls ``on_remote_restart`` (under a supervisor, its rolling restart)."""
        signal = self.record.write(self.redis)
        if signal == "TSTP":
            log.warning("quiet requested from afar (TSTP)")
            self.quiet()
        elif signal == "TERM":
            log.warning("stop requested from afar (TERM)")
            self.on_remote_stop()
        elif signal == "USR2":
            log.warning("rolling restart requested from afar (USR2)")
            self.on_remote_restart()
        elif signal is not None:
            log.error("ignored an unknown signal sent from afar: %r", signal)

    def _stop_in_background(self) -> None:
        threading.Thread(target=self.stop, name="limitd-remote-stop", daemon=True).start()

    def quiet(self) -> None:
        """Finish what runs, start nothing new (TSTP)."""
        with self._lock:
            self._stopping = True
            processors = list(self._processors)
        for processor in processors:
            processor.terminate()
        if self.dispatcher is not None:
            self.dispatcher.close()
        self.gate.close()
        self.poller.terminate()
        self.record.quiet = True
        self.heartbeat.beat_soon()
        self._busy_changed()

    def stop(self, timeout: float | None = None, *, grace: float = KILL_GRACE_SECONDS) -> int:
        """Stop within ``timeout`` seconds (default: the capsule's), then give threads
        still running a requeued job up to ``grace`` seconds to unwind (their late acks
        are harmless: see ``limit_fetch.lua``). Returns how many jobs were requeued."""
        deadline = clock.monotonic() + (self.config.timeout if timeout is None else timeout)
        self.quiet()
        self._wait_for_processors(deadline)
        requeued = self._hard_shutdown(grace)
        if self.lane is not None:
            self.lane.stop(grace)
        if self.dispatcher is not None:
            self.dispatcher.stop()
        self.wakeup.stop()
        self.poller.join(1.0)
        self.heartbeat.stop()
        self.flusher.stop()
        self._retire()
        log.info("capsule %s stopped (%d jobs requeued)", self.config.name, requeued)
        self.stopped.set()
        return requeued

    def drain(self, *, scheduled: bool = False) -> Counter[str]:
        """Run jobs in this thread until every queue of the capsule is empty (or holds
        only jobs its limits forbid); with ``scheduled``, also move due scheduled and
        retry jobs first and after each job. Returns the count of each outcome."""
        outcomes: Counter[str] = Counter()
        finished = None
        while True:
            if scheduled:
                self.poller.enqueue_due()
            if isinstance(self.fetch, LimitFetch):
                self.fetch.woken("")  # no wake-ups here: every queue is looked at
            unit = self.fetch.try_retrieve(finished)  # also settles the finished one
            if unit is None:
                break
            outcomes[self.executor.execute(unit, inline=True)] += 1
            finished = unit
        self.stats.flush(self.redis)
        return outcomes

    def add_busy_listener(self, listener: Callable[[], None]) -> None:
        """Called (from processor threads) whenever a job starts or ends, and on quiet.
        Keep it cheap: set an event, do the work elsewhere."""
        self._busy_listeners.append(listener)

    def _busy_changed(self) -> None:
        for listener in self._busy_listeners:
            listener()

    def processor_count(self) -> int:
        """Processor threads still running (0 once a quiet capsule has finished)."""
        with self._lock:
            return len(self._processors)

    def busy(self) -> int:
        """Jobs running now, counted without listing them (the process title asks often,
        and a busy loop holds a thousand)."""
        with self._lock:
            threads = sum(1 for p in self._processors if self._runs_here(p.current))
        return threads + (self.lane.busy() if self.lane is not None else 0)

    def _runs_here(self, unit: UnitOfWork | None) -> bool:
        """A processor's unit is its running job, unless it handed it to the loop and
        waits for a slot (not running anywhere yet)."""
        return unit is not None and (self.lane is None or not self.lane.holds(unit))

    def capacity(self) -> int:
        """Jobs it can run at once: its threads, plus its event loop's slots."""
        return self.config.concurrency + (self.lane.size if self.lane is not None else 0)

    def work(self) -> list[WorkItem]:
        with self._lock:
            processors = list(self._processors)
        threads = [
            WorkItem(str(p.ident), unit.queue, unit.job, p.current_since)
            for p in processors
            if (unit := p.current) is not None and self._runs_here(unit)
        ]
        if self.lane is None:
            return threads
        tasks = [
            WorkItem(f"async-{index}", unit.queue, unit.job, since)
            for index, (unit, since) in enumerate(self.lane.running())
        ]
        return threads + tasks

    def _held(self) -> list[UnitOfWork]:
        with self._lock:
            processors = list(self._processors)
        held = [unit for processor in processors for unit in processor.held()]
        if self.lane is not None:
            held += self.lane.held()
        return held + (self.dispatcher.held() if self.dispatcher is not None else [])

    def _build_lane(self) -> AsyncLane | None:
        """The event loop for async jobs, when the app has any (or the config sized it)."""
        size = self.config.async_concurrency
        if size is None and self.executor.jobs.has_async():
            size = DEFAULT_ASYNC_CONCURRENCY
        if size is None:
            return None
        lane = AsyncLane(
            self.executor,
            self._settle_async,
            size,
            name=self.config.name,
            block_warning=self.config.async_block_warning,
        )
        self.executor.hand_off = lane.submit
        if self.dispatcher is not None:
            self.dispatcher.extra = lane.room_to_fetch
        bridged = self.executor.chain.without_acall()
        if bridged:
            log.warning(
                "server middleware without acall() run async jobs on a worker thread each: %s",
                ", ".join(bridged),
            )
        return lane

    def _settle_async(self, unit: UnitOfWork) -> None:
        """An async job finished: the limit fetch settles it with its next call; the
        basic fetch has nothing to settle (BRPOP took the job; its deferred calls were
        made by ``execute_async``)."""
        if self.dispatcher is not None:
            self.dispatcher.settle_later(unit)
        else:
            unit.acknowledge()

    def _build_fetch(self) -> LimitFetch | BasicFetch:
        if self.config.fetch == "basic":
            return BasicFetch(self.redis, self.order)
        return LimitFetch(
            self.redis,
            self.order,
            self.id,
            gate=self.gate,
            blocking=self.config.blocking,
            dynamic=self.config.dynamic,
        )

    def _on_wake(self, queue: str) -> None:
        fetch = self.fetch
        if isinstance(fetch, LimitFetch) and fetch.wants(queue):
            if queue and queue not in self.order.weights:
                fetch.refresh_dynamic()
            fetch.woken(queue)
            self.gate.wake()

    def _spawn(self, index: int) -> None:
        processor = Processor(
            index,
            self.dispatcher or self.fetch,
            self.executor,
            self._processor_exited,
            capsule=self.config.name,
            on_busy=self._busy_changed,
        )
        self._processors.add(processor)
        processor.start()

    def _processor_exited(self, processor: Processor) -> None:
        """Processors leave the set themselves; one that died while the capsule runs is
        replaced, so a crash in one job never shrinks the capsule."""
        with self._lock:
            self._processors.discard(processor)
            if not self._stopping:
                log.error("processor %d died unexpectedly; starting a new one", processor.index)
                self._spawn(processor.index)

    def _wait_for_processors(self, deadline: float) -> None:
        """Until every processor has left and the loop has no job (or the deadline)."""
        while clock.monotonic() < deadline:
            with self._lock:
                if not self._processors and (self.lane is None or not self.lane.holding()):
                    return
            threading.Event().wait(JOIN_POLL_SECONDS)

    def _hard_shutdown(self, grace: float) -> int:
        """Requeue the jobs still running, then interrupt only the threads running them.
        Idle threads are left to notice the stop when their fetch returns: one that
        fetches a job (even one just requeued) hands it back itself, whereas interrupting
        it could land between its fetch and that hand-back and lose the job."""
        with self._lock:
            remaining = list(self._processors)
        running = [(p, unit) for p in remaining if (unit := p.current) is not None]
        ours = {id(unit) for _, unit in running}  # a processor waiting for a loop slot
        on_loop = [u for u in self.lane.abandon() if id(u) not in ours] if self.lane else []
        if running or on_loop:
            self.fetch.bulk_requeue([unit for _, unit in running] + on_loop)
            log.warning("timeout reached: requeued %d unfinished jobs", len(running) + len(on_loop))
        if self.lane is not None:
            self.lane.cancel()
        for processor, _ in running:
            processor.kill()
        # Idle threads leave within one fetch; those interrupted need their job's next
        # bytecode, which a job blocked in C code delays.
        idle_until = clock.monotonic() + self.fetch.block_seconds + 1
        killed_until = clock.monotonic() + grace
        killed = {p for p, _ in running}
        for processor in remaining:
            until = killed_until if processor in killed else idle_until
            processor.join(max(0.0, until - clock.monotonic()))
        return len(running) + len(on_loop)

    def _retire(self) -> None:
        """Last words in Redis: counters, no process record, no liveness. Whatever the
        capsule still holds (a requeue that failed) is returned by reaping itself."""
        try:
            self.stats.flush(self.redis)
            self.record.clear(self.redis)
            if self.limited:
                leftover = liveness.retire(self.redis, self.id)
                if leftover:
                    log.warning("returned %d jobs left in progress", leftover)
        except redis_py.RedisError as exc:
            log.error("could not retire capsule %s cleanly: %s", self.id, exc)


def import_app(modules: Sequence[str]) -> None:
    """Import the modules that define the app's jobs: the only jobs this worker runs."""
    for module in modules:
        try:
            importlib.import_module(module)
        except ImportError as exc:
            raise ImportError(f"cannot import required module {module!r}: {exc}") from exc
