"""Quiet and stop sent from afar (the dashboard's buttons, ``limitd.api.Processes``): the
signal waits in Redis for the process's next record write, as Sidekiq's do."""

from __future__ import annotations

import signal
from pathlib import Path

import redis as redis_py

from limitd import keys
from limitd.api import Processes
from limitd.connection.embedded import RedisServer
from limitd.supervisor import Capsule, CapsuleConfig
from tests.helpers import LimitdProcesses, wait_for


def test_quiet_from_afar_quiets_the_capsule(redis: redis_py.Redis) -> None:
    capsule = Capsule(CapsuleConfig(concurrency=2, record_period=0.05), redis=redis)
    capsule.start()
    try:
        wait_for(lambda: len(Processes(redis)) == 1, message="the process record")
        assert Processes(redis).quiet(capsule.identity)
        wait_for(lambda: capsule.record.quiet, message="quiet")
        wait_for(lambda: capsule.processor_count() == 0, message="processors gone")
        wait_for(lambda: Processes(redis).processes[0].quiet, message="quiet in the record")
        assert not redis.exists(keys.process_signals(capsule.identity))
    finally:
        capsule.stop(timeout=2)


def test_stop_from_afar_stops_an_in_process_capsule(redis: redis_py.Redis) -> None:
    capsule = Capsule(CapsuleConfig(concurrency=2, record_period=0.05), redis=redis)
    capsule.start()
    wait_for(lambda: len(Processes(redis)) == 1, message="the process record")
    assert Processes(redis).stop(capsule.identity)
    assert capsule.stopped.wait(10), "the stop asked from afar ran to its end"
    assert len(Processes(redis)) == 0, "the record cleared by the stop"
    assert capsule.processor_count() == 0


def test_an_unknown_process_gets_no_signal(redis: redis_py.Redis) -> None:
    assert not Processes(redis).quiet("nobody:1:abc")
    assert not redis.exists(keys.process_signals("nobody:1:abc"))


def test_stop_from_afar_stops_the_whole_supervisor(
    tmp_path: Path, own_redis_server: RedisServer
) -> None:
    redis = own_redis_server.client()
    processes = LimitdProcesses(tmp_path, own_redis_server.url)
    supervisor = processes.start("-c", "2", "-p", "2")
    try:
        wait_for(lambda: len(Processes(redis)) == 2, timeout=30, message="two capsules")
        first = Processes(redis).processes[0]
        assert Processes(redis).stop(first.identity)
        assert supervisor.wait(timeout=30) == 0, "the supervisor stopped gracefully"
        assert len(Processes(redis)) == 0
    finally:
        processes.kill_all()
        assert signal.SIGTERM  # the signal the supervisor was sent
