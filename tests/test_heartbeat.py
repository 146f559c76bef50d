"""The Sidekiq-format process record: written while running, gone after stop."""

from __future__ import annotations

import json
import threading

import pytest
import redis as redis_py

import limitd
from limitd.supervisor import Capsule, CapsuleConfig
from limitd.supervisor.heartbeat import Heartbeat
from tests.helpers import wait_for

release = threading.Event()


@limitd.job(name="heartbeat_test.Hold")
def hold() -> None:
    release.wait(10)


def test_process_record_shows_what_runs(redis: redis_py.Redis) -> None:
    release.clear()
    capsule = Capsule(CapsuleConfig(concurrency=2, queues=["default", "b"], tag="web"), redis=redis)
    capsule.start()
    try:
        identity = capsule.identity
        assert redis.smembers("processes") == {identity.encode()}
        info = json.loads(redis.hget(identity, "info"))
        assert info["tag"] == "web"
        assert info["concurrency"] == 2
        assert info["queues"] == ["default", "b"]
        assert info["identity"] == identity
        assert 0 < redis.ttl(identity) <= 60
        jid = hold.perform_async()
        wait_for(lambda: capsule.busy() == 1, message="job to start")
        capsule.beat()
        assert redis.hget(identity, "busy") == b"1"
        [work] = [json.loads(w) for w in redis.hvals(f"{identity}:work")]
        assert work["queue"] == "default"
        assert json.loads(work["payload"])["jid"] == jid
    finally:
        release.set()
        capsule.stop(timeout=2)
    assert redis.smembers("processes") == set()
    assert not redis.exists(identity, f"{identity}:work")
    assert redis.get("stat:processed") == b"1"


def test_running_jobs_are_written_for_sidekiq_6_and_7(redis: redis_py.Redis) -> None:
    """Sidekiq 7 reads ``<identity>:work``, Sidekiq 6 ``<identity>:workers``: both hold the
    running job in the format both read, expire with the record, and empty when it ends."""
    release.clear()
    capsule = Capsule(CapsuleConfig(concurrency=2, record_period=0.05), redis=redis)
    capsule.start()
    identity = capsule.identity
    work_keys = (f"{identity}:work", f"{identity}:workers")
    try:
        jid = hold.perform_async()
        wait_for(lambda: all(redis.hlen(key) == 1 for key in work_keys), message="work rows")
        for key in work_keys:
            [work] = [json.loads(w) for w in redis.hvals(key)]
            assert work["queue"] == "default"
            assert isinstance(work["run_at"], int)
            assert isinstance(work["payload"], str)  # the job's JSON text, as Sidekiq stores it
            assert json.loads(work["payload"])["jid"] == jid
            assert 0 < redis.ttl(key) <= 60
        assert redis.hkeys(work_keys[0]) == redis.hkeys(work_keys[1])
        release.set()
        wait_for(lambda: not redis.exists(*work_keys), message="work rows to be cleared")
        assert redis.hget(identity, "busy") == b"0"
        release.clear()
        hold.perform_async()
        wait_for(lambda: redis.exists(*work_keys) == 2, message="a second job's rows")
    finally:
        release.set()
        capsule.stop(timeout=2)
    assert not redis.exists(identity, *work_keys)


def test_busy_is_refreshed_at_the_record_period_not_the_heartbeat(
    redis: redis_py.Redis,
) -> None:
    release.clear()
    config = CapsuleConfig(concurrency=2, heartbeat_period=3600, record_period=0.05)
    capsule = Capsule(config, redis=redis)
    capsule.start()
    try:
        assert redis.hget(capsule.identity, "busy") == b"0"
        hold.perform_async()
        wait_for(lambda: redis.hget(capsule.identity, "busy") == b"1", message="busy 1")
        release.set()
        wait_for(lambda: redis.hget(capsule.identity, "busy") == b"0", message="busy 0")
    finally:
        release.set()
        capsule.stop(timeout=2)


def test_heartbeat_refreshes_between_beats() -> None:
    """The light refresh runs every refresh period; the full beat only at start and when
    its own (long) period is up or ``beat_soon`` asks."""
    calls: list[str] = []
    heartbeat = Heartbeat(
        lambda: calls.append("beat"),
        3600,
        refresh=lambda: calls.append("refresh"),
        refresh_period=0.01,
    )
    heartbeat.start()
    try:
        wait_for(lambda: calls.count("refresh") >= 3, message="three refreshes")
        assert calls.count("beat") == 1
        heartbeat.beat_soon()
        wait_for(lambda: calls.count("beat") == 2, message="the beat asked for")
    finally:
        heartbeat.stop()
    assert calls[0] == "beat"


def test_record_period_must_be_positive() -> None:
    with pytest.raises(ValueError, match="record_period must be > 0"):
        CapsuleConfig(record_period=0)
