"""The two halves of expiring jobs.

The deadline is absolute and fixed at push time, as Sidekiq Pro does it:
``expires_at = start + expires_in``, where ``start`` is when the job was due to run
first (its ``at`` for ``perform_in``/``perform_at``, else its ``created_at``). Stored in
the payload as float epoch seconds, it travels with the job into the retry set and
back, so a retry keeps the original deadline instead of getting a fresh one.

The check costs no Redis call: the payload is already in hand when the server chain
sees the job. A job past its deadline raises :class:`~limitd.middleware.chain.Dropped`
from ``starting``, before any middleware further in (limiters, the job's own code)
runs; the executor records the outcome ``expired`` and the job is acknowledged with
the other middleware's ``settled`` work (its batch counts it, its unique lock goes),
neither retried nor sent to the dead set.
"""

from __future__ import annotations

import logging

from limitd import clock, options
from limitd.iteration import ITERABLE_CLASSES
from limitd.middleware.base import ClientMiddleware, ServerMiddleware
from limitd.middleware.chain import Dropped
from limitd.payload import Payload, to_seconds
from limitd.spec import JobSpec

log = logging.getLogger("limitd.expiry")

OPTION = "expires_in"
DEADLINE = "expires_at"
OUTCOME = "expired"


class JobExpired(Dropped):
    """A job found past its ``expires_at`` when a processor was about to run it."""

    def __init__(self, message: str, late: float) -> None:
        super().__init__(OUTCOME, message)
        self.late = late


def deadline_of(payload: Payload) -> float | None:
    """When ``payload`` was due to have started by: the ``expires_at`` it carries
    (float seconds, or milliseconds as Sidekiq 8 writes timestamps), or None."""
    return to_seconds(payload.get(DEADLINE))


class ExpiryStamp(ClientMiddleware):
    """Client middleware: a job pushed with ``expires_in`` gets its ``expires_at``.
    A payload that has one already (pushed again by a tool, or by a Ruby client with
    Sidekiq Pro) keeps it."""

    def concerns(self, spec: JobSpec | None, payload: Payload) -> bool:
        return payload.get(OPTION) is not None

    def push_work(self, spec: JobSpec | None, payload: Payload) -> None:
        expires_in = payload.get(OPTION)
        if expires_in is None or DEADLINE in payload:
            return None
        try:  # a raw push's value is checked here, as the job option is where declared
            payload[OPTION] = expires_in = options.seconds(expires_in)
        except ValueError as exc:
            raise options.InvalidJobOption(
                f"{payload.get('class')}: expires_in={expires_in!r}: {exc}"
            ) from None
        start = to_seconds(payload.get("at")) or to_seconds(payload.get("created_at"))
        payload[DEADLINE] = (start if start is not None else clock.now()) + float(expires_in)
        return None


class ExpiryCheck(ServerMiddleware):
    """Server middleware: a job past its deadline does not run. Only jobs that carry a
    deadline pass through it (``concerns``)."""

    concerns_fields = frozenset({DEADLINE})

    def concerns(self, payload: Payload) -> bool:
        """A job with a deadline, unless it is iterable: that one is checked before its
        first run only (``limitd.iteration``), and resumes to its end once started."""
        return DEADLINE in payload and payload.get("class") not in ITERABLE_CLASSES

    def starting(self, spec: JobSpec, payload: Payload, queue: str) -> None:
        check_deadline(payload, queue)


def check_deadline(payload: Payload, queue: str) -> None:
    """Raise :class:`JobExpired` (and log it) when ``payload`` is past its deadline."""
    deadline = deadline_of(payload)
    if deadline is None:
        return
    late = clock.now() - deadline
    if late < 0:
        return
    log.warning(
        "expired jid=%s class=%s queue=%s late=%.3fs: not run (expires_at %.3f)",
        payload.get("jid"),
        payload.get("class"),
        queue,
        late,
        deadline,
    )
    raise JobExpired(f"job {payload.get('jid')} expired {late:.3f}s before it started", late)
