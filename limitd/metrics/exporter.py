"""``limitd metrics``: the cluster's state in Prometheus's text format, read from Redis
at each scrape.

One exporter for the whole cluster, however many supervisors run: the figures are the
ones ``limitd queues`` and the admin API show (``limitd.api``), read when Prometheus asks,
so N supervisors do not export N copies of them and nothing is cached between scrapes.

A scrape costs a fixed number of round trips whatever the number of queues, processes or
tenants: one for the counters and set sizes, three for the queues (``queue_overview``),
two for the processes (``Processes``), then each feature's ``metrics(redis)`` hook, which
must be bounded the same way (``limitd.plugins.Feature``). A part that fails (Redis gone
away, a feature's bug) is logged and left out; the others are still served, and
``limitd_exporter_up{part}`` says which parts are missing.
"""

from __future__ import annotations

import logging
import signal
from collections.abc import Callable, Iterable, Iterator, Sequence
from typing import Any

import redis as redis_py
from prometheus_client import CollectorRegistry, start_http_server
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from limitd import clock, keys
from limitd.api import Processes, QueueStatus, queue_overview
from limitd.plugins import Feature, registered

log = logging.getLogger("limitd.metrics")

CORE = "core"  # the part of a scrape limitd itself reads; features are named parts
STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM)
JOIN_TIMEOUT = 2.0


class ClusterCollector(Collector):
    """A prometheus-client collector of limitd's cluster-wide state: the core figures,
    then each feature's families (``features()``: the registered features, read at each
    scrape)."""

    def __init__(
        self,
        redis: redis_py.Redis,
        features: Callable[[], Sequence[Feature]] = registered,
    ) -> None:
        self.redis = redis
        self.features = features

    def collect(self) -> Iterator[Metric]:
        started = clock.monotonic()
        up = GaugeMetricFamily(
            "limitd_exporter_up",
            "1 when this part of the scrape was read, 0 when it failed (see the exporter's log).",
            labels=["part"],
        )
        served: set[str] = set()
        parts: list[tuple[str, Callable[[], Iterable[Any]]]] = [(CORE, self._core)]
        for feature in self.features():
            if feature.metrics is not None:
                parts.append((feature.name, _hook(feature.metrics, self.redis)))
        for name, read in parts:
            families = _read_part(name, read, served)
            up.add_metric([name], 0 if families is None else 1)
            yield from families or ()
        yield up
        yield GaugeMetricFamily(
            "limitd_exporter_scrape_duration_seconds",
            "Time this scrape took to read every part from Redis.",
            value=clock.monotonic() - started,
        )

    def _core(self) -> list[Metric]:
        return [
            *totals(self.redis),
            *queue_families(queue_overview(self.redis)),
            *process_families(Processes(self.redis)),
        ]


def _hook(metrics: Callable[[Any], Iterable[Any]], redis: redis_py.Redis) -> Callable[[], Any]:
    return lambda: metrics(redis)


def _read_part(
    name: str, read: Callable[[], Iterable[Any]], served: set[str]
) -> list[Metric] | None:
    """The part's families, or None (logged) when it raised or returned something that
    would spoil the whole page: not a metric family, or a name already served."""
    try:
        families = list(read())
        for family in families:
            if not isinstance(family, Metric):
                raise TypeError(f"expected prometheus-client metric families, got {family!r}")
            if family.name in served:
                raise ValueError(f"metric family {family.name!r} is already served")
    except Exception:
        log.exception("metrics: could not read the %s part; serving the others", name)
        return None
    served.update(family.name for family in families)
    return families


def totals(redis: redis_py.Redis) -> list[Metric]:
    """Counters and set sizes, in one transaction (one round trip)."""
    k = keys.of(redis)
    pipe = redis.pipeline(transaction=True)
    pipe.get(k.STAT_PROCESSED)
    pipe.get(k.STAT_FAILED)
    pipe.zcard(k.RETRY)
    pipe.zcard(k.SCHEDULE)
    pipe.zcard(k.DEAD)
    processed, failed, retries, scheduled, dead = pipe.execute()
    return [
        CounterMetricFamily(
            "limitd_processed", "Jobs processed since the counter was created.", int(processed or 0)
        ),
        CounterMetricFamily(
            "limitd_failed", "Jobs that failed since the counter was created.", int(failed or 0)
        ),
        GaugeMetricFamily("limitd_retry_set_size", "Jobs waiting in the retry set.", retries),
        GaugeMetricFamily(
            "limitd_scheduled_set_size", "Jobs waiting in the schedule set.", scheduled
        ),
        GaugeMetricFamily("limitd_dead_set_size", "Jobs in the dead set.", dead),
    ]


def queue_families(queues: Sequence[QueueStatus]) -> list[Metric]:
    """One series per queue of each figure ``limitd queues`` shows. The limits have a
    series only for the queues that have one (no series: unlimited)."""
    labels = ["queue"]
    size = GaugeMetricFamily("limitd_queue_size", "Jobs waiting in the queue.", labels=labels)
    latency = GaugeMetricFamily(
        "limitd_queue_latency_seconds",
        "Age of the oldest job waiting in the queue (0 when empty).",
        labels=labels,
    )
    busy = GaugeMetricFamily(
        "limitd_queue_busy", "Jobs of the queue running now, in all processes.", labels=labels
    )
    limit = GaugeMetricFamily(
        "limitd_queue_limit",
        "Jobs of the queue allowed to run at once in all processes (no series: unlimited).",
        labels=labels,
    )
    process_limit = GaugeMetricFamily(
        "limitd_queue_process_limit",
        "Jobs of the queue allowed to run at once in each process (no series: unlimited).",
        labels=labels,
    )
    paused = GaugeMetricFamily("limitd_queue_paused", "1 when the queue is paused.", labels=labels)
    for queue in queues:
        size.add_metric([queue.name], queue.size)
        latency.add_metric([queue.name], queue.latency)
        busy.add_metric([queue.name], queue.busy)
        paused.add_metric([queue.name], 1 if queue.paused else 0)
        if queue.limit is not None:
            limit.add_metric([queue.name], queue.limit)
        if queue.process_limit is not None:
            process_limit.add_metric([queue.name], queue.process_limit)
    return [size, latency, busy, limit, process_limit, paused]


def process_families(processes: Processes) -> list[Metric]:
    """Live worker processes and their threads, summed per capsule name (``""`` for
    records that name none, such as Ruby Sidekiq's)."""
    labels = ["capsule"]
    count = GaugeMetricFamily(
        "limitd_processes", "Worker processes alive (with a process record).", labels=labels
    )
    threads = GaugeMetricFamily(
        "limitd_threads", "Processor threads of the live worker processes.", labels=labels
    )
    busy = GaugeMetricFamily(
        "limitd_busy_threads", "Processor threads running a job now.", labels=labels
    )
    by_capsule: dict[str, list[int]] = {}
    for process in processes:
        sums = by_capsule.setdefault(process.capsule or "", [0, 0, 0])
        sums[0] += 1
        sums[1] += process.concurrency or 0
        sums[2] += process.busy
    for capsule, (alive, total, running) in sorted(by_capsule.items()):
        count.add_metric([capsule], alive)
        threads.add_metric([capsule], total)
        busy.add_metric([capsule], running)
    return [count, threads, busy]


def registry_for(redis: redis_py.Redis) -> CollectorRegistry:
    """A registry of its own holding only the cluster collector (not prometheus-client's
    global one, which would add this exporter's own process figures)."""
    registry = CollectorRegistry()
    registry.register(ClusterCollector(redis))
    return registry


def serve(redis: redis_py.Redis, bind: str, port: int) -> int:
    """Serve ``/metrics`` on ``bind:port`` until SIGINT or SIGTERM, then shut the
    server down and return the signal's number. The signals are blocked before the
    server's thread starts (it inherits the mask), so only this thread takes them, in
    ``sigwait``: no handler runs in the middle of a scrape."""
    signal.pthread_sigmask(signal.SIG_BLOCK, STOP_SIGNALS)
    try:
        server, thread = start_http_server(port, addr=bind, registry=registry_for(redis))
        try:
            log.info("serving limitd metrics on http://%s:%d/metrics", bind, port)
            signum = signal.sigwait(STOP_SIGNALS)
            log.info("received %s: stopping", signal.Signals(signum).name)
        finally:
            server.shutdown()
            server.server_close()
            thread.join(JOIN_TIMEOUT)
    finally:
        signal.pthread_sigmask(signal.SIG_UNBLOCK, STOP_SIGNALS)
    return signum
