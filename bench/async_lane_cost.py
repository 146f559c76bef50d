"""What the async lane adds to a job, in one process (issue 33): the CPU per job of
async jobs run by limitd's lane (``AsyncLane`` with the capsule's executor and default
server middleware, the jobs given to it as a fetch call gives them) against the same
coroutines run on a bare asyncio loop, 1,000 in flight, each awaiting a short sleep.

    .venv/bin/python bench/async_lane_cost.py [--jobs 50000] [--in-flight 1000]
        [--rounds 5] [--sleep 0.01]

No Redis is involved past the start: the lane's finished jobs go to a dispatch that
only counts them, so what is measured is the lane, the executor and the middleware
chain, not the fetch call (bench/fetch_call.py) or a drain (bench/async_io.py). The
bare loop is what any asyncio worker pays for a task awaiting a timer: creating the
task, its timer in the loop's heap, two steps. Rounds alternate the two, and the figures
are medians of process CPU time (user + sys) per job, so the machine's other load
moves both alike.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import statistics
import threading
import time
from typing import Any

import limitd
from limitd.connection.embedded import RedisServer
from limitd.fetch.basic import UnitOfWork
from limitd.middleware.defaults import default_server_chain
from limitd.retry.handler import RetryHandler
from limitd.supervisor.async_lane import AsyncLane
from limitd.supervisor.executor import JobExecutor

SLEEP = 0.01


@limitd.job(name="bench.LaneSleep", queue="lane")
async def lane_sleep(i: int) -> None:
    await asyncio.sleep(SLEEP)


class CountingDispatch:
    """The lane's dispatch: counts finished jobs and says when all are in."""

    def __init__(self, jobs: int) -> None:
        self.jobs, self.count = jobs, 0
        self.all_done = threading.Event()

    def finish(self, unit: UnitOfWork) -> None:
        self.count += 1  # the loop's thread only
        if self.count == self.jobs:
            self.all_done.set()


def units(jobs: int) -> list[UnitOfWork]:
    """Payloads as ``perform_async`` writes them (random hex jids, float times)."""
    rng = random.Random(0)
    now = time.time()
    payloads = [
        json.dumps(
            {
                "class": "bench.LaneSleep",
                "args": [i],
                "queue": "lane",
                "jid": rng.randbytes(12).hex(),
                "retry": True,
                "created_at": now,
                "enqueued_at": now,
            }
        ).encode()
        for i in range(jobs)
    ]
    # No fetch: the counting dispatch settles them, and nothing asks it.
    return [UnitOfWork("lane", payload, None) for payload in payloads]  # type: ignore[arg-type]


def lane_round(redis: Any, jobs: int, in_flight: int) -> float:
    """CPU seconds per job for ``jobs`` run through a fresh lane."""
    dispatch = CountingDispatch(jobs)
    executor = JobExecutor(RetryHandler(redis), default_server_chain(redis))
    lane = AsyncLane(executor, dispatch, in_flight)  # type: ignore[arg-type]
    executor.hand_off = lane.submit
    lane.start()
    todo = units(jobs)
    started = time.process_time()
    # As the capsule's fetch calls give them: batches the size of the room there is.
    while todo:
        room = lane.room_to_fetch() or 1
        batch, todo = todo[:room], todo[room:]
        left = lane.take_fetched(batch)
        for unit in left:  # no room after all: as a processor would
            lane.submit(unit, *executor.async_job(unit))  # type: ignore[misc]
        if not left and not lane.room_to_fetch():
            time.sleep(0.001)  # the fetch would wait for room; so does this
    dispatch.all_done.wait(600)
    spent = time.process_time() - started
    lane.stop(5)
    return spent / jobs


def bare_round(jobs: int, in_flight: int) -> float:
    """CPU seconds per job for the same coroutines on a bare loop, in flight alike."""

    async def run() -> None:
        room = asyncio.Semaphore(in_flight)
        done = asyncio.Event()
        finished = 0

        def ended(_: asyncio.Task[None]) -> None:
            nonlocal finished
            finished += 1
            room.release()
            if finished == jobs:
                done.set()

        loop = asyncio.get_running_loop()
        for i in range(jobs):
            await room.acquire()
            loop.create_task(lane_sleep.fn(i)).add_done_callback(ended)
        await done.wait()

    started = time.process_time()
    asyncio.run(run())
    return (time.process_time() - started) / jobs


def main() -> None:
    global SLEEP
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--jobs", type=int, default=50_000)
    parser.add_argument("--in-flight", type=int, default=1000)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--sleep", type=float, default=SLEEP, help="each job's await (s)")
    args = parser.parse_args()
    SLEEP = args.sleep
    import redis as redis_py

    server = RedisServer()
    server.start()
    try:
        redis = redis_py.Redis.from_url(server.url)
        lane_us: list[float] = []
        bare_us: list[float] = []
        for n in range(args.rounds):
            pair = [
                ("lane", lambda: lane_round(redis, args.jobs, args.in_flight)),
                ("bare", lambda: bare_round(args.jobs, args.in_flight)),
            ]
            for name, run in pair if n % 2 == 0 else pair[::-1]:
                per_job = 1e6 * run()
                (lane_us if name == "lane" else bare_us).append(per_job)
                print(f"round {n + 1} {name}: {per_job:.1f} us/job")
        lane, bare = statistics.median(lane_us), statistics.median(bare_us)
        print(
            f"median: lane {lane:.1f} us/job, bare asyncio {bare:.1f} us/job, "
            f"the lane adds {lane - bare:.1f} us/job ({args.jobs} jobs, "
            f"{args.in_flight} in flight, {args.rounds} rounds)"
        )
    finally:
        server.stop()


if __name__ == "__main__":
    main()
