"""Tenant fairness around the middleware: the ``fair_tenant:`` config section and its
environment variables, the clients ``configure`` and ``start`` build, the check that
every throttled queue is fetched, and what operators see (``top_tenants``,
``reroutes``, ``limitd tenants``)."""

from __future__ import annotations

import argparse
import datetime as dt
import json
import subprocess
import sys
import textwrap
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import redis as redis_py
import yaml
from freezegun import freeze_time

import limitd
from limitd import keys
from limitd.api import TenantStatus, reroutes, top_tenants
from limitd.client import ClientChain, default_client
from limitd.commands import add_admin_commands, start
from limitd.config import (
    CapsuleConfig,
    CapsuleSpec,
    Config,
    ConfigError,
    RedisSettings,
    app_modules,
    check_app,
    config_as_dict,
    load_config,
)
from limitd.connection.embedded import RedisServer
from limitd.fair_tenant.admin import window_label
from limitd.fair_tenant.checks import check_fair_tenant_queues
from limitd.fair_tenant.middleware import FairTenant, FairTenantSettings

ROOT = Path(__file__).resolve().parent.parent
T0 = dt.datetime(2026, 11, 21, 12, 0, 0, tzinfo=dt.timezone.utc)
SYNC = "fair_admin_test.Sync"
REPORT = "fair_admin_test.Report"
SLOW, SLOWER, REPORTS_SLOW = "fair_admin_slow", "fair_admin_slower", "fair_admin_reports_slow"


@limitd.job(
    name=SYNC,
    fair_tenant_queues=[
        {"queue": SLOW, "threshold": 5, "per": 3600},
        {"queue": SLOWER, "threshold": 2, "per": 60},
    ],
    tenant=lambda account, *_: f"acct-{account}",
)
def sync(account: int, n: int = 0) -> None: ...


@limitd.job(
    name=REPORT,
    queue="fair_admin_reports",
    fair_tenant_queues=[{"queue": REPORTS_SLOW, "threshold": 1, "per": 60}],
    tenant=lambda account: account,
)
def report(account: str) -> None: ...


@limitd.job(name="fair_admin_test.Plain", queue="x")
def plain() -> None: ...


def settings_of(client: limitd.Client) -> FairTenantSettings:
    [fair] = [m for m in client.middleware if isinstance(m, FairTenant)]
    return fair.settings


def write(tmp_path: Path, text: str, name: str = "app.yml") -> Path:
    path = tmp_path / name
    path.write_text(textwrap.dedent(text))
    return path


# the fair_tenant: section and LIMITD_FAIR_TENANT_<KEY>

SECTION = """
    fair_tenant:
      max_throttling_window: 600
      enqueues_key: "fair:{queue}:{job_class}:{fair_tenant}"
      logger: app.fairness
"""


def test_the_yaml_section_is_read_and_round_trips(tmp_path: Path) -> None:
    config = load_config([write(tmp_path, SECTION)], env={})
    assert config.section("fair_tenant") == FairTenantSettings(
        max_throttling_window=600.0,
        enqueues_key="fair:{queue}:{job_class}:{fair_tenant}",
        logger="app.fairness",
    )
    effective = config_as_dict(config)
    assert effective["fair_tenant"]["enqueues_key"] == "fair:{queue}:{job_class}:{fair_tenant}"
    dumped = write(tmp_path, yaml.safe_dump(effective), "effective.yml")
    assert load_config([dumped], env={}).section("fair_tenant") == config.section("fair_tenant")


def test_no_section_means_the_defaults() -> None:
    assert load_config([], env={}).section("fair_tenant") == FairTenantSettings()


def test_the_environment_wins(tmp_path: Path) -> None:
    env = {
        "LIMITD_FAIR_TENANT_MAX_THROTTLING_WINDOW": "30",
        "LIMITD_FAIR_TENANT_LOGGER": "ops.fairness",
        "LIMITD_FAIR_TENANT_ENQUEUES_KEY": "",  # empty: unset, the file's value stays
    }
    settings = load_config([write(tmp_path, SECTION)], env=env).section("fair_tenant")
    assert settings.max_throttling_window == 30.0
    assert settings.logger == "ops.fairness"
    assert settings.enqueues_key == "fair:{queue}:{job_class}:{fair_tenant}"


@pytest.mark.parametrize(
    ("template", "expected"),
    [
        ("fair:{tenant}", "placeholder {tenant} in 'fair:{tenant}' is not one of"),
        ("fair:{job_class}", "must contain {fair_tenant}"),
        ("fair:{fair_tenant", "expected '}' before end of string"),
        ("fair:{fair_tenant!r}", "placeholder {fair_tenant!r}"),
        ("fair:{}:{fair_tenant}", "placeholder {} in"),
    ],
)
def test_a_bad_enqueues_key_is_rejected(tmp_path: Path, template: str, expected: str) -> None:
    path = write(tmp_path, f"fair_tenant: {{enqueues_key: {json.dumps(template)}}}\n")
    with pytest.raises(ConfigError) as caught:
        load_config([path], env={})
    assert str(caught.value).startswith(f"{path}: fair_tenant.enqueues_key: ")
    assert expected in str(caught.value)


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("fair_tenant: {max_throttling_window: 0}\n", "max_throttling_window: expected a number"),
        ("fair_tenant: {max_window: 60}\n", "max_window: unknown key; did you mean"),
        ("fair_tenant: {logger: ''}\n", "logger: expected a logger name"),
        ("fair_tenant: 3\n", "fair_tenant: expected a mapping"),
    ],
)
def test_bad_values_name_the_file_and_key(tmp_path: Path, text: str, expected: str) -> None:
    path = write(tmp_path, text)
    with pytest.raises(ConfigError, match=expected) as caught:
        load_config([path], env={})
    assert str(caught.value).startswith(f"{path}: fair_tenant")


@pytest.mark.parametrize(
    ("env", "expected"),
    [
        (
            {"LIMITD_FAIR_TENANT_MAX_THROTTLING_WINDOW": "nan"},
            "environment: LIMITD_FAIR_TENANT_MAX_THROTTLING_WINDOW: expected a number",
        ),
        (
            {"LIMITD_FAIR_TENANT_ENQUEUES_KEY": "x:{job_class}"},
            "environment: LIMITD_FAIR_TENANT_ENQUEUES_KEY: 'x:{job_class}' must contain",
        ),
        (
            {"LIMITD_FAIR_TENANT_WINDOW": "60"},
            "environment: LIMITD_FAIR_TENANT_WINDOW: unknown variable",
        ),
    ],
)
def test_bad_environment_variables_are_named(env: dict[str, str], expected: str) -> None:
    with pytest.raises(ConfigError) as caught:
        load_config([], env=env)
    assert str(caught.value).startswith(expected)


# the clients configure and start build


@pytest.fixture
def fair_env(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("LIMITD_FAIR_TENANT_LOGGER", "from.env")


def test_configure_uses_the_config_settings(
    tmp_path: Path, redis_server: RedisServer, redis: redis_py.Redis, fair_env: None
) -> None:
    path = write(tmp_path, SECTION)
    client = limitd.configure(str(path), url=redis_server.url)
    try:
        assert default_client() is client
        assert settings_of(client) == FairTenantSettings(
            600.0, "fair:{queue}:{job_class}:{fair_tenant}", "from.env"
        )
        report.perform_async("acme")
    finally:
        client.redis.close()
    assert redis.zcard(f"fair:fair_admin_reports:{REPORT}:acme") == 1


def test_start_builds_clients_with_the_config_settings(
    redis_server: RedisServer, redis: redis_py.Redis, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The supervisor's children: run_capsule sets a default client before it runs."""
    seen: list[FairTenantSettings] = []

    class Launched:
        def __init__(self, capsule: object, titles: bool, ready: object = None) -> None:
            seen.append(settings_of(default_client()))

        def run(self) -> int:
            return 0

    monkeypatch.setattr(start, "Capsule", lambda config, redis, middleware: None)
    monkeypatch.setattr(start, "Launcher", Launched)
    # A capsule process sets its threads' scheduling policy and CPUs; this one is the
    # test's own, whose later tests and subprocesses would inherit them.
    monkeypatch.setattr(start.cpu_scheduling, "apply", lambda policy: None)
    monkeypatch.setattr(start.cpu_affinity, "apply", lambda *setting: None)
    settings = FairTenantSettings(60.0, "x:{fair_tenant}", "child.fairness")
    sections = {"fair_tenant": settings}
    assert start.run_capsule(CapsuleConfig(), RedisSettings(), redis_server.url, sections) == 0
    assert seen == [settings]


# every throttled queue must be fetched by some capsule


def config_with(*capsules: CapsuleConfig, files: tuple[str, ...] = ("conf/app.yml",)) -> Config:
    return Config(files=list(files), capsules=[CapsuleSpec(c) for c in capsules])


def test_an_unfetched_throttled_queue_is_a_config_error() -> None:
    config = config_with(
        CapsuleConfig(queues=["default", SLOW]),
        CapsuleConfig(name="reports", queues=["fair_admin_reports", REPORTS_SLOW]),
    )
    with pytest.raises(ConfigError) as caught:
        check_fair_tenant_queues(config, [report.spec, sync.spec])
    assert str(caught.value) == (
        f"conf/app.yml: job {SYNC}: fair_tenant_queues[1].queue '{SLOWER}' is not in any "
        "capsule's queues (jobs routed there would never run)"
    )


def test_listed_throttled_queues_pass() -> None:
    config = config_with(
        CapsuleConfig(queues=["default", [SLOW, 2], [SLOWER, 1]]),
        CapsuleConfig(name="reports", queues=[REPORTS_SLOW]),
    )
    check_fair_tenant_queues(config, [sync.spec, report.spec])


def test_a_dynamic_capsule_fetches_any_queue() -> None:
    config = config_with(
        CapsuleConfig(queues=["default"]), CapsuleConfig(name="rest", queues=["x"], dynamic=True)
    )
    check_fair_tenant_queues(config, [sync.spec, report.spec])


def test_jobs_without_rules_are_not_checked() -> None:
    check_fair_tenant_queues(config_with(CapsuleConfig(queues=["x"])), [plain.spec])


def test_check_app_reads_the_registry_and_modules_are_collected() -> None:
    config = config_with(CapsuleConfig(queues=["default"]), files=())
    config.require = ["app.jobs"]
    config.capsules.append(CapsuleSpec(CapsuleConfig(name="b", queues=["b"], require=["app.b"])))
    assert app_modules(config) == ["app.jobs", "app.b"]
    with pytest.raises(ConfigError, match=r"^command line: job \S+: fair_tenant_queues\["):
        check_app(config)  # this module's jobs (at least) are registered


TINY_APP = """
    import limitd

    @limitd.job(name="tiny_app.Sync", tenant=lambda account: account,
                fair_tenant_queues=[{"queue": "tiny_throttled", "threshold": 1, "per": 60}])
    def sync(account): ...
"""


def run_cli(cwd: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "limitd.cli", *args],
        cwd=cwd,
        capture_output=True,
        text=True,
        check=False,
        timeout=30,
    )


def test_limitd_check_and_start_reject_an_unfetched_throttled_queue(tmp_path: Path) -> None:
    write(tmp_path, TINY_APP, "tiny_app.py")
    (tmp_path / "conf").mkdir()
    write(tmp_path, "require: [tiny_app]\nqueues: [default]\n", "conf/app.yml")
    for command in ("check", "start"):
        out = run_cli(tmp_path, command, "conf/app.yml")
        assert out.returncode == 78, out.stderr
        assert (
            "conf/app.yml: job tiny_app.Sync: fair_tenant_queues[0].queue 'tiny_throttled' "
            "is not in any capsule's queues (jobs routed there would never run)"
        ) in out.stderr
    write(tmp_path, "require: [tiny_app]\nqueues: [default, [tiny_throttled, 1]]\n", "conf/app.yml")
    out = run_cli(tmp_path, "check", "conf/app.yml")
    assert out.returncode == 0, out.stderr
    assert yaml.safe_load(out.stdout)["fair_tenant"]["max_throttling_window"] == 86400


# what operators see


def enqueue_traffic() -> None:
    """acct-1: 2 jobs every 2 minutes, 6 in all (the 6th is past 5 an hour: slow);
    acct-2: one job; report tenant x: one job, 4 minutes in."""
    with freeze_time(T0) as frozen:
        sync.perform_async(2, 0)
        for minutes in (0, 2, 4):
            frozen.move_to(T0 + dt.timedelta(minutes=minutes))
            sync.perform_async(1, minutes)
            sync.perform_async(1, minutes + 1)
        report.perform_async("x")


@pytest.fixture
def traffic(redis: redis_py.Redis) -> Iterator[None]:
    enqueue_traffic()
    with freeze_time(T0 + dt.timedelta(minutes=4)):
        yield


def test_top_tenants_figures_and_current_rule(redis: redis_py.Redis, traffic: None) -> None:
    assert redis.llen(keys.of(redis).queue(SLOW)) == 1
    busiest, second, third = top_tenants(redis)
    assert (busiest.job, busiest.tenant) == (SYNC, "acct-1")
    assert [(w.queue, w.per, w.enqueues) for w in busiest.windows] == [
        (SLOW, 3600.0, 6),
        (SLOWER, 60.0, 2),
    ]
    assert busiest.enqueues == 6
    assert busiest.rerouted == {SLOW: 1}
    assert busiest.last_enqueued_at == (T0 + dt.timedelta(minutes=4)).timestamp()
    # 6 >= 5 and 2 >= 2: an enqueue now is the 7th of the hour and the 3rd of the
    # minute, so the last rule routes it.
    assert busiest.rule_now is not None
    assert busiest.rule_now.queue == SLOWER
    # ties on enqueues (1 each): the most recent first
    assert (second.job, second.tenant, second.enqueues) == (REPORT, "x", 1)
    assert second.rule_now is not None
    assert second.rule_now.queue == REPORTS_SLOW  # threshold 1: the next one is rerouted
    assert (third.tenant, third.enqueues, third.rule_now, third.rerouted) == ("acct-2", 1, None, {})


def test_rule_now_is_where_the_next_enqueue_goes(redis: redis_py.Redis, traffic: None) -> None:
    for status in top_tenants(redis):
        expected = status.rule_now.queue if status.rule_now else None
        routed = queue_lengths(redis)
        if status.job == SYNC:
            sync.perform_async(int(status.tenant.split("-")[1]), 99)
        else:
            report.perform_async(status.tenant)
        grown = {q for q, n in queue_lengths(redis).items() if n > routed.get(q, 0)}
        assert grown == {expected or ("default" if status.job == SYNC else "fair_admin_reports")}


def queue_lengths(redis: redis_py.Redis) -> dict[str, int]:
    names = ["default", "fair_admin_reports", SLOW, SLOWER, REPORTS_SLOW]
    return {name: int(redis.llen(keys.of(redis).queue(name))) for name in names}


def test_limit_and_window(redis: redis_py.Redis, traffic: None) -> None:
    assert [s.tenant for s in top_tenants(redis, limit=1)] == ["acct-1"]
    recent = top_tenants(redis, window=90)
    assert [(s.job, s.tenant) for s in recent] == [(SYNC, "acct-1"), (REPORT, "x")]


def test_windows_slide_out(redis: redis_py.Redis) -> None:
    enqueue_traffic()
    with freeze_time(T0 + dt.timedelta(hours=2)):
        statuses = {s.tenant: s for s in top_tenants(redis)}
    assert set(statuses) == {"acct-1", "acct-2", "x"}, "still within max_throttling_window"
    assert [w.enqueues for w in statuses["acct-1"].windows] == [0, 0]
    assert statuses["acct-1"].rule_now is None
    assert statuses["acct-1"].rerouted == {SLOW: 1}, "reroute counts are all-time"


def test_reroutes_are_counted_per_job_tenant_and_rule(redis: redis_py.Redis) -> None:
    with freeze_time(T0):
        sync.perform_bulk([[3, n] for n in range(4)])  # 3rd and 4th: over 2 a minute
        for _ in range(3):
            report.perform_async("y")
        [status] = [s for s in top_tenants(redis) if s.tenant == "acct-3"]
    assert reroutes(redis) == {
        (SYNC, "acct-3", SLOWER, 2): 2,
        (REPORT, "y", REPORTS_SLOW, 1): 2,
    }
    assert status.rerouted_by_rule == {2: 2}
    assert status.rerouted == {SLOWER: 2}


def test_a_queue_placeholder_uses_the_jobs_declared_queue(redis: redis_py.Redis) -> None:
    settings = FairTenantSettings(enqueues_key="fair_admin:{queue}:{job_class}:{fair_tenant}")
    client = limitd.Client(redis, middleware=ClientChain([FairTenant(settings)]))
    with freeze_time(T0):
        report.set(client=client).perform_async("z")
        [status] = top_tenants(redis, settings=settings)
    assert redis.exists(f"fair_admin:fair_admin_reports:{REPORT}:z")
    assert status.enqueues == 1


def test_settings_default_to_the_default_clients(redis: redis_py.Redis) -> None:
    settings = FairTenantSettings(enqueues_key="elsewhere:{job_class}:{fair_tenant}")
    limitd.set_default_client(limitd.Client(redis, middleware=ClientChain([FairTenant(settings)])))
    with freeze_time(T0):
        report.perform_async("w")
        [status] = top_tenants()
    assert status.enqueues == 1


# limitd tenants


def tenants_cli(capsys: pytest.CaptureFixture[str], redis: redis_py.Redis, *argv: str) -> Any:
    parser = argparse.ArgumentParser(prog="limitd")
    add_admin_commands(parser.add_subparsers(required=True), lambda args: redis)
    args = parser.parse_args(["tenants", *argv])
    capsys.readouterr()
    code = args.command(args)
    captured = capsys.readouterr()
    return code, captured.out, captured.err


def test_limitd_tenants_json(
    capsys: pytest.CaptureFixture[str], redis: redis_py.Redis, traffic: None
) -> None:
    code, out, _ = tenants_cli(capsys, redis, "--json", "--limit", "2")
    assert code == 0
    first, second = json.loads(out)
    assert first == {
        "job": SYNC,
        "tenant": "acct-1",
        "last_enqueued_at": (T0 + dt.timedelta(minutes=4)).timestamp(),
        "enqueues": [
            {"queue": SLOW, "threshold": 5, "per": 3600.0, "enqueues": 6},
            {"queue": SLOWER, "threshold": 2, "per": 60.0, "enqueues": 2},
        ],
        "rule_now": SLOWER,
        "rerouted": {SLOW: 1},
        "rerouted_by_rule": {"1": 1},
    }
    assert (second["tenant"], second["rule_now"], second["rerouted"]) == ("x", REPORTS_SLOW, {})


def test_limitd_tenants_table(
    capsys: pytest.CaptureFixture[str], redis: redis_py.Redis, traffic: None
) -> None:
    code, out, _ = tenants_cli(capsys, redis)
    assert code == 0
    header, *rows = out.splitlines()
    assert header.split() == ["TENANT", "JOB", "ENQUEUES", "RULE", "NOW", "REROUTED"]
    assert rows[0].split() == ["acct-1", SYNC, "6/1h", "2/1m", SLOWER, f"{SLOW}=1"]
    assert rows[2].split() == ["acct-2", SYNC, "1/1h", "0/1m", "-", "-"]


def test_limitd_tenants_with_nothing_tracked(
    capsys: pytest.CaptureFixture[str], redis: redis_py.Redis
) -> None:
    assert tenants_cli(capsys, redis)[1] == "no tenants tracked\n"


def test_limitd_tenants_bad_limit_exits_64(
    capsys: pytest.CaptureFixture[str], redis: redis_py.Redis
) -> None:
    code, _, err = tenants_cli(capsys, redis, "--limit", "0")
    assert code == 64
    assert "--limit must be an integer >= 1" in err


def test_limitd_tenants_subprocess(redis_server: RedisServer, redis: redis_py.Redis) -> None:
    report.perform_async("sub")
    out = run_cli(ROOT, "--redis", redis_server.url, "tenants", "--json")
    assert out.returncode == 0, out.stderr
    [row] = json.loads(out.stdout)
    assert (row["job"], row["tenant"], row["enqueues"][0]["enqueues"]) == (REPORT, "sub", 1)


@pytest.mark.parametrize(
    ("seconds", "label"), [(3600, "1h"), (60, "1m"), (90, "90s"), (86_400, "1d"), (1.5, "1.5s")]
)
def test_window_labels(seconds: float, label: str) -> None:
    assert window_label(seconds) == label


def test_status_as_dict_without_rules() -> None:
    status = TenantStatus("j", "t", 1.0, (), {})
    assert (status.enqueues, status.rule_now) == (0, None)
    assert status.as_dict()["enqueues"] == []


def test_limitd_tenants_unknown_module_exits_64(
    capsys: pytest.CaptureFixture[str], redis: redis_py.Redis
) -> None:
    code, _, err = tenants_cli(capsys, redis, "-r", "no_such_fair_admin_module")
    assert code == 64
    assert "cannot import required module 'no_such_fair_admin_module'" in err


def test_top_tenants_limit_must_be_positive(redis: redis_py.Redis) -> None:
    with pytest.raises(ValueError, match="limit must be at least 1"):
        top_tenants(redis, limit=0)
