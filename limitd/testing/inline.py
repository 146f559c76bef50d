"""The inline mode: a pushed job runs at once, in the pushing thread, through the server
middleware, before the push returns (Sidekiq's ``Sidekiq::Testing.inline!``, Celery's
``task_always_eager``)::

    with limitd.testing.inline():
        signup(email="a@example.com")   # send_welcome has run when this returns

Retries are off: a job's exception goes up through the push to the code that pushed it.
``perform_in`` / ``perform_at`` run at once too. A job pushed from async code
(``await job.aio.perform_async``) runs on the caller's loop when it is async.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from typing import Any

from limitd.client import Client
from limitd.middleware.client_chain import raised_after_write
from limitd.payload import Payload
from limitd.testing.memory import MemoryServer, memory_redis
from limitd.testing.mode import installed
from limitd.testing.runner import JobRunner


class InlineJobs:
    """The sink of the inline mode: runs each pushed job as it arrives, and counts them."""

    def __init__(self, server_middleware: Iterable[Any] = ()) -> None:
        self.server = MemoryServer(self)
        self.redis = memory_redis(self.server)
        self.runner = JobRunner(self.redis, list(server_middleware))
        self.performed: list[Payload] = []  # every job run, in the order they started
        self.client: Client | None = None

    def accept(self, payloads: list[Payload]) -> None:
        for payload in payloads:
            self.performed.append(payload)
            try:
                self.runner.run(payload)
            except BaseException as error:
                # The job ran: its failure is recorded (its batch, its unique lock), and
                # the push that brought it must not take its reservations back.
                raised_after_write(error)
                raise

    async def aaccept(self, payloads: list[Payload]) -> None:
        for payload in payloads:
            self.performed.append(payload)
            try:
                await self.runner.arun(payload)
            except BaseException as error:
                raised_after_write(error)
                raise

    def __repr__(self) -> str:
        return f"<limitd.testing.InlineJobs performed={len(self.performed)}>"


@contextmanager
def inline(
    *, client_middleware: Iterable[Any] = (), server_middleware: Iterable[Any] = ()
) -> Iterator[InlineJobs]:
    """Inline mode for the block (see the module); the :class:`InlineJobs` it gives lists
    the jobs performed."""
    jobs = InlineJobs(server_middleware)
    with installed(jobs.redis, client_middleware) as client:
        jobs.client = client
        yield jobs
