"""Tenant fairness through real Redis: window boundaries under freezegun, rule order,
tenant sources, bulk, scheduled jobs, retries, and concurrent enqueues."""

from __future__ import annotations

import datetime as dt
import json
import threading

import pytest
import redis as redis_py
from freezegun import freeze_time

import limitd
from limitd import keys
from limitd.fair_tenant.middleware import FairTenantSettings
from limitd.supervisor import Capsule, CapsuleConfig

T0 = dt.datetime(2026, 11, 21, 12, 0, 0, tzinfo=dt.timezone.utc)
TWO_RULES = [
    {"queue": "throttled_2x", "threshold": 3, "per": 3600},
    {"queue": "throttled_4x", "threshold": 2, "per": 60},
]


@limitd.job(
    name="fair_test.Sync",
    fair_tenant_queues=[{"queue": "throttled", "threshold": 3, "per": dt.timedelta(minutes=1)}],
    tenant=lambda account, *_: f"account-{account}",
)
def sync(account: int, n: int = 0) -> None: ...


@limitd.job(name="fair_test.Two", fair_tenant_queues=TWO_RULES, tenant=lambda account, *_: account)
def two(account: str, n: int = 0) -> None: ...


@limitd.job(name="fair_test.Plain")
def plain(n: int) -> None: ...


class Report(
    limitd.Job,
    name="fair_test.Report",
    retry=3,
    fair_tenant_queues=[{"queue": "throttled", "threshold": 1, "per": 60}],
):
    def perform(self, account: str) -> None:
        raise RuntimeError("flaky")

    def fair_tenant(self, account: str) -> str:
        return account


def queues_of(redis: redis_py.Redis, *names: str) -> dict[str, int]:
    return {name: int(redis.llen(keys.of(redis).queue(name))) for name in names}


def enqueues(redis: redis_py.Redis, job: str, tenant: str) -> int:
    key = keys.of(redis).fair_tenant_enqueues(
        keys.FAIR_TENANT_DEFAULT_KEY, queue="default", job_class=job, tenant=tenant
    )
    return int(redis.zcard(key))


@freeze_time(T0)
def test_the_job_counts_toward_its_own_threshold(redis: redis_py.Redis) -> None:
    """threshold 3: the first 3 of a window keep their queue, the 4th is rerouted."""
    for n in range(4):
        sync.perform_async(7, n)
    assert queues_of(redis, "default", "throttled") == {"default": 3, "throttled": 1}
    [rerouted] = redis.lrange(keys.of(redis).queue("throttled"), 0, -1)
    payload = json.loads(rerouted)
    assert payload["args"] == [7, 3]
    assert payload["fair_tenant"] == "account-7"
    assert "fair_tenant_queues" not in payload


def test_the_window_slides(redis: redis_py.Redis) -> None:
    with freeze_time(T0) as frozen:
        for n in range(3):
            sync.perform_async(7, n)
        frozen.tick(dt.timedelta(seconds=59))
        sync.perform_async(7, 3)  # 4 in the last minute
        frozen.tick(dt.timedelta(seconds=1))
        sync.perform_async(7, 4)  # the first 3 are exactly 60 s old: out of the window
    assert [
        json.loads(j)["args"][1] for j in redis.lrange(keys.of(redis).queue("throttled"), 0, -1)
    ] == [3]
    assert redis.llen(keys.of(redis).queue("default")) == 4


@freeze_time(T0)
def test_tenants_are_counted_apart(redis: redis_py.Redis) -> None:
    for n in range(4):
        sync.perform_async(1, n)
        sync.perform_async(2, n)
    assert queues_of(redis, "default", "throttled") == {"default": 6, "throttled": 2}


def test_the_last_matching_rule_wins(redis: redis_py.Redis) -> None:
    """Rules: more than 3 per hour -> 2x; more than 2 per minute -> 4x."""
    routed = []
    with freeze_time(T0) as frozen:
        for n in range(4):  # a burst: 3rd is over 2/min, 4th over both
            two.perform_async("a", n)
        frozen.tick(dt.timedelta(minutes=10))
        two.perform_async("a", 4)  # 5 in the hour, 1 in the minute: only rule 1
    for queue in ("default", "throttled_2x", "throttled_4x"):
        routed += [
            (json.loads(j)["args"][1], queue)
            for j in redis.lrange(keys.of(redis).queue(queue), 0, -1)
        ]
    assert sorted(routed) == [
        (0, "default"),
        (1, "default"),
        (2, "throttled_4x"),
        (3, "throttled_4x"),
        (4, "throttled_2x"),
    ]


def test_entries_are_trimmed_to_the_max_window(redis: redis_py.Redis) -> None:
    client = limitd.Client(
        redis,
        middleware=limitd.client.ClientChain(
            [
                limitd.fair_tenant.middleware.FairTenant(
                    FairTenantSettings(max_throttling_window=600)
                )
            ]
        ),
    )
    with freeze_time(T0) as frozen:
        for n in range(5):
            two.set(client=client).perform_async("b", n)
        key = keys.of(redis).fair_tenant_enqueues(
            keys.FAIR_TENANT_DEFAULT_KEY, queue="default", job_class="fair_test.Two", tenant="b"
        )
        assert redis.zcard(key) == 5
        assert 3590 < redis.ttl(key) <= 3600, "the longest rule (1 h) sets the expiry"
        frozen.tick(dt.timedelta(hours=1, seconds=1))
        two.set(client=client).perform_async("b", 5)
    assert redis.zcard(key) == 1


@freeze_time(T0)
def test_tenant_sources_in_order(redis: redis_py.Redis) -> None:
    class SetTenant:
        def __call__(self, spec, payload, redis, call_next):  # type: ignore[no-untyped-def]
            payload.setdefault("fair_tenant", "from-middleware")
            return call_next(payload)

    sync.set(fair_tenant="explicit").perform_async(1)
    client = limitd.Client(redis)
    client.middleware.prepend(SetTenant())
    sync.set(client=client).perform_async(1)
    sync.perform_async(1)
    plain.perform_async(1)  # no rules, no tenant hook: not tracked
    assert enqueues(redis, "fair_test.Sync", "explicit") == 1
    assert enqueues(redis, "fair_test.Sync", "from-middleware") == 1
    assert enqueues(redis, "fair_test.Sync", "account-1") == 1
    assert redis.zcard(keys.of(redis).FAIR_TENANT_TENANTS) == 3


@freeze_time(T0)
@pytest.mark.standalone_only("counts one server's round trips")
def test_bulk_counts_each_job_in_one_round_trip(redis: redis_py.Redis) -> None:
    before = redis.info("commandstats").get("cmdstat_evalsha", {}).get("calls", 0)
    jids = sync.perform_bulk([[1, n] for n in range(5)] + [[2, n] for n in range(5)])
    after = redis.info("commandstats")["cmdstat_evalsha"]["calls"]
    assert after - before == 2, "one script call per tenant in the chunk"
    assert len(set(jids)) == 10
    throttled = [
        json.loads(j)["args"] for j in redis.lrange(keys.of(redis).queue("throttled"), 0, -1)
    ]
    assert sorted(throttled) == [[1, 3], [1, 4], [2, 3], [2, 4]]
    sync.perform_async(1, 5)
    assert json.loads(redis.lindex(keys.of(redis).queue("throttled"), 0))["args"] == [1, 5]


@freeze_time(T0)
def test_scheduled_jobs_are_counted_and_routed_when_scheduled(redis: redis_py.Redis) -> None:
    for n in range(4):
        sync.perform_in(3600, 9, n)
    queues = sorted(json.loads(m)["queue"] for m in redis.zrange(keys.of(redis).SCHEDULE, 0, -1))
    assert queues == ["default", "default", "default", "throttled"]
    assert enqueues(redis, "fair_test.Sync", "account-9") == 4


def test_retries_keep_the_throttled_queue(redis: redis_py.Redis) -> None:
    with freeze_time(T0):
        Report.perform_async("x")
        Report.perform_async("x")  # over threshold 1: throttled
        capsule = Capsule(CapsuleConfig(queues=["default", "throttled"]), redis=redis)
        assert capsule.drain() == {"retry": 2}
    retries = sorted(json.loads(m)["queue"] for m in redis.zrange(keys.of(redis).RETRY, 0, -1))
    assert retries == ["default", "throttled"]
    assert enqueues(redis, "fair_test.Report", "x") == 2, "retries are not counted again"


@freeze_time(T0)
def test_reroutes_are_counted_per_job_tenant_and_rule(redis: redis_py.Redis) -> None:
    for n in range(6):
        sync.perform_async(3, n)
    counts = {
        tuple(json.loads(k)): int(v)
        for k, v in redis.hgetall(keys.of(redis).FAIR_TENANT_REROUTES).items()
    }
    assert counts == {("fair_test.Sync", "account-3", "throttled", "1"): 3}


@pytest.mark.standalone_only("threads share one connection pool")
def test_concurrent_enqueues_are_counted_exactly(redis: redis_py.Redis) -> None:
    """8 threads x 1,000 enqueues of one tenant: exactly 8,000 counted, and exactly the
    enqueues after the threshold rerouted."""
    big = limitd.job(
        name="fair_test.Big",
        fair_tenant_queues=[{"queue": "throttled", "threshold": 5000, "per": 3600}],
    )(lambda n: None)
    client = limitd.Client(redis_py.Redis(connection_pool=redis.connection_pool))

    def produce() -> None:
        for n in range(1000):
            big.set(client=client, fair_tenant="greedy").perform_async(n)

    threads = [threading.Thread(target=produce) for _ in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(120)
    assert enqueues(redis, "fair_test.Big", "greedy") == 8000
    assert queues_of(redis, "default", "throttled") == {"default": 5000, "throttled": 3000}


@pytest.mark.parametrize(
    "bad",
    [
        [],
        [{"queue": "q", "threshold": 1}],
        [{"queue": "", "threshold": 1, "per": 60}],
        [{"queue": "q", "threshold": -1, "per": 60}],
        [{"queue": "q", "threshold": 1, "per": 0}],
        [{"queue": "q", "threshold": 1, "per": 60, "extra": 1}],
        "throttled",
    ],
)
def test_bad_rules_fail_at_definition(bad: object) -> None:
    with pytest.raises(limitd.InvalidJobOption, match="fair_tenant_queues"):
        limitd.job(name="fair_test.Bad", fair_tenant_queues=bad)(lambda: None)


def test_settings_from_the_environment() -> None:
    base = FairTenantSettings(max_throttling_window=100, logger="yaml.logger")
    settings = FairTenantSettings.from_env(
        base,
        {
            "LIMITD_FAIR_TENANT_MAX_THROTTLING_WINDOW": "7200",
            "LIMITD_FAIR_TENANT_ENQUEUES_KEY": "ft:{job_class}:{fair_tenant}",
        },
    )
    assert settings == FairTenantSettings(7200.0, "ft:{job_class}:{fair_tenant}", "yaml.logger")


@pytest.mark.parametrize(
    ("env", "message"),
    [
        ({"LIMITD_FAIR_TENANT_MAX_THROTTLING_WINDOW": "abc"}, "MAX_THROTTLING_WINDOW"),
        ({"LIMITD_FAIR_TENANT_MAX_THROTTLING_WINDOW": "nan"}, "max_throttling_window"),
        ({"LIMITD_FAIR_TENANT_MAX_THROTTLING_WINDOW": "-5"}, "max_throttling_window"),
        ({"LIMITD_FAIR_TENANT_ENQUEUES_KEY": "ft:{tenant}"}, "enqueues_key"),
    ],
)
def test_bad_settings_fail_when_the_client_is_built(env: dict[str, str], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        FairTenantSettings.from_env(None, env)


def test_the_tenant_index_keeps_only_recent_tenants(redis: redis_py.Redis) -> None:
    with freeze_time(T0) as frozen:
        sync.perform_async(1)
        frozen.tick(dt.timedelta(days=1, seconds=1))
        sync.perform_async(2)
    members = [json.loads(m) for m in redis.zrange(keys.of(redis).FAIR_TENANT_TENANTS, 0, -1)]
    assert members == [["fair_test.Sync", "account-2"]]


@pytest.mark.standalone_only("counts one server's round trips")
def test_a_large_bulk_chunk_is_counted_in_one_call(redis: redis_py.Redis) -> None:
    jids = sync.perform_bulk([[4, n] for n in range(5000)], batch_size=5000)
    assert len(set(jids)) == 5000
    assert enqueues(redis, "fair_test.Sync", "account-4") == 5000
    assert queues_of(redis, "default", "throttled") == {"default": 3, "throttled": 4997}
