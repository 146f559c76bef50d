"""The admin commands (``limitd status``, ``queues``, ``limit``, ``pause``/``resume``,
``retries``/``dead``/``scheduled``) against a real Redis.

The commands run in-process through a parser built here with ``add_admin_commands``,
exactly as ``limitd.cli`` registers them; one subprocess test checks the wiring in
``limitd.cli`` itself and is skipped until that wiring exists.
"""

from __future__ import annotations

import argparse
import json
import re
import socket
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import pytest
import redis as redis_py

import limitd
from limitd import keys
from limitd.api import DeadSet, Processes, Queue, RetrySet, ScheduledSet
from limitd.commands import add_admin_commands
from limitd.commands.common import ResolveRedis
from limitd.connection.embedded import RedisServer
from limitd.payload import dumps
from limitd.supervisor.heartbeat import ProcessRecord, WorkItem

ROOT = Path(__file__).resolve().parent.parent
HOUR = 3600.0


@limitd.job(name="cli_admin_test.Echo")
def echo(*args: object) -> None:
    pass


@limitd.job(name="cli_admin_test.Mail", queue="mail")
def mail(*args: object) -> None:
    pass


@dataclass
class Result:
    code: int
    out: str
    err: str

    def json(self) -> object:
        return json.loads(self.out)


Cli = Callable[..., Result]


def make_cli(resolve: ResolveRedis, capsys: pytest.CaptureFixture[str]) -> Cli:
    """A ``limitd`` entry point with only the admin commands, run in-process."""

    def run(*argv: str) -> Result:
        parser = argparse.ArgumentParser(prog="limitd")
        add_admin_commands(parser.add_subparsers(title="commands", required=True), resolve)
        capsys.readouterr()
        args = parser.parse_args(argv)
        code = args.command(args)
        captured = capsys.readouterr()
        return Result(code, captured.out, captured.err)

    return run


@pytest.fixture
def cli(redis: redis_py.Redis, capsys: pytest.CaptureFixture[str]) -> Cli:
    return make_cli(lambda args: redis, capsys)


def columns(line: str) -> list[str]:
    """The cells of a table line: columns are at least two spaces apart."""
    return re.split(r"\s{2,}", line.strip())


def park(redis: redis_py.Redis, key: str, score: float, *args: object, **fields: object) -> str:
    """Push a real job with the client, take it back off its queue, and put it in a
    sorted set with extra fields (an error, a retry count), as a failure would."""
    jid = str(echo.perform_async(*args))
    payload = json.loads(redis.rpop(keys.of(redis).queue("default")))  # type: ignore[arg-type]
    redis.zadd(key, {dumps({**payload, **fields}): score})
    return jid


def failed(redis: redis_py.Redis, key: str, score: float, *args: object) -> str:
    return park(
        redis,
        key,
        score,
        *args,
        error_class="TimeoutError",
        error_message="took too long\nsecond line",
        retry_count=2,
        failed_at=score - 60,
    )


def beat(redis: redis_py.Redis, identity: str, busy: int = 1, **info: object) -> ProcessRecord:
    """A process record as a running capsule writes it."""
    work = [WorkItem(f"t{i}", "default", b"{}", time.time()) for i in range(busy)]
    record = ProcessRecord(
        identity,
        {
            "hostname": "host-a",
            "pid": 4242,
            "tag": "web",
            "capsule": "default",
            "capsule_id": "cap-1",
            "concurrency": 5,
            "cpus": "2-3",
            "queues": ["default", "mail"],
            **info,
        },
        lambda: work,
    )
    record.write(redis)
    return record


# status


def test_status_lists_processes_and_totals(cli: Cli, redis: redis_py.Redis) -> None:
    beat(redis, "host-a:4242:abc", busy=2)
    redis.sadd(keys.of(redis).PROCESSES, "host-gone:1:dead")  # no hash: expired, not shown
    redis.set(keys.of(redis).STAT_PROCESSED, 120)
    redis.set(keys.of(redis).STAT_FAILED, 7)
    echo.perform_async(1)
    mail.perform_async(2)
    failed(redis, keys.of(redis).RETRY, time.time() + HOUR)
    failed(redis, keys.of(redis).DEAD, time.time())
    result = cli("status")
    assert result.code == 0, result.err
    lines = result.out.splitlines()
    assert columns(lines[0]) == [
        *("IDENTITY", "TAG", "CAPSULE", "PID", "CPUS", "BUSY", "QUEUES", "QUIET", "LAST BEAT")
    ]
    process = columns(lines[1])
    assert process[:-1] == [
        *("host-a:4242:abc", "web", "default", "4242", "2-3", "2/5", "default,mail", "no")
    ]
    assert process[-1].endswith("s")
    assert "host-gone" not in result.out
    assert lines[3].split() == ["PROCESSED", "FAILED", "ENQUEUED", "SCHEDULED", "RETRIES", "DEAD"]
    assert lines[4].split() == ["120", "7", "2", "0", "1", "1"]


def test_status_json(cli: Cli, redis: redis_py.Redis) -> None:
    beat(redis, "host-a:4242:abc", busy=1, tag="")
    result = cli("status", "--json")
    assert result.code == 0, result.err
    document = result.json()
    assert isinstance(document, dict)
    (process,) = document["processes"]
    assert process["identity"] == "host-a:4242:abc"
    assert process["pid"] == 4242
    assert process["busy"] == 1
    assert process["concurrency"] == 5
    assert process["cpus"] == "2-3"
    assert process["queues"] == ["default", "mail"]
    assert process["quiet"] is False
    assert 0 <= process["seconds_since_beat"] < 10
    assert document["totals"] == {
        "processed": 0,
        "failed": 0,
        "enqueued": 0,
        "scheduled": 0,
        "retries": 0,
        "dead": 0,
    }


def test_status_with_no_processes(cli: Cli) -> None:
    result = cli("status")
    assert result.code == 0
    assert result.out.startswith("no processes running\n")


def test_processes_snapshot_reads_records_of_other_implementations(
    redis: redis_py.Redis,
) -> None:
    """A Sidekiq (Ruby) record has no capsule fields and may carry odd values: it is
    listed anyway, with None where limitd's fields are missing."""
    redis.sadd(keys.of(redis).PROCESSES, "ruby:1:x")
    redis.hset(
        "ruby:1:x",
        mapping={"info": '{"hostname": "ruby", "pid": 1}', "busy": "0", "beat": "x"},
    )
    (process,) = Processes(redis)
    assert (process.hostname, process.pid, process.capsule) == ("ruby", 1, None)
    assert process.beat is None and process.seconds_since_beat is None
    assert process.quiet is False


# queues


@pytest.fixture
def two_queues(redis: redis_py.Redis) -> None:
    """``default``: one job queued 30 s ago. ``mail``: two jobs, limits 3 and 1,
    paused, two running."""
    old = {"class": "cli_admin_test.Echo", "args": [], "jid": "j1", "queue": "default"}
    redis.lpush(keys.of(redis).queue("default"), dumps({**old, "enqueued_at": time.time() - 30}))
    redis.sadd(keys.of(redis).QUEUES, "default")
    mail.perform_async("a")
    mail.perform_async("b")
    Queue("mail", redis).limit = 3
    Queue("mail", redis).process_limit = 1
    Queue("mail", redis).pause()
    redis.hset(keys.of(redis).BUSY, "mail", 2)


@pytest.mark.usefixtures("two_queues")
def test_queues_table(cli: Cli) -> None:
    result = cli("queues")
    assert result.code == 0, result.err
    header, default, mail_row = (columns(line) for line in result.out.splitlines())
    assert header == [
        "QUEUE",
        "SIZE",
        "LATENCY",
        "LIMIT",
        "PROCESS LIMIT",
        "RATE",
        "BUSY",
        "PAUSED",
    ]
    assert default[:2] == ["default", "1"]
    assert float(default[2]) == pytest.approx(30, abs=2)
    assert default[3:] == ["-", "-", "-", "0"]
    assert mail_row[:2] == ["mail", "2"]
    assert mail_row[3:] == ["3", "1", "-", "2", "paused"]


@pytest.mark.usefixtures("two_queues")
def test_queues_json(cli: Cli) -> None:
    rows = cli("queues", "--json").json()
    assert isinstance(rows, list)
    assert rows[0]["latency"] == pytest.approx(30, abs=2)
    assert isinstance(rows[1]["latency"], float)
    unlimited = {"limit": None, "process_limit": None, "busy": 0, "paused": False}
    unlimited["rate_limit"] = None
    unlimited |= {"fair": False, "tenants_waiting": None}
    assert [{**row, "latency": 0} for row in rows] == [
        {"name": "default", "size": 1, "latency": 0, **unlimited},
        {"name": "mail", "size": 2, "latency": 0, "limit": 3, "process_limit": 1}
        | {"busy": 2, "paused": True, "rate_limit": None, "fair": False, "tenants_waiting": None},
    ]


def test_queues_when_there_are_none(cli: Cli) -> None:
    assert cli("queues").out == "no queues\n"
    assert cli("queues", "--json").json() == []


# limit, pause, resume


def test_limit_set_clear_reset(cli: Cli, redis: redis_py.Redis) -> None:
    queue = Queue("webhooks", redis)
    result = cli("limit", "set", "webhooks", "5")
    assert (result.code, result.out) == (0, "limit of queue 'webhooks' set to 5\n")
    assert (queue.limit, queue.process_limit) == (5, None)
    assert cli("limit", "set", "webhooks", "2", "--process").code == 0
    assert (queue.limit, queue.process_limit) == (5, 2)

    assert cli("limit", "clear", "webhooks").code == 0
    assert queue.limit is None
    assert redis.hget(keys.of(redis).LIMITS, "webhooks") == b"none"  # kept unlimited over config
    assert queue.process_limit == 2

    assert cli("limit", "reset", "webhooks", "--process").code == 0
    assert redis.hget(keys.of(redis).PROCESS_LIMITS, "webhooks") is None
    assert cli("limit", "reset", "webhooks").code == 0
    assert redis.hget(keys.of(redis).LIMITS, "webhooks") is None


def test_limit_zero_is_allowed(cli: Cli, redis: redis_py.Redis) -> None:
    assert cli("limit", "set", "webhooks", "0").code == 0
    assert Queue("webhooks", redis).limit == 0


def test_pause_and_resume(cli: Cli, redis: redis_py.Redis) -> None:
    result = cli("pause", "mail", "default")
    assert result.code == 0
    assert result.out == "queue 'mail' paused\nqueue 'default' paused\n"
    assert Queue("mail", redis).paused and Queue("default", redis).paused
    assert cli("resume", "mail").code == 0
    assert not Queue("mail", redis).paused
    assert Queue("default", redis).paused


# bad input and no Redis


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (("limit", "set", "q", "-3"), "limitd limit set: N must be an integer >= 0, got -3"),
        (("limit", "set", "q", "x"), "limitd limit set: N must be an integer >= 0, got 'x'"),
        (("limit", "set", "q", "1.5"), "limitd limit set: N must be an integer"),
        (("limit", "set", "", "1"), "limitd limit set: a queue name cannot be empty"),
        (("retries", "list", "--limit", "0"), "limitd retries list: --limit must be"),
        (("dead", "list", "--limit", "many"), "limitd dead list: --limit must be"),
        (("retries", "retry"), "limitd retries retry: give at least one job id, or --all"),
        (("dead", "delete", "--all", "j1"), "limitd dead delete: give job ids or --all"),
        (("pause", " "), "limitd pause: a queue name cannot be empty"),
    ],
)
def test_bad_input_is_one_line_and_exit_64(
    argv: tuple[str, ...], message: str, capsys: pytest.CaptureFixture[str]
) -> None:
    def no_redis_needed(args: argparse.Namespace) -> redis_py.Redis:
        raise AssertionError("input is checked before Redis is looked for")

    result = make_cli(no_redis_needed, capsys)(*argv)
    assert result.code == 64
    assert result.out == ""
    assert len(result.err.splitlines()) == 1
    assert result.err.startswith(message)


def test_no_redis_found_exits_69(capsys: pytest.CaptureFixture[str]) -> None:
    result = make_cli(lambda args: None, capsys)("queues")
    assert result.code == 69
    assert "no Redis found" in result.err
    assert "--redis" in result.err


def test_unreachable_redis_exits_69(capsys: pytest.CaptureFixture[str]) -> None:
    with socket.socket() as sock:  # a port nobody listens on
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    unreachable = redis_py.Redis(port=port, socket_connect_timeout=1)
    result = make_cli(lambda args: unreachable, capsys)("status")
    assert result.code == 69
    assert result.err.startswith("limitd status: cannot reach Redis")


# retries, dead, scheduled: list


def test_retries_list_newest_first_with_errors(cli: Cli, redis: redis_py.Redis) -> None:
    now = time.time()
    first = failed(redis, keys.of(redis).RETRY, now + HOUR, "soon")
    last = failed(redis, keys.of(redis).RETRY, now + 3 * HOUR, "x" * 100)
    result = cli("retries", "list")
    assert result.code == 0, result.err
    header, newest, oldest = result.out.splitlines()
    assert header.split() == ["JID", "CLASS", "QUEUE", "AT", "RETRIES", "ERROR", "ARGS"]
    assert newest.startswith(last) and oldest.startswith(first)
    assert "cli_admin_test.Echo  default" in newest
    assert "TimeoutError: took too long second line" in newest
    assert newest.endswith('["' + "x" * 35 + "...")
    assert oldest.endswith('["soon"]')


def test_list_limit_says_how_many_are_left(cli: Cli, redis: redis_py.Redis) -> None:
    now = time.time()
    jids = [failed(redis, keys.of(redis).DEAD, now - i, i) for i in range(3)]
    result = cli("dead", "list", "--limit", "2")
    lines = result.out.splitlines()
    assert [line.split()[0] for line in lines[1:3]] == jids[:2]
    assert lines[-1] == "showing 2 of 3, newest first (--limit N for more)"


def test_list_json(cli: Cli, redis: redis_py.Redis) -> None:
    at = 1_800_000_000.0
    jid = failed(redis, keys.of(redis).DEAD, at, 1, {"k": "v"})
    rows = cli("dead", "list", "--json").json()
    assert rows == [
        {
            "jid": jid,
            "class": "cli_admin_test.Echo",
            "queue": "default",
            "at": "2027-01-15T08:00:00+00:00",
            "score": at,
            "args": [1, {"k": "v"}],
            "retry_count": 2,
            "error_class": "TimeoutError",
            "error_message": "took too long\nsecond line",
            "malformed": None,
        }
    ]


def test_scheduled_list_has_no_error_columns(cli: Cli, redis: redis_py.Redis) -> None:
    jid = str(echo.perform_in(HOUR, "later"))
    result = cli("scheduled", "list")
    header, row = result.out.splitlines()
    assert header.split() == ["JID", "CLASS", "QUEUE", "AT", "ARGS"]
    assert row.startswith(jid) and row.endswith('["later"]')
    (entry,) = cli("scheduled", "list", "--json").json()  # type: ignore[misc]
    assert "error_class" not in entry


def test_malformed_entries_are_listed(cli: Cli, redis: redis_py.Redis) -> None:
    redis.zadd(keys.of(redis).DEAD, {b"not json": time.time()})
    result = cli("dead", "list")
    assert "(malformed)" in result.out
    (row,) = cli("dead", "list", "--json").json()  # type: ignore[misc]
    assert row["class"] is None and row["malformed"]


def test_empty_set(cli: Cli) -> None:
    assert cli("retries", "list").out == "the retry set is empty\n"
    assert cli("retries", "list", "--json").json() == []


# retries, dead, scheduled: retry and delete


def test_retry_by_jid_enqueues_it(cli: Cli, redis: redis_py.Redis) -> None:
    jid = failed(redis, keys.of(redis).RETRY, time.time() + HOUR, "again")
    other = failed(redis, keys.of(redis).RETRY, time.time() + HOUR, "stays")
    result = cli("retries", "retry", jid)
    assert (result.code, result.out) == (0, "retried 1 job from the retry set\n")
    assert RetrySet(redis).find_job(jid) is None
    assert RetrySet(redis).find_job(other) is not None
    (queued,) = Queue("default", redis)
    assert (queued.jid, queued.args, queued.retry_count) == (jid, ["again"], 2)


def test_delete_by_jid(cli: Cli, redis: redis_py.Redis) -> None:
    jids = [failed(redis, keys.of(redis).DEAD, time.time(), i) for i in range(3)]
    result = cli("dead", "delete", jids[0], jids[2])
    assert (result.code, result.err) == (0, "")
    assert [entry.jid for entry in DeadSet(redis)] == [jids[1]]
    assert Queue("default", redis).size() == 0


def test_unknown_jid_exits_1_and_the_others_are_processed(cli: Cli, redis: redis_py.Redis) -> None:
    jid = failed(redis, keys.of(redis).RETRY, time.time() + HOUR)
    result = cli("retries", "delete", "nope-123", jid)
    assert result.code == 1
    assert result.err == "limitd retries delete: no job with jid nope-123 in the retry set\n"
    assert result.out == "deleted 1 job from the retry set\n"
    assert RetrySet(redis).size() == 0


def test_retry_all_and_delete_all(cli: Cli, redis: redis_py.Redis) -> None:
    for i in range(3):
        failed(redis, keys.of(redis).DEAD, time.time(), i)
    echo.perform_in(HOUR, "a")
    echo.perform_in(2 * HOUR, "b")
    assert cli("dead", "retry", "--all").out == "retried 3 jobs from the dead set\n"
    assert DeadSet(redis).size() == 0
    assert Queue("default", redis).size() == 3
    assert cli("scheduled", "delete", "--all").out == "deleted 2 jobs from the scheduled set\n"
    assert ScheduledSet(redis).size() == 0


def test_retry_all_reports_malformed_entries_left(cli: Cli, redis: redis_py.Redis) -> None:
    failed(redis, keys.of(redis).RETRY, time.time())
    redis.zadd(keys.of(redis).RETRY, {b"not json": time.time()})
    result = cli("retries", "retry", "--all")
    assert (result.code, result.out) == (0, "retried 1 job from the retry set\n")
    assert "1 malformed entries stay in the retry set" in result.err
    assert RetrySet(redis).size() == 1


# the command line itself, once limitd.cli registers the admin commands


def limitd_cmd(*args: str) -> list[str]:
    return [sys.executable, "-m", "limitd.cli", *args]


def cli_has_admin_commands() -> bool:
    """Whether ``limitd.cli`` already calls ``add_admin_commands``."""
    help_text = subprocess.run(
        limitd_cmd("--help"), cwd=ROOT, capture_output=True, text=True, check=False
    ).stdout
    return "queues" in help_text


@pytest.mark.skipif(not cli_has_admin_commands(), reason="limitd.cli has no admin commands yet")
def test_limitd_queues_json_subprocess(redis_server: RedisServer, redis: redis_py.Redis) -> None:
    mail.perform_async("x")
    Queue("mail", redis).limit = 4
    result = subprocess.run(
        limitd_cmd("--redis", redis_server.url, "queues", "--json"),
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=False,
        timeout=30,
    )
    assert result.returncode == 0, result.stderr
    (row,) = json.loads(result.stdout)
    assert (row["name"], row["size"], row["limit"]) == ("mail", 1, 4)
