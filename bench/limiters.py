"""What a limiter check costs: calls per second of ``within_limit`` from 10 threads of
one process, for each kind, with limits that never bind (every check is one script
call, two for concurrent), beside a plain PING from the same threads (the round-trip
floor). Then, if ``bench/limiters_fetch.py`` exists, the cost of queue rate limits in
the fetch, in the same run.

    python bench/limiters.py [--seconds 2] [--rounds 3] [--threads 10] [--redis URL]
                             [--fetch-jobs 20000] [--fetch-rounds 5] [--no-fetch]

Prints the median over the rounds of each kind's calls per second.
"""

from __future__ import annotations

import argparse
import importlib.util
import logging
import statistics
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import redis as redis_py
from _common import redis_for_bench

import limitd

KINDS: dict[str, Callable[[], limitd.Limiter]] = {
    "concurrent (1,000 slots)": lambda: limitd.Limiter.concurrent("bench-c", 1_000),
    "bucket (1e9 per minute)": lambda: limitd.Limiter.bucket("bench-b", 10**9, "minute"),
    "window (1e9 per second)": lambda: limitd.Limiter.window("bench-w", 10**9, "second"),
    "leaky (1e9 per second)": lambda: limitd.Limiter.leaky("bench-l", 10**9, "second"),
}


def calls_per_second(call: Callable[[], object], threads: int, seconds: float) -> float:
    """Run ``call`` in a loop on ``threads`` threads for ``seconds``; total calls / s."""
    counts = [0] * threads
    stop = threading.Event()

    def loop(index: int) -> None:
        while not stop.is_set():
            call()
            counts[index] += 1

    workers = [threading.Thread(target=loop, args=(i,)) for i in range(threads)]
    started = time.perf_counter()
    for worker in workers:
        worker.start()
    time.sleep(seconds)
    stop.set()
    for worker in workers:
        worker.join()
    return sum(counts) / (time.perf_counter() - started)


def check(limiter: limitd.Limiter) -> Callable[[], None]:
    def run() -> None:
        with limiter.within_limit():
            pass

    return run


def limiter_rows(
    seconds: float, rounds: int, threads: int, conn: redis_py.Redis
) -> list[tuple[str, float]]:
    cases: dict[str, Callable[[], object]] = {"PING (round-trip floor)": conn.ping}
    cases.update({name: check(make()) for name, make in KINDS.items()})
    results: dict[str, list[float]] = {name: [] for name in cases}
    for call in cases.values():
        calls_per_second(call, threads, 0.3)  # warm up: scripts loaded, connections open
    for round_number in range(rounds):
        names = list(cases)
        shift = round_number % len(names)
        for name in names[shift:] + names[:shift]:
            results[name].append(calls_per_second(cases[name], threads, seconds))
    return [(name, statistics.median(rates)) for name, rates in results.items()]


def print_table(rows: list[tuple[str, float]], threads: int, rounds: int) -> None:
    print(f"| check ({threads} threads, median of {rounds}) | calls/s |")
    print("|---|---|")
    for name, rate in rows:
        print(f"| {name} | {rate:,.0f} |")


def fetch_module() -> Any:
    path = Path(__file__).with_name("limiters_fetch.py")
    if not path.exists():
        return None
    spec = importlib.util.spec_from_file_location("limiters_fetch", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=2.0)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--threads", type=int, default=10)
    parser.add_argument("--redis", help="Redis URL (default: a private redis-server)")
    parser.add_argument("--fetch-jobs", type=int, default=20_000)
    parser.add_argument("--fetch-rounds", type=int, default=5)
    parser.add_argument("--no-fetch", action="store_true", help="skip the fetch part")
    args = parser.parse_args()
    logging.basicConfig(level=logging.WARNING)
    with redis_for_bench(args.redis) as conn:
        limitd.set_default_client(limitd.Client(conn))
        try:
            rows = limiter_rows(args.seconds, args.rounds, args.threads, conn)
        finally:
            limitd.set_default_client(None)
    print_table(rows, args.threads, args.rounds)
    if args.no_fetch:
        return
    module = fetch_module()
    if module is None:
        print(
            "\nbench/limiters_fetch.py does not exist yet: no figures for rate limits in the fetch"
        )
        return
    print(f"\nRate limits in the fetch ({args.fetch_jobs} jobs per drain):")
    fetch_rows = module.fetch_rows(args.fetch_jobs, args.fetch_rounds, args.threads, args.redis)
    module.print_rows(fetch_rows)


if __name__ == "__main__":
    main()
