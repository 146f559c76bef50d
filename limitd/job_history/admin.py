"""The job history as an operator reads it: per job class, the last minutes' processed
and failed jobs, their time and the histogram of their durations::

    from limitd.api import job_history

    for row in job_history(minutes=60):
        print(row.job_class, row.processed, row.failed, row.average_ms)
        for minute in row.minutes:          # oldest first, quiet minutes as zeros
            print(minute.start, minute.processed, minute.buckets)

One round trip whatever the number of classes: an ``HGETALL`` per minute, pipelined.
Figures land in the minute the job ended in, a few seconds (``flush_interval``) after.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import redis as redis_py

from limitd import clock, keys
from limitd.client import connection_or_default
from limitd.job_history.store import BUCKETS, bucket_bounds, parse_field

DEFAULT_MINUTES = 60
LONGEST = 24 * 60  # minutes one call may ask for


@dataclass
class MinuteFigures:
    """One class over one minute; ``start`` is the minute's start, epoch seconds."""

    start: int
    processed: int = 0
    failed: int = 0
    milliseconds: int = 0
    buckets: list[int] = field(default_factory=lambda: [0] * BUCKETS)

    def as_dict(self) -> dict[str, Any]:
        return {
            "start": self.start,
            "processed": self.processed,
            "failed": self.failed,
            "milliseconds": self.milliseconds,
            "buckets": list(self.buckets),
        }


@dataclass
class ClassHistory:
    """One job class over the minutes asked for: totals, and ``minutes`` oldest first."""

    job_class: str
    minutes: list[MinuteFigures]

    @property
    def processed(self) -> int:
        return sum(minute.processed for minute in self.minutes)

    @property
    def failed(self) -> int:
        return sum(minute.failed for minute in self.minutes)

    @property
    def milliseconds(self) -> int:
        return sum(minute.milliseconds for minute in self.minutes)

    @property
    def average_ms(self) -> float:
        timed = sum(sum(minute.buckets) for minute in self.minutes)
        return self.milliseconds / timed if timed else 0.0

    @property
    def buckets(self) -> list[int]:
        """The histogram over every minute."""
        return [sum(minute.buckets[b] for minute in self.minutes) for b in range(BUCKETS)]

    def as_dict(self) -> dict[str, Any]:
        return {
            "job_class": self.job_class,
            "processed": self.processed,
            "failed": self.failed,
            "milliseconds": self.milliseconds,
            "average_ms": self.average_ms,
            "buckets": self.buckets,
            "minutes": [minute.as_dict() for minute in self.minutes],
        }


def bucket_labels() -> list[str]:
    """The buckets' ranges as a reader wants them: ``<1ms``, ``1-2ms`` ... ``>=4.7h``."""
    labels = []
    for bucket in range(BUCKETS):
        low, high = bucket_bounds(bucket)
        labels.append(f"<{_duration(high)}" if low == 0 else f"{_duration(low)}-{_duration(high)}")
    labels[-1] = f">={_duration(bucket_bounds(BUCKETS - 1)[0])}"
    return labels


def _duration(milliseconds: float) -> str:
    if milliseconds < 1000:
        return f"{milliseconds:g}ms"
    if milliseconds < 60_000:
        return f"{milliseconds / 1000:.3g}s"
    if milliseconds < 3_600_000:
        return f"{milliseconds / 60_000:.3g}m"
    return f"{milliseconds / 3_600_000:.2g}h"


def job_history(
    redis: redis_py.Redis | None = None, minutes: int = DEFAULT_MINUTES
) -> list[ClassHistory]:
    """Every job class that ran in the last ``minutes`` minutes (the current one last),
    busiest first."""
    if not 1 <= minutes <= LONGEST:
        raise ValueError(f"minutes: expected 1 to {LONGEST}, got {minutes}")
    conn = connection_or_default(redis)
    layout = keys.of(conn)
    now_minute = int(clock.now() // 60)
    span = list(range(now_minute - minutes + 1, now_minute + 1))
    pipe = conn.pipeline(transaction=False)
    for minute in span:
        pipe.hgetall(layout.job_history(minute))
    rows: dict[str, ClassHistory] = {}
    for index, found in enumerate(pipe.execute()):
        for name, value in found.items():
            _add(rows, span, index, _text(name), int(value))
    return sorted(rows.values(), key=lambda row: (-row.processed, row.job_class))


def _add(rows: dict[str, ClassHistory], span: list[int], index: int, name: str, value: int) -> None:
    parsed = parse_field(name)
    if parsed is None:
        return
    job_class, part = parsed
    row = rows.get(job_class)
    if row is None:
        row = rows[job_class] = ClassHistory(job_class, [MinuteFigures(m * 60) for m in span])
    minute = row.minutes[index]
    if part == "p":
        minute.processed += value
    elif part == "f":
        minute.failed += value
    elif part == "ms":
        minute.milliseconds += value
    elif part.isdigit() and int(part) < BUCKETS:
        minute.buckets[int(part)] += value


def _text(name: Any) -> str:
    return name.decode() if isinstance(name, bytes) else str(name)
