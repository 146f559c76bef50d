"""Which Redis app code and every command use (``limitd.locate``): each step of the order
wins over the later ones, and app code run beside a real ``limitd start`` with its
embedded Redis reaches that Redis."""

from __future__ import annotations

import logging
import os
import signal
import subprocess
import sys
import textwrap
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
import redis as redis_py

import limitd
from limitd import keys, locate
from limitd.commands.start import given_files, share_location
from limitd.connection.embedded import RedisServer, free_port
from limitd.locate import RedisNotFound, app_location
from tests.helpers import limitd_start, wait_for

ENV_VARS = ("LIMITD_REDIS_URL", "REDIS_URL", "LIMITD_CONFIG")


@pytest.fixture(autouse=True)
def clean(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """Nothing configured by the environment; the working directory is a fresh one."""
    for var in ENV_VARS:
        monkeypatch.setenv(var, "")  # recorded, so a value set by the code under test goes
        monkeypatch.delenv(var)
    monkeypatch.chdir(tmp_path)


def record(base_dir: Path, url: str) -> None:
    """The record ``limitd start`` writes for its embedded Redis beside a config."""
    (base_dir / ".limitd").mkdir(parents=True, exist_ok=True)
    (base_dir / ".limitd" / "redis.url").write_text(url + "\n")


def conf(path: Path, text: str = "queues: [default]\n") -> str:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    return str(path)


def dead_url() -> str:
    return f"redis://127.0.0.1:{free_port()}/0"


def test_an_explicit_url_wins_over_everything(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, redis_server: RedisServer
) -> None:
    monkeypatch.setenv("LIMITD_REDIS_URL", "redis://env:1/0")
    monkeypatch.setenv("LIMITD_CONFIG", conf(tmp_path / "a.yml", "redis: {url: redis://c:1/0}"))
    record(tmp_path / "conf", redis_server.url)
    where = app_location("redis://given:1/0")
    assert (where.url, where.step) == ("redis://given:1/0", locate.EXPLICIT)


def test_limitd_redis_url_wins_over_redis_url_and_the_config(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setenv("REDIS_URL", "redis://plain:1/0")
    monkeypatch.setenv("LIMITD_REDIS_URL", "redis://limitd:1/0")
    monkeypatch.setenv("LIMITD_CONFIG", conf(tmp_path / "a.yml", "redis: {url: redis://c:1/0}"))
    assert app_location().url == "redis://limitd:1/0"
    monkeypatch.delenv("LIMITD_REDIS_URL")
    assert (app_location().url, app_location().source) == ("redis://plain:1/0", "REDIS_URL")


def test_the_environment_wins_over_a_config_file(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setenv("REDIS_URL", "redis://env:1/0")
    path = conf(tmp_path / "a.yml", "redis: {url: redis://c:1/0}")
    assert app_location(files=[path]).url == "redis://env:1/0"


def test_the_configs_url_wins_over_its_embedded_redis(
    tmp_path: Path, redis_server: RedisServer
) -> None:
    path = conf(tmp_path / "conf" / "a.yml", "redis: {url: redis://c:1/0}")
    record(tmp_path / "conf", redis_server.url)
    where = app_location(files=[path])
    assert (where.url, where.step) == ("redis://c:1/0", locate.CONFIGURED)


def test_the_configs_embedded_redis_wins_over_one_found_here(
    tmp_path: Path, redis_server: RedisServer, own_redis_server: RedisServer
) -> None:
    path = conf(tmp_path / "elsewhere" / "a.yml")
    record(tmp_path / "elsewhere", own_redis_server.url)
    record(tmp_path / "conf", redis_server.url)
    where = app_location(files=[path])
    assert (where.url, where.step) == (own_redis_server.url, locate.EMBEDDED)


def test_a_named_config_whose_redis_is_not_running_is_an_error_not_a_fallback(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, redis_server: RedisServer
) -> None:
    path = conf(tmp_path / "elsewhere" / "a.yml")
    record(tmp_path / "conf", redis_server.url)  # running here: must not be picked
    monkeypatch.setenv("LIMITD_CONFIG", path)
    with pytest.raises(RedisNotFound) as error:
        app_location()
    assert f"{path} names no redis.url" in str(error.value)
    assert f"limitd start {path}" in str(error.value)
    assert str(tmp_path / "elsewhere" / ".limitd") in str(error.value)


def test_an_embedded_redis_running_in_conf_wins_over_the_default(
    tmp_path: Path, redis_server: RedisServer, caplog: pytest.LogCaptureFixture
) -> None:
    record(tmp_path / "conf", redis_server.url)
    with caplog.at_level(logging.WARNING, logger="limitd.locate"):
        where = app_location()
    assert (where.url, where.step) == (redis_server.url, locate.DISCOVERED)
    assert str(tmp_path / "conf" / ".limitd") in caplog.text
    assert "LIMITD_CONFIG" in caplog.text


def test_an_embedded_redis_running_here_is_found_too(
    tmp_path: Path, redis_server: RedisServer
) -> None:
    record(tmp_path, redis_server.url)
    assert app_location().url == redis_server.url


def test_a_record_whose_redis_is_gone_is_ignored(tmp_path: Path) -> None:
    record(tmp_path / "conf", dead_url())
    where = app_location()
    assert (where.url, where.step) == ("redis://127.0.0.1:6379/0", locate.DEFAULT)


def test_two_running_embedded_servers_here_are_ambiguous(
    tmp_path: Path, redis_server: RedisServer, own_redis_server: RedisServer
) -> None:
    record(tmp_path, redis_server.url)
    record(tmp_path / "conf", own_redis_server.url)
    with pytest.raises(RedisNotFound, match="two embedded limitd Redis servers") as error:
        app_location()
    assert str(tmp_path / ".limitd") in str(error.value)
    assert str(tmp_path / "conf" / ".limitd") in str(error.value)


def test_limitd_config_with_two_paths_merges_them_beside_the_first(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, redis_server: RedisServer
) -> None:
    first = conf(tmp_path / "one" / "base.yml", "queues: [default]\nconcurrency: 3\n")
    second = conf(tmp_path / "two" / "prod.yml", "concurrency: 7\n")
    record(tmp_path / "one", redis_server.url)
    record(tmp_path / "two", dead_url())
    monkeypatch.setenv("LIMITD_CONFIG", os.pathsep.join([first, second]))
    where = app_location()
    assert (where.url, where.step) == (redis_server.url, locate.EMBEDDED)
    assert where.config is not None
    assert where.config.capsules[0].config.concurrency == 7


def test_the_second_limitd_config_file_can_name_the_url(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    first = conf(tmp_path / "base.yml")
    second = conf(tmp_path / "prod.yml", "redis: {url: redis://prod:1/0}\n")
    monkeypatch.setenv("LIMITD_CONFIG", f"{first}{os.pathsep}{second}")
    assert app_location().url == "redis://prod:1/0"


def test_explicit_config_files_take_the_place_of_limitd_config(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setenv("LIMITD_CONFIG", conf(tmp_path / "env.yml", "redis: {url: redis://e:1/0}"))
    given = conf(tmp_path / "given.yml", "redis: {url: redis://g:1/0}")
    assert app_location(files=[given]).url == "redis://g:1/0"
    assert locate.config_files([given]) == [given]


def test_the_default_client_follows_the_order(
    monkeypatch: pytest.MonkeyPatch,
    tmp_path: Path,
    redis: redis_py.Redis,
    redis_server: RedisServer,
) -> None:
    """App code that never calls configure(): LIMITD_CONFIG's Redis gets the job."""
    path = conf(tmp_path / "a.yml", f"redis: {{url: '{redis_server.url}'}}\n")
    monkeypatch.setenv("LIMITD_CONFIG", path)
    limitd.set_default_client(None)

    @limitd.job(name="resolution.Noop")
    def noop() -> None:
        pass

    noop.perform_async()
    assert redis.llen("queue:default") == 1


def test_configure_refuses_a_config_whose_redis_is_not_running(tmp_path: Path) -> None:
    with pytest.raises(RedisNotFound, match="is not running"):
        limitd.configure(conf(tmp_path / "a.yml"))


def test_start_reads_the_c_files_then_its_own_else_limitd_config(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    class Args:
        config = ["base.yml"]
        files = ["prod.yml"]

    assert given_files(Args()) == ["base.yml", "prod.yml"]  # type: ignore[arg-type]
    Args.config, Args.files = [], []
    monkeypatch.setenv("LIMITD_CONFIG", f"a.yml{os.pathsep}b.yml")
    assert given_files(Args()) == ["a.yml", "b.yml"]  # type: ignore[arg-type]


def test_start_exports_the_config_paths_for_its_children_and_says_so(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    path = conf(tmp_path / "conf" / "a.yml")
    where = locate.Location("unix:///x.sock", locate.EMBEDDED, "the embedded Redis")
    with caplog.at_level(logging.INFO, logger="limitd.cli"):
        share_location(where, ["conf/a.yml"])
    assert os.environ["LIMITD_CONFIG"] == path
    assert f"export LIMITD_CONFIG={path}" in caplog.text


def test_start_exports_a_url_given_on_the_command_line_with_its_password_masked(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    conf(tmp_path / "a.yml")
    where = locate.Location("redis://u:secret@h:1/0", locate.EXPLICIT, "the URL given")
    with caplog.at_level(logging.INFO, logger="limitd.cli"):
        share_location(where, ["a.yml"])
    assert os.environ["LIMITD_REDIS_URL"] == "redis://u:secret@h:1/0"
    assert "export LIMITD_REDIS_URL='redis://u:***@h:1/0'" in caplog.text
    assert "secret" not in caplog.text


APP = textwrap.dedent("""
    import os, pathlib, limitd

    OUT = pathlib.Path(__file__).with_name("ran.txt")

    @limitd.job(name="res_app.Record")
    def record(text):
        with OUT.open("a") as f:
            f.write(text + " " + os.environ.get("LIMITD_CONFIG", "-") + "\\n")
""")

ENQUEUE = "import res_app, sys; print(res_app.record.perform_async(sys.argv[1]))"


@dataclass
class Quickstart:
    """A repository-like root with ``conf/app.yml`` and the app, where ``limitd start
    conf/app.yml`` runs with its embedded Redis in ``conf/.limitd/``."""

    root: Path
    env: dict[str, str]  # no Redis or config in it, as in a fresh terminal
    conn: redis_py.Redis

    def ran(self) -> list[str]:
        path = self.root / "ran.txt"
        return path.read_text().splitlines() if path.exists() else []

    def run(
        self, *argv: str, cwd: Path | None = None, **env: str
    ) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [sys.executable, *argv],
            cwd=cwd or self.root,
            env={**self.env, **env},
            capture_output=True,
            text=True,
            check=False,
            timeout=60,
        )


@pytest.fixture(scope="module")
def quickstart(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Quickstart]:
    root = tmp_path_factory.mktemp("checkout")
    (root / "res_app.py").write_text(APP)
    conf(root / "conf" / "app.yml", "require: [res_app]\nqueues: [default]\ntimeout: 1\n")
    env = {k: v for k, v in os.environ.items() if k not in ENV_VARS}
    proc = limitd_start(root, "conf/app.yml", env=env)
    url_file = root / "conf" / ".limitd" / "redis.url"
    try:
        wait_for(url_file.exists, timeout=20, message="the embedded Redis")
        with redis_py.Redis.from_url(url_file.read_text().strip()) as conn:
            wait_for(
                lambda: conn.scard(keys.of(conn).CAPSULES) == 1, timeout=20, message="a capsule"
            )
            yield Quickstart(root, env, conn)
    finally:
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=30) == 0


def test_app_code_run_from_the_root_reaches_the_embedded_redis(quickstart: Quickstart) -> None:
    out = quickstart.run("-c", ENQUEUE, "from-root")
    assert out.returncode == 0, out.stderr
    assert len(out.stdout.strip()) == 24
    assert str(quickstart.root / "conf" / ".limitd") in out.stderr  # the warning says where
    wait_for(lambda: any(line.startswith("from-root ") for line in quickstart.ran()))


def test_start_logs_the_line_that_app_code_elsewhere_exports(
    quickstart: Quickstart, tmp_path: Path
) -> None:
    config = str((quickstart.root / "conf" / "app.yml").resolve())
    log = (quickstart.root / "limitd.log").read_text()
    assert f"export LIMITD_CONFIG={config}" in log
    out = quickstart.run(
        "-c",
        ENQUEUE,
        "from-elsewhere",
        cwd=tmp_path,
        LIMITD_CONFIG=config,
        PYTHONPATH=str(quickstart.root),
    )
    assert out.returncode == 0, out.stderr
    assert out.stderr == ""  # a named config: nothing to warn about
    wait_for(lambda: f"from-elsewhere {config}" in quickstart.ran(), message="the job")


def test_workers_pass_limitd_config_on_to_their_jobs(quickstart: Quickstart) -> None:
    config = str((quickstart.root / "conf" / "app.yml").resolve())
    quickstart.run("-c", ENQUEUE, "env-check")
    wait_for(lambda: f"env-check {config}" in quickstart.ran(), message="the job")


def test_commands_run_from_the_root_find_the_embedded_redis(quickstart: Quickstart) -> None:
    out = quickstart.run("-m", "limitd.cli", "queues", "--json")
    assert out.returncode == 0, out.stderr
    assert "default" in out.stdout


def test_a_command_naming_a_config_that_is_not_running_says_so(tmp_path: Path) -> None:
    conf(tmp_path / "conf" / "other.yml")
    env = {k: v for k, v in os.environ.items() if k not in ENV_VARS}
    out = subprocess.run(
        [sys.executable, "-m", "limitd.cli", "-C", "conf/other.yml", "queues"],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        check=False,
    )
    assert out.returncode == 69
    assert "conf/other.yml names no redis.url" in out.stderr
    assert "limitd start conf/other.yml" in out.stderr
