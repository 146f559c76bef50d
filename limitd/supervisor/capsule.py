"""A capsule: N processor threads taking jobs from one fetch, plus the poller and the
heartbeat. The supervisor runs one in each child process; tests and scripts can also
run it in-process.

What a capsule is made of, each in its own module: the fetch and the dispatch its
threads take jobs from (``limitd.fetch.factory`` picks them from the config), the
processors (``processors.py``: their lifecycle), the event loop for async jobs
(``async_lane.py``, a null lane without any), the executor that runs one job, and the
heartbeat, poller and counters. Lifecycle (Sidekiq's verbs): ``start``; ``quiet``
(finish current jobs, take no new ones); ``stop(timeout)`` (quiet, wait until one
monotonic deadline, then requeue unfinished jobs *before* abandoning their threads);
``drain`` (run in the calling thread until the queues are empty: for tests and scripts).

Every heartbeat marks the capsule alive, writes the Sidekiq process record (also
rewritten every ``record_period``; ``remote.py`` obeys the signals read back with it),
lets the fetch do its work on Redis (for the limit fetch: re-apply configured limits,
reap capsules that stopped beating unless its own beats failed lately,
``liveness.ReapGate``, and requeue jobs it holds but no thread runs), and flushes the
job counters, which ``StatsFlusher`` otherwise writes a second after jobs end.
"""

from __future__ import annotations

import logging
import threading
from collections import Counter
from collections.abc import Callable

import redis as redis_py

from limitd import clock
from limitd.app_hooks import server_config
from limitd.config import CapsuleConfig
from limitd.fetch import liveness
from limitd.fetch.basic import UnitOfWork
from limitd.fetch.factory import build_fetch
from limitd.fetch.wakeup import IdleGate, WakeupListener
from limitd.locate import app_location, connect_to
from limitd.middleware.chain import ServerChain
from limitd.middleware.defaults import default_server_chain
from limitd.queues.order import QueueOrder
from limitd.registry import import_app
from limitd.retry import RetryHandler
from limitd.supervisor import remote
from limitd.supervisor.async_lane import build_lane
from limitd.supervisor.executor import INTERRUPTED, JobExecutor
from limitd.supervisor.heartbeat import (
    Heartbeat,
    WorkItem,
    process_info,
)
from limitd.supervisor.poller import ScheduledPoller
from limitd.supervisor.processors import Processors
from limitd.supervisor.stats import JobStats, StatsFlusher

log = logging.getLogger("limitd.capsule")

KILL_GRACE_SECONDS = 3.0
POOL_EXTRA = 8  # connections beyond one per thread: heartbeat, poller, wake-ups


class Capsule:
    """``Capsule(config, redis=..., middleware=...)``: without ``redis``, it connects
    where the app would; the modules in ``config.require`` are imported (once)."""

    def __init__(
        self,
        config: CapsuleConfig | None = None,
        *,
        redis: redis_py.Redis | None = None,
        middleware: ServerChain | None = None,
    ) -> None:
        self.config = config = config or CapsuleConfig()
        import_app(config.require)
        self.redis = redis if redis is not None else connect_for(config)
        self.id = config.capsule_id
        self.order = QueueOrder(config.queues)
        self.gate = IdleGate(config.poll_range)
        self.fetch, self.dispatcher = build_fetch(config, self.redis, self.order, self.gate)
        self.stats = JobStats()
        self.app = app = server_config()
        self.executor = JobExecutor(
            RetryHandler(
                self.redis,
                config.dead_set,
                [*config.death_handlers, *app.death_handlers],
                error_handlers=app.error_handlers,
            ),
            middleware if middleware is not None else default_server_chain(self.redis),
            self.stats,
            max_recoveries=config.max_recoveries,
        )
        self.lane = build_lane(config, self.executor, self.dispatcher)
        self._busy_listeners: list[Callable[[], None]] = []
        self.processors = Processors(
            config.concurrency,
            self.dispatcher,
            self.executor,
            self.lane,
            name=config.name,
            on_busy=self._busy_changed,
        )
        self.poller = ScheduledPoller(
            self.redis,
            poll_interval_average=config.poll_interval_average,
            average_scheduled_poll_interval=config.average_scheduled_poll_interval,
            mode=config.scheduled_poll,
        )
        self.reap_gate = liveness.ReapGate(config.heartbeat_period)
        self.flusher = StatsFlusher(self.stats, self.redis)
        # A stop or rolling restart asked from afar (see ``remote.py``): a supervisor
        # replaces both. ``stopped`` is set once ``stop`` has retired the capsule.
        self.on_remote_stop: Callable[[], None] = remote.stop_in_background(self.stop)
        self.on_remote_restart: Callable[[], None] = remote.no_supervisor
        self.stopped = threading.Event()
        self._quieted = False
        info = process_info(config, self.order.weights, self.lane.size)
        self.remote = remote.RemoteControl(self, self.redis, config, info, self.work)
        self.record, self.identity = self.remote.record, self.remote.record.identity
        self.heartbeat = Heartbeat(
            self.beat,
            config.heartbeat_period,
            refresh=self.remote.write,
            refresh_period=config.record_period,
        )
        # One subscription for the fetch's wake-ups and the poller's due times.
        channels = {**self.poller.channels(), **self.fetch.wake_handlers()}
        self.wakeup = WakeupListener(self.redis, channels)

    def start(self) -> None:
        self.app.fire("startup")
        self.lane.start()
        self.heartbeat.start()
        self.flusher.start()
        self.dispatcher.start()
        if self.wakeup.handlers:
            self.wakeup.start()
        self.processors.start()
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
            self.fetch.vouch(self.config.heartbeat_period)
            self.remote.write()
        except redis_py.RedisError:
            self.reap_gate.failed()
            raise
        self.reap_gate.succeeded()
        self.fetch.maintain(self._held, reap=self.reap_gate.open())
        self.stats.flush(self.redis)

    def quiet(self) -> None:
        """Finish what runs, start nothing new (TSTP). Middleware whose jobs can stop
        early (iterable jobs, between two items) are told."""
        self.processors.quiet()
        self.executor.chain.quiet()
        self.dispatcher.close()
        self.gate.close()
        self.poller.terminate()
        self.record.quiet = True
        self.heartbeat.beat_soon()
        self._busy_changed()
        if not self._quieted:  # TSTP then TERM: the app hears of it once
            self._quieted = True
            self.app.fire("quiet")

    def stop(self, timeout: float | None = None, *, grace: float = KILL_GRACE_SECONDS) -> int:
        """Stop within ``timeout`` seconds (default: the capsule's), then give threads
        still running a requeued job up to ``grace`` seconds to unwind (their late
        settlements are harmless: see ``limit_fetch.lua``). Returns how many jobs were
        requeued."""
        deadline = clock.monotonic() + (self.config.timeout if timeout is None else timeout)
        self.quiet()
        self.processors.wait(deadline)
        requeued = self.processors.hard_shutdown(grace)
        self.lane.stop(grace)
        self.dispatcher.stop()
        self.wakeup.stop()
        self.poller.join(1.0)
        self.heartbeat.stop()
        self.flusher.stop()
        self._retire()
        self.app.fire("shutdown")
        log.info("capsule %s stopped (%d jobs requeued)", self.config.name, requeued)
        self.stopped.set()
        return requeued

    def drain(self, *, scheduled: bool = False) -> Counter[str]:
        """Run jobs in this thread until every queue of the capsule is empty (or holds
        only jobs its limits forbid); with ``scheduled``, also move due scheduled and
        retry jobs first and after each job. Returns the count of each outcome. Each
        job ends as a processor's does: on the dispatch's ``finish``."""
        outcomes: Counter[str] = Counter()
        while True:
            if scheduled:
                self.poller.enqueue_due()
            unit = self.dispatcher.take_now()  # also settles the jobs finished before
            if unit is None:
                break
            outcome = self.executor.execute(unit, inline=True)
            outcomes[outcome] += 1
            self.dispatcher.finish(unit)
            if outcome == INTERRUPTED and self._quieted:
                break  # put back because the capsule quieted: it would come straight back
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
        return self.processors.count()

    def busy(self) -> int:
        """Jobs running now, counted without listing them (the process title asks often,
        and a busy loop holds a thousand)."""
        return self.processors.busy() + self.lane.busy()

    def capacity(self) -> int:
        """Jobs it can run at once: its threads, plus its event loop's slots."""
        return self.config.concurrency + self.lane.size

    def work(self) -> list[WorkItem]:
        return self.processors.work()

    def _held(self) -> list[UnitOfWork]:
        return self.processors.held() + self.dispatcher.held()

    def _retire(self) -> None:
        """Last words in Redis: counters, no process record, no liveness. Whatever the
        capsule still holds (a requeue that failed) is returned by the fetch."""
        try:
            self.stats.flush(self.redis)
            self.record.clear(self.redis)
            leftover = self.fetch.retire()
            if leftover:
                log.warning("returned %d jobs left in progress", leftover)
        except redis_py.RedisError as exc:
            log.error("could not retire capsule %s cleanly: %s", self.id, exc)


def connect_for(config: CapsuleConfig) -> redis_py.Redis:
    """A capsule's own pool, where the app finds Redis: a connection per thread and a
    few for the heartbeat, the poller and the wake-ups."""
    return connect_to(app_location(), max_connections=config.concurrency + POOL_EXTRA)
