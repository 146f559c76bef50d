"""The fake mode: pushed jobs are recorded in memory, per queue, for the test to look at
and to run when it chooses (Sidekiq's ``Sidekiq::Testing.fake!``)::

    with limitd.testing.fake() as jobs:
        signup(email="a@example.com")
        assert jobs.args_for(send_welcome) == [["a@example.com"]]
        jobs.drain()   # runs them, and the jobs they push, until none is left

The push is production's (client middleware, push gates, the unique and batch features
played in memory: see :mod:`limitd.testing.memory`); running a job is a capsule's server
chain and ``perform`` (see :mod:`limitd.testing.runner`), without retries.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from typing import Any

from limitd import clock
from limitd.client import Client
from limitd.payload import Payload
from limitd.testing.memory import MemoryServer, memory_redis
from limitd.testing.mode import installed
from limitd.testing.runner import JobRunner

DEFAULT_MAX_JOBS = 10_000


class TooManyJobs(RuntimeError):
    """A drain ran ``max_jobs`` jobs and more were left: jobs that keep pushing jobs."""


def job_name(job: Any) -> str:
    """The wire name of a job given as a job function, a job class or its name."""
    if isinstance(job, str):
        return job
    spec = getattr(job, "spec", None)
    name = getattr(spec, "name", None)
    if not isinstance(name, str):
        raise TypeError(f"expected a limitd job, job class or job name, not {job!r}")
    return name


class FakeJobs:
    """The jobs pushed in fake mode, oldest first, and the helpers to run them.

    A job is its payload as a capsule would fetch it (``class``, ``args``, ``queue``,
    ``jid``, the options, ``bid`` inside a batch), with ``at`` (epoch seconds) when it was
    scheduled with ``perform_in`` / ``perform_at``."""

    def __init__(self, server_middleware: Iterable[Any] = ()) -> None:
        self._jobs: list[Payload] = []
        self.server = MemoryServer(self)
        self.redis = memory_redis(self.server)
        self.runner = JobRunner(self.redis, list(server_middleware))
        self.client: Client | None = None  # the default client while the mode is on

    # The sink the in-memory Redis pushes into.

    def accept(self, payloads: list[Payload]) -> None:
        self._jobs.extend(payloads)

    async def aaccept(self, payloads: list[Payload]) -> None:
        self._jobs.extend(payloads)

    # Looking.

    @property
    def jobs(self) -> list[Payload]:
        """Every job waiting, oldest first (a copy)."""
        return list(self._jobs)

    @property
    def queues(self) -> dict[str, list[Payload]]:
        """The waiting jobs by queue name, oldest first (a copy)."""
        by_queue: dict[str, list[Payload]] = {}
        for payload in self._jobs:
            by_queue.setdefault(payload["queue"], []).append(payload)
        return by_queue

    def jobs_for(self, job: Any = None, *, queue: str | None = None) -> list[Payload]:
        """The waiting jobs of one job (function, class or name) and/or one queue."""
        return self._matching(job, queue)

    def args_for(self, job: Any) -> list[list[Any]]:
        """The arguments each waiting job of ``job`` was pushed with, oldest first."""
        return [payload["args"] for payload in self._matching(job, None)]

    @property
    def scheduled(self) -> list[Payload]:
        """The waiting jobs pushed with ``perform_in`` / ``perform_at`` (they have ``at``)."""
        return [payload for payload in self._jobs if "at" in payload]

    def __len__(self) -> int:
        return len(self._jobs)

    def __iter__(self) -> Iterator[Payload]:
        return iter(list(self._jobs))

    def __repr__(self) -> str:
        counts = ", ".join(f"{q}={len(js)}" for q, js in self.queues.items())
        return f"<limitd.testing.FakeJobs {counts or 'empty'}>"

    # Changing.

    def clear(self, job: Any = None, *, queue: str | None = None) -> int:
        """Forget waiting jobs (all, or those of one job and/or queue); how many."""
        gone = self._matching(job, queue)
        self._jobs = [payload for payload in self._jobs if payload not in gone]
        return len(gone)

    def run_one(self, job: Any = None, *, queue: str | None = None) -> Payload:
        """Run the oldest waiting job (of ``job`` and/or ``queue``), scheduled or not, and
        return its payload. Raises LookupError when none waits."""
        payload = self._take(job, queue, due_only=False)
        if payload is None:
            raise LookupError(f"limitd.testing: no job waiting{_filters(job, queue)}")
        self.runner.run(payload)
        return payload

    def drain(
        self,
        job: Any = None,
        *,
        queue: str | None = None,
        due_only: bool = False,
        max_jobs: int = DEFAULT_MAX_JOBS,
    ) -> int:
        """Run waiting jobs, oldest first, including those they push, until none is left
        (of ``job`` and/or ``queue``); scheduled ones too unless ``due_only`` (then only
        those whose time has come, by :func:`limitd.clock.now`, which freezegun moves).
        Returns how many ran. A job that raises stops the drain with its error (it is
        not put back). More than ``max_jobs`` raises :class:`TooManyJobs`."""
        ran = 0
        while (payload := self._take(job, queue, due_only)) is not None:
            self._count(ran, max_jobs, payload)
            self.runner.run(payload)
            ran += 1
        return ran

    async def adrain(
        self,
        job: Any = None,
        *,
        queue: str | None = None,
        due_only: bool = False,
        max_jobs: int = DEFAULT_MAX_JOBS,
    ) -> int:
        """:meth:`drain` from async code (an async test): async jobs run on its loop."""
        ran = 0
        while (payload := self._take(job, queue, due_only)) is not None:
            self._count(ran, max_jobs, payload)
            await self.runner.arun(payload)
            ran += 1
        return ran

    def drain_queue(self, queue: str, *, max_jobs: int = DEFAULT_MAX_JOBS) -> int:
        """:meth:`drain` of one queue."""
        return self.drain(queue=queue, max_jobs=max_jobs)

    def _count(self, ran: int, max_jobs: int, payload: Payload) -> None:
        if ran >= max_jobs:
            self._jobs.insert(0, payload)
            raise TooManyJobs(
                f"limitd.testing: drained {max_jobs} jobs and more are waiting (next: "
                f"class={payload['class']}); do jobs keep pushing jobs? (max_jobs=)"
            )

    def _take(self, job: Any, queue: str | None, due_only: bool) -> Payload | None:
        now = clock.now() if due_only else None
        for index, payload in enumerate(self._jobs):
            if payload in self._matching(job, queue, [payload]) and (
                now is None or float(payload.get("at", 0)) <= now
            ):
                return self._jobs.pop(index)
        return None

    def _matching(
        self, job: Any, queue: str | None, among: list[Payload] | None = None
    ) -> list[Payload]:
        name = job_name(job) if job is not None else None
        return [
            payload
            for payload in (self._jobs if among is None else among)
            if (name is None or payload["class"] == name)
            and (queue is None or payload["queue"] == queue)
        ]


def _filters(job: Any, queue: str | None) -> str:
    said = [f"class={job_name(job)}"] if job is not None else []
    said += [f"queue={queue}"] if queue is not None else []
    return f" ({', '.join(said)})" if said else ""


@contextmanager
def fake(
    *, client_middleware: Iterable[Any] = (), server_middleware: Iterable[Any] = ()
) -> Iterator[FakeJobs]:
    """Fake mode for the block: pushes are recorded in the :class:`FakeJobs` it gives.
    ``client_middleware`` / ``server_middleware``: added after the app's and the
    features' (for middleware a test wants that the app adds elsewhere)."""
    jobs = FakeJobs(server_middleware)
    with installed(jobs.redis, client_middleware) as client:
        jobs.client = client
        yield jobs
