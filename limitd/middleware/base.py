"""The typed contract of a middleware: a base class per side, every hook a no-op.

A feature subclasses :class:`ClientMiddleware` or :class:`ServerMiddleware` and
overrides the hooks it needs. Hooks decide; they do not talk to Redis: they return the
Redis work to do (:mod:`limitd.middleware.work`), and the chain makes it, in sync code or
on an event loop alike. So a feature is written once, and a type checker sees every
call the chain makes.

Client side, for each push, middleware in chain order::

    work = push_work(spec, payload)        # e.g. take a lock
    if work and not admit(spec, payload, reply_of(work)): halt the push
    undo = undo_work(spec, payload)        # made if a later middleware halts or raises
    ... the rest of the chain, then the write

and for a bulk chunk, ``bulk_work`` before its jobs pass the chain one by one, and
``abandon_work`` when the chunk is not written.

Server side, for each job, middleware that are ``concerned`` with it, in chain order::

    starting(spec, payload, queue)         # work made before perform
    ... the rest of the chain, then perform
    ended(spec, payload, queue, error)     # inner first; may replace the job's error
    settled(spec, payload, queue, outcome, error)  # script calls sent with the ack

and ``quiet()`` once, when the capsule stops taking jobs.

A plain callable (``__call__(spec, payload, redis_or_queue, call_next)``) still works
as a middleware, as the README describes; the shipped ones all use these classes.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, ClassVar

from limitd.connection import ScriptCall
from limitd.keys import KeyLayout
from limitd.middleware.work import RedisClient, Work
from limitd.payload import Payload
from limitd.spec import JobSpec


class ClientMiddleware:
    """A client middleware: may reserve something before the push (its ``push_work``),
    halt the push on the reply (``admit``), and give the reservation back when the push
    does not happen (``undo_work``)."""

    def concerns(self, spec: JobSpec | None, payload: Payload) -> bool:
        """False: nothing for this middleware to do for jobs like ``payload`` (the same
        class and options; its args and jid may differ), so a bulk push leaves it out
        for a whole chunk instead of asking each job. Decide by class and options only."""
        return True

    def push_work(self, spec: JobSpec | None, payload: Payload) -> Work | None:
        """Redis work to make before this job goes on (None: nothing to ask)."""
        return None

    def admit(self, spec: JobSpec | None, payload: Payload, reply: Any) -> bool:
        """Given the reply to ``push_work``, whether the push goes on."""
        return True

    def undo_work(self, spec: JobSpec | None, payload: Payload) -> Work | None:
        """Work that gives back what this middleware reserved, made if the rest of the
        chain halts the push or raises."""
        return None

    def bulk_work(self, spec: JobSpec | None, payloads: list[Payload]) -> Sequence[Work]:
        """Work for a whole bulk chunk, made in one round trip before its jobs pass the
        chain one by one (a script call's ``on_reply`` receives its reply)."""
        return ()

    def abandon_work(self, spec: JobSpec | None, payloads: list[Payload]) -> Sequence[Work]:
        """Work that gives back what was reserved for a chunk that was not written."""
        return ()

    def for_layout(self, layout: KeyLayout) -> ClientMiddleware:
        """This middleware for pushes through a connection of key ``layout`` (the chain
        asks once per layout): one whose work names keys returns one naming them in
        ``layout``; the default is itself."""
        return self


@dataclass(frozen=True)
class Ending:
    """What a server middleware does once the rest of the chain returned or raised:
    Redis work to make now, then, when ``error`` is set, the job ends with that error
    instead (raised from the original one)."""

    work: Work | Sequence[Work] | None = None
    error: BaseException | None = None


class ServerMiddleware:
    """A server middleware. ``redis`` is the client its work is made on (the capsule's;
    on the event loop, that client's asyncio twin)."""

    redis: RedisClient | None = None
    # The payload fields ``concerns`` looks for, when a job that holds none of them
    # cannot concern this middleware: the chain then asks one set operation for all such
    # middleware instead of calling each one's ``concerns`` (every job passes the chain;
    # most hold none of the fields features add). None: ``concerns`` decides alone.
    concerns_fields: ClassVar[frozenset[str] | None] = None
    # True when ``ended`` only ever acts on a job that raised (``error`` set): a job that
    # returns is then not wrapped for it. For a middleware concerned with every job
    # that only handles failures (the limiters' reschedule of ``OverLimit``).
    ends_only_on_error: ClassVar[bool] = False

    def concerns(self, payload: Payload) -> bool:
        """False: this middleware is skipped for this job, around perform and at
        ``settled`` alike (every job passes the chain; most use few features). With
        ``concerns_fields``, asked only about jobs holding one of those fields."""
        return True

    def starting(self, spec: JobSpec, payload: Payload, queue: str) -> Work | None:
        """Work to make before the job runs."""
        return None

    def ended(
        self, spec: JobSpec, payload: Payload, queue: str, error: BaseException | None
    ) -> Ending | None:
        """The job ran (``error`` None) or raised ``error``, before the retry decision."""
        return None

    def settled(
        self,
        spec: JobSpec | None,
        payload: Payload,
        queue: str,
        outcome: str,
        error: BaseException | None,
    ) -> ScriptCall | list[ScriptCall] | None:
        """The job's fate is recorded (``done``, ``retry``, ``dead``, ``discarded``,
        ``rescheduled``, ``interrupted``, or what a ``Dropped`` names): script calls to
        make before it is acknowledged, in the same round trip when the fetch can. They
        must be idempotent per jid: if they fail, the job runs again. After the outcomes
        in ``chain.RUNS_AGAIN`` the same job runs again: keep what it holds. An
        ``interrupted`` job is put back in line, not acknowledged: return nothing."""
        return None

    def quiet(self) -> None:
        """The capsule stopped taking jobs (it is about to stop, or was quieted): a
        middleware whose jobs can stop early asks them to. Called from the thread that
        quiets the capsule; keep it quick (set a flag)."""
