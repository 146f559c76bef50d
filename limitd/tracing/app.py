"""Tracing for app code that pushes jobs outside ``limitd start`` (a web process, a
script): :func:`instrument` adds the producer middleware to a client's chain, so that
a push made while a span is current (a request's) carries its context to the job.

::

    from limitd.tracing.app import instrument

    instrument()  # the default client, and its async twin, which shares its chain

The app sets up its OpenTelemetry SDK (tracer provider, exporter) itself, as for any
other instrumentation; without one, the API makes every span a no-op.
"""

from __future__ import annotations

from limitd.client import Client, default_client
from limitd.middleware.client_chain import ClientChain
from limitd.tracing.middleware import TracingClient


def instrument(client: Client | None = None) -> Client:
    """Trace the pushes of ``client`` (the default client when None) from now on: a
    ``send <queue>`` span per job, its context written into the payload. Instrumenting
    twice changes nothing. Returns the client."""
    target = client if client is not None else default_client()
    instrument_chain(target.middleware)
    return target


def uninstrument(client: Client | None = None) -> None:
    """Stop tracing the pushes of ``client`` (the default client when None)."""
    target = client if client is not None else default_client()
    target.middleware.remove(TracingClient)


def instrument_chain(chain: ClientChain) -> None:
    """Put the producer middleware first in ``chain``, unless it is there already: its
    span then covers the other middleware and the write."""
    if TracingClient not in chain:
        chain.prepend(TracingClient())
