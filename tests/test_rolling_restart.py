"""Signals an operator sends to ``limitd start``, and the rolling restart (USR2): real
subprocesses, real signals, a job module changed on disk between two deploys."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
from collections.abc import Callable
from pathlib import Path

import httpx2 as httpx
import pytest
import redis as redis_py

from limitd import keys
from limitd.api import Processes
from limitd.connection.embedded import RedisServer
from limitd.supervisor import Capsule, CapsuleConfig
from tests.helpers import children, running, wait_for
from tests.web import Dashboard

APP = """
import os, limitd

VERSION = {version!r}

@limitd.job(name="roll_app.Record", queue="work")
def record(number):
    limitd.redis_client().rpush("ran", f"{{VERSION}} {{number}} {{os.getpid()}}")
"""

CONFIG = """
require: [roll_app]
queues: [work]
concurrency: 2
processes: 2
timeout: 5
heartbeat_period: 0.5
"""


def write_app(app_dir: Path, version: str) -> None:
    # Versions differ in length: a rewrite within the same second must not let Python
    # take the old bytecode for current (its cache checks the source's mtime and size).
    (app_dir / "roll_app.py").write_text(APP.format(version=version))


@pytest.fixture
def app_dir(tmp_path: Path) -> Path:
    write_app(tmp_path, "old")
    (tmp_path / "roll.yml").write_text(CONFIG)
    return tmp_path


def log_text(app_dir: Path) -> str:
    return (app_dir / "limitd.log").read_text(errors="replace")


def fetching(redis: redis_py.Redis) -> int:
    """Processes whose record says they take jobs (written when a capsule starts, and
    marked quiet as soon as it is told to stop)."""
    return sum(1 for process in Processes(redis) if not process.quiet)


class Traffic:
    """Enqueues numbered jobs until stopped and watches, as often as it can, how many
    processes take jobs: the fewest it saw is what a rolling restart must keep above 0."""

    def __init__(self, redis: redis_py.Redis) -> None:
        self.redis = redis
        self.sent = 0
        self.fewest_fetching: int | None = None
        self._done = threading.Event()
        self._threads = [
            threading.Thread(target=self._enqueue),
            threading.Thread(target=self._watch),
        ]

    def __enter__(self) -> Traffic:
        for thread in self._threads:
            thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._done.set()
        for thread in self._threads:
            thread.join()

    def _enqueue(self) -> None:
        while not self._done.wait(0.01):  # a steady stream, not a burst
            push(self.redis, self.sent)
            self.sent += 1

    def _watch(self) -> None:
        while not self._done.is_set():
            count = fetching(self.redis)
            if self.fewest_fetching is None or count < self.fewest_fetching:
                self.fewest_fetching = count


def push(redis: redis_py.Redis, number: int) -> None:
    payload = {"class": "roll_app.Record", "args": [number], "jid": f"{number:024x}"}
    redis.lpush(keys.of(redis).queue("work"), json.dumps(payload))


def ran(redis: redis_py.Redis) -> list[tuple[str, int, int]]:
    rows = [row.decode().split() for row in redis.lrange("ran", 0, -1)]
    return [(version, int(number), int(pid)) for version, number, pid in rows]


def wait_until_all_ran(redis: redis_py.Redis, count: int) -> None:
    wait_for(lambda: redis.llen("ran") >= count, timeout=60, message=f"{count} jobs run")


def test_usr2_replaces_every_process_with_new_code_without_stopping_work(
    supervisor: Callable[..., subprocess.Popen[bytes]], redis: redis_py.Redis, app_dir: Path
) -> None:
    proc = supervisor("roll.yml")
    wait_for(lambda: fetching(redis) == 2, timeout=30, message="two processes fetching")
    old = children(proc.pid)
    with Traffic(redis) as traffic:
        wait_for(lambda: redis.llen("ran") >= 20, timeout=30, message="jobs running")
        write_app(app_dir, "renewed")
        proc.send_signal(signal.SIGUSR2)
        wait_for(
            lambda: "rolling restart done" in log_text(app_dir),
            timeout=90,
            message="the rolling restart to end",
        )
    assert traffic.fewest_fetching is not None and traffic.fewest_fetching >= 1
    after_roll = traffic.sent
    for number in range(after_roll, after_roll + 20):
        push(redis, number)
    wait_until_all_ran(redis, after_roll + 20)
    rows = ran(redis)
    assert sorted(number for _, number, _ in rows) == list(range(after_roll + 20)), (
        "every job ran exactly once"
    )
    new = children(proc.pid)
    assert len(new) == 2 and not set(new) & set(old)
    assert {version for version, number, _ in rows if number >= after_roll} == {"renewed"}
    assert {pid for _, number, pid in rows if number >= after_roll} <= set(new)
    assert proc.poll() is None
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(timeout=30) == 0
    assert not any(running(pid) for pid in old + new)


def test_a_new_process_that_fails_to_start_stops_the_roll(
    supervisor: Callable[..., subprocess.Popen[bytes]], redis: redis_py.Redis, app_dir: Path
) -> None:
    proc = supervisor("roll.yml")
    wait_for(lambda: fetching(redis) == 2, timeout=30, message="two processes fetching")
    old = children(proc.pid)
    (app_dir / "roll_app.py").write_text("import limitd\n\ndef broken(:\n")
    proc.send_signal(signal.SIGUSR2)
    wait_for(
        lambda: "rolling restart stopped" in log_text(app_dir),
        timeout=60,
        message="the roll to stop",
    )
    assert "SyntaxError" in log_text(app_dir)
    assert children(proc.pid) == old, "the old processes keep running"
    for number in range(10):
        push(redis, number)
    wait_until_all_ran(redis, 10)
    assert {version for version, _, _ in ran(redis)} == {"old"}
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(timeout=30) == 0


def test_a_rolling_restart_asked_from_afar_reaches_the_supervisor(
    supervisor: Callable[..., subprocess.Popen[bytes]], redis: redis_py.Redis, app_dir: Path
) -> None:
    proc = supervisor("roll.yml")
    wait_for(lambda: fetching(redis) == 2, timeout=30, message="two processes fetching")
    old = children(proc.pid)
    assert Processes(redis).restart(Processes(redis).processes[0].identity)
    wait_for(
        lambda: "rolling restart done" in log_text(app_dir),
        timeout=90,
        message="the rolling restart to end",
    )
    assert not set(children(proc.pid)) & set(old)
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(timeout=30) == 0


IGNORED = [
    signal.SIGALRM,
    signal.SIGTTOU,
    signal.SIGVTALRM,
    signal.SIGPROF,
    signal.SIGIO,
    signal.SIGWINCH,
    signal.SIGCONT,
    signal.SIGURG,
]


def test_stray_signals_leave_the_supervisor_and_its_children_running(
    supervisor: Callable[..., subprocess.Popen[bytes]], redis: redis_py.Redis, app_dir: Path
) -> None:
    proc = supervisor("roll.yml")
    wait_for(lambda: fetching(redis) == 2, timeout=30, message="two processes fetching")
    pids = children(proc.pid)
    for signum in IGNORED:
        proc.send_signal(signum)
    for signum in (signal.SIGUSR2, *IGNORED):
        for pid in pids:  # sent to a child by mistake
            os.kill(pid, signum)
    wait_for(
        lambda: log_text(app_dir).count("received PROF: ignored") == 3,
        message="the supervisor and both children to log the ignored PROF",
    )
    proc.send_signal(signal.SIGUSR1)  # Sidekiq 5's quiet
    wait_for(lambda: fetching(redis) == 0, message="every child quiet")
    assert proc.poll() is None
    assert children(proc.pid) == pids
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(timeout=30) == 0


@pytest.mark.parametrize("stop", [signal.SIGQUIT, signal.SIGINT])
def test_quit_and_int_stop_gracefully(
    supervisor: Callable[..., subprocess.Popen[bytes]],
    redis: redis_py.Redis,
    stop: signal.Signals,
) -> None:
    proc = supervisor("roll.yml")
    wait_for(lambda: fetching(redis) == 2, timeout=30, message="two processes fetching")
    pids = children(proc.pid)
    proc.send_signal(stop)
    assert proc.wait(timeout=30) == 0
    assert not any(running(pid) for pid in pids)
    assert len(Processes(redis)) == 0


def test_the_dashboard_and_the_cli_ask_the_process_for_a_rolling_restart(
    dashboard: Dashboard, redis: redis_py.Redis, redis_server: RedisServer, tmp_path: Path
) -> None:
    """Both leave USR2 for the process, which hands it to ``on_remote_restart`` (under
    a supervisor: USR2 to the supervisor, as the subprocess tests above show)."""
    capsule = Capsule(CapsuleConfig(concurrency=1, record_period=0.05), redis=redis)
    asked = threading.Semaphore(0)
    capsule.on_remote_restart = asked.release
    capsule.start()
    try:
        wait_for(lambda: len(Processes(redis)) == 1, message="the process record")
        with httpx.Client() as http:
            token = http.get(dashboard.url("/busy")).cookies["limitd_csrf"]
            answer = http.post(
                dashboard.url("/busy/restart"), data={"csrf": token, "identity": capsule.identity}
            )
        assert answer.status_code == 303
        assert asked.acquire(timeout=10), "the dashboard's request reached the capsule"
        assert limitd_cli(redis_server, tmp_path, "restart", capsule.identity).returncode == 0
        assert asked.acquire(timeout=10), "the CLI's request reached the capsule"
        unknown = limitd_cli(redis_server, tmp_path, "restart", "nobody:1:x")
        assert unknown.returncode == 1 and "no live process" in unknown.stderr
    finally:
        capsule.stop(timeout=2)


def limitd_cli(
    redis_server: RedisServer, cwd: Path, *args: str
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "limitd.cli", "--redis", redis_server.url, *args],
        cwd=cwd,
        capture_output=True,
        text=True,
        check=False,
        timeout=60,
    )
