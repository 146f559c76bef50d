"""Turning reliable push on and off in a process that enqueues.

``enable()`` makes every push of the process (every ``Client``, sync and asyncio) go
through one :class:`~limitd.reliable_push.hold.PushBuffer`: while Redis cannot be
reached, ``perform_async`` returns the job's jid instead of raising, and the job is
written once Redis answers. It registers the buffer's metrics with prometheus-client
(the process's default registry unless told otherwise) and an exit hook that tries to
write what is kept, then logs what is lost.
"""

from __future__ import annotations

import atexit
import threading
from collections.abc import Iterator
from typing import Any

from limitd import plugins
from limitd.reliable_push.hold import BufferFull, PushBuffer

__all__ = ["BufferFull", "PushBuffer", "current", "disable", "enable"]

DEFAULT_REGISTRY: Any = object()
"""``enable(registry=...)``'s default: prometheus-client's process-wide ``REGISTRY``."""

_lock = threading.Lock()
_current: _Enabled | None = None


class _Enabled:
    """A buffer in use, with its exit hook and metrics registration, to undo them."""

    def __init__(self, buffer: PushBuffer, flush_at_exit: float, registry: Any) -> None:
        self.buffer = buffer
        self.flush_at_exit = flush_at_exit
        self.registry = registry
        self.collector: Any = None
        if registry is not None:
            self.collector = buffer_collector(buffer)
            registry.register(self.collector)
        atexit.register(self.at_exit)
        plugins.add_push_gate(buffer, last=True)  # after a transaction's hold

    def at_exit(self) -> None:
        self.buffer.flush_before_exit(self.flush_at_exit)

    def undo(self) -> None:
        plugins.remove_push_gate(self.buffer)
        atexit.unregister(self.at_exit)
        if self.collector is not None:
            self.registry.unregister(self.collector)


def enable(
    *,
    max_buffered: int = 10_000,
    flush_at_exit: float = 5.0,
    max_pause: float = 5.0,
    registry: Any = DEFAULT_REGISTRY,
) -> PushBuffer:
    """Turn reliable push on for this process (again: with these settings) and return
    its buffer.

    - ``max_buffered``: the most jobs kept in memory at once; a push that does not fit
      raises ``BufferFull`` (a ``redis.ConnectionError``), as the push raised before;
    - ``flush_at_exit``: seconds the exit hook tries to write kept jobs before logging
      the lost ones;
    - ``max_pause``: the longest pause between two retries (they start at 0.1s and
      double);
    - ``registry``: the prometheus-client registry for the buffer's metrics, None for
      none.

    Set short Redis timeouts on the client (``socket_connect_timeout``,
    ``socket_timeout``): a push that waits for a silent network holds its caller for as
    long before it is kept."""
    global _current
    if flush_at_exit < 0:
        raise ValueError(f"flush_at_exit must be 0 or more seconds, not {flush_at_exit!r}")
    buffer = PushBuffer(max_buffered, max_pause=max_pause)
    if registry is DEFAULT_REGISTRY:
        from prometheus_client import REGISTRY

        registry = REGISTRY
    with _lock:
        if _current is not None:
            _current.undo()  # what it kept is still written by its own thread
        _current = _Enabled(buffer, flush_at_exit, registry)
    return buffer


def disable() -> None:
    """Turn reliable push off: pushes fail again while Redis is away. Jobs already kept
    are still written in the background."""
    global _current
    with _lock:
        if _current is not None:
            _current.undo()
            _current = None


def current() -> PushBuffer | None:
    """The buffer in use, None when reliable push is off."""
    enabled = _current
    return enabled.buffer if enabled is not None else None


def buffer_collector(buffer: PushBuffer) -> Any:
    """A prometheus-client collector of ``buffer``'s counts, read at each scrape."""
    from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric

    class BufferCollector:
        def collect(self) -> Iterator[Metric]:
            yield GaugeMetricFamily(
                "limitd_client_buffered_pushes",
                "Jobs kept in memory because Redis could not be reached, not yet written",
                value=buffer.buffered_jobs,
            )
            yield CounterMetricFamily(
                "limitd_client_pushes_buffered",
                "Jobs kept in memory because Redis could not be reached, since the start",
                value=buffer.buffered_total,
            )
            yield CounterMetricFamily(
                "limitd_client_buffered_pushes_dropped",
                "Kept jobs dropped because their push failed for another reason when written",
                value=buffer.dropped_total,
            )

    return BufferCollector()
