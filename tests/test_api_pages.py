"""The sorted sets read a page at a time, as the dashboard does: by offset, by filter
(bounded), and one entry by jid and score; and the "all matching" actions."""

from __future__ import annotations

import pytest
import redis as redis_py

from limitd import keys
from limitd.api import DeadSet, Queue, RetrySet, ScheduledSet
from limitd.api.sorted_sets import SCAN_COUNT, EntryFilter
from limitd.payload import dumps

T0 = 1_780_000_000.0


def member(jid: str, klass: str = "pages.Echo", queue: str = "default", **fields: object) -> str:
    return dumps({"class": klass, "args": [], "jid": jid, "queue": queue, **fields})


def fill(redis: redis_py.Redis, key: str, count: int, **fields: object) -> None:
    """``count`` members, jid ``{i:024x}`` scored ``T0 + i``."""
    redis.zadd(key, {member(f"{i:024x}", **fields): T0 + i for i in range(count)})


def calls(redis: redis_py.Redis, command: str) -> int:
    stats = redis.info("commandstats").get(f"cmdstat_{command}", {})
    return int(stats.get("calls", 0))


@pytest.mark.standalone_only("counts one server's commands")
def test_page_by_offset_newest_or_oldest_first_in_one_call(redis: redis_py.Redis) -> None:
    fill(redis, keys.of(redis).DEAD, 60)
    dead = DeadSet(redis)
    before = calls(redis, "zrevrange")
    page = dead.page(25, 25)
    assert calls(redis, "zrevrange") == before + 1
    assert [entry.score for entry in page] == [T0 + i for i in range(34, 9, -1)]
    assert page[0].jid == f"{34:024x}"
    assert [entry.score for entry in dead.page(50, 25)] == [T0 + i for i in range(9, -1, -1)]
    assert dead.page(60, 25) == []
    assert dead.page(0, 0) == []
    soonest = dead.page(0, 3, ascending=True)
    assert [entry.jid for entry in soonest] == [f"{i:024x}" for i in range(3)]


def test_filtered_page_by_name_and_text_in_the_set_order(redis: redis_py.Redis) -> None:
    redis.zadd(
        keys.of(redis).RETRY,
        {
            member("a" * 24, "app.SendMail", args=["ann@example.com"]): T0 + 1,
            member("b" * 24, "app.SendMail", args=["bob@example.com"]): T0 + 3,
            member("c" * 24, "app.ChargeCard", args=["ann@example.com"]): T0 + 2,
            b"{broken ann@example.com": T0 + 4,
        },
    )
    retries = RetrySet(redis)
    by_name = retries.filtered_page(EntryFilter(name="SendMail"), 0, 25)
    assert [entry.jid for entry in by_name.entries] == ["b" * 24, "a" * 24]
    assert (by_name.matched, by_name.complete) == (2, True)
    by_text = retries.filtered_page(EntryFilter(text="ann@"), 0, 25, ascending=True)
    assert [entry.jid for entry in by_text.entries] == ["a" * 24, "c" * 24, None]
    both = retries.filtered_page(EntryFilter(name="Mail", text="ann@"), 0, 25)
    assert [entry.jid for entry in both.entries] == ["a" * 24]
    second = retries.filtered_page(EntryFilter(text="example.com"), 1, 1)
    assert ([entry.jid for entry in second.entries], second.matched) == (["b" * 24], 4)
    assert retries.filtered_page(EntryFilter(name="Nothing"), 0, 25).matched == 0


def test_filter_text_is_literal_not_a_glob(redis: redis_py.Redis) -> None:
    redis.zadd(
        keys.of(redis).DEAD,
        {member("a" * 24, args=["x*y[1]"]): T0, member("b" * 24, args=["xzy1"]): T0 + 1},
    )
    found = DeadSet(redis).filtered_page(EntryFilter(text="x*y[1]"), 0, 25)
    assert [entry.jid for entry in found.entries] == ["a" * 24]


@pytest.mark.standalone_only("counts one server's commands")
def test_filtered_page_stops_at_its_bound_and_says_so(redis: redis_py.Redis) -> None:
    fill(redis, keys.of(redis).DEAD, 5 * SCAN_COUNT)
    dead = DeadSet(redis)
    before = calls(redis, "zscan")
    bounded = dead.filtered_page(EntryFilter(name="Echo"), 0, 25, scan_limit=SCAN_COUNT)
    assert calls(redis, "zscan") == before + 1
    assert not bounded.complete
    assert 25 <= bounded.matched < 5 * SCAN_COUNT
    scores = [entry.score for entry in bounded.entries]
    assert scores == sorted(scores, reverse=True)
    whole = dead.filtered_page(EntryFilter(name="Echo"), 0, 25)
    assert (whole.matched, whole.complete) == (5 * SCAN_COUNT, True)
    assert whole.entries[0].score == T0 + 5 * SCAN_COUNT - 1


def test_find_job_with_a_score_tells_duplicate_jids_apart(redis: redis_py.Redis) -> None:
    jid = "d" * 24
    redis.zadd(
        keys.of(redis).SCHEDULE,
        {member(jid, args=[1]): T0 + 10, member(jid, args=[2]): T0 + 20, b"{bad": T0 + 10},
    )
    scheduled = ScheduledSet(redis)
    assert "{bad" in [entry.text for entry in scheduled.entries_at(T0 + 10)]
    assert len(scheduled.entries_at(T0 + 10)) == 2
    later = scheduled.find_job(jid, T0 + 20)
    assert later is not None and later.args == [2]
    assert scheduled.find_job(jid, T0 + 15) is None
    assert scheduled.find_job("e" * 24, T0 + 10) is None
    assert later.delete()
    assert scheduled.find_job(jid, T0 + 20) is None
    remaining = scheduled.find_job(jid)
    assert remaining is not None and remaining.args == [1]


def test_retry_and_kill_only_the_matching_entries(redis: redis_py.Redis) -> None:
    fill(redis, keys.of(redis).RETRY, 3, klass="pages.Mail", queue="mail")
    redis.zadd(
        keys.of(redis).RETRY, {member(f"{i:024x}", "pages.Sms"): T0 + i for i in range(10, 12)}
    )
    retries = RetrySet(redis)
    assert retries.retry_all(retries.matching(EntryFilter(name="Mail"))) == 3
    assert (Queue("mail", redis).size(), retries.size()) == (3, 2)
    assert retries.kill_all(retries.matching(EntryFilter(text='"pages.Sms"'))) == 2
    assert (retries.size(), DeadSet(redis).size()) == (0, 2)
