"""The job history's data: the in-memory tally of one process and its Redis layout.

One hash per minute, ``limitd:job_history:<epoch minute>`` (``KeyLayout.job_history``;
in cluster mode under the ``{limitd}`` tag, so a flush is one pipeline to one shard),
with per job class ``<class>`` the fields::

    <class>|p     jobs that ran (failed ones included)
    <class>|f     of those, jobs that raised
    <class>|ms    their total duration, in milliseconds
    <class>|<b>   jobs whose duration fell in bucket <b> (0..25; only buckets seen)

Buckets grow by powers of two: bucket 0 is under 1 ms, bucket ``b`` holds durations of
``2**(b-1)`` to ``2**b`` ms, and the last one everything from ``2**24`` ms (4.7 hours)
up. A field is written only when its count is not zero, so a class that ran a few
quick jobs in a minute costs a handful of fields. Each hash expires ``retention``
seconds after its minute's last flush.
"""

from __future__ import annotations

import threading
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from limitd import keys

BUCKETS = 26
DEFAULT_RETENTION = 8 * 3600  # seconds a minute's hash is kept after its last write


def bucket_of(milliseconds: float) -> int:
    """The histogram bucket of a duration: its whole milliseconds' bit length, capped."""
    return min(BUCKETS - 1, int(max(milliseconds, 0.0)).bit_length())


def bucket_bounds(bucket: int) -> tuple[float, float]:
    """The durations (ms) bucket ``bucket`` holds, from (inclusive) to (exclusive)."""
    if bucket == 0:
        return (0.0, 1.0)
    upper = float("inf") if bucket == BUCKETS - 1 else float(2**bucket)
    return (float(2 ** (bucket - 1)), upper)


@dataclass
class Counts:
    """One job class's figures over one minute."""

    processed: int = 0
    failed: int = 0
    milliseconds: int = 0
    buckets: dict[int, int] = field(default_factory=dict)

    def add(self, other: Counts) -> None:
        self.processed += other.processed
        self.failed += other.failed
        self.milliseconds += other.milliseconds
        for bucket, count in other.buckets.items():
            self.buckets[bucket] = self.buckets.get(bucket, 0) + count

    def fields(self, job_class: str) -> dict[str, int]:
        """The hash fields to increment for these counts (zeros left out)."""
        found = {
            f"{job_class}|p": self.processed,
            f"{job_class}|f": self.failed,
            f"{job_class}|ms": self.milliseconds,
        }
        found.update({f"{job_class}|{b}": n for b, n in self.buckets.items()})
        return {name: count for name, count in found.items() if count}


Minutes = dict[tuple[int, str], Counts]  # (epoch minute, job class) -> counts


class Tally:
    """What one process's jobs did since its last flush, per (minute, class).

    Shared by every processor thread and the event loop of the process: one lock, held
    for a few dictionary operations per job, and swapped out whole by :meth:`take`."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._minutes: Minutes = {}

    def record(
        self, minute: int, job_class: str, milliseconds: float | None, failed: bool
    ) -> None:
        """One job of ``job_class`` ended in ``minute``; ``milliseconds`` None: it was not
        timed (it never reached ``perform``), so it is counted without a duration."""
        with self._lock:
            counts = self._minutes.get((minute, job_class))
            if counts is None:
                counts = self._minutes[minute, job_class] = Counts()
            counts.processed += 1
            counts.failed += failed
            if milliseconds is not None:
                bucket = bucket_of(milliseconds)
                counts.milliseconds += round(milliseconds)
                counts.buckets[bucket] = counts.buckets.get(bucket, 0) + 1

    def take(self) -> Minutes:
        """Everything tallied so far, leaving the tally empty."""
        with self._lock:
            taken, self._minutes = self._minutes, {}
        return taken

    def give_back(self, minutes: Minutes) -> None:
        """Counts a flush could not write, added back for the next one."""
        with self._lock:
            for key, counts in minutes.items():
                mine = self._minutes.get(key)
                if mine is None:
                    self._minutes[key] = counts
                else:
                    mine.add(counts)

    def __len__(self) -> int:
        with self._lock:
            return len(self._minutes)


def flush(redis: Any, minutes: Minutes, retention: int = DEFAULT_RETENTION) -> int:
    """Write ``minutes`` in one round trip: ``HINCRBY`` per field, ``EXPIRE`` per minute's
    hash. Returns the number of commands sent (0 when there was nothing to write)."""
    if not minutes:
        return 0
    layout = keys.of(redis)
    pipe = redis.pipeline(transaction=False)
    sent = 0
    for (minute, job_class), counts in minutes.items():
        key = layout.job_history(minute)
        for name, count in counts.fields(job_class).items():
            pipe.hincrby(key, name, count)
            sent += 1
    for key in _keys_of(layout, (minute for minute, _ in minutes)):
        pipe.expire(key, retention)
        sent += 1
    pipe.execute()
    return sent


def _keys_of(layout: keys.KeyLayout, minutes: Iterable[int]) -> list[str]:
    return [layout.job_history(minute) for minute in sorted(set(minutes))]


def parse_field(name: str) -> tuple[str, str] | None:
    """A hash field as (job class, part): part is ``p``, ``f``, ``ms`` or a bucket
    number. Class names may hold ``|``: the part is after the last one."""
    job_class, sep, part = name.rpartition("|")
    return (job_class, part) if sep and job_class else None
