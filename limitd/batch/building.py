"""Which batch this thread is adding jobs to: the link between ``Batch.jobs()`` (above the
client) and the client middleware that tags each pushed job (below it), which must not
import each other."""

from __future__ import annotations

import contextvars
from collections.abc import Iterator
from contextlib import contextmanager

_building: contextvars.ContextVar[str | None] = contextvars.ContextVar(
    "limitd_building_batch", default=None
)


def building_bid() -> str | None:
    """The bid of the batch whose ``jobs()`` block this thread is in, if any."""
    return _building.get()


@contextmanager
def building_inside(bid: str) -> Iterator[None]:
    """Jobs pushed by this thread inside the block join batch ``bid``."""
    token = _building.set(bid)
    try:
        yield
    finally:
        _building.reset(token)
