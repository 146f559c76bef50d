"""Wire compatibility with Ruby Sidekiq, checked against the real thing.

Needs ``ruby`` and the Sidekiq gem (Debian: ``apt-get install ruby-sidekiq``; CI installs
it). Skipped without them, unless LIMITD_REQUIRE_SIDEKIQ=1 makes their absence a failure.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import textwrap
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest
import redis as redis_py

import limitd
from limitd.connection.embedded import RedisServer
from limitd.supervisor import Capsule, CapsuleConfig
from tests.helpers import LimitdProcesses, children, wait_for

HAVE_SIDEKIQ = bool(shutil.which("ruby") and shutil.which("sidekiq"))
if not HAVE_SIDEKIQ and os.environ.get("LIMITD_REQUIRE_SIDEKIQ") == "1":
    raise RuntimeError("LIMITD_REQUIRE_SIDEKIQ=1 but ruby/sidekiq are not installed")
pytestmark = pytest.mark.skipif(not HAVE_SIDEKIQ, reason="ruby and sidekiq not installed")

RUBY_APP = textwrap.dedent("""
    require "sidekiq"
    require "json"

    class HardJob
      include Sidekiq::Worker
      sidekiq_options queue: "critical", retry: 3
    end

    class RubyEcho
      include Sidekiq::Worker
      def perform(*args)
        Sidekiq.redis { |c| c.rpush("ruby_ran", JSON.generate(args)) }
      end
    end

    class RubyFails
      include Sidekiq::Worker
      def perform(*)
        raise ArgumentError, "raised in ruby"
      end
    end
""")

received: list[list[object]] = []


class HardJob(limitd.Job, name="HardJob", queue="critical"):
    def perform(self, name: str, count: int) -> None:
        received.append([name, count])


@limitd.job(name="interop.PythonFails", retry=2)
def python_fails() -> None:
    raise KeyError("raised in python")


ruby_looked = threading.Event()


@limitd.job(name="interop.WaitsForRuby", queue="busy_page")
def waits_for_ruby() -> None:
    ruby_looked.wait(60)


@pytest.fixture
def ruby_app(tmp_path: Path, redis_server: RedisServer) -> Path:
    (tmp_path / "app.rb").write_text(RUBY_APP)
    return tmp_path


def ruby(app: Path, code: str, server: RedisServer) -> str:
    script = (
        f'require "./app"\nSidekiq.configure_client {{ |c| c.redis = {{ url: '
        f'"{server.url}" }} }}\n{code}'
    )
    out = subprocess.run(
        ["ruby", "-e", script], cwd=app, capture_output=True, text=True, timeout=60, check=True
    )
    return out.stdout


@pytest.fixture
def sidekiq(
    ruby_app: Path, redis_server: RedisServer, redis: redis_py.Redis
) -> Iterator[subprocess.Popen[bytes]]:
    env = {**os.environ, "REDIS_URL": redis_server.url}
    proc = subprocess.Popen(
        ["sidekiq", "-r", "./app.rb", "-q", "ruby", "-c", "2"],
        cwd=ruby_app,
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    yield proc
    proc.send_signal(signal.SIGTERM)
    proc.wait(timeout=30)


def test_ruby_client_jobs_run_in_limitd(
    ruby_app: Path, redis_server: RedisServer, redis: redis_py.Redis
) -> None:
    received.clear()
    jids = ruby(
        ruby_app,
        'puts HardJob.perform_async("bob", 5)\nputs HardJob.perform_in(3600, "later", 7)',
        redis_server,
    ).split()
    capsule = Capsule(CapsuleConfig(queues=["critical"]), redis=redis)
    assert capsule.drain() == {"done": 1}
    assert received == [["bob", 5]]
    assert capsule.poller.enqueue_due(now=limitd.clock.now() + 7200) == 1
    assert capsule.drain() == {"done": 1}
    assert received == [["bob", 5], ["later", 7]]
    assert len(jids) == 2


def test_ruby_pushes_reach_a_running_capsule_that_lists_many_queues(
    ruby_app: Path, redis_server: RedisServer, redis: redis_py.Redis
) -> None:
    """A Ruby client publishes no wake-up: a job it pushes into a queue that is already
    in the capsule's ready index runs at once, one pushed into an empty queue once the
    index's sweep reaches that queue (limitd/fetch/ready_index.py)."""
    received.clear()
    queues = [f"tenant_{i:04d}" for i in range(500)]
    config = CapsuleConfig(queues=queues, heartbeat_period=0.2, index_sweep=1000)
    capsule = Capsule(config, redis=redis)
    capsule.start()
    try:
        ruby(
            ruby_app,
            'HardJob.set(queue: "tenant_0321").perform_async("first", 1)\n'
            'HardJob.set(queue: "tenant_0007").perform_async("second", 2)',
            redis_server,
        )
        wait_for(lambda: len(received) == 2, timeout=30, message="both Ruby jobs to run")
    finally:
        capsule.stop(timeout=5)
    assert sorted(received) == [["first", 1], ["second", 2]]


def test_limitd_jobs_run_in_ruby_sidekiq(
    sidekiq: subprocess.Popen[bytes], redis: redis_py.Redis
) -> None:
    limitd.Client(redis).push(
        {"class": "RubyEcho", "queue": "ruby", "args": [1, "two", {"k": [3.5, None, True]}]}
    )
    wait_for(lambda: redis.llen("ruby_ran") == 1, timeout=30, message="sidekiq to run it")
    assert json.loads(redis.lindex("ruby_ran", 0)) == [1, "two", {"k": [3.5, None, True]}]


def test_ruby_retries_are_readable_by_limitd(
    sidekiq: subprocess.Popen[bytes], redis: redis_py.Redis
) -> None:
    jid = limitd.Client(redis).push({"class": "RubyFails", "queue": "ruby", "args": [], "retry": 2})
    wait_for(lambda: redis.zcard("retry") == 1, timeout=30, message="sidekiq to fail it")
    from limitd.payload import parse, to_seconds

    entry = parse(redis.zrange("retry", 0, 0)[0])
    assert entry["jid"] == jid
    assert entry["retry_count"] == 0
    assert entry["error_class"] == "ArgumentError"
    assert to_seconds(entry["failed_at"]) is not None


def test_limitd_retries_are_readable_by_ruby(
    ruby_app: Path, redis_server: RedisServer, redis: redis_py.Redis
) -> None:
    jid = python_fails.perform_async()
    Capsule(CapsuleConfig(), redis=redis).drain()
    out = ruby(
        ruby_app,
        'require "sidekiq/api"\n'
        "Sidekiq::RetrySet.new.each { |e| puts [e.jid, e.klass, "
        'e["retry_count"], e["error_class"], e.queue].join(" ") }\n'
        "puts Sidekiq::Stats.new.processed",
        redis_server,
    )
    assert out.split("\n")[:2] == [f"{jid} interop.PythonFails 0 KeyError default", "1"]


def test_ruby_sidekiq_6_lists_running_limitd_jobs(
    ruby_app: Path, redis_server: RedisServer, redis: redis_py.Redis
) -> None:
    """Sidekiq 6's ``Workers`` (its Busy page) reads ``<identity>:workers``, not ``:work``."""
    ruby_looked.clear()
    config = CapsuleConfig(queues=["busy_page"], concurrency=2, record_period=0.05)
    capsule = Capsule(config, redis=redis)
    capsule.start()
    try:
        jid = waits_for_ruby.perform_async()
        workers_key = f"{capsule.identity}:workers"
        wait_for(lambda: redis.hlen(workers_key) == 1, message="the running job's row")
        out = ruby(
            ruby_app,
            'require "sidekiq/api"\n'
            "Sidekiq::Workers.new.each { |process, _thread, work| puts [process, "
            'work["queue"], work["payload"]["class"], work["payload"]["jid"]].join(" ") }\n'
            "puts Sidekiq::Workers.new.size",
            redis_server,
        )
    finally:
        ruby_looked.set()
        capsule.stop(timeout=5)
    row = f"{capsule.identity} busy_page interop.WaitsForRuby {jid}"
    assert out.split("\n")[:2] == [row, "1"]


PYTHON_APP = textwrap.dedent("""
    import limitd
    from limitd.client import default_client

    @limitd.job(name="interop_app.Done", queue="work")
    def done(n):
        default_client().redis.sadd("done", n)
""")


def test_ruby_stats_and_process_set_are_current_after_jobs_and_a_crash(
    ruby_app: Path, redis_server: RedisServer, redis: redis_py.Redis
) -> None:
    """Ruby reads the counters right after the jobs (not a heartbeat later), and a
    SIGKILLed child leaves ``ProcessSet`` at once while its replacement joins it."""
    (ruby_app / "interop_app.py").write_text(PYTHON_APP)
    processes = LimitdProcesses(ruby_app, redis_server.url)
    flags = ("-r", "interop_app", "-q", "work", "-p", "2", "--heartbeat-period", "30")
    supervisor = processes.start(*flags)
    listed = (
        'require "sidekiq/api"\nputs Sidekiq::ProcessSet.new.map { |p| p["pid"] }.sort.join(",")'
    )
    try:
        wait_for(lambda: len(children(supervisor.pid)) == 2, timeout=20, message="2 children")
        pids = children(supervisor.pid)
        wait_for(
            lambda: ruby(ruby_app, listed, redis_server).split() == [",".join(map(str, pids))],
            timeout=30,
            message="both processes in Ruby's ProcessSet",
        )
        limitd.Client(redis).push_bulk(
            {"class": "interop_app.Done", "queue": "work"}, [[n] for n in range(30)]
        )
        wait_for(lambda: redis.scard("done") == 30, timeout=30, message="30 jobs")
        stats = 'require "sidekiq/api"\nputs Sidekiq::Stats.new.processed'
        wait_for(
            lambda: ruby(ruby_app, stats, redis_server).strip() == "30",
            timeout=5,
            message="Sidekiq::Stats at 30",
        )
        victim = pids[0]
        os.kill(victim, signal.SIGKILL)
        wait_for(
            lambda: str(victim) not in ruby(ruby_app, listed, redis_server).strip().split(","),
            timeout=15,
            message="the dead child gone from Ruby's ProcessSet",
        )
        wait_for(
            lambda: len(ruby(ruby_app, listed, redis_server).strip().split(",")) == 2,
            timeout=30,
            message="the replacement in Ruby's ProcessSet",
        )
    finally:
        processes.kill_all()
