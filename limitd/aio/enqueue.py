"""What ``job.aio`` returns: the enqueue methods of :class:`limitd.job.Enqueuer`, awaitable.

::

    jid = await send_webhook.aio.perform_async(42, "https://example.com/hook")
    await send_webhook.aio.set(queue="low").perform_at(when, 42, "https://...")

Same arguments, same options (checked the same way by ``set``) and same return values
as the sync forms; the push goes through an :class:`~limitd.aio.client.AsyncClient`. The
methods are typed with the job's parameters like the sync ones (see ``docs/typing.md``).
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Sequence
from typing import Any, Generic

from limitd import clock, options
from limitd.aio.client import AsyncClient, async_client_for
from limitd.arguments import P, PlaceArguments, positional_only
from limitd.client import Client
from limitd.payload import Payload
from limitd.spec import JobSpec


class AsyncEnqueuer(Generic[P]):
    """Pushes one job with a fixed set of options, from async code. ``client`` may be
    an :class:`AsyncClient` or a sync :class:`~limitd.client.Client` (its async twin is
    used); without one, the default client's twin, looked up at each push. ``P`` is the
    job's parameters; ``place`` turns a call's arguments into the payload's list (see
    :mod:`limitd.arguments`)."""

    def __init__(
        self,
        spec: JobSpec,
        overrides: dict[str, Any] | None = None,
        client: AsyncClient | Client | None = None,
        *,
        place: PlaceArguments = positional_only,
    ) -> None:
        self._spec = spec
        self._overrides = overrides or {}
        self._client = client
        self._place = place

    def set(
        self, *, client: AsyncClient | Client | None = None, **job_options: Any
    ) -> AsyncEnqueuer[P]:
        """A configured copy: the options are checked like definition options."""
        merged = {**self._overrides, **options.validate(self._spec.name, job_options)}
        return AsyncEnqueuer(self._spec, merged, client or self._client, place=self._place)

    async def perform_async(self, *args: P.args, **kwargs: P.kwargs) -> str | None:
        """Enqueue now. Returns the jid, or None if a client middleware stopped the push."""
        return await self._push(self._place(args, kwargs), at=None)

    async def perform_in(
        self, interval: float | dt.timedelta, /, *args: P.args, **kwargs: P.kwargs
    ) -> str | None:
        """Run after ``interval`` seconds (or a timedelta)."""
        if isinstance(interval, dt.timedelta):
            interval = interval.total_seconds()
        return await self._push(self._place(args, kwargs), at=clock.now() + float(interval))

    async def perform_at(
        self, when: float | dt.datetime, /, *args: P.args, **kwargs: P.kwargs
    ) -> str | None:
        """Run at an epoch time in seconds or a datetime (naive means local time)."""
        at = when.timestamp() if isinstance(when, dt.datetime) else float(when)
        return await self._push(self._place(args, kwargs), at=at)

    async def perform_bulk(
        self, args_list: Sequence[Sequence[Any]], batch_size: int = 1000
    ) -> list[str | None]:
        """Enqueue many jobs of this class, one LPUSH per ``batch_size`` jobs. Each
        inner list is one job's positional arguments, unchecked by type checkers."""
        return await async_client_for(self._client).push_bulk(
            self._item([]), [list(a) for a in args_list], batch_size=batch_size, spec=self._spec
        )

    async def _push(self, args: list[Any], at: float | None) -> str | None:
        item = self._item(args)
        if at is not None and at > clock.now():
            item["at"] = at
        return await async_client_for(self._client).push(item, spec=self._spec)

    def _item(self, args: list[Any]) -> Payload:
        return {**self._spec.options, **self._overrides, "class": self._spec.name, "args": args}

    def __repr__(self) -> str:
        return f"<limitd async enqueuer {self._spec.name}>"
