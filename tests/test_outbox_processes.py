"""The outbox relay inside a real ``limitd start``, and the ``outbox:`` section's checks.

Until ``limitd.features`` lists the outbox, the subprocess registers it itself (a small
runner script) and in-process tests register it for their own duration."""

from __future__ import annotations

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
from sqlalchemy import Engine, create_engine, text
from sqlalchemy.orm import Session, sessionmaker

import limitd
from limitd.cli import main
from limitd.commands.start import EX_CONFIG
from limitd.config import config_as_dict, load_config
from limitd.connection.embedded import RedisServer
from limitd.outbox.section import OutboxSettings
from limitd.outbox.table import create_table
from limitd.transactions import hold
from limitd.transactions import sqlalchemy as tx
from tests.helpers import wait_for


@limitd.job(name="test_outbox_processes.welcome", queue="relayed")
def welcome(user_id: int) -> None: ...


def start(cwd: Path, *args: str, redis_url: str) -> subprocess.Popen[bytes]:
    with (cwd / "limitd.log").open("ab") as log:
        return subprocess.Popen(
            [sys.executable, "-m", "limitd.cli", *args],
            cwd=cwd,
            env={**os.environ, "LIMITD_REDIS_URL": redis_url},
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )


@pytest.fixture
def supervisors() -> Iterator[list[subprocess.Popen[bytes]]]:
    started: list[subprocess.Popen[bytes]] = []
    yield started
    for proc in started:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()


@dataclass
class Database:
    url: str  # SQLAlchemy's
    table: str
    engine: Engine
    sessions: sessionmaker[Session]

    def rows(self) -> int:
        with self.engine.connect() as conn:
            return int(conn.execute(text(f"SELECT count(*) FROM {self.table}")).scalar_one())


@pytest.fixture
def database(
    postgres_table: tuple[str, str], monkeypatch: pytest.MonkeyPatch
) -> Iterator[Database]:
    """An outbox table, and sessions that write enqueues into it."""
    url, name = postgres_table
    url = url.replace("postgresql://", "postgresql+psycopg://")
    engine = create_engine(url)
    create_table(engine, name)
    monkeypatch.setattr(tx, "_outboxes", [])
    sessions = sessionmaker(engine)
    tx.transaction_aware(sessions, outbox=name)
    yield Database(url, name, engine, sessions)
    hold.remove_provider(tx.current_held)
    engine.dispose()


def relayed(redis: redis_py.Redis) -> list[str]:
    return [limitd.payload.parse(raw)["jid"] for raw in redis.lrange("queue:relayed", 0, -1)]


@pytest.mark.timeout(90)
def test_limitd_start_with_an_outbox_section_relays_committed_rows(
    tmp_path: Path,
    redis_server: RedisServer,
    redis: redis_py.Redis,
    database: Database,
    supervisors: list[subprocess.Popen[bytes]],
) -> None:
    (tmp_path / "outbox.yml").write_text(
        textwrap.dedent(f"""
            queues: [elsewhere]       # the relayed jobs stay in Redis, to be counted
            concurrency: 1
            processes: 2
            outbox:
              url: {database.url}
              table: {database.table}
              poll_interval: 0.05
        """)
    )
    supervisors.append(start(tmp_path, "start", "outbox.yml", redis_url=redis_server.url))
    jids = []
    for batch in range(5):
        with database.sessions() as session, session.begin():
            jids += [welcome.perform_async(batch * 10 + n) for n in range(10)]
    with database.sessions() as session:
        session.begin()
        welcome.perform_async(-1)
        session.rollback()
    wait_for(lambda: database.rows() == 0, 60, "the relay to take every row")
    assert redis.llen("queue:relayed") == 50
    assert sorted(relayed(redis)) == sorted(jids)
    supervisors[0].send_signal(signal.SIGTERM)
    assert supervisors[0].wait(timeout=30) == 0
    log = (tmp_path / "limitd.log").read_text()
    assert log.count("outbox relay started") == 1  # in process 0 only


@pytest.mark.parametrize(
    ("section", "key", "expected"),
    [
        ("{table: limitd_outbox}", "outbox.url", "SQLAlchemy database URL"),
        ("{url: 5}", "outbox.url", "expected a string"),
        ("{url: 'not a url'}", "outbox.url", "SQLAlchemy database URL"),
        (
            "{url: 'postgresql+psycopg://db/app', table: 'x; DROP TABLE y'}",
            "outbox.table",
            "table name",
        ),
        ("{url: 'postgresql+psycopg://db/app', poll_interval: 0}", "outbox.poll_interval", "> 0"),
        ("{url: 'postgresql+psycopg://db/app', chunk: 0}", "outbox.chunk", "integer >= 1"),
        (
            "{url: 'postgresql+psycopg://db/app', pol_interval: 1}",
            "outbox.pol_interval",
            "unknown key",
        ),
    ],
)
def test_config_errors_name_the_file_the_key_and_what_is_expected(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], section: str, key: str, expected: str
) -> None:
    config = tmp_path / "bad.yml"
    config.write_text(f"queues: [default]\noutbox: {section}\n")
    assert main(["check", str(config)]) == EX_CONFIG
    error = capsys.readouterr().err
    assert str(config) in error and key in error and expected in error


def test_limitd_start_exits_78_on_a_bad_outbox_section(
    tmp_path: Path, redis_server: RedisServer, supervisors: list[subprocess.Popen[bytes]]
) -> None:
    (tmp_path / "bad.yml").write_text("queues: [default]\noutbox: {poll_interval: 1}\n")
    supervisors.append(start(tmp_path, "start", "bad.yml", redis_url=redis_server.url))
    assert supervisors[0].wait(timeout=30) == EX_CONFIG
    log = (tmp_path / "limitd.log").read_text()
    assert "bad.yml" in log and "outbox.url" in log


def test_the_outbox_section_is_optional_and_printed_without_the_password(tmp_path: Path) -> None:
    config = tmp_path / "good.yml"
    config.write_text(
        "queues: [default]\noutbox: {url: 'postgresql+psycopg://app:secret@db/app', chunk: 5}\n"
    )
    printed = config_as_dict(load_config([config]))["outbox"]
    assert printed == {
        "url": "postgresql+psycopg://app:***@db/app",
        "table": "limitd_outbox",
        "poll_interval": 1.0,
        "chunk": 5,
    }
    (tmp_path / "none.yml").write_text("queues: [default]\n")
    assert load_config([tmp_path / "none.yml"]).section("outbox") == OutboxSettings()


def test_limitd_outbox_relay_once_and_status(
    redis: redis_py.Redis,
    redis_server: RedisServer,
    database: Database,
    capsys: pytest.CaptureFixture[str],
) -> None:
    with database.sessions() as session, session.begin():
        jids = [welcome.perform_async(n) for n in range(3)]
    flags = ["--url", database.url, "--table", database.table]
    assert main(["outbox", "status", *flags, "--json"]) == 0
    assert '"rows": 3' in capsys.readouterr().out
    assert main(["--redis", redis_server.url, "outbox", "relay", "--once", *flags]) == 0
    assert capsys.readouterr().out.strip() == "3"
    assert sorted(relayed(redis)) == sorted(jids)
    assert main(["outbox", "status", *flags]) == 0
    assert "rows waiting: 0" in capsys.readouterr().out


@pytest.mark.timeout(60)
def test_limitd_outbox_relay_runs_until_sigterm(
    tmp_path: Path,
    redis_server: RedisServer,
    redis: redis_py.Redis,
    database: Database,
    supervisors: list[subprocess.Popen[bytes]],
) -> None:
    flags = ["--url", database.url, "--table", database.table]
    supervisors.append(start(tmp_path, "outbox", "relay", *flags, redis_url=redis_server.url))
    for batch in range(3):
        with database.sessions() as session, session.begin():
            welcome.perform_async(batch)
        wait_for(lambda: database.rows() == 0, 30, "the relay to take the row")
    assert redis.llen("queue:relayed") == 3
    supervisors[0].send_signal(signal.SIGTERM)
    assert supervisors[0].wait(timeout=10) == 0
