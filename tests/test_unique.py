"""Unique jobs through real Redis: each release policy, the lock's lifetime under
freezegun, compare-and-delete after expiry, bulk, and concurrent enqueues."""

from __future__ import annotations

import datetime as dt
import json
import logging
import threading
from collections.abc import Iterator

import pytest
import redis as redis_py
from freezegun import freeze_time

import limitd
from limitd import keys
from limitd.supervisor import Capsule, CapsuleConfig
from limitd.unique import middleware as unique

T0 = dt.datetime(2026, 11, 22, 9, 0, 0, tzinfo=dt.timezone.utc)
ran: list[tuple[str, object]] = []
failures_left: dict[int, int] = {}


@limitd.job(name="unique_test.Import", unique_for=600)
def import_account(account: int) -> None:
    ran.append(("import", account))
    if failures_left.get(account, 0) > 0:
        failures_left[account] -= 1
        raise RuntimeError("upstream down")


@limitd.job(name="unique_test.Refresh", unique_for=60, unique_until="executing")
def refresh(key: str) -> None:
    # While the first copy runs, its lock is already gone: a new copy may be queued.
    if not ran:
        ran.append(("refresh", refresh.perform_async(key)))


@limitd.job(name="unique_test.Ping", unique_for=60, unique_until="timeout")
def ping(host: str) -> None:
    ran.append(("ping", host))


@limitd.job(name="unique_test.Once", unique_for=600, retry=False)
def once(n: int) -> None:
    raise RuntimeError("no retry")


@limitd.job(name="unique_test.Doomed", unique_for=600, retry=0)
def doomed(n: int) -> None:
    raise RuntimeError("dies at once")


@pytest.fixture
def capsule(redis: redis_py.Redis) -> Iterator[Capsule]:
    ran.clear()
    failures_left.clear()
    yield Capsule(CapsuleConfig(queues=["default", "other"]), redis=redis)


def lock_of(redis: redis_py.Redis, job: str, args: list, queue: str = "default") -> str | None:
    value = redis.get(keys.of(redis).unique_lock(job, queue, unique.args_digest(args)))
    return value.decode() if value else None


def skipped(redis: redis_py.Redis) -> int:
    return int(redis.get(keys.of(redis).UNIQUE_SKIPPED) or 0)


def test_a_duplicate_is_not_pushed_and_is_counted(capsule: Capsule, redis) -> None:
    jid = import_account.perform_async(1)
    assert jid is not None
    assert import_account.perform_async(1) is None
    assert redis.llen(keys.of(redis).queue("default")) == 1
    assert skipped(redis) == 1
    assert lock_of(redis, "unique_test.Import", [1]) == jid
    # Other arguments or another queue are other jobs.
    assert import_account.perform_async(2) is not None
    assert import_account.set(queue="other").perform_async(1) is not None
    assert redis.llen(keys.of(redis).queue("default")) == 2


def test_arguments_compare_in_canonical_form(capsule: Capsule, redis) -> None:
    assert import_account.perform_async({"a": 1, "b": [1, 2]}) is not None
    assert import_account.perform_async({"b": [1, 2], "a": 1}) is None
    assert import_account.perform_async({"a": 1, "b": [2, 1]}) is not None


def test_until_executed_releases_on_success(capsule: Capsule, redis) -> None:
    import_account.perform_async(1)
    assert capsule.drain() == {"done": 1}
    assert lock_of(redis, "unique_test.Import", [1]) is None
    assert import_account.perform_async(1) is not None


def test_until_executed_keeps_the_lock_across_retries(capsule: Capsule, redis) -> None:
    failures_left[1] = 2
    with freeze_time(T0) as frozen:
        jid = import_account.perform_async(1)
        for _ in range(2):
            assert capsule.drain(scheduled=True) == {"retry": 1}
            assert lock_of(redis, "unique_test.Import", [1]) == jid
            assert import_account.perform_async(1) is None
            frozen.tick(dt.timedelta(hours=1))  # past the backoff
        assert capsule.drain(scheduled=True) == {"done": 1}
    assert lock_of(redis, "unique_test.Import", [1]) is None
    assert ran == [("import", 1)] * 3


@pytest.mark.parametrize(("job", "outcome"), [(once, "discarded"), (doomed, "dead")])
def test_until_executed_releases_when_the_job_will_not_run_again(
    capsule: Capsule, redis, job, outcome
) -> None:
    job.perform_async(7)
    assert lock_of(redis, job.spec.name, [7]) is not None
    assert capsule.drain() == {outcome: 1}
    assert lock_of(redis, job.spec.name, [7]) is None


def test_until_executing_releases_when_the_job_starts(capsule: Capsule, redis) -> None:
    first = refresh.perform_async("k")
    assert refresh.perform_async("k") is None
    assert capsule.drain() == {"done": 2}
    [(_, second)] = ran
    assert second is not None and second != first  # pushed while the first one ran
    assert lock_of(redis, "unique_test.Refresh", ["k"]) is None


def test_until_timeout_keeps_the_lock_after_success(capsule: Capsule, redis) -> None:
    jid = ping.perform_async("db")
    assert capsule.drain() == {"done": 1}
    assert lock_of(redis, "unique_test.Ping", ["db"]) == jid
    assert (
        redis.pttl(keys.of(redis).unique_lock("unique_test.Ping", "default", ping_digest()))
        > 59_000
    )
    assert ping.perform_async("db") is None


def ping_digest() -> str:
    return unique.args_digest(["db"])


@freeze_time(T0)
def test_a_scheduled_job_holds_its_lock_for_the_delay_plus_unique_for(redis) -> None:
    ping.perform_in(dt.timedelta(minutes=10), "db")
    key = keys.of(redis).unique_lock("unique_test.Ping", "default", ping_digest())
    # Redis counts the lifetime in real time: a few milliseconds may have passed.
    assert 660_000 - 5_000 < redis.pttl(key) <= 660_000
    assert ping.perform_at(T0 + dt.timedelta(hours=1), "db") is None


def test_the_lock_lifetime_is_unique_for(redis) -> None:
    import_account.perform_async(5)
    key = keys.of(redis).unique_lock("unique_test.Import", "default", unique.args_digest([5]))
    assert 600_000 - 5_000 < redis.pttl(key) <= 600_000


def test_a_push_tried_again_with_its_jid_is_not_its_own_duplicate(redis) -> None:
    """A push whose write failed after it took the lock (a failover retry, reliable push)
    runs the chain again with the same jid: it must get through, not be skipped."""
    item = {"class": "unique_test.Import", "args": [6], "jid": "a" * 24}
    client = limitd.client.default_client()
    assert client.push(dict(item)) == "a" * 24
    assert client.push(dict(item)) == "a" * 24
    assert skipped(redis) == 0
    assert import_account.perform_async(6) is None  # another jid is still a duplicate
    assert skipped(redis) == 1


def test_a_job_whose_lock_expired_does_not_free_a_newer_copys_lock(capsule: Capsule, redis) -> None:
    first = import_account.perform_async(3)
    key = keys.of(redis).unique_lock("unique_test.Import", "default", unique.args_digest([3]))
    redis.delete(key)  # the lock expired while the first copy waited in the queue
    second = import_account.perform_async(3)
    assert second is not None
    assert capsule.drain() == {"done": 2}  # FIFO: the first copy ran first...
    assert lock_of(redis, "unique_test.Import", [3]) is None  # ...the second released its own
    # The release script itself, against a lock another job holds:
    redis.set(key, "someone-else")
    assert unique.release(redis, {"jid": first, "unique_key": key}) is False
    assert redis.get(key) == b"someone-else"
    assert unique.release(redis, {"jid": "someone-else", "unique_key": key}) is True
    assert unique.release(redis, {"jid": "someone-else", "unique_key": key}) is False


def test_bulk_enqueue_is_unique_per_job(capsule: Capsule, redis) -> None:
    jids = import_account.perform_bulk([[1], [1], [2], [1]])
    assert [jid is not None for jid in jids] == [True, False, True, False]
    assert redis.llen(keys.of(redis).queue("default")) == 2
    assert skipped(redis) == 2


def test_a_push_halted_later_in_the_chain_frees_the_lock(redis) -> None:
    client = limitd.Client(redis)
    client.middleware.add(lambda spec, payload, conn, call_next: None)
    assert import_account.set(client=client).perform_async(9) is None
    assert lock_of(redis, "unique_test.Import", [9]) is None


def test_eight_threads_enqueueing_the_same_job_push_exactly_one(redis) -> None:
    start = threading.Barrier(8)
    results: list[str | None] = []
    lock = threading.Lock()

    def enqueue() -> None:
        start.wait()
        jid = import_account.perform_async(42)
        with lock:
            results.append(jid)

    threads = [threading.Thread(target=enqueue) for _ in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert len([jid for jid in results if jid is not None]) == 1
    assert redis.llen(keys.of(redis).queue("default")) == 1
    assert skipped(redis) == 7


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"unique_for": 0}, "positive number of seconds"),
        ({"unique_for": 10, "unique_until": "done"}, "'executed', 'executing', 'timeout'"),
    ],
)
def test_bad_unique_options_fail_at_definition(options: dict, message: str) -> None:
    with pytest.raises(limitd.InvalidJobOption, match=message):
        limitd.job(name="unique_test.Bad", **options)(lambda: None)


def test_a_skipped_duplicate_is_logged_at_debug_level(
    redis, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG, logger="limitd.unique")
    import_account.perform_async(11)
    import_account.perform_async(11)
    [record] = [r for r in caplog.records if r.name == "limitd.unique"]
    assert record.levelno == logging.DEBUG
    assert "class=unique_test.Import queue=default" in record.getMessage()


seen_while_running: list[str | None] = []
probe_redis: list[redis_py.Redis] = []


@limitd.job(name="unique_test.Probe", unique_for=60)
def probe(key: str) -> None:
    seen_while_running.append(lock_of(probe_redis[0], "unique_test.Probe", [key]))


@pytest.mark.parametrize(
    ("alias", "expected"),
    [  # (limitd's policy, lock held while the job runs, lock held after it succeeded)
        ("until_executed", ("executed", True, False)),  # the unique-jobs gems' default
        ("success", ("executed", True, False)),  # Sidekiq Enterprise's default
        ("until_executing", ("executing", False, False)),
        ("start", ("executing", False, False)),  # Sidekiq Enterprise
        ("until_timeout", ("timeout", True, True)),
    ],
)
def test_sidekiq_names_of_unique_until_behave_as_their_meaning(
    capsule: Capsule, redis: redis_py.Redis, alias: str, expected: tuple[str, bool, bool]
) -> None:
    policy, held_while_running, held_after = expected
    seen_while_running.clear()
    probe_redis[:] = [redis]
    jid = probe.set(unique_until=alias).perform_async(alias)
    assert jid is not None
    [queued] = redis.lrange(keys.of(redis).queue("default"), 0, -1)
    assert json.loads(queued)["unique_until"] == policy  # one spelling on the wire
    assert probe.set(unique_until=alias).perform_async(alias) is None
    assert capsule.drain() == {"done": 1}
    assert seen_while_running == [jid if held_while_running else None]
    assert lock_of(redis, "unique_test.Probe", [alias]) == (jid if held_after else None)


def test_a_sidekiq_name_given_at_definition_is_stored_as_limitds() -> None:
    job = limitd.job(name="unique_test.Started", unique_for=10, unique_until="start")(lambda: None)
    assert job.spec.options["unique_until"] == "executing"
