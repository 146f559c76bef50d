"""Limiters in job code (``limitd.Limiter``): each kind's boundary under a frozen clock
and on the real one, waiting that wakes when room appears, ``OverLimit``, statistics,
and the reschedule of a job ``OverLimit`` escapes (batch and unique state kept)."""

from __future__ import annotations

import argparse
import contextlib
import datetime as dt
import json
import threading
from collections.abc import Iterator

import pytest
import redis as redis_py
from freezegun import freeze_time

import limitd
from limitd import keys
from limitd.limiters import limiter as limiter_module
from limitd.limiters import middleware as limiter_middleware
from limitd.limiters.admin import limiter_usage, limiters
from limitd.limiters.commands import add_limiters_command
from limitd.limiters.tries import Pause, Tries
from limitd.payload import Payload
from limitd.supervisor import Capsule, CapsuleConfig
from limitd.unique import middleware as unique
from tests.helpers import wait_for

T0 = "2026-11-23 12:00:30"  # 30 s into a minute
ODD = 'stripe:acct 7 *?[x]{y} "é"\n'


def take(limiter: limitd.Limiter, times: int) -> list[bool]:
    """Enter ``times`` blocks at once (all held until the end): which got in."""
    got = []
    with contextlib.ExitStack() as stack:
        for _ in range(times):
            try:
                stack.enter_context(limiter.within_limit())
                got.append(True)
            except limitd.OverLimit:
                got.append(False)
    return got


def once(limiter: limitd.Limiter) -> bool:
    return take(limiter, 1) == [True]


# The boundaries, under a frozen clock (wait_timeout=0: a frozen clock never reaches a
# deadline).


def test_concurrent_allows_n_holders_and_frees_a_slot_on_exit(redis: redis_py.Redis) -> None:
    limiter = limitd.Limiter.concurrent("c", 3, wait_timeout=0)
    with freeze_time(T0):
        assert take(limiter, 4) == [True, True, True, False]
        assert take(limiter, 3) == [True, True, True]  # all released on exit
        assert redis.zcard(keys.of(redis).limiter("holders", "c")) == 0


def test_a_concurrent_lock_expires_after_lock_timeout(redis: redis_py.Redis) -> None:
    limiter = limitd.Limiter.concurrent("c", 1, lock_timeout=10, wait_timeout=0)
    with freeze_time(T0) as frozen:
        block = limiter.within_limit()
        block.__enter__()  # a holder that never leaves (as if killed)
        assert not once(limiter)
        frozen.tick(9.999)
        assert not once(limiter)
        frozen.tick(0.002)
        assert once(limiter)
        block.__exit__(None, None, None)  # its late release frees nothing it no longer holds
    [status] = limiters(redis)
    assert status.expired == 1


def test_bucket_resets_at_the_calendar_boundary(redis: redis_py.Redis) -> None:
    limiter = limitd.Limiter.bucket("b", 3, "minute", wait_timeout=0)
    with freeze_time(T0) as frozen:
        assert take(limiter, 4) == [True, True, True, False]
        frozen.tick(29.999)  # 12:00:59.999: still the same minute
        assert not once(limiter)
        frozen.tick(0.001)  # 12:01:00: a new minute, a new count
        assert take(limiter, 4) == [True, True, True, False]


def test_a_sub_second_bucket_counts_each_interval_apart(redis: redis_py.Redis) -> None:
    # Four 0.25 s intervals start within 12:00:30: each has its own counter (they once
    # shared the second's, so the bucket stayed full until 12:00:31).
    limiter = limitd.Limiter.bucket("b", 2, 0.25, wait_timeout=0)
    with freeze_time(T0) as frozen:
        for _ in range(4):
            assert take(limiter, 3) == [True, True, False]
            assert limiter_usage(redis, limiters(redis)) == {"b": 2}
            frozen.tick(0.25)
        assert limiter_usage(redis, limiters(redis)) == {"b": 0}  # 12:00:31: a new one


def test_window_slides(redis: redis_py.Redis) -> None:
    limiter = limitd.Limiter.window("w", 3, 60, wait_timeout=0)
    with freeze_time(T0) as frozen:
        for _ in range(3):
            assert once(limiter)
            frozen.tick(10)
        assert not once(limiter)  # t0+30: three calls in the last minute
        frozen.tick(29.999)
        assert not once(limiter)
        frozen.tick(0.001)  # t0+60: the first call leaves the window
        assert once(limiter)
        assert not once(limiter)
        frozen.tick(10)  # t0+70: the second one leaves
        assert once(limiter)


def test_leaky_bucket_allows_a_burst_then_a_steady_rate(redis: redis_py.Redis) -> None:
    limiter = limitd.Limiter.leaky("l", 60, "minute", wait_timeout=0)
    with freeze_time(T0) as frozen:
        assert [once(limiter) for _ in range(61)] == [True] * 60 + [False]
        for _ in range(5):  # then one a second
            frozen.tick(0.5)
            assert not once(limiter)
            frozen.tick(0.5)
            assert once(limiter)
            assert not once(limiter)
        frozen.tick(60)  # drained: a full burst again
        assert [once(limiter) for _ in range(61)] == [True] * 60 + [False]


# Waiting wakes when room appears. The clock is frozen and moves on by each pause the
# limiter decides on, as if the pause had taken exactly that long: on a real clock a
# busy machine that stalls between two calls lets room appear before the third (a CI
# run saw it), and the third call never waits at all.

# (a full limiter, how long room takes to appear in it): T0 starts one of the bucket's
# 0.3 s calendar intervals (it is a whole multiple of 0.3 s after the epoch), so the next
# starts 0.3 s later; the oldest of the window's two entries leaves after 0.3 s; the
# leaky bucket drips one every 0.15 s.
WAITERS = [
    pytest.param(lambda: limitd.Limiter.window("w", 2, 0.3, wait_timeout=5), 0.3, id="window"),
    pytest.param(lambda: limitd.Limiter.bucket("b", 2, 0.3, wait_timeout=5), 0.3, id="bucket"),
    pytest.param(lambda: limitd.Limiter.leaky("l", 2, 0.3, wait_timeout=5), 0.15, id="leaky"),
]


@contextlib.contextmanager
def pauses_move_the_clock(monkeypatch: pytest.MonkeyPatch) -> Iterator[list[float]]:
    """Freeze limitd's clock (the event loop keeps the real one) and tick it by every
    pause a ``within_limit`` decides on: the pauses, in order."""
    pauses: list[float] = []
    decide = Tries.after

    def after(self: Tries, reply: object) -> Pause | limitd.OverLimit | None:
        outcome = decide(self, reply)
        if isinstance(outcome, Pause):
            pauses.append(outcome.seconds)
            frozen.tick(outcome.seconds)
        return outcome

    with freeze_time(T0, real_asyncio=True) as frozen:
        monkeypatch.setattr(Tries, "after", after)
        yield pauses


def assert_waited_once_for_room(redis: redis_py.Redis, pauses: list[float], pause: float) -> None:
    """The third call paused once, exactly as long as room took to appear, and got in."""
    assert pauses == [pytest.approx(pause)]
    [status] = limiters(redis)
    assert (status.calls, status.immediate, status.waited, status.over_limit) == (3, 2, 1, 0)
    assert status.average_wait == pytest.approx(pause, abs=0.001)


@pytest.mark.parametrize(("make", "pause"), WAITERS)
def test_a_full_limiter_waits_until_room_appears(
    redis: redis_py.Redis, monkeypatch: pytest.MonkeyPatch, make, pause: float
) -> None:
    limiter = make()
    with pauses_move_the_clock(monkeypatch) as pauses:
        assert take(limiter, 2) == [True, True]
        assert once(limiter)  # waited (well under the 5 s deadline) instead of failing
    assert_waited_once_for_room(redis, pauses, pause)


@pytest.mark.standalone_only("watches one server's blocked clients")
def test_a_concurrent_waiter_wakes_when_a_slot_is_released(
    redis: redis_py.Redis, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The lock would only expire after 60 s and one BLPOP may block as long: a waiter
    # done within the join's deadline got in because the release woke it.
    monkeypatch.setattr(limiter_module, "MAX_BLOCK", 60.0)
    limiter = limitd.Limiter.concurrent("c", 1, lock_timeout=60, wait_timeout=30)
    entered, release = threading.Event(), threading.Event()

    def holder() -> None:
        with limiter.within_limit():
            entered.set()
            release.wait(10)

    thread = threading.Thread(target=holder)
    thread.start()
    assert entered.wait(10)
    waiter_result: list[bool] = []
    waiter = threading.Thread(target=lambda: waiter_result.append(once(limiter)))
    waiter.start()
    # Release only once the waiter is blocked waiting for a wake-up: otherwise it could
    # find the slot free at its first try and never wait.
    wait_for(
        lambda: int(redis.info("clients")["blocked_clients"]) >= 1,
        message="the waiter to block on the wake list",
    )
    release.set()
    waiter.join(10)
    thread.join(10)
    assert not waiter.is_alive() and waiter_result == [True]
    [status] = limiters(redis)
    assert (status.immediate, status.waited, status.held) == (1, 1, 0)


def test_names_with_odd_characters_are_their_own_limiters(redis: redis_py.Redis) -> None:
    odd = limitd.Limiter.concurrent(ODD, 1, wait_timeout=0)
    plain = limitd.Limiter.concurrent("stripe", 1, wait_timeout=0)
    prefix = limitd.Limiter.concurrent("stripe:acct", 1, wait_timeout=0)
    with odd.within_limit():
        assert not once(odd)
        assert once(plain) and once(prefix)
    assert {status.name for status in limiters(redis)} == {ODD, "stripe", "stripe:acct"}


@pytest.mark.parametrize(
    ("build", "message"),
    [
        (lambda: limitd.Limiter.window("w1", 5, "fortnight"), "limiter 'w1': interval 'fortnight'"),
        (lambda: limitd.Limiter.bucket("b1", 5, 0), "limiter 'b1': interval 0"),
        (lambda: limitd.Limiter.bucket("b2", 5, 0.0005), "interval 0.0005 is not a number"),
        (lambda: limitd.Limiter.leaky("l1", 0, "minute"), "limiter 'l1': count must be"),
        (lambda: limitd.Limiter.window("w2", -3, "minute"), "limiter 'w2': count must be"),
        (lambda: limitd.Limiter.concurrent("c1", 5, lock_timeout=0), "lock_timeout 0"),
        (lambda: limitd.Limiter.concurrent("c2", 5, lock_timeout="x"), "lock_timeout 'x'"),
        (lambda: limitd.Limiter.concurrent("c3", 5, wait_timeout=-1), "wait_timeout -1"),
        (lambda: limitd.Limiter.concurrent("", 5), "non-empty string"),
    ],
)
def test_bad_definitions_are_clear_value_errors(build, message: str) -> None:
    with pytest.raises(ValueError, match=message.replace("[", r"\[")):
        build()


def test_stats_expire_with_ttl_and_are_listed_by_the_command(
    redis: redis_py.Redis, capsys: pytest.CaptureFixture[str]
) -> None:
    limiter = limitd.Limiter.concurrent("listed", 2, wait_timeout=0, ttl=3600)
    with limiter.within_limit():
        assert 3590 < redis.ttl(keys.of(redis).limiter("stats", "listed")) <= 3600
        assert 3590 < redis.ttl(keys.of(redis).LIMITERS) <= 3600
        parser = argparse.ArgumentParser(prog="limitd")
        add_limiters_command(parser.add_subparsers(), lambda args: redis)
        args = parser.parse_args(["limiters", "--json"])
        assert args.command(args) == 0
        [shown] = json.loads(capsys.readouterr().out)
        assert (shown["name"], shown["kind"], shown["held"], shown["calls"]) == (
            "listed",
            "concurrent",
            1,
            1,
        )
        args = parser.parse_args(["limiters"])
        assert args.command(args) == 0
        table = capsys.readouterr().out.splitlines()
        assert table[0].split()[:2] == ["NAME", "KIND"] and table[1].split()[:3] == [
            "listed",
            "concurrent",
            "2",
        ]
    redis.delete(keys.of(redis).limiter("stats", "listed"))  # as when its ttl ran out
    assert limiters(redis) == [] and redis.zcard(keys.of(redis).LIMITERS) == 0
    assert limitd.api.limiters is limiters


# OverLimit out of a job: rescheduled, not failed.

FULL = limitd.Limiter.concurrent("full", 1, wait_timeout=0)


@limitd.job(name="limiters_test.Limited", retry=3, max_overlimit=2)
def limited(n: int) -> None:
    with FULL.within_limit():
        pass


@limitd.job(name="limiters_test.LimitedUnique", unique_for=600)
def limited_unique(n: int) -> None:
    with FULL.within_limit():
        pass


@pytest.fixture
def capsule(redis: redis_py.Redis) -> Iterator[Capsule]:
    limiter_middleware.set_limiter_backoff(None)
    yield Capsule(CapsuleConfig(queues=["default"]), redis=redis)
    limiter_middleware.set_limiter_backoff(None)


@pytest.fixture
def full(redis: redis_py.Redis) -> Iterator[None]:
    with FULL.within_limit():
        yield


def scheduled(redis: redis_py.Redis) -> list[tuple[Payload, float]]:
    return [
        (json.loads(raw), at)
        for raw, at in redis.zrange(keys.of(redis).SCHEDULE, 0, -1, withscores=True)
    ]


def test_over_limit_reschedules_with_a_growing_backoff_then_retries(
    redis: redis_py.Redis, capsule: Capsule, full: None
) -> None:
    with freeze_time(T0) as frozen:
        jid = limited.perform_async(1)
        assert capsule.drain() == {"rescheduled": 1}
        for count in (1, 2):
            now = frozen().timestamp()
            [(payload, at)] = scheduled(redis)
            assert (payload["jid"], payload["overlimit_count"]) == (jid, count)
            assert "retry_count" not in payload and redis.zcard(keys.of(redis).RETRY) == 0
            assert 5 * count - 0.01 <= at - now <= 5 * count + 5
            # (a datetime holds microseconds: a little past `at`, never just before it)
            frozen.move_to(dt.datetime.fromtimestamp(at + 0.001, dt.timezone.utc))
            expected = "rescheduled" if count == 1 else "retry"
            assert capsule.drain(scheduled=True) == {expected: 1}
        # max_overlimit=2 reached: the third OverLimit took the retry path.
        assert redis.zcard(keys.of(redis).SCHEDULE) == 0
        [raw] = redis.zrange(keys.of(redis).RETRY, 0, -1)
        retried = json.loads(raw)
        assert (retried["retry_count"], retried["error_class"]) == (0, "limitd.OverLimit")
        assert retried["overlimit_count"] == 2


def test_the_backoff_hook_chooses_the_delay(
    redis: redis_py.Redis, capsule: Capsule, full: None
) -> None:
    limiter_middleware.set_limiter_backoff(lambda count, exc, payload: 42 * count)
    with freeze_time(T0) as frozen:
        limited.perform_async(1)
        assert capsule.drain() == {"rescheduled": 1}
        [(_, at)] = scheduled(redis)
        assert at == frozen().timestamp() + 42


@limitd.job(name="limiters_test.OwnBackoff", limiter_backoff=lambda count, exc, payload: 7)
def own_backoff() -> None: ...


class ClassBackoff(limitd.Job, name="limiters_test.ClassBackoff"):
    def perform(self) -> None: ...

    def limiter_backoff(self, count: int, exc: BaseException, payload: Payload) -> float:
        return 9 * count


def test_a_jobs_own_backoff_hook_wins_over_the_global_one() -> None:
    # The hook as a ``@limitd.job`` keyword and as a ``limitd.Job`` method.
    exc = limitd.OverLimit("x", "concurrent", 0.0)
    limiter_middleware.set_limiter_backoff(lambda count, exc, payload: 42)
    try:
        assert limiter_middleware.backoff_seconds(own_backoff.spec, 2, exc, {}) == 7
        assert limiter_middleware.backoff_seconds(ClassBackoff.spec, 2, exc, {}) == 18
        assert limiter_middleware.backoff_seconds(limited.spec, 2, exc, {}) == 42
    finally:
        limiter_middleware.set_limiter_backoff(None)


def test_a_rescheduled_job_keeps_its_unique_lock_and_its_batch(
    redis: redis_py.Redis, capsule: Capsule, full: None
) -> None:
    batch = limitd.Batch("limited")
    with batch.jobs():
        jid = limited_unique.perform_async(7)
    assert capsule.drain() == {"rescheduled": 1}
    lock = keys.of(redis).unique_lock(
        "limiters_test.LimitedUnique", "default", unique.args_digest([7])
    )
    assert redis.get(lock) == jid.encode()  # type: ignore[union-attr]
    status = limitd.Batch.status(batch.bid)
    assert (status.pending, status.failures, status.complete) == (1, {}, False)
    assert redis.get(keys.of(redis).STAT_FAILED) in (None, b"0")


def test_usage_says_how_full_each_kind_is_now(redis: redis_py.Redis) -> None:
    window = limitd.Limiter.window("usage-window", 3, "minute", wait_timeout=0)
    bucket = limitd.Limiter.bucket("usage-bucket", 100, "day", wait_timeout=0)
    leaky = limitd.Limiter.leaky("usage-leaky", 10, "day", wait_timeout=0)
    concurrent = limitd.Limiter.concurrent("usage-concurrent", 5)
    with freeze_time(T0) as frozen:
        for limiter, calls in ((window, 5), (bucket, 7), (leaky, 4), (concurrent, 2)):
            for _ in range(calls):
                with contextlib.suppress(limitd.OverLimit), limiter.within_limit():
                    pass
        with concurrent.within_limit():
            statuses = limiters(redis)
            used = limiter_usage(redis, statuses)
        assert used == {
            "usage-window": 3,  # 5 calls, 2 over the limit
            "usage-bucket": 7,
            "usage-leaky": 4,
            "usage-concurrent": 1,  # held while it was read
        }
        frozen.tick(60)
        later = limiter_usage(redis, limiters(redis))
    assert later["usage-window"] == 0  # a rolling minute later
    assert later["usage-bucket"] == 7  # the same UTC day
    assert later["usage-leaky"] == pytest.approx(4 - 10 / 1440)
    assert later["usage-concurrent"] == 0
