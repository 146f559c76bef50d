"""App hooks under a real ``limitd start``: the config requires an app module that
declares a Sentry-style error reporter (``examples/sentry_style.py``) and lifecycle
hooks with ``limitd.configure_server``. A job fails twice then succeeds, another dies;
the reporter must hear each failure with its jid, class, queue and retry count (and no
arguments), the death once; the capsule process runs startup, then quiet on TSTP (once,
though TERM quiets again), then shutdown on TERM. Everything is written by the app to a
JSON-lines file, read with deadlines."""

from __future__ import annotations

import json
import os
import signal
import textwrap
from pathlib import Path
from typing import Any

import redis as redis_py

import limitd
from limitd.connection.embedded import RedisServer
from tests.helpers import LimitdProcesses, wait_for

REPO = Path(__file__).resolve().parent.parent
APP = textwrap.dedent("""
    import os, sys
    from pathlib import Path

    sys.path.insert(0, {repo!r})  # the examples package, beside limitd
    import limitd
    from examples.sentry_style import ErrorReporter, file_transport

    send = file_transport(Path(__file__).resolve().with_name("events.jsonl"))
    reporter = ErrorReporter(send, release="test")


    def note(kind):
        send({{"kind": kind, "process": os.getpid()}})


    note("imported")


    @limitd.job(name="ah.FailsTwice", queue="hooks", retry_in=lambda count, exc, p: 0.2)
    def fails_twice():
        runs = limitd.redis_client().incr("ah:runs")
        if runs <= 2:
            raise ValueError(f"run {{runs}}")
        limitd.redis_client().set("ah:succeeded", 1)


    @limitd.job(name="ah.Doomed", queue="hooks", retry=1, retry_in=lambda count, exc, p: 0.2)
    def doomed(secret):
        raise RuntimeError("never works")


    @limitd.configure_server
    def setup(config: limitd.ServerConfig) -> None:
        note("configured")
        config.error_handlers.append(reporter.capture)
        config.death_handlers.append(reporter.capture_death)
        for event in ("startup", "quiet", "shutdown"):
            config.on(event, lambda event=event: note(event))
""")
CONFIG = textwrap.dedent("""
    require: [hooks_app]
    queues: [hooks]
    concurrency: 2
    timeout: 5
""")


def events(app_dir: Path) -> list[dict[str, Any]]:
    path = app_dir / "events.jsonl"
    if not path.exists():
        return []
    # A line is read only once its newline is there: the app may be writing the last one
    # (one write() is not seen whole by a concurrent read).
    complete = path.read_text().rpartition("\n")[0]
    return [json.loads(line) for line in complete.splitlines()]


def kinds(app_dir: Path) -> list[str]:
    return [event["kind"] for event in events(app_dir) if "kind" in event]


def test_a_sentry_style_reporter_and_lifecycle_hooks_under_limitd_start(
    tmp_path: Path, redis_server: RedisServer, redis: redis_py.Redis
) -> None:
    (tmp_path / "hooks_app.py").write_text(APP.format(repo=str(REPO)))
    (tmp_path / "hooks.yml").write_text(CONFIG)
    processes = LimitdProcesses(tmp_path, redis_server.url)

    def output() -> str:
        return (tmp_path / "limitd.log").read_text()

    try:
        proc = processes.start("hooks.yml")
        wait_for(lambda: "startup" in kinds(tmp_path), timeout=30, message="startup hook")
        client = limitd.Client(redis)
        flaky = client.push({"class": "ah.FailsTwice", "args": [], "queue": "hooks"})
        dead = client.push({"class": "ah.Doomed", "args": ["s3cret"], "queue": "hooks", "retry": 1})

        def reported() -> list[dict[str, Any]]:
            return [e for e in events(tmp_path) if "exception" in e]

        wait_for(
            lambda: len(reported()) == 5 and redis.get("ah:succeeded"),
            timeout=30,
            message=f"five reports and a success\n{output()}",
        )
        os.kill(proc.pid, signal.SIGTSTP)  # the supervisor relays it to its children
        wait_for(lambda: "quiet" in kinds(tmp_path), timeout=15, message="quiet hook")
        os.kill(proc.pid, signal.SIGTERM)
        assert proc.wait(timeout=30) == 0, output()
    finally:
        processes.kill_all()

    failures = [e["extra"] for e in reported() if e["level"] != "fatal"]
    seen = sorted(
        (f["class"], f["jid"], f["queue"], f["retry_count"], f["will_retry"]) for f in failures
    )
    assert seen == sorted(  # retry_count and will_retry as recorded in each
        [
            ("ah.FailsTwice", flaky, "hooks", 0, True),
            ("ah.FailsTwice", flaky, "hooks", 1, True),
            ("ah.Doomed", dead, "hooks", 0, True),
            ("ah.Doomed", dead, "hooks", 1, False),
        ]
    )
    assert not any("args" in f or "s3cret" in json.dumps(f) for f in failures)
    (death,) = [e for e in reported() if e["level"] == "fatal"]
    assert death["extra"]["jid"] == dead and death["exception"]["value"] == "never works"

    # Imported once, by the supervisor before it forked; the rest in the capsule process.
    by_kind = {event["kind"]: event["process"] for event in events(tmp_path) if "kind" in event}
    assert kinds(tmp_path) == ["imported", "configured", "startup", "quiet", "shutdown"]
    assert by_kind["imported"] == proc.pid
    capsule_pids = {by_kind[k] for k in ("configured", "startup", "quiet", "shutdown")}
    assert len(capsule_pids) == 1 and proc.pid not in capsule_pids
    assert {e["process"] for e in reported()} == capsule_pids
