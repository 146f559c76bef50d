"""What the job history costs in Redis memory per job class per hour: for a number of
job classes, write 60 minutes of history as the capsules would (one flush per minute,
each class with jobs in a few duration buckets, or in every bucket), then add up
``MEMORY USAGE`` of the 60 minute hashes and divide by the classes.

    python bench/job_history_memory.py [--classes 1 10 50] [--buckets 6] [--redis URL]

Prints one line per number of classes: bytes per class per hour with ``--buckets``
buckets in use per class and minute (a class whose durations vary a little), and with
all 26 (the worst case). A minute's hash holds, per class, 3 counters and one field per
bucket in use, so the figure depends on the class names' length (here 32 characters,
like ``billing.jobs.SendInvoiceReminder``) and on Redis's hash encoding: a hash of up
to ``hash-max-listpack-entries`` (512 by default in Redis 7) fields is a compact
listpack, a bigger one a hash table, about twice as large per class.
"""

from __future__ import annotations

import argparse
import random

import redis as redis_py
from _common import redis_for_bench

from limitd import keys
from limitd.job_history.store import BUCKETS, Counts, Minutes, flush

MINUTES = 60
FIRST_MINUTE = 1_000  # epoch minute in 1970: no live history is that old


def class_name(index: int) -> str:
    """32 characters, distinct for up to 10,000 classes."""
    return f"billing.jobs.SendInvoiceRemi{index:04d}"


def hour_of(classes: int, buckets: int, rng: random.Random) -> list[Minutes]:
    """Sixty minutes of tallies, each class with ``buckets`` buckets in use."""
    hour = []
    for minute in range(FIRST_MINUTE, FIRST_MINUTE + MINUTES):
        tally: Minutes = {}
        for index in range(classes):
            start = rng.randrange(0, BUCKETS - buckets + 1)
            spread = {start + b: rng.randrange(1, 500) for b in range(buckets)}
            processed = sum(spread.values())
            tally[minute, class_name(index)] = Counts(
                processed=processed,
                failed=rng.randrange(0, 20),
                milliseconds=processed * rng.randrange(1, 5000),
                buckets=spread,
            )
        hour.append(tally)
    return hour


def bytes_per_class_hour(conn: redis_py.Redis, classes: int, buckets: int) -> float:
    _clear(conn)
    for tally in hour_of(classes, buckets, random.Random(classes * 100 + buckets)):
        flush(conn, tally)
    layout = keys.of(conn)
    total = sum(
        int(conn.memory_usage(layout.job_history(minute), samples=0) or 0)
        for minute in range(FIRST_MINUTE, FIRST_MINUTE + MINUTES)
    )
    _clear(conn)
    return total / classes


def _clear(conn: redis_py.Redis) -> None:
    """Delete the run's own minute hashes (only those: ``--redis`` may be shared)."""
    layout = keys.of(conn)
    conn.delete(*(layout.job_history(m) for m in range(FIRST_MINUTE, FIRST_MINUTE + MINUTES)))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--classes", type=int, nargs="+", default=[1, 10, 50])
    parser.add_argument("--buckets", type=int, default=6)
    parser.add_argument("--redis", help="a Redis URL (default: a private redis-server)")
    args = parser.parse_args()
    with redis_for_bench(args.redis) as conn:
        version = conn.info("server")["redis_version"]
        print(f"Redis {version}; 60 minute hashes; bytes of MEMORY USAGE per job class per hour")
        for classes in args.classes:
            typical = bytes_per_class_hour(conn, classes, args.buckets)
            worst = bytes_per_class_hour(conn, classes, BUCKETS)
            print(
                f"{classes:>4} classes: {typical / 1024:7.1f} KiB with {args.buckets} buckets "
                f"in use, {worst / 1024:7.1f} KiB with all {BUCKETS}"
            )


if __name__ == "__main__":
    main()
