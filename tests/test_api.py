"""The admin API against a real Redis: queues, the three sorted sets, and Stats."""

from __future__ import annotations

import datetime as dt
import json
import random
from collections.abc import Iterable

import pytest
import redis as redis_py
from freezegun import freeze_time

import limitd
from limitd import keys
from limitd.api import (
    DeadSet,
    JobRecord,
    Queue,
    RetrySet,
    ScheduledSet,
    SortedEntry,
    Stats,
)
from limitd.api.stats import redis_info
from limitd.api.work import running_jobs
from limitd.job import JobFunction
from limitd.payload import MalformedPayload, dumps
from limitd.retry import DeadSetPolicy, RetryHandler
from limitd.supervisor.heartbeat import ProcessRecord, WorkItem

START = dt.datetime(2026, 3, 1, 12, 0, 0, tzinfo=dt.timezone.utc)
T0 = START.timestamp()


@limitd.job(name="api_test.Echo")
def echo(*args: object) -> None:
    pass


@limitd.job(name="api_test.Mail", queue="mail")
def mail(*args: object) -> None:
    pass


def raw_payload(jid: str, **fields: object) -> str:
    return dumps({"class": "api_test.Echo", "args": [], "jid": jid, "queue": "default", **fields})


def args_of(entries: Iterable[JobRecord]) -> list[object]:
    return [entry.args[0] for entry in entries]


def fail(redis: redis_py.Redis, job: JobFunction, *args: object) -> str:
    """Run the real retry handler on a job that raised, as a processor would."""
    jid = job.perform_async(*args)
    payload = json.loads(redis.rpop(keys.of(redis).queue(job.spec.queue)))  # type: ignore[arg-type]
    RetryHandler(redis).job_failed(job.spec, payload, job.spec.queue, ValueError("boom"))
    return str(jid)


# Queues


def test_queue_sizes_and_list_of_queues(redis: redis_py.Redis) -> None:
    for i in range(3):
        echo.perform_async(i)
    mail.perform_async("x")
    assert Queue("default").size() == 3
    assert Queue("mail").size() == 1
    assert Queue("nothing").size() == 0
    assert [q.name for q in Queue.all()] == ["default", "mail"]


def test_queue_latency_is_the_age_of_the_oldest_job(redis: redis_py.Redis) -> None:
    assert Queue("default").latency() == 0.0
    with freeze_time(START) as frozen:
        echo.perform_async("old")
        frozen.tick(5)
        echo.perform_async("new")
        frozen.tick(10)
        assert Queue("default").latency() == pytest.approx(15.0)
        assert [e.latency() for e in Queue("default")] == pytest.approx([15.0, 10.0])


def test_queue_reads_millisecond_timestamps(redis: redis_py.Redis) -> None:
    enqueued_ms = int((T0 - 30) * 1000)
    redis.lpush(keys.of(redis).queue("default"), raw_payload("a" * 24, enqueued_at=enqueued_ms))
    with freeze_time(START):
        assert Queue("default").latency() == pytest.approx(30.0)
        (entry,) = Queue("default")
    assert entry.enqueued_at == pytest.approx(T0 - 30)


def test_queue_iterates_oldest_first_across_pages(redis: redis_py.Redis) -> None:
    for i in range(7):
        echo.perform_async(i)
    queue = Queue("default")
    queue.page_size = 3
    assert args_of(queue) == list(range(7))


def test_deleting_while_iterating_skips_nothing(redis: redis_py.Redis) -> None:
    for i in range(10):
        echo.perform_async(i)
    queue = Queue("default")
    queue.page_size = 3
    seen = []
    for entry in queue:
        seen.append(entry.args[0])
        if entry.args[0] % 2 == 0 or entry.args[0] > 5:
            assert entry.delete()
    assert seen == list(range(10))
    assert args_of(queue) == [1, 3, 5]


def test_deleting_every_job_while_iterating(redis: redis_py.Redis) -> None:
    for i in range(8):
        echo.perform_async(i)
    queue = Queue("default")
    queue.page_size = 3
    seen = []
    for entry in queue:
        seen.append(entry.args[0])
        entry.delete()
    assert seen == list(range(8))
    assert queue.size() == 0


def test_iteration_resumes_after_jobs_are_fetched(redis: redis_py.Redis) -> None:
    for i in range(10):
        echo.perform_async(i)
    queue = Queue("default")
    queue.page_size = 3
    seen = []
    for entry in queue:
        seen.append(entry.args[0])
        if entry.args[0] == 2:
            for _ in range(5):  # a fetcher takes 0..4, two of which were not yet seen
                redis.rpop(queue.key)
            echo.perform_async(10)  # a producer pushes a newer job
    assert seen == [0, 1, 2, 5, 6, 7, 8, 9, 10]


@pytest.mark.parametrize("seed", range(10))
def test_iteration_under_random_deletes_fetches_and_pushes(
    redis: redis_py.Redis, seed: int
) -> None:
    """Every job queued from start to end is yielded once, in order, whatever the
    caller deletes and the fetchers take meanwhile."""
    rng = random.Random(seed)
    for i in range(40):
        echo.perform_async(i)
    queue = Queue("default")
    queue.page_size = rng.randrange(1, 6)
    fetched: set[int] = set()
    seen, pushed = [], 40
    for entry in queue:
        seen.append(entry.args[0])
        if rng.random() < 0.5:
            entry.delete()
        if rng.random() < 0.2:
            taken: list[bytes] = redis.rpop(queue.key, 2) or []  # type: ignore[assignment]
            fetched.update(json.loads(raw)["args"][0] for raw in taken)
        if rng.random() < 0.1:
            echo.perform_async(pushed)
            pushed += 1
    assert seen == sorted(set(seen))
    assert set(range(pushed)) - fetched <= set(seen)


def test_queue_find_and_delete(redis: redis_py.Redis) -> None:
    jids = [echo.perform_async(i) for i in range(4)]
    queue = Queue("default")
    queue.page_size = 2
    entry = queue.find_job(str(jids[2]))
    assert entry is not None
    assert (entry.jid, entry.klass, entry.args, entry.queue) == (
        jids[2],
        "api_test.Echo",
        [2],
        "default",
    )
    assert entry.delete() is True
    assert entry.delete() is False
    assert queue.find_job(str(jids[2])) is None
    assert queue.find_job("*") is None
    assert args_of(queue) == [0, 1, 3]


def test_queue_clear_removes_the_list_and_its_name(redis: redis_py.Redis) -> None:
    for i in range(3):
        echo.perform_async(i)
    mail.perform_async(1)
    assert Queue("default").clear() == 3
    assert Queue("default").size() == 0
    assert [q.name for q in Queue.all()] == ["mail"]


def test_malformed_queue_entry_is_listed_and_deletable(redis: redis_py.Redis) -> None:
    jid = echo.perform_async(1)
    redis.lpush(keys.of(redis).queue("default"), b"not json \xff")
    entries = list(Queue("default"))
    assert [e.jid for e in entries] == [jid, None]
    bad = entries[1]
    assert bad.payload is None
    assert bad.parse_error is not None
    assert bad.text == "not json \\xff"
    assert (bad.klass, bad.queue, bad.args, bad.latency()) == (None, None, [], 0.0)
    assert bad.delete() is True
    assert Queue("default").size() == 1


# Sorted sets


def test_scheduled_set_iterates_newest_first_and_finds_by_jid(redis: redis_py.Redis) -> None:
    with freeze_time(START):
        jids = {delay: echo.perform_in(delay, delay) for delay in (10, 30, 20)}
    scheduled = ScheduledSet()
    assert scheduled.size() == 3
    assert args_of(scheduled) == [30, 20, 10]
    entry = scheduled.find_job(str(jids[20]))
    assert entry is not None
    assert entry.score == T0 + 20
    assert entry.at == START + dt.timedelta(seconds=20)
    assert scheduled.find_job("f" * 24) is None


def test_equal_scores_page_without_skips_even_while_deleting(redis: redis_py.Redis) -> None:
    with freeze_time(START):
        for i in range(7):
            echo.perform_at(T0 + 60, i)
        echo.perform_at(T0 + 90, "later")
        echo.perform_at(T0 + 30, "sooner")
    scheduled = ScheduledSet()
    scheduled.page_size = 2
    listed = args_of(scheduled)
    assert listed[0] == "later"
    assert listed[-1] == "sooner"
    assert sorted(map(str, listed[1:-1])) == [str(i) for i in range(7)]
    seen = []
    for entry in scheduled:
        seen.append(entry.args[0])
        assert entry.delete()
    assert seen == listed
    assert scheduled.size() == 0


@pytest.mark.parametrize("seed", range(5))
def test_set_iteration_under_random_actions(redis: redis_py.Redis, seed: int) -> None:
    rng = random.Random(seed)
    members = {raw_payload(f"{i:024x}", args=[i]): T0 + rng.randrange(4) for i in range(30)}
    redis.zadd(keys.of(redis).RETRY, members)
    retries = RetrySet()
    retries.page_size = rng.randrange(1, 5)
    expected = args_of(retries)
    seen, actions = [], []
    for entry in retries:
        seen.append(entry.args[0])
        actions.append(rng.choice(["keep", "delete", "retry", "kill"]))
        if actions[-1] != "keep":
            assert getattr(entry, actions[-1])()
    assert seen == expected
    sizes = (retries.size(), Queue("default").size(), DeadSet().size())
    assert sizes == (actions.count("keep"), actions.count("retry"), actions.count("kill"))


def test_retry_now_moves_a_scheduled_job_to_its_queue(redis: redis_py.Redis) -> None:
    with freeze_time(START) as frozen:
        jid = mail.perform_in(3600, "hello")
        frozen.tick(7)
        entry = ScheduledSet().find_job(str(jid))
        assert entry is not None
        assert entry.retry() is True
        assert entry.retry() is False
    assert ScheduledSet().size() == 0
    assert Queue("mail").size() == 1
    (queued,) = Queue("mail")
    assert (queued.jid, queued.args, queued.enqueued_at) == (jid, ["hello"], T0 + 7)
    assert "mail" in [q.name for q in Queue.all()]


def test_retry_set_entry_shows_the_error_and_retries_once(redis: redis_py.Redis) -> None:
    with freeze_time(START):
        jid = fail(redis, echo, 1)
    retries = RetrySet()
    (entry,) = retries
    assert (entry.jid, entry.error_class, entry.error_message) == (jid, "ValueError", "boom")
    assert (entry.retry_count, entry.failed_at) == (0, T0)
    other = RetrySet(redis).find_job(jid)  # a second operator holding the same entry
    assert other is not None
    assert entry.retry() is True
    assert other.retry() is False
    assert Queue("default").size() == 1
    (queued,) = Queue("default")
    assert queued.retry_count == 0
    assert retries.size() == 0


def test_kill_moves_to_the_dead_set(redis: redis_py.Redis) -> None:
    with freeze_time(START):
        jid = fail(redis, echo, 1)
    entry = RetrySet().find_job(jid)
    assert entry is not None
    with freeze_time(START + dt.timedelta(seconds=100)):
        assert entry.kill() is True
    assert entry.kill() is False
    assert RetrySet().size() == 0
    (dead,) = DeadSet()
    assert (dead.jid, dead.score, dead.error_class) == (jid, T0 + 100, "ValueError")
    assert dead.raw == entry.raw
    assert not hasattr(dead, "kill")


def test_kill_trims_the_dead_set(redis: redis_py.Redis) -> None:
    redis.zadd(keys.of(redis).DEAD, {raw_payload(f"{i:024x}"): T0 - 100 + i for i in range(3)})
    with freeze_time(START):
        jid = echo.perform_in(60, 1)
        scheduled = ScheduledSet(dead_policy=DeadSetPolicy(max_jobs=2))
        entry = scheduled.find_job(str(jid))
        assert entry is not None
        assert entry.kill()
    assert [e.jid for e in DeadSet()] == [jid, f"{2:024x}"]


def test_dead_entries_can_be_retried_into_their_queue(redis: redis_py.Redis) -> None:
    redis.zadd(keys.of(redis).DEAD, {raw_payload("d" * 24, queue="mail", retry_count=25): T0})
    (entry,) = DeadSet()
    assert isinstance(entry, SortedEntry)
    assert entry.retry() is True
    assert DeadSet().size() == 0
    (queued,) = Queue("mail")
    assert (queued.jid, queued.retry_count) == ("d" * 24, 25)


def test_delete_and_clear_sorted_sets(redis: redis_py.Redis) -> None:
    with freeze_time(START):
        jids = [echo.perform_in(10 + i, i) for i in range(3)]
    scheduled = ScheduledSet()
    entry = scheduled.find_job(str(jids[1]))
    assert entry is not None
    assert entry.delete() is True
    assert entry.delete() is False
    assert args_of(scheduled) == [2, 0]
    assert scheduled.clear() == 2
    assert scheduled.size() == 0
    assert DeadSet().clear() == 0


def test_malformed_member_does_not_break_a_set(redis: redis_py.Redis) -> None:
    redis.zadd(keys.of(redis).RETRY, {b"{broken": T0 + 5, raw_payload("b" * 24).encode(): T0})
    retries = RetrySet()
    bad, good = list(retries)
    assert (bad.payload, bad.jid, bad.text, good.jid) == (None, None, "{broken", "b" * 24)
    assert retries.find_job("b" * 24) is not None
    with pytest.raises(MalformedPayload, match="not valid JSON"):
        bad.retry()
    assert retries.retry_all() == 1
    assert retries.size() == 1
    assert bad.delete() is True
    assert retries.size() == 0


def test_killing_a_malformed_member_keeps_its_text(redis: redis_py.Redis) -> None:
    redis.zadd(keys.of(redis).SCHEDULE, {b"[1, 2]": T0})
    (bad,) = ScheduledSet()
    with freeze_time(START):
        assert bad.kill() is True
    (dead,) = DeadSet()
    assert (dead.klass, dead.get("raw"), dead.score) == ("limitd.MalformedPayload", "[1, 2]", T0)
    assert "JSON list" in str(dead.error_message)


def test_retry_all_and_kill_all(redis: redis_py.Redis) -> None:
    with freeze_time(START):
        for i in range(5):
            echo.perform_in(10 + i, i)
        mail.perform_in(10, "m")
        scheduled = ScheduledSet()
        scheduled.page_size = 2
        assert scheduled.retry_all() == 6
        assert (Queue("default").size(), Queue("mail").size(), scheduled.size()) == (5, 1, 0)
        for i in range(3):
            echo.perform_in(10 + i, i)
        assert scheduled.kill_all() == 3
    assert (scheduled.size(), DeadSet().size()) == (0, 3)


def test_sorted_entries_read_millisecond_timestamps(redis: redis_py.Redis) -> None:
    ms = int(T0 * 1000)
    redis.zadd(
        keys.of(redis).RETRY, {raw_payload("c" * 24, created_at=ms, failed_at=ms + 1500): T0}
    )
    (entry,) = RetrySet()
    assert (entry.created_at, entry.failed_at) == (T0, T0 + 1.5)


# Stats


def test_stats_snapshot(redis: redis_py.Redis) -> None:
    redis.set(keys.of(redis).STAT_PROCESSED, 12)
    redis.set(keys.of(redis).STAT_FAILED, 3)
    redis.sadd(keys.of(redis).PROCESSES, "host:1", "host:2")
    for i in range(3):
        echo.perform_async(i)
    mail.perform_async(1)
    echo.perform_in(60, 1)
    redis.zadd(keys.of(redis).RETRY, {raw_payload("1" * 24): T0})
    redis.zadd(keys.of(redis).DEAD, {raw_payload("2" * 24): T0, raw_payload("3" * 24): T0})
    stats = Stats()
    assert (stats.processed, stats.failed, stats.processes_size) == (12, 3, 2)
    assert stats.queues == {"default": 3, "mail": 1}
    assert stats.enqueued == 4
    assert (stats.scheduled_size, stats.retry_size, stats.dead_size) == (1, 1, 2)
    Queue("default").clear()
    stats.refresh()
    assert (stats.enqueued, stats.queues) == (1, {"mail": 1})


def test_empty_stats(redis: redis_py.Redis) -> None:
    stats = Stats(redis)
    assert (stats.processed, stats.failed, stats.enqueued, stats.queues) == (0, 0, 0, {})


def test_record_of_raw_bytes() -> None:
    record = JobRecord(raw_payload("e" * 24, retry_count="x").encode())
    assert (record.jid, record.retry_count, record.get("missing", 7)) == ("e" * 24, None, 7)
    assert repr(record) == f"<JobRecord jid={'e' * 24} class=api_test.Echo>"


def test_redis_info_reads_version_memory_and_clients(redis: redis_py.Redis) -> None:
    info = redis_info(redis)
    assert info.version == redis.info("server")["redis_version"]
    assert info.used_memory_human and info.used_memory_human[-1] in "BKMG"
    assert info.connected_clients is not None and info.connected_clients >= 1
    assert set(info.as_dict()) == {
        "version",
        "used_memory_human",
        "connected_clients",
        "uptime_seconds",
    }


# Running jobs (the process records' work hashes)


@pytest.mark.standalone_only("process identities without the cluster tag")
def test_running_jobs_of_live_processes_longest_running_first(redis: redis_py.Redis) -> None:
    first = raw_payload("a" * 24, args=["<b>x</b>"], queue="mail").encode()
    second = raw_payload("b" * 24, args=[2]).encode()
    records = {
        "host:1:aa": [WorkItem("11", "mail", first, T0 + 5)],
        "host:2:bb": [WorkItem("21", "default", second, T0), WorkItem("22", "x", b"{no", T0 + 9)],
    }
    for identity, work in records.items():
        ProcessRecord(identity, {"hostname": "host"}, lambda work=work: work).write(redis)
    jobs = running_jobs(list(records), redis)
    assert [(j.identity, j.thread, j.queue, j.run_at) for j in jobs] == [
        ("host:2:bb", "21", "default", T0),
        ("host:1:aa", "11", "mail", T0 + 5),
        ("host:2:bb", "22", "x", T0 + 9),
    ]
    assert (jobs[0].jid, jobs[0].klass, jobs[0].args) == ("b" * 24, "api_test.Echo", [2])
    assert jobs[1].as_dict()["args"] == ["<b>x</b>"]
    assert jobs[2].job.payload is None and jobs[2].klass is None  # listed, not fatal
    assert running_jobs([], redis) == []
    assert running_jobs(["host:gone:cc"], redis) == []
