"""Limited-capacity jobs: at most N copies of a job running, each draining work kept
elsewhere (rows of a table, objects in a bucket), never more queued than can run::

    class ImportBacklog(limitd.LimitedCapacityJob, name="ImportBacklog", queue="imports"):
        def perform_work(self, *args): ...          # one unit of work from the backlog
        def remaining_work_count(self, *args): ...  # how much is left
        def max_running_jobs(self): return 25

    ImportBacklog.perform_with_capacity()           # fill the free capacity

The rules:

- ``perform_with_capacity(*args)`` pushes as many copies as there are free places:
  ``max_running_jobs()`` minus the copies running and those already queued, and no more
  than ``remaining_work_count(*args)``;
- a copy runs ``perform_work`` only if it gets a running place when it starts
  (``max_running_jobs()`` is read again then, so lowering it lets the running copies
  finish and starts none until below);
- after ``perform_work`` succeeds, the copy hands its place to a successor while
  ``remaining_work_count`` is above 0; after a failure it does not: the error is logged,
  the copy goes to the dead set (these jobs are never retried: a retry would hold a
  place for a job due much later), and the next periodic refill is the backoff.

The same ``args`` should be given to every call: the copies share one capacity per
class, whatever their arguments. Places and leases live in Redis
(:mod:`limitd.capacity.store`); a copy killed by SIGKILL gives its place back when its
lease runs out, or keeps it if the limit fetch requeues it and it runs again.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import Any, ClassVar

from limitd.capacity.leases import keeper
from limitd.capacity.store import NO_SUCCESSOR, CapacityStore, Timing
from limitd.client import Client, default_client
from limitd.job import Job
from limitd.payload import new_jid

log = logging.getLogger("limitd.capacity")

REQUIRED = ("perform_work", "remaining_work_count", "max_running_jobs")
_classes: dict[str, type[LimitedCapacityJob]] = {}


class LimitedCapacityJob(Job, abstract=True):
    """Base class of limited-capacity jobs (see the module docstring). Subclasses
    define ``perform_work(*args)``, ``remaining_work_count(*args)`` and
    ``max_running_jobs()``; ``lease`` and ``queued_ttl`` (seconds, class attributes)
    tune how fast the place of a copy that died or never started comes back."""

    lease: ClassVar[float] = Timing.lease
    queued_ttl: ClassVar[float] = Timing.queued_ttl

    def __init_subclass__(
        cls, name: str | None = None, abstract: bool = False, **job_options: Any
    ) -> None:
        if not abstract:
            _check_class(cls, job_options)
            job_options["retry"] = 0  # a failed copy goes to the dead set, not retried
        super().__init_subclass__(name=name, abstract=abstract, **job_options)
        if not abstract:
            _classes[cls.spec.name] = cls

    @classmethod
    def perform_with_capacity(cls, *args: Any) -> list[str]:
        """Push one copy per free place (at most ``remaining_work_count(*args)``);
        returns their jids, none when the capacity is full or no work is left."""
        instance = cls()
        maximum = instance._max_running()
        remaining = instance._remaining(args)
        client = default_client()
        store = cls._store(client)
        wanted = min(maximum, remaining)
        reserved = store.reserve(maximum, remaining, [new_jid() for _ in range(wanted)])
        return cls._push_copies(client, store, reserved, args, cls.spec.queue)

    def perform(self, *args: Any) -> None:
        """Take a running place, do one unit of work, hand the place on."""
        client = default_client()
        store = self._store(client)
        maximum = self._max_running()
        if not store.claim(self.jid, maximum):
            log.info(
                "no capacity jid=%s class=%s: %d copies may run, none started",
                self.jid,
                self.spec.name,
                maximum,
            )
            return
        keeper.hold(store, self.jid)
        try:
            self.perform_work(*args)  # type: ignore[attr-defined]
            remaining = self._remaining(args)
        except Exception:
            store.finish(self.jid, maximum, NO_SUCCESSOR, "")
            raise
        finally:  # a Shutdown (requeued) keeps the place for the copy's next run
            keeper.drop(store, self.jid)
        successor = new_jid()
        if store.finish(self.jid, maximum, remaining, successor):
            queue = str(self.payload.get("queue") or self.spec.queue)
            self._push_copies(client, store, [successor], args, queue)

    @classmethod
    def _push_copies(
        cls, client: Client, store: CapacityStore, jids: list[str], args: Sequence[Any], queue: str
    ) -> list[str]:
        """Push a copy for each reserved jid; places of copies not pushed (a middleware
        halted them, or the push raised) are given back."""
        pushed: list[str] = []
        try:
            for jid in jids:
                item = {**cls.spec.options, "class": cls.spec.name, "args": list(args)}
                if client.push({**item, "queue": queue, "jid": jid}, spec=cls.spec):
                    pushed.append(jid)
        finally:
            store.unreserve([jid for jid in jids if jid not in pushed])
        return pushed

    @classmethod
    def _store(cls, client: Client) -> CapacityStore:
        return CapacityStore(client.redis, cls.spec.name, Timing(cls.lease, cls.queued_ttl))

    def _max_running(self) -> int:
        value = self.max_running_jobs()  # type: ignore[attr-defined]
        return _count(value, f"{self.spec.name}.max_running_jobs()")

    def _remaining(self, args: Sequence[Any]) -> int:
        value = self.remaining_work_count(*args)  # type: ignore[attr-defined]
        return _count(value, f"{self.spec.name}.remaining_work_count()")


def capacity_job(name: str) -> type[LimitedCapacityJob] | None:
    """The limited-capacity job class registered under the wire name ``name``."""
    return _classes.get(name)


def _check_class(cls: type, job_options: dict[str, Any]) -> None:
    missing = [method for method in REQUIRED if not callable(getattr(cls, method, None))]
    if missing:
        raise TypeError(f"limited-capacity job {cls.__qualname__} must define {', '.join(missing)}")
    if job_options.get("retry", 0) not in (0, False):
        raise TypeError(
            f"limited-capacity job {cls.__qualname__}: retry must not be set (copies are "
            "never retried: a failed one goes to the dead set and the refill replaces it)"
        )
    Timing(getattr(cls, "lease"), getattr(cls, "queued_ttl"))  # noqa: B009


def _count(value: Any, where: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise TypeError(f"{where} must return a whole number >= 0, not {value!r}")
    return value
