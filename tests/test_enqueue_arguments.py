"""Keyword arguments at enqueue: the type checkers accept them (the enqueue methods take
the job's parameters), so at run time each is placed at its parameter's position in the
payload's ``args`` list, and one that has no position is refused before anything is
written. Checked in Redis for every enqueue form, sync and async, both job styles."""

from __future__ import annotations

import asyncio
import json
import time
from typing import Any

import pytest
import redis as redis_py

import limitd
from limitd.spec import JobSpec


@limitd.job(name="arguments_test.Send", queue="args")
def send(tenant: int, url: str, timeout: float = 5.0, retries: int = 3) -> None: ...


@limitd.job(name="arguments_test.Spread", queue="args")
def spread(first: int, *rest: int) -> None: ...


@limitd.job(name="arguments_test.Flagged", queue="args")
def flagged(n: int, *, loud: bool = False) -> None: ...


class Hard(limitd.Job, name="arguments_test.Hard", queue="args"):
    def perform(self, name: str, count: int = 1, note: str = "") -> None: ...


def queued_args(redis: redis_py.Redis) -> list[list[Any]]:
    """The ``args`` of every job queued or scheduled, oldest first."""
    queued = [json.loads(raw) for raw in reversed(redis.lrange("queue:args", 0, -1))]
    scheduled = [json.loads(raw) for raw in redis.zrange("schedule", 0, -1)]
    return [job["args"] for job in queued + scheduled]


def test_keywords_take_their_parameters_positions(redis: redis_py.Redis) -> None:
    send.perform_async(1, url="https://a")
    send.perform_async(url="https://b", tenant=2)
    send.perform_async(3, "https://c", retries=9)  # timeout skipped: its default is sent
    send.perform_async(4, "https://d", 1.5)  # positional only: unchanged
    assert queued_args(redis) == [
        [1, "https://a"],
        [2, "https://b"],
        [3, "https://c", 5.0, 9],
        [4, "https://d", 1.5],
    ]


def test_every_enqueue_form_places_keywords(redis: redis_py.Redis) -> None:
    send.perform_in(60, 1, url="u1")
    send.perform_at(time.time() + 60, 2, url="u2")
    send.set(queue="args").perform_async(3, url="u3", timeout=1.0)
    Hard.perform_async("a", note="n")
    Hard.set(queue="args").perform_in(60, name="b")
    Hard.perform_at(time.time() + 120, "c", count=2)

    async def enqueue_async() -> None:
        await send.aio.perform_async(4, url="u4")
        await send.aio.set(queue="args").perform_in(180, 5, url="u5")
        await Hard.aio.perform_at(time.time() + 240, name="d", count=3)

    asyncio.run(enqueue_async())
    assert sorted(queued_args(redis), key=str) == sorted(
        [
            [1, "u1"],
            [2, "u2"],
            [3, "u3", 1.0],
            ["a", 1, "n"],
            ["b"],
            ["c", 2],
            [4, "u4"],
            [5, "u5"],
            ["d", 3],
        ],
        key=str,
    )


def test_a_parameter_named_like_the_delay_is_the_jobs(redis: redis_py.Redis) -> None:
    """``interval`` and ``when`` are positional-only, so a job's own parameter of that
    name goes to the job, not to the schedule."""

    @limitd.job(name="arguments_test.Poll", queue="args")
    def poll(interval: int, when: str) -> None: ...

    poll.perform_in(60, interval=5, when="now")
    poll.perform_at(time.time() + 60, 6, when="later")
    assert queued_args(redis) == [[5, "now"], [6, "later"]]


def test_varargs_pass_through_and_keyword_only_is_refused(redis: redis_py.Redis) -> None:
    spread.perform_async(1, 2, 3)
    spread.perform_async(first=4)
    flagged.perform_async(5)
    with pytest.raises(TypeError, match=r"arguments_test\.Flagged: 'loud' has no position"):
        flagged.perform_async(6, loud=True)
    assert queued_args(redis) == [[1, 2, 3], [4], [5]]


def test_a_bad_keyword_is_refused_before_anything_is_written(redis: redis_py.Redis) -> None:
    with pytest.raises(TypeError, match=r"arguments_test\.Send: .*unexpected keyword.*'urll'"):
        send.perform_async(1, "u", urll="https://typo")
    with pytest.raises(TypeError, match=r"arguments_test\.Send: .*multiple values.*'tenant'"):
        send.perform_async(1, tenant=2, url="u")
    with pytest.raises(TypeError, match=r"arguments_test\.Hard: .*'name'"):
        asyncio.run(Hard.aio.perform_async(count=2))
    assert queued_args(redis) == []


def test_an_enqueuer_from_a_bare_spec_takes_positions_only(redis: redis_py.Redis) -> None:
    spec: JobSpec = send.spec
    enqueuer = limitd.Enqueuer(spec)
    enqueuer.perform_async(1, "u")
    with pytest.raises(TypeError, match=r"keyword arguments \['url'\] need the job's function"):
        enqueuer.perform_async(2, url="u")
    with pytest.raises(TypeError, match="need the job's function"):
        asyncio.run(enqueuer.aio.perform_async(2, url="u"))
    assert queued_args(redis) == [[1, "u"]]
