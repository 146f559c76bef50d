"""Limiters in ``async def`` code (``limiter.aio.within_limit()``): each kind admits what
the sync form admits (the same steps through both, under a frozen clock), a release
wakes an async waiter, ``OverLimit`` after ``wait_timeout`` and the decorator form (both
run through the sync and the async form), the event loop keeps running while a check
waits, and sync and async holders share the same slots.

No pytest-asyncio: each test runs its coroutine with :func:`run` (``asyncio.run``)."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Awaitable, Callable, Coroutine
from typing import Any, TypeVar

import pytest
import redis as redis_py
from freezegun import freeze_time

import limitd
from limitd import keys
from limitd.connection import loop_twin
from limitd.limiters import limiter as limiter_module
from limitd.limiters.admin import LimiterStatus, limiters
from tests.test_limiters import (
    T0,
    WAITERS,
    assert_waited_once_for_room,
    once,
    pauses_move_the_clock,
    take,
)

T = TypeVar("T")
# ("take", n): enter n blocks at once, then leave them; ("hold", 1): enter one, leave it
# at the end of the scenario; ("tick", seconds): move the frozen clock on.
Step = tuple[str, float]


def run(main: Callable[[], Coroutine[Any, Any, T]], *clients: redis_py.Redis) -> T:
    """``asyncio.run(main())``, then close the loop's asyncio twins of ``clients`` (the
    default client's when none are named) so no socket outlives its loop."""

    async def wrapped() -> T:
        try:
            return await main()
        finally:
            for client in clients or (limitd.client.default_client().redis,):
                await loop_twin(client).aclose()

    return asyncio.run(wrapped())


async def atake(limiter: limitd.Limiter, times: int) -> list[bool]:
    """``take`` through the async form: enter ``times`` blocks at once, held to the end."""
    got = []
    async with contextlib.AsyncExitStack() as stack:
        for _ in range(times):
            try:
                await stack.enter_async_context(limiter.aio.within_limit())
                got.append(True)
            except limitd.OverLimit:
                got.append(False)
    return got


async def aonce(limiter: limitd.Limiter) -> bool:
    return await atake(limiter, 1) == [True]


async def until(condition: Callable[[], Awaitable[object]], timeout: float = 10.0) -> None:
    """Poll ``condition`` with a deadline, letting the loop run between polls."""
    deadline = asyncio.get_running_loop().time() + timeout
    while not await condition():
        if asyncio.get_running_loop().time() > deadline:
            raise AssertionError(f"timed out after {timeout}s")
        await asyncio.sleep(0.005)


async def blocked_clients(redis: redis_py.Redis) -> int:
    return int((await loop_twin(redis).info("clients"))["blocked_clients"])


# The same steps through both forms, under a frozen clock (wait_timeout=0: a frozen clock
# never reaches a deadline). Each scenario crosses its kind's boundaries.

SCENARIOS: dict[str, tuple[Callable[[], limitd.Limiter], list[Step], list[list[bool]]]] = {
    "concurrent": (
        lambda: limitd.Limiter.concurrent("c", 3, lock_timeout=10, wait_timeout=0),
        # a holder that stays (as if killed): its lock expires after 10 s
        [
            ("take", 4),
            ("hold", 1),
            ("take", 3),
            ("tick", 9.999),
            ("take", 3),
            ("tick", 0.002),
            ("take", 4),
        ],
        [
            [True, True, True, False],
            [True],
            [True, True, False],
            [True, True, False],
            [True, True, True, False],
        ],
    ),
    "bucket": (
        lambda: limitd.Limiter.bucket("b", 3, "minute", wait_timeout=0),
        [("take", 4), ("tick", 29.999), ("take", 1), ("tick", 0.001), ("take", 4)],
        [[True, True, True, False], [False], [True, True, True, False]],
    ),
    "window": (
        lambda: limitd.Limiter.window("w", 3, 60, wait_timeout=0),
        [("take", 1), ("tick", 10)] * 3
        + [("take", 1), ("tick", 29.999), ("take", 1), ("tick", 0.001), ("take", 2)]
        + [("tick", 10), ("take", 1)],
        [[True]] * 3 + [[False], [False], [True, False], [True]],
    ),
    "leaky": (
        lambda: limitd.Limiter.leaky("l", 60, "minute", wait_timeout=0),
        [("take", 61)]
        + [("tick", 0.5), ("take", 1), ("tick", 0.5), ("take", 2)] * 3
        + [("tick", 60), ("take", 61)],
        [[True] * 60 + [False]] + [[False], [True, False]] * 3 + [[True] * 60 + [False]],
    ),
}


def sync_steps(limiter: limitd.Limiter, steps: list[Step], frozen: Any) -> list[list[bool]]:
    results = []
    with contextlib.ExitStack() as held:
        for what, n in steps:
            if what == "tick":
                frozen.tick(n)
            elif what == "hold":
                held.enter_context(limiter.within_limit())
                results.append([True])
            else:
                results.append(take(limiter, int(n)))
    return results


async def async_steps(limiter: limitd.Limiter, steps: list[Step], frozen: Any) -> list[list[bool]]:
    results = []
    async with contextlib.AsyncExitStack() as held:
        for what, n in steps:
            if what == "tick":
                frozen.tick(n)
            elif what == "hold":
                await held.enter_async_context(limiter.aio.within_limit())
                results.append([True])
            else:
                results.append(await atake(limiter, int(n)))
    return results


@pytest.mark.parametrize("kind", list(SCENARIOS))
def test_the_async_form_admits_exactly_what_the_sync_form_admits(
    redis: redis_py.Redis, kind: str
) -> None:
    make, steps, expected = SCENARIOS[kind]
    # real_asyncio: the event loop keeps the real monotonic clock; limitd's clock freezes.
    with freeze_time(T0, real_asyncio=True) as frozen:
        sync_results = sync_steps(make(), steps, frozen)
        sync_stats = limiters(redis)
    redis.flushall()
    with freeze_time(T0, real_asyncio=True) as frozen:

        async def main() -> tuple[list[list[bool]], list[LimiterStatus]]:
            results = await async_steps(make(), steps, frozen)
            return results, limiters(redis)

        async_results, async_stats = run(main)
    assert sync_results == expected
    assert async_results == sync_results
    assert async_stats == sync_stats  # the same calls, waits, refusals, holds and expiries


# Waiting wakes when room appears (the clock moves on by each pause, as in the sync
# test), and gives up at the deadline.


@pytest.mark.parametrize(("make", "pause"), WAITERS)
def test_a_full_limiter_waits_until_room_appears(
    redis: redis_py.Redis, monkeypatch: pytest.MonkeyPatch, make, pause: float
) -> None:
    limiter = make()

    async def main() -> tuple[list[bool], bool]:
        return await atake(limiter, 2), await aonce(limiter)

    with pauses_move_the_clock(monkeypatch) as pauses:
        assert run(main) == ([True, True], True)  # waited instead of failing
    assert_waited_once_for_room(redis, pauses, pause)


@pytest.mark.standalone_only("watches one server's blocked clients")
def test_an_async_waiter_is_woken_by_a_release_from_another_task(
    redis: redis_py.Redis, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The lock would only expire after 60 s and one BLPOP may block as long: a waiter in
    # within the 10 s below got in because the release woke it.
    monkeypatch.setattr(limiter_module, "MAX_BLOCK", 60.0)
    limiter = limitd.Limiter.concurrent("c", 1, lock_timeout=60, wait_timeout=30)

    async def main() -> bool:
        entered, release = asyncio.Event(), asyncio.Event()

        async def holder() -> None:
            async with limiter.aio.within_limit():
                entered.set()
                await release.wait()

        holding = asyncio.create_task(holder())
        await asyncio.wait_for(entered.wait(), 10)
        waiter = asyncio.create_task(aonce(limiter))
        # Release only once the waiter blocks on the wake list (not at its first try).
        await until(lambda: _at_least_one_blocked(redis))
        release.set()
        got_in = await asyncio.wait_for(waiter, 10)
        await holding
        return got_in

    assert run(main) is True
    [status] = limiters(redis)
    assert (status.immediate, status.waited, status.held) == (1, 1, 0)


async def _at_least_one_blocked(redis: redis_py.Redis) -> bool:
    return await blocked_clients(redis) >= 1


@pytest.mark.parametrize("flavour", ["sync", "async"])
@pytest.mark.parametrize(
    "make",
    [
        lambda: limitd.Limiter.bucket("daily", 1, "day", wait_timeout=0.2),
        lambda: limitd.Limiter.concurrent("daily", 1, lock_timeout=60, wait_timeout=0.2),
    ],
    ids=["sleeping", "blocking on the wake list"],
)
def test_over_limit_after_wait_timeout(redis: redis_py.Redis, make, flavour: str) -> None:
    limiter = make()
    error = over_limit(limiter) if flavour == "sync" else run(lambda: aover_limit(limiter))
    assert type(error) is limitd.OverLimit
    assert (error.name, error.kind) == ("daily", limiter.kind) and 0.1 < error.waited < 5
    [status] = limiters(redis)
    assert (status.calls, status.immediate, status.over_limit) == (2, 1, 1)


def over_limit(limiter: limitd.Limiter) -> limitd.OverLimit:
    """Hold one slot and try a second: the ``OverLimit`` it raises after its wait."""
    # The first block keeps a concurrent slot taken while the second waits.
    with (
        limiter.within_limit(),
        pytest.raises(limitd.OverLimit) as raised,
        limiter.within_limit(),
    ):
        pytest.fail("ran over the limit")
    return raised.value


async def aover_limit(limiter: limitd.Limiter) -> limitd.OverLimit:
    """``over_limit`` through the async form."""
    async with limiter.aio.within_limit():
        with pytest.raises(limitd.OverLimit) as raised:
            async with limiter.aio.within_limit():
                pytest.fail("ran over the limit")
    return raised.value


# The loop runs while a check waits.


@pytest.mark.standalone_only("watches one server's blocked clients")
def test_the_loop_runs_while_a_waiter_blocks_on_the_wake_list(redis: redis_py.Redis) -> None:
    # Were the BLPOP blocking the loop, this coroutine would not run again before the
    # waiter gave up (3 s): it would not see the waiter blocked, and could not release.
    limiter = limitd.Limiter.concurrent("c", 1, lock_timeout=60, wait_timeout=3)

    async def main() -> bool:
        with contextlib.ExitStack() as sync_holder:
            sync_holder.enter_context(limiter.within_limit())
            waiter = asyncio.create_task(aonce(limiter))
            await until(lambda: _at_least_one_blocked(redis))
            for _ in range(20):
                await asyncio.sleep(0)
                assert not waiter.done()
        return await asyncio.wait_for(waiter, 10)  # the sync release woke it

    assert run(main) is True


def test_the_loop_runs_while_a_waiter_sleeps(
    redis: redis_py.Redis, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The waiter sleeps about 1 s for room: were its sleep blocking the loop, this
    # coroutine would only see it refused once it was already done. (The clock moves by
    # the pause alone, so a stall of the machine between the two calls cannot make room.)
    limiter = limitd.Limiter.window("w", 1, 1.0, wait_timeout=5)
    stats = keys.of(redis).limiter("stats", "w")

    async def main() -> bool:
        assert await aonce(limiter)
        waiter = asyncio.create_task(aonce(limiter))

        async def refused_once() -> bool:
            return await loop_twin(redis).hget(stats, "calls") == b"2"

        await until(refused_once)
        for _ in range(20):
            await asyncio.sleep(0)
            assert not waiter.done()
        return await asyncio.wait_for(waiter, 10)

    with pauses_move_the_clock(monkeypatch) as pauses:
        assert run(main) is True
    assert pauses == [1.0]


# Sync and async holders, and the Redis the async form uses.


def test_sync_and_async_holders_share_the_same_slots(redis: redis_py.Redis) -> None:
    limiter = limitd.Limiter.concurrent("shared", 2, wait_timeout=0)
    holders = keys.of(redis).limiter("holders", "shared")

    async def main() -> None:
        with limiter.within_limit():
            async with limiter.aio.within_limit():
                assert redis.zcard(holders) == 2
                assert not once(limiter) and not await aonce(limiter)
            assert redis.zcard(holders) == 1
            assert once(limiter) and await aonce(limiter)
            async with limiter.aio.within_limit():
                assert not once(limiter)
        assert redis.zcard(holders) == 0

    run(main)
    [status] = limiters(redis)
    assert (status.calls, status.immediate, status.over_limit, status.held) == (8, 5, 3, 0)


@pytest.mark.standalone_only("a cluster has only database 0")
def test_the_async_form_uses_the_limiters_own_redis(redis: redis_py.Redis) -> None:
    pool = redis.connection_pool  # the same server, database 1
    other = redis_py.Redis(
        connection_pool=redis_py.ConnectionPool(
            connection_class=pool.connection_class, **{**pool.connection_kwargs, "db": 1}
        )
    )
    try:
        limiter = limitd.Limiter.concurrent("own", 1, wait_timeout=0, redis=other)

        async def main() -> None:
            async with limiter.aio.within_limit():
                assert other.zcard(keys.of(redis).limiter("holders", "own")) == 1
                assert redis.exists(keys.of(redis).limiter("holders", "own")) == 0

        run(main, other)
        assert [status.name for status in limiters(other)] == ["own"] and limiters(redis) == []
    finally:
        other.flushdb()
        other.close()


@pytest.mark.parametrize("flavour", ["sync", "async"])
def test_within_limit_as_a_decorator(redis: redis_py.Redis, flavour: str) -> None:
    limiter = limitd.Limiter.concurrent("deco", 1, wait_timeout=0)
    if flavour == "sync":

        @limiter.within_limit()
        def call(n: int) -> int:
            assert not once(limiter)  # held while the function runs
            return n * 2

        assert [call(1), call(2)] == [2, 4]  # released after each call
        return

    @limiter.aio.within_limit()
    async def acall(n: int) -> int:
        assert not await aonce(limiter)  # held while the function runs
        return n * 2

    async def main() -> list[int]:
        return [await acall(1), await acall(2)]  # released after each call

    assert run(main) == [2, 4]
