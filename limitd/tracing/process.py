"""Tracing in a capsule process of ``limitd start`` with ``tracing: {enabled: true}``:
the consumer middleware first in the capsule's server chain, the producer middleware
first in the process's default client (so the pushes a job makes are children of its
run), and the spans still buffered flushed when the process stops.

The tracer provider is the app's: its ``require``d module sets up the SDK before the
supervisor forks, and every capsule process inherits it (the SDK's batch processor
starts its export thread again in a forked child). A capsule process leaves with
``os._exit``, which runs no ``atexit`` hook, so :meth:`TracingService.stop` flushes
the provider itself.
"""

from __future__ import annotations

import logging

from opentelemetry import trace

from limitd.client import default_client
from limitd.plugins import ProcessContext
from limitd.tracing.app import instrument_chain
from limitd.tracing.middleware import TracingServer

log = logging.getLogger("limitd.tracing")
FLUSH_TIMEOUT_MS = 1500  # a service's stop must return within a second or two


class TracingService:
    """Adds the tracing middleware when the process starts, flushes spans at stop."""

    def __init__(self, context: ProcessContext) -> None:
        self.context = context

    def start(self) -> None:
        if TracingServer not in self.context.chain:
            self.context.chain.prepend(TracingServer())
        instrument_chain(default_client().middleware)
        provider = trace.get_tracer_provider()
        if isinstance(provider, (trace.ProxyTracerProvider, trace.NoOpTracerProvider)):
            log.warning(
                "tracing.enabled is true but no OpenTelemetry SDK tracer provider is set: "
                "spans are dropped (set one up in a module the config's require lists)"
            )

    def stop(self) -> None:
        """Export the spans the provider still holds. ``force_flush`` is the SDK's (the
        API's provider has none, and has nothing to flush)."""
        flush = getattr(trace.get_tracer_provider(), "force_flush", None)
        if callable(flush) and not flush(FLUSH_TIMEOUT_MS):
            log.warning("spans not exported within %d ms of stopping", FLUSH_TIMEOUT_MS)

