"""``limitd metrics``'s collector in this process: the families it builds from a known
cluster state, the fixed number of Redis round trips a scrape costs, and a scrape that
survives a failing part (a feature's hook, Redis gone)."""

from __future__ import annotations

import json
import logging
from collections.abc import Iterable
from typing import Any

import pytest
import redis as redis_py
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.parser import text_string_to_metric_families

import limitd
from limitd import clock, keys
from limitd.api import Queue
from limitd.capacity.metrics import GITLAB
from limitd.connection.embedded import RedisServer
from limitd.fair_tenant.metrics import fair_tenant_metrics
from limitd.fair_tenant.plug import FAIR_TENANT
from limitd.metrics.exporter import ClusterCollector
from limitd.plugins import Feature, registered

Samples = dict[tuple[str, tuple[tuple[str, str], ...]], float]

REROUTED = "metrics_test.Rerouted"


@limitd.job(
    name=REROUTED,
    tenant=lambda account: f"acct-{account}",
    fair_tenant_queues=[
        {"queue": "metrics_slow", "threshold": 0, "per": 60},
        {"queue": "metrics_slower", "threshold": 2, "per": 60},
    ],
)
def rerouted(account: int) -> None: ...


def scrape(redis: redis_py.Redis, features: Iterable[Feature] | None = None) -> Samples:
    """One scrape through prometheus-client's own exposition and parser, as samples
    keyed by name and sorted labels."""
    chosen = registered if features is None else (lambda: list(features))
    registry = CollectorRegistry()
    registry.register(ClusterCollector(redis, chosen))
    return parse(generate_latest(registry).decode())


def parse(text: str) -> Samples:
    samples: Samples = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            samples[(sample.name, tuple(sorted(sample.labels.items())))] = sample.value
    return samples


def value(samples: Samples, name: str, **labels: str) -> float:
    return samples[(name, tuple(sorted(labels.items())))]


def write_process(redis: redis_py.Redis, identity: str, capsule: str, busy: int) -> None:
    """A live process record, as a capsule's heartbeat writes it."""
    info = {"hostname": "h", "pid": 1, "capsule": capsule, "concurrency": 5, "queues": ["a"]}
    redis.sadd(keys.of(redis).PROCESSES, identity)
    redis.hset(identity, mapping={"info": json.dumps(info), "busy": busy, "beat": clock.now()})


def test_a_scrape_carries_the_cluster_state(redis: redis_py.Redis) -> None:
    client = limitd.Client(redis)
    for n in range(3):
        client.push({"class": "Work", "queue": "a", "args": [n]})
    client.push({"class": "Work", "queue": "b", "args": []})
    client.push({"class": "Work", "queue": "b", "args": [], "at": clock.now() + 600})
    Queue("a", redis).limit = 4
    Queue("a", redis).process_limit = 2
    Queue("b", redis).pause()
    redis.hset(keys.of(redis).busy_of("a"), "a", 2)
    redis.set(keys.of(redis).STAT_PROCESSED, 40)
    redis.set(keys.of(redis).STAT_FAILED, 3)
    redis.zadd(keys.of(redis).RETRY, {"r1": 1.0, "r2": 2.0})
    redis.zadd(keys.of(redis).DEAD, {"d1": 1.0})
    write_process(redis, "host:1:aa", "default", busy=2)
    write_process(redis, "host:2:bb", "default", busy=1)
    write_process(redis, "host:3:cc", "mail", busy=0)
    redis.sadd(keys.of(redis).PROCESSES, "host:4:gone")  # no hash: a dead process, not counted

    samples = scrape(redis, [])

    assert value(samples, "limitd_queue_size", queue="a") == 3
    assert value(samples, "limitd_queue_size", queue="b") == 1
    assert 0 <= value(samples, "limitd_queue_latency_seconds", queue="a") < 60
    assert value(samples, "limitd_queue_busy", queue="a") == 2
    assert value(samples, "limitd_queue_limit", queue="a") == 4
    assert value(samples, "limitd_queue_process_limit", queue="a") == 2
    assert ("limitd_queue_limit", (("queue", "b"),)) not in samples  # unlimited
    assert value(samples, "limitd_queue_paused", queue="a") == 0
    assert value(samples, "limitd_queue_paused", queue="b") == 1
    assert value(samples, "limitd_processed_total") == 40
    assert value(samples, "limitd_failed_total") == 3
    assert value(samples, "limitd_retry_set_size") == 2
    assert value(samples, "limitd_scheduled_set_size") == 1
    assert value(samples, "limitd_dead_set_size") == 1
    assert value(samples, "limitd_processes", capsule="default") == 2
    assert value(samples, "limitd_processes", capsule="mail") == 1
    assert value(samples, "limitd_threads", capsule="default") == 10
    assert value(samples, "limitd_busy_threads", capsule="default") == 3
    assert value(samples, "limitd_busy_threads", capsule="mail") == 0
    assert value(samples, "limitd_exporter_up", part="core") == 1


def test_metric_names_follow_prometheus_conventions(redis: redis_py.Redis) -> None:
    limitd.Client(redis).push({"class": "Work", "queue": "a", "args": []})
    registry = CollectorRegistry()
    registry.register(ClusterCollector(redis))
    for family in text_string_to_metric_families(generate_latest(registry).decode()):
        # limitd's prefix, or the names GitLab's LimitedCapacity::Worker dashboards read
        assert family.name.startswith(("limitd_", GITLAB.prefix)), family.name
        assert family.documentation, family.name
        if family.type == "counter":
            assert all(s.name.endswith("_total") for s in family.samples), family.name
        assert not family.name.endswith(("_ms", "_milliseconds", "_minutes")), family.name


class RoundTrips:
    """A connection class that counts what it sends: one packed send per command, one
    per pipeline or transaction, i.e. one per round trip."""

    sent = 0

    @classmethod
    def connection_class(cls) -> type[redis_py.Connection]:
        class Counting(redis_py.Connection):
            def send_packed_command(self, command: Any, check_health: bool = True) -> None:
                cls.sent += 1
                super().send_packed_command(command, check_health)

        return Counting


def counted_scrape(server: RedisServer) -> int:
    """Round trips of one scrape with every registered feature, on a warm connection."""
    counter = RoundTrips()
    pool = redis_py.ConnectionPool.from_url(server.url, connection_class=counter.connection_class())
    conn = redis_py.Redis(connection_pool=pool)
    try:
        scrape(conn)  # the first opens the connection (HELLO, CLIENT SETINFO ...)
        before = counter.sent
        samples = scrape(conn)
        assert all(v == 1 for (name, _), v in samples.items() if name == "limitd_exporter_up"), (
            samples
        )
        return counter.sent - before
    finally:
        conn.close()
        pool.disconnect()


def fill(redis: redis_py.Redis, queues: int) -> None:
    """``queues`` queues, each with a job, a limit and busy slots, plus as many process
    records and rerouted tenants: everything a scrape reads grows with it."""
    client = limitd.Client(redis)
    for n in range(queues):
        client.push({"class": "Work", "queue": f"q{n}", "args": [n]})
        Queue(f"q{n}", redis).limit = n + 1
        redis.hset(keys.of(redis).BUSY, f"q{n}", 1)
        write_process(redis, f"host:{n}:id", f"capsule{n % 7}", busy=1)
        rerouted.perform_async(n)


def test_a_scrape_costs_the_same_round_trips_for_3_or_200_queues(
    redis: redis_py.Redis, redis_server: RedisServer
) -> None:
    fill(redis, 3)
    small = counted_scrape(redis_server)
    redis.flushall()
    fill(redis, 200)
    large = counted_scrape(redis_server)
    assert large == small, (small, large)
    assert small <= 12  # core: 6 (totals 1, queues 3, processes 2), then each feature


def test_fair_tenant_reroutes_are_counted_per_job_queue_and_rule(redis: redis_py.Redis) -> None:
    for account in (1, 1, 1, 2):
        rerouted.perform_async(account)
    # acct-1: the 1st and 2nd by rule 1; the 3rd by rule 2 (its window holds 2 already)
    samples = scrape(redis, [FAIR_TENANT])
    name = "limitd_fair_tenant_reroutes_total"
    assert value(samples, name, job_class=REROUTED, queue="metrics_slow", rule="1") == 3
    assert value(samples, name, job_class=REROUTED, queue="metrics_slower", rule="2") == 1
    assert value(samples, "limitd_exporter_up", part="fair_tenant") == 1
    assert [f.name for f in fair_tenant_metrics(redis)] == ["limitd_fair_tenant_reroutes"]


def broken(redis: Any) -> list[Any]:
    raise RuntimeError("bug in a feature's hook")


def not_a_family(redis: Any) -> list[Any]:
    return ["limitd_oops 1"]


def stealing(redis: Any) -> list[Any]:
    return [GaugeMetricFamily("limitd_queue_size", "a name the core serves", value=1)]


@pytest.mark.parametrize("hook", [broken, not_a_family, stealing])
def test_a_failing_feature_hook_is_logged_and_the_rest_still_served(
    redis: redis_py.Redis, caplog: pytest.LogCaptureFixture, hook: Any
) -> None:
    limitd.Client(redis).push({"class": "Work", "queue": "a", "args": []})
    features = [Feature(name="bad", metrics=hook), FAIR_TENANT]
    with caplog.at_level(logging.ERROR, logger="limitd.metrics"):
        samples = scrape(redis, features)
    assert value(samples, "limitd_exporter_up", part="bad") == 0
    assert value(samples, "limitd_exporter_up", part="core") == 1
    assert value(samples, "limitd_exporter_up", part="fair_tenant") == 1
    assert value(samples, "limitd_queue_size", queue="a") == 1
    assert "could not read the bad part" in caplog.text


def test_a_scrape_without_redis_still_answers_with_core_down(
    own_redis_server: RedisServer, caplog: pytest.LogCaptureFixture
) -> None:
    conn = own_redis_server.client(socket_timeout=1, socket_connect_timeout=1)
    own_redis_server.stop()
    samples = scrape(conn, [FAIR_TENANT])
    assert value(samples, "limitd_exporter_up", part="core") == 0
    assert value(samples, "limitd_exporter_up", part="fair_tenant") == 0
    assert not any(name.startswith("limitd_queue") for name, _ in samples)
    assert "could not read the core part" in caplog.text
