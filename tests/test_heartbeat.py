"""The Sidekiq-format process record: written while running, gone after stop."""

from __future__ import annotations

import json
import threading

import redis as redis_py

import limitd
from limitd.supervisor import Capsule, CapsuleConfig
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
