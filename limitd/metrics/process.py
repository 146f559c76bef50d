"""Per-process job metrics: each capsule process started by ``limitd start`` with a
``metrics:`` section serves its own ``/metrics`` on ``port + process_number``.

Why a port per process rather than prometheus-client's multiprocess mode: nothing is
shared between processes (no directory of memory-mapped files to create, clean at start
and sweep when a process dies), and a dead process's series vanish with it, while a
restarted one (same ``process_number``, same port) starts its counters again, which
Prometheus reads as a counter reset. The cost is one scrape target per process.

The service adds :class:`limitd.metrics.jobs.JobMetrics` to the capsule's server chain
when it starts (before the first job) and serves a registry of its own, holding the job
families, the process's CPU and memory (``process_*``), ``limitd_process_info``, and
what the process saw of Redis refusing its writes (out of memory, read-only:
``limitd_redis_refusing_writes``, ``limitd_redis_refused_writes_total``), which a Redis
that refuses writes could not store for the cluster-wide exporter.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Iterator, Sequence
from wsgiref.simple_server import WSGIServer

from prometheus_client import CollectorRegistry, Gauge, ProcessCollector, start_http_server
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from limitd.metrics.jobs import JobMetrics
from limitd.metrics.section import KEY, MetricsSettings
from limitd.plugins import ProcessContext, Service
from limitd.supervisor.refusals import REFUSALS, WriteRefusals

log = logging.getLogger("limitd.metrics")
JOIN_TIMEOUT = 2.0


class ProcessMetrics:
    """Serves one capsule process's job metrics over HTTP, from ``start`` to ``stop``."""

    def __init__(self, context: ProcessContext, settings: MetricsSettings) -> None:
        self.context = context
        self.bind = settings.bind
        self.port = settings.port_of(context.capsule.process_number)
        self.registry = CollectorRegistry()
        self.middleware = JobMetrics(self.registry)
        ProcessCollector(registry=self.registry)
        self.registry.register(RefusalCollector(REFUSALS))
        self._describe_process()
        self._server: WSGIServer | None = None
        self._thread: threading.Thread | None = None

    def start(self) -> None:
        """Listen first, then join the chain: a process that cannot serve its metrics
        fails to start (its config asked for them) rather than run unobserved."""
        try:
            self._server, self._thread = start_http_server(
                self.port, addr=self.bind, registry=self.registry
            )
        except OSError as exc:
            raise OSError(
                exc.errno,
                f"cannot serve job metrics on {self.bind}:{self.port} (metrics.port + "
                f"process number {self.context.capsule.process_number}): {exc.strerror}",
            ) from exc
        self.context.chain.prepend(self.middleware)
        log.info("job metrics served on http://%s:%d/metrics", self.bind, self.port)

    def stop(self) -> None:
        server, thread = self._server, self._thread
        self._server = self._thread = None
        if server is None:
            return
        server.shutdown()
        server.server_close()
        if thread is not None:
            thread.join(JOIN_TIMEOUT)

    def _describe_process(self) -> None:
        """``limitd_process_info``: which capsule and child serve on this port."""
        info = Gauge(
            "limitd_process_info",
            "Always 1: the capsule and process number of the process serving these metrics.",
            ("capsule", "process_number"),
            registry=self.registry,
        )
        capsule = self.context.capsule
        info.labels(capsule.name, str(capsule.process_number)).set(1)


class RefusalCollector(Collector):
    """Redis refusing this process's writes, read from its ``WriteRefusals`` at scrape."""

    def __init__(self, refusals: WriteRefusals) -> None:
        self.refusals = refusals

    def collect(self) -> Iterator[Metric]:
        yield GaugeMetricFamily(
            "limitd_redis_refusing_writes",
            "1 while Redis refuses this process's writes (out of memory, read-only), else 0.",
            value=1 if self.refusals.refusing else 0,
        )
        yield CounterMetricFamily(
            "limitd_redis_refused_writes",
            "Writes of this process's heartbeat, record and counters that Redis refused.",
            value=self.refusals.total,
        )


def process_services(context: ProcessContext) -> Sequence[Service]:
    """The per-process metrics server when the config's ``metrics`` section has a port;
    nothing otherwise."""
    settings = context.section(KEY)
    if not isinstance(settings, MetricsSettings) or not settings.enabled:
        return []
    return [ProcessMetrics(context, settings)]
