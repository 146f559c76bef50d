"""limitd's jobs for bench/async_io.py (``limitd start`` requires this module): each
waits 100 ms, standing in for an HTTP call, then counts itself done. The async one waits
on the capsule's event loop; the sync one holds a processor thread while it waits."""

from __future__ import annotations

import asyncio
import os
import time

import redis.asyncio as aioredis
import tally
from bench_counter import COUNTER_KEY, incr

import limitd

QUEUE = "io"
WAIT_SECONDS = 0.1
# As many connections as jobs on the loop at once (bench/async_io.py's async_concurrency),
# so none is refused: redis-py 8's asyncio pool refuses a 101st by default, where the
# peers' redis-py 5 has no cap. (A BlockingConnectionPool would wait instead, at the cost
# of a timeout context per command.)
MAX_CONNECTIONS = 1000

_clients: dict[int, aioredis.Redis] = {}


def _loop_client() -> aioredis.Redis:
    """One asyncio client per running loop (a client's connections belong to the loop
    that opened them), made on first use, after any fork."""
    loop_id = id(asyncio.get_running_loop())
    client = _clients.get(loop_id)
    if client is None:
        pool = aioredis.ConnectionPool.from_url(
            os.environ["BENCH_REDIS_URL"], max_connections=MAX_CONNECTIONS
        )
        client = _clients[loop_id] = aioredis.Redis(connection_pool=pool)
    return client


@limitd.job(name="bench.WaitIO", queue=QUEUE)
async def wait_io(i: int) -> None:
    await asyncio.sleep(WAIT_SECONDS)
    if tally.incr_in_job():
        await _loop_client().incr(COUNTER_KEY)
    else:
        tally.done()


@limitd.job(name="bench.WaitIOSync", queue=QUEUE)
def wait_io_sync(i: int) -> None:
    time.sleep(WAIT_SECONDS)
    if tally.incr_in_job():
        incr()
    else:
        tally.done()
