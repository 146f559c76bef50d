"""What every layer may know about a job definition, and which job is running.

The spec sits below the middleware, the retry handler and the client, which all read it,
and below the enqueue API (``limitd.job``) that builds it, so none of them imports
another to learn what a job is.
"""

from __future__ import annotations

import contextvars
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from limitd.payload import DEFAULT_QUEUE, Payload

RetryInHook = Callable[[int, BaseException, Payload], Any]
ExhaustedHook = Callable[[Payload, BaseException], Any]

_current_payload: contextvars.ContextVar[Payload | None] = contextvars.ContextVar(
    "limitd_current_payload", default=None
)


@dataclass(frozen=True)
class JobSpec:
    """Everything the client and the server know about one job definition."""

    name: str
    origin: str
    run: Callable[[Payload], Any]
    options: dict[str, Any] = field(default_factory=dict)
    retry_in: RetryInHook | None = None
    retries_exhausted: ExhaustedHook | None = None
    # Feature hooks by keyword (declared with ``limitd.options.declare_hook``); each
    # feature reads its own through a typed accessor of its own.
    hooks: Mapping[str, Callable[..., Any]] = field(default_factory=dict)
    # ``run`` returns a coroutine: the capsule runs the job on its event loop, not on a
    # processor thread (see ``limitd.supervisor.async_lane``).
    is_async: bool = False

    @property
    def queue(self) -> str:
        return str(self.options.get("queue", DEFAULT_QUEUE))


def current_payload() -> Payload | None:
    """The payload of the job running in this thread, or None outside a job. Lets job code
    read its own jid, retry_count or batch id without changing its signature."""
    return _current_payload.get()


def running(payload: Payload) -> contextvars.Token[Payload | None]:
    """Mark ``payload`` as the job running in this context (see :func:`current_payload`)."""
    return _current_payload.set(payload)


def finished(token: contextvars.Token[Payload | None]) -> None:
    _current_payload.reset(token)
