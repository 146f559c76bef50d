"""Dashboard pages over big collections: how long the Dead page takes to render over a
dead set of 10,000 jobs (a full one, as ``DeadSetPolicy`` keeps at most), and one
queue's page over a queue of 1,000,000 jobs, first page and a deep one.

    .venv/bin/python bench/web_pages.py [--dead 10000] [--queued 1000000] [--rounds 5]

On a private redis-server started for the run (or ``--redis-url``), the pages are asked
through the ASGI app in this process (Starlette's TestClient: no network, no server),
the whole page as a browser's first load gets it. Each figure is the median of
``--rounds`` requests after one warm-up. The target: every page under a second, as a
page must read a page of the collection, never all of it. The filtered Dead pages scan
the set (bounded, see ``SortedSet.filtered_page``) and are shown for comparison.
"""

from __future__ import annotations

import argparse
import random
import statistics
import time

import redis as redis_py
from _common import redis_for_bench
from starlette.testclient import TestClient

from limitd import keys
from limitd.payload import dumps
from limitd.web import app

TARGET_SECONDS = 1.0
QUEUE = "bench_web"
CHUNK = 5_000
ERRORS = [
    ("billing.CardDeclined", "card_declined: insufficient funds"),
    ("TimeoutError", "SMTP server did not answer in 30 s"),
    ("ConnectionRefusedError", "[Errno 111] Connection refused"),
    ("KeyError", "'customer_id'"),
]
CLASSES = ["billing.ChargeCard", "mailer.SendReceipt", "sync.PushToCrm", "reports.Build"]


def fill_dead(conn: redis_py.Redis, count: int, rng: random.Random) -> None:
    now = time.time()
    for first in range(0, count, CHUNK):
        members = {}
        for i in range(first, min(count, first + CHUNK)):
            error_class, message = rng.choice(ERRORS)
            died = now - i * 7.0
            payload = {
                "class": rng.choice(CLASSES),
                "args": [f"cus_{rng.randrange(10**6)}", rng.randrange(10**4)],
                "jid": f"{i:024x}",
                "queue": "default",
                "retry_count": 25,
                "error_class": error_class,
                "error_message": message,
                "failed_at": died - 86_400,
                "created_at": died - 90_000,
            }
            members[dumps(payload)] = died
        conn.zadd(keys.of(conn).DEAD, members)


def fill_queue(conn: redis_py.Redis, count: int) -> None:
    now = time.time()
    for first in range(0, count, CHUNK):
        batch = [
            dumps(
                {
                    "class": "sync.PushToCrm",
                    "args": ["contact", i],
                    "jid": f"{i:024x}",
                    "queue": QUEUE,
                    "enqueued_at": now,
                }
            )
            for i in range(first, min(count, first + CHUNK))
        ]
        conn.lpush(keys.of(conn).queue(QUEUE), *batch)
    conn.sadd(keys.of(conn).QUEUES, QUEUE)


def median_seconds(client: TestClient, path: str, rounds: int) -> float:
    client.get(path).raise_for_status()  # warm-up: templates compiled, scripts loaded
    times = []
    for _ in range(rounds):
        started = time.perf_counter()
        response = client.get(path)
        times.append(time.perf_counter() - started)
        response.raise_for_status()
    return statistics.median(times)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dead", type=int, default=10_000, help="jobs in the dead set")
    parser.add_argument("--queued", type=int, default=1_000_000, help="jobs in the queue")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--redis-url", default=None, help="default: a private redis-server")
    parser.add_argument("--seed", type=int, default=1)
    args = parser.parse_args()
    with redis_for_bench(args.redis_url) as conn:
        k = keys.of(conn)
        conn.delete(k.DEAD, k.queue(QUEUE))
        started = time.perf_counter()
        fill_dead(conn, args.dead, random.Random(args.seed))
        fill_queue(conn, args.queued)
        print(
            f"filled: {conn.zcard(k.DEAD):,} dead, {conn.llen(k.queue(QUEUE)):,} "
            f"queued in {QUEUE!r} ({time.perf_counter() - started:.1f} s)"
        )
        last_dead = max(1, -(-args.dead // 25))
        last_queue = max(1, -(-args.queued // 25))
        pages = [
            ("Dead, page 1", "/dead"),
            (f"Dead, page {last_dead:,} (the last)", f"/dead?page={last_dead}"),
            ("Dead, filtered by job name", "/dead?name=ChargeCard"),
            ("Dead, filtered by text, page 2", "/dead?text=cus_1&page=2"),
            ("Queue, page 1", f"/queues/{QUEUE}"),
            (f"Queue, page {last_queue:,} (the last)", f"/queues/{QUEUE}?page={last_queue}"),
        ]
        with TestClient(app(conn)) as client:
            results = [(label, median_seconds(client, path, args.rounds)) for label, path in pages]
        try:
            print(f"\nmedian of {args.rounds} renders, target under {TARGET_SECONDS:.0f} s:")
            for label, seconds in results:
                verdict = "ok" if seconds < TARGET_SECONDS else "OVER TARGET"
                print(f"  {label:<40} {seconds * 1000:8.1f} ms  {verdict}")
        finally:
            conn.delete(keys.of(conn).DEAD, keys.of(conn).queue(QUEUE))
            conn.srem(keys.of(conn).QUEUES, QUEUE)


if __name__ == "__main__":
    main()
