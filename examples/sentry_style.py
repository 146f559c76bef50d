"""A Sentry-style error reporter for limitd, with no Sentry in it.

What an error-tracking SDK does for a job system, in a few lines: turn each failed
attempt into an *event* (the exception, a fingerprint that groups repeats, tags to
search by, extra context) and hand it to a *transport*. Here the transport is a function
you pass; :func:`file_transport` appends JSON lines, which is what the tests read. A
real SDK's transport sends over HTTP from a background thread, and its ``flush`` belongs
in a shutdown hook, as below.

Wire it up in a module your config ``require``s::

    import limitd
    from examples.sentry_style import ErrorReporter, file_transport

    reporter = ErrorReporter(file_transport("errors.jsonl"), release="2026.11.1")

    @limitd.configure_server
    def report_errors(config: limitd.ServerConfig) -> None:
        config.error_handlers.append(reporter.capture)
        config.death_handlers.append(reporter.capture_death)
        config.on("shutdown", reporter.flush)

Arguments stay out of the events unless ``send_args=True``: they often hold personal
data, and what leaves the process is the reporter's decision.
"""

from __future__ import annotations

import json
import os
import threading
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import Any

from limitd.payload import Payload
from limitd.retry import Failure, error_class_name

Event = dict[str, Any]
Transport = Callable[[Event], None]


class ErrorReporter:
    """Builds one event per failed attempt (``capture``) and one per death
    (``capture_death``), and hands each to ``transport``. A retried failure is reported
    as a warning, the last one as an error: alerts fire on jobs that gave up, not on
    every hiccup a retry absorbs."""

    def __init__(
        self, transport: Transport, *, release: str | None = None, send_args: bool = False
    ) -> None:
        self.transport = transport
        self.release = release
        self.send_args = send_args
        self.sent = 0
        self._lock = threading.Lock()

    def capture(self, exc: BaseException, failure: Failure) -> None:
        """The error handler: ``config.error_handlers.append(reporter.capture)``."""
        self._send(
            {
                "level": "warning" if failure.will_retry else "error",
                "exception": _exception(exc),
                "fingerprint": [failure.job_class, error_class_name(exc)],
                "tags": {"job.class": failure.job_class, "queue": failure.queue},
                "extra": failure.as_dict(include_args=self.send_args),
            }
        )

    def capture_death(self, payload: Payload, exc: BaseException) -> None:
        """The death handler: a job that will not run again, whatever retried it."""
        self._send(
            {
                "level": "fatal",
                "message": f"job {payload.get('class')} died",
                "exception": _exception(exc),
                "tags": {"job.class": payload.get("class"), "queue": payload.get("queue")},
                "extra": {"jid": payload.get("jid"), "retry_count": payload.get("retry_count")},
            }
        )

    def flush(self) -> None:
        """Nothing is buffered here; a real SDK drains its queue at this point."""

    def _send(self, event: Event) -> None:
        event["release"] = self.release
        event["process"] = os.getpid()
        with self._lock:
            self.sent += 1
        self.transport(event)


def _exception(exc: BaseException) -> dict[str, Any]:
    return {
        "type": error_class_name(exc),
        "value": str(exc),
        "stacktrace": traceback.format_exception(type(exc), exc, exc.__traceback__),
    }


def file_transport(path: str | Path) -> Transport:
    """A transport that appends each event as one JSON line (one ``write`` on a file
    opened for appending, so capsule processes and threads do not interleave lines)."""
    target = Path(path)

    def send(event: Event) -> None:
        line = (json.dumps(event, default=str) + "\n").encode()
        descriptor = os.open(target, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        try:
            os.write(descriptor, line)
        finally:
            os.close(descriptor)

    return send
