"""What ties an iterable job's run to the capsule running it.

A job's code cannot see its capsule, so the server middleware does it: for each
iterable job it binds, for the time the job runs, the capsule's Redis and the capsule's
"stop soon" flag, which the capsule's quiet sets. The run loop (``job.py``) reads the
binding; with none (a test calling ``perform``, the testing modes, a chain without the
feature) a run keeps no progress and is never asked to stop.

The middleware makes no Redis call of its own: the run saves its progress itself, item
by item, through ``store.py``.
"""

from __future__ import annotations

import contextvars
import threading
from dataclasses import dataclass
from typing import Any

from limitd.iteration import ITERABLE_CLASSES
from limitd.middleware.base import Ending, ServerMiddleware
from limitd.payload import Payload
from limitd.spec import JobSpec


@dataclass(frozen=True)
class Binding:
    """A running iterable job's capsule: its Redis client and its stop flag."""

    redis: Any
    stopping: threading.Event


_binding: contextvars.ContextVar[Binding | None] = contextvars.ContextVar(
    "limitd_iteration_binding", default=None
)


def binding() -> Binding | None:
    """The running iterable job's capsule, or None outside one."""
    return _binding.get()


class IterationControl(ServerMiddleware):
    """Server middleware: binds each iterable job to this capsule (see the module
    docstring); ``quiet`` asks the iterable jobs running here to stop after their
    current item."""

    def __init__(self, redis: Any) -> None:
        self.client = redis  # not ``redis``: the chain makes no work of ours
        self.stopping = threading.Event()

    def concerns(self, payload: Payload) -> bool:
        return payload.get("class") in ITERABLE_CLASSES

    def starting(self, spec: JobSpec, payload: Payload, queue: str) -> None:
        _binding.set(Binding(self.client, self.stopping))

    def ended(
        self, spec: JobSpec, payload: Payload, queue: str, error: BaseException | None
    ) -> Ending | None:
        _binding.set(None)
        return None

    def quiet(self) -> None:
        self.stopping.set()
