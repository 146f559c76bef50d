"""``limitd start`` / ``limitd enqueue`` as real subprocesses, with real signals."""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import textwrap
from collections.abc import Iterator
from pathlib import Path

import pytest
import redis as redis_py

from limitd.cli import build_parser, parse_args
from limitd.connection.embedded import RedisServer
from tests.helpers import wait_for

APP = textwrap.dedent("""
    import pathlib, threading, limitd

    OUT = pathlib.Path(__file__).with_name("ran.txt")
    release = threading.Event()

    @limitd.job(name="cli_app.Record")
    def record(text):
        with OUT.open("a") as f:
            f.write(text + "\\n")

    @limitd.job(name="cli_app.Forever")
    def forever():
        record("started")
        while not release.wait(0.01):
            pass
""")


@pytest.fixture
def app_dir(tmp_path: Path) -> Path:
    (tmp_path / "cli_app.py").write_text(APP)
    return tmp_path


def limitd_cmd(*args: str) -> list[str]:
    return [sys.executable, "-m", "limitd.cli", *args]


@pytest.fixture
def worker(
    app_dir: Path, redis_server: RedisServer, redis: redis_py.Redis
) -> Iterator[subprocess.Popen[str]]:
    env = {**os.environ, "LIMITD_REDIS_URL": redis_server.url}
    with (app_dir / "worker.log").open("w") as log:
        proc = subprocess.Popen(
            limitd_cmd("start", "-r", "cli_app", "-c", "2", "-t", "1"),
            cwd=app_dir,
            env=env,
            stdout=log,
            stderr=subprocess.STDOUT,
            text=True,
        )
    wait_for(lambda: redis.scard("processes") == 1, message="worker heartbeat")
    yield proc
    if proc.poll() is None:
        proc.kill()
        proc.wait()


def ran(app_dir: Path) -> list[str]:
    path = app_dir / "ran.txt"
    return path.read_text().split() if path.exists() else []


def test_enqueue_then_worker_runs_it(
    worker: subprocess.Popen[str], app_dir: Path, redis_server: RedisServer
) -> None:
    out = subprocess.run(
        limitd_cmd(
            "--redis", redis_server.url, "enqueue", "cli_app.Record", '["hello"]', "-r", "cli_app"
        ),
        cwd=app_dir,
        capture_output=True,
        text=True,
        check=True,
    )
    assert len(out.stdout.strip()) == 24
    wait_for(lambda: ran(app_dir) == ["hello"], message="the job to run")


def test_term_requeues_a_job_past_the_timeout(
    worker: subprocess.Popen[str], app_dir: Path, redis: redis_py.Redis
) -> None:
    redis.lpush(
        "queue:default", json.dumps({"class": "cli_app.Forever", "args": [], "jid": "f" * 24})
    )
    wait_for(lambda: ran(app_dir) == ["started"], message="the long job to start")
    worker.send_signal(signal.SIGTERM)
    assert worker.wait(timeout=10) == 0
    [job] = redis.lrange("queue:default", 0, -1)
    assert json.loads(job)["jid"] == "f" * 24
    assert redis.scard("processes") == 0


def test_tstp_quiets_and_ttin_dumps_stacks(
    worker: subprocess.Popen[str], app_dir: Path, redis: redis_py.Redis
) -> None:
    identity = redis.smembers("processes").pop()
    worker.send_signal(signal.SIGTSTP)
    wait_for(
        lambda: redis.hget(identity, "quiet") == b"true",
        timeout=15,
        message="quiet flag in the process record",
    )
    worker.send_signal(signal.SIGTTIN)
    log = app_dir / "worker.log"
    wait_for(lambda: "thread limitd-heartbeat" in log.read_text(), message="stack dump")
    worker.send_signal(signal.SIGINT)
    assert worker.wait(timeout=10) == 0
    assert "received TSTP" in log.read_text()


def test_missing_module_is_a_config_error(tmp_path: Path) -> None:
    out = subprocess.run(
        limitd_cmd("start", "-r", "no_such_module_here"),
        cwd=tmp_path,
        capture_output=True,
        text=True,
        check=False,
    )
    assert out.returncode == 78
    assert "cannot import required module 'no_such_module_here'" in out.stderr


def test_enqueue_rejects_bad_arguments(redis_server: RedisServer) -> None:
    out = subprocess.run(
        limitd_cmd("--redis", redis_server.url, "enqueue", "X", "{1"),
        capture_output=True,
        text=True,
        check=False,
    )
    assert out.returncode == 64
    assert "JSON list" in out.stderr


def test_version() -> None:
    out = subprocess.run(limitd_cmd("--version"), capture_output=True, text=True, check=True)
    assert out.stdout.startswith("limitd ")


APP_CONFIG = "require: [cli_app]\nqueues: [default]\ntimeout: 1\n"
# The same as Sidekiq users write it: symbol keys, a weighted queue, require as a string.
SIDEKIQ_CONFIG = ":require: cli_app\n:concurrency: 2\n:queues:\n  - [default, 2]\n:timeout: 1\n"


@pytest.mark.parametrize(
    ("argv", "config"),
    [
        (("-C", "app.yml", "start"), APP_CONFIG),
        (("start", "-C", "app.yml"), APP_CONFIG),  # where a Sidekiq user puts it
        (("start", "--config", "app.yml"), SIDEKIQ_CONFIG),
    ],
)
def test_c_names_the_config_of_start_too(
    app_dir: Path,
    redis_server: RedisServer,
    redis: redis_py.Redis,
    argv: tuple[str, ...],
    config: str,
) -> None:
    """``limitd -C app.yml start`` and ``limitd start -C app.yml`` are ``limitd start
    app.yml``: its workers import the app's jobs (they used to start with none and retry
    every job as unknown)."""
    (app_dir / "app.yml").write_text(config)
    env = {**os.environ, "LIMITD_REDIS_URL": redis_server.url}
    with (app_dir / "worker.log").open("w") as log:
        proc = subprocess.Popen(
            limitd_cmd(*argv),
            cwd=app_dir,
            env=env,
            stdout=log,
            stderr=subprocess.STDOUT,
        )
    try:
        redis.lpush("queue:default", json.dumps({"class": "cli_app.Record", "args": ["via-c"]}))
        wait_for(lambda: ran(app_dir) == ["via-c"], timeout=20, message="the app's job to run")
        assert redis.zcard("retry") == 0
    finally:
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=15) == 0, (app_dir / "worker.log").read_text()


@pytest.mark.parametrize(
    "argv", [("-C", "app.yml", "check"), ("check", "-C", "app.yml"), ("check", "--config=app.yml")]
)
def test_c_names_the_config_of_check_too(app_dir: Path, argv: tuple[str, ...]) -> None:
    (app_dir / "app.yml").write_text(APP_CONFIG)
    out = subprocess.run(
        limitd_cmd(*argv),
        cwd=app_dir,
        capture_output=True,
        text=True,
        check=False,
    )
    assert out.returncode == 0, out.stderr
    assert "cli_app" in out.stdout


def test_check_after_c_reports_a_mistake_in_that_file(app_dir: Path) -> None:
    (app_dir / "sidekiq.yml").write_text(":concurrency: 5\n:pidfile: tmp/sidekiq.pid\n")
    out = subprocess.run(
        limitd_cmd("check", "-C", "sidekiq.yml"),
        cwd=app_dir,
        capture_output=True,
        text=True,
        check=False,
    )
    assert out.returncode == 78
    assert "sidekiq.yml: pidfile: limitd writes no pid file" in out.stderr


def test_check_without_any_config_is_bad_input(tmp_path: Path) -> None:
    env = {k: v for k, v in os.environ.items() if k != "LIMITD_CONFIG"}
    out = subprocess.run(
        limitd_cmd("check"), cwd=tmp_path, env=env, capture_output=True, text=True, check=False
    )
    assert out.returncode == 64
    assert "LIMITD_CONFIG" in out.stderr


def test_enqueue_of_a_name_no_module_defines_lists_the_names_that_exist(
    app_dir: Path, redis_server: RedisServer, redis: redis_py.Redis
) -> None:
    (app_dir / "app.yml").write_text(APP_CONFIG)
    out = subprocess.run(
        limitd_cmd("--redis", redis_server.url, "-C", "app.yml", "enqueue", "cli_app.Recrod"),
        cwd=app_dir,
        capture_output=True,
        text=True,
        check=False,
    )
    assert out.returncode == 64
    assert "no job named 'cli_app.Recrod' in cli_app" in out.stderr
    assert "cli_app.Forever, cli_app.Record" in out.stderr
    assert "--force" in out.stderr
    assert redis.llen("queue:default") == 0


def test_enqueue_force_pushes_a_job_only_other_workers_know(
    tmp_path: Path, redis_server: RedisServer, redis: redis_py.Redis
) -> None:
    out = subprocess.run(
        limitd_cmd("--redis", redis_server.url, "enqueue", "HardJob", '["x", 1]', "--force"),
        cwd=tmp_path,
        capture_output=True,
        text=True,
        check=False,
    )
    assert out.returncode == 0, out.stderr
    [job] = redis.lrange("queue:default", 0, -1)
    assert json.loads(job)["class"] == "HardJob"
    assert json.loads(job)["jid"] == out.stdout.strip()


def every_parser(
    parser: argparse.ArgumentParser, path: str = "limitd"
) -> Iterator[tuple[str, argparse.ArgumentParser]]:
    yield path, parser
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, sub in action.choices.items():
                yield from every_parser(sub, f"{path} {name}")


def test_every_command_takes_c_after_its_name_too() -> None:
    missing = [
        path
        for path, parser in every_parser(build_parser())
        if not {"-C", "--config"} <= set(parser._option_string_actions)
    ]
    assert not missing


@pytest.mark.parametrize(
    ("argv", "files"),
    [
        (["-C", "a.yml", "start", "x.yml", "-C", "b.yml"], ["a.yml", "b.yml"]),
        (
            ["-C", "t.yml", "limit", "-C", "a.yml", "set", "-C", "b.yml", "q", "3"],
            ["t.yml", "a.yml", "b.yml"],
        ),
        (["retries", "list", "--config", "z.yml", "-C", "y.yml"], ["z.yml", "y.yml"]),
        (["status"], []),
    ],
)
def test_c_files_count_wherever_they_are_typed_in_order(argv: list[str], files: list[str]) -> None:
    args = parse_args(argv)
    assert args.config == files
    assert not [name for name in vars(args) if name.startswith("config_after")]


def test_an_admin_command_finds_redis_through_c_after_its_name(
    tmp_path: Path, redis_server: RedisServer, redis: redis_py.Redis
) -> None:
    redis.lpush("queue:via_c", "{}")
    redis.sadd("queues", "via_c")
    (tmp_path / "app.yml").write_text(f"redis:\n  url: {redis_server.url}\n")
    env = {k: v for k, v in os.environ.items() if not k.endswith("REDIS_URL")}
    out = subprocess.run(
        limitd_cmd("queues", "--json", "-C", "app.yml"),
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        check=False,
    )
    assert out.returncode == 0, out.stderr
    assert [row["name"] for row in json.loads(out.stdout)] == ["via_c"]


def test_start_takes_sidekiqs_v_and_g_and_refuses_e_with_what_to_do() -> None:
    args = parse_args(["start", "-v", "-g", "blue"])
    assert args.verbose is True and args.tag == "blue"
    assert parse_args(["-v", "start"]).verbose is True  # before the command, as ever
    out = subprocess.run(
        limitd_cmd("start", "-e", "production"), capture_output=True, text=True, check=False
    )
    assert out.returncode == 2
    assert "limitd has no environments" in out.stderr
    assert "limitd start base.yml production.yml" in out.stderr
