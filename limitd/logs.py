"""Logs an operator can read: which job wrote a line, text or JSON lines, levels per logger.

- :class:`JobContext` is a handler filter: a record logged while a job runs in that
  thread (see :func:`limitd.spec.current_payload`) gets the job's ``jid``, ``class`` and
  ``queue``, so an app's own ``logging.getLogger("app").info(...)`` inside a job says which
  job it came from. Outside a job the fields are absent. limitd's own lines about a job
  pass the fields as ``extra`` and name them in the message already; the filter leaves
  those alone, so a text line never names the job twice.
- :func:`own_frames` cuts limitd's frames out of a traceback: a failing job's WARNING
  shows the job's code, not the middleware it ran through (the full one is at DEBUG).
- :func:`configure` sets up the root logger for ``limitd start``. It runs once in the
  supervisor before it forks: the capsule children inherit the handler with its formatter
  and filter, and SIGHUP's reopen swaps the handler's stream, not the handler, so both
  survive a log rotation.
"""

from __future__ import annotations

import datetime as dt
import json
import logging
import os
from types import TracebackType
from typing import Any

from limitd.config import LoggingSettings
from limitd.payload import Payload
from limitd.spec import current_payload

TEXT_FORMAT = (
    "%(asctime)s pid=%(process)d %(threadName)s %(levelname)s %(name)s: %(job_context)s%(message)s"
)
JOB_FIELDS = ("jid", "class", "queue")
FORMATS = ("text", "json")
_PACKAGE_DIR = os.path.dirname(os.path.abspath(__file__)) + os.sep  # this module is at its root


def job_fields(payload: Payload, queue: str | None = None) -> dict[str, Any]:
    """The fields that name a job in a record: for ``extra=`` or the filter."""
    return {
        "jid": payload.get("jid"),
        "class": payload.get("class"),
        "queue": queue if queue is not None else payload.get("queue"),
    }


class JobContext(logging.Filter):
    """Stamps records logged inside a running job with that job's fields. Each thread
    (and each asyncio task) has its own current job, so processors never mix them up."""

    def filter(self, record: logging.LogRecord) -> bool:
        payload = current_payload()
        if payload is None or hasattr(record, "jid"):
            return True
        fields = job_fields(payload)
        record.__dict__.update(fields)
        record.job_context = " ".join(f"{key}={value}" for key, value in fields.items()) + " "
        return True


def text_formatter() -> logging.Formatter:
    """limitd's text lines; ``job_context`` is empty outside a job (or without the filter)."""
    return logging.Formatter(TEXT_FORMAT, defaults={"job_context": ""})


class JsonFormatter(logging.Formatter):
    """One JSON object per line, for log shippers: time (UTC, ISO 8601), level, logger,
    message, pid, thread, the job's jid/class/queue when there is one, and the formatted
    traceback as ``exc_info`` when the record has one."""

    def format(self, record: logging.LogRecord) -> str:
        entry: dict[str, Any] = {
            "time": dt.datetime.fromtimestamp(record.created, dt.timezone.utc).isoformat(
                timespec="milliseconds"
            ),
            "level": record.levelname,
            "logger": record.name,
            "message": record.getMessage(),
            "pid": record.process,
            "thread": record.threadName,
        }
        entry.update({key: record.__dict__[key] for key in JOB_FIELDS if key in record.__dict__})
        if record.exc_info and not record.exc_text:
            record.exc_text = self.formatException(record.exc_info)
        if record.exc_text:
            entry["exc_info"] = record.exc_text
        if record.stack_info:
            entry["stack_info"] = self.formatStack(record.stack_info)
        return json.dumps(entry, default=str)


def formatter_for(name: str) -> logging.Formatter:
    return JsonFormatter() if name == "json" else text_formatter()


def handler_for(settings: LoggingSettings) -> logging.Handler:
    """A handler to the file (else standard error) with the chosen format and the job
    filter."""
    handler = logging.FileHandler(settings.file) if settings.file else logging.StreamHandler()
    handler.setFormatter(formatter_for(settings.format))
    handler.addFilter(JobContext())
    return handler


def configure(settings: LoggingSettings) -> logging.Handler:
    """Send every record to one :func:`handler_for` ``settings``, and set the root's and
    each named logger's level. Replaces the root's handlers (the command line's start-up
    one). Returns the handler."""
    handler = handler_for(settings)
    root = logging.getLogger()
    for old in list(root.handlers):
        root.removeHandler(old)
    root.addHandler(handler)
    root.setLevel(settings.level)
    for name, level in settings.levels.items():
        logging.getLogger(name).setLevel(level)
    return handler


def own_frames(tb: TracebackType | None) -> TracebackType | None:
    """``tb`` without the frames of limitd's own package: what the job's author needs.
    When every frame is limitd's (a middleware raised), the innermost one stays, so the
    line still says where the error came from."""
    kept: list[TracebackType] = []
    last = None
    while tb is not None:
        if not tb.tb_frame.f_code.co_filename.startswith(_PACKAGE_DIR):
            kept.append(tb)
        last, tb = tb, tb.tb_next
    if not kept and last is not None:
        kept = [last]
    rebuilt = None
    for frame in reversed(kept):
        rebuilt = TracebackType(rebuilt, frame.tb_frame, frame.tb_lasti, frame.tb_lineno)
    return rebuilt
