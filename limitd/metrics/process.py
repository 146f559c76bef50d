"""Per-process job metrics: each capsule process started by ``limitd start`` with a
``metrics:`` section serves its own ``/metrics`` on ``port + process_number``.

Why a port per process rather than prometheus-client's multiprocess mode: nothing is
shared between processes (no directory of memory-mapped files to create, clean at start
and sweep when a process dies), and a dead process's series vanish with it, while a
restarted one (same ``process_number``, same port) starts its counters again, which
Prometheus reads as a counter reset. The cost is one scrape target per process.

The service adds :class:`limitd.metrics.jobs.JobMetrics` to the capsule's server chain
when it starts (before the first job) and serves a registry of its own, holding the job
families, the process's CPU and memory (``process_*``) and ``limitd_process_info``.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Sequence
from wsgiref.simple_server import WSGIServer

from prometheus_client import CollectorRegistry, Gauge, ProcessCollector, start_http_server

from limitd.metrics.jobs import JobMetrics
from limitd.metrics.section import KEY, MetricsSettings
from limitd.plugins import ProcessContext, Service

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


def process_services(context: ProcessContext) -> Sequence[Service]:
    """The per-process metrics server when the config's ``metrics`` section has a port;
    nothing otherwise."""
    settings = context.section(KEY)
    if not isinstance(settings, MetricsSettings) or not settings.enabled:
        return []
    return [ProcessMetrics(context, settings)]
