"""Logs an operator can read: one line per failure saying where the job went, with the
job's own frames; the running job's jid/class/queue on the lines its code writes; text or
JSON lines; levels per logger; plain help texts."""

from __future__ import annotations

import argparse
import datetime as dt
import io
import json
import logging
import os
import signal
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import redis as redis_py
from freezegun import freeze_time

import limitd
from limitd import keys
from limitd.cli import build_parser
from limitd.config import ConfigError, LoggingSettings, load_config
from limitd.connection.embedded import RedisServer
from limitd.job import JobFunction
from limitd.logs import JobContext, JsonFormatter, configure, own_frames, text_formatter
from limitd.payload import MalformedPayload, parse
from limitd.supervisor import Capsule, CapsuleConfig
from tests.helpers import limitd_start, wait_for

LIMITD_DIR = os.path.dirname(limitd.__file__) + os.sep
app_log = logging.getLogger("app.logs_test")
both_started = threading.Barrier(2, timeout=10)


class Flaky(limitd.Job, name="logs_test.Flaky", queue="flaky"):
    def perform(self, reason: str) -> None:
        raise_from_app_code(reason)

    def retry_in(self, count: int, exc: BaseException, payload: dict[str, Any]) -> float:
        return 30


@limitd.job(name="logs_test.Once", queue="once", retry=0)
def once(reason: str) -> None:
    raise_from_app_code(reason)


@limitd.job(name="logs_test.Never", queue="never", retry=False)
def never(reason: str) -> None:
    raise_from_app_code(reason)


@limitd.job(name="logs_test.Talk", queue="talk")
def talk(word: str) -> None:
    app_log.info("saying %s", word)


@limitd.job(name="logs_test.TalkTogether", queue="talk")
def talk_together(word: str) -> None:
    both_started.wait()  # both threads are inside a job when either logs
    app_log.info("saying %s", word)


def raise_from_app_code(reason: str) -> None:
    raise ValueError(reason)


@pytest.fixture
def root_logging() -> Iterator[None]:
    """``configure`` changes the process's root logger: put it back for other tests."""
    root = logging.getLogger()
    handlers, level = list(root.handlers), root.level
    named = {name: logging.getLogger(name).level for name in ("app.noisy", "limitd.fetch")}
    yield
    for handler in list(root.handlers):
        if handler not in handlers:
            root.removeHandler(handler)
            handler.close()
    for handler in handlers:
        if handler not in root.handlers:
            root.addHandler(handler)
    root.setLevel(level)
    for name, old in named.items():
        logging.getLogger(name).setLevel(old)


def configured(tmp_path: Path, **settings: Any) -> Path:
    path = tmp_path / "limitd.log"
    configure(LoggingSettings(file=str(path), **settings))
    return path


def fail_records(caplog: pytest.LogCaptureFixture, level: int) -> list[logging.LogRecord]:
    return [r for r in caplog.records if r.levelno == level and r.msg.startswith("fail ")]


def traceback_of(record: logging.LogRecord) -> str:
    assert record.exc_info is not None
    return logging.Formatter().formatException(record.exc_info)


# -- the fail line ----------------------------------------------------------------------


@freeze_time("2030-01-02 03:04:05", tz_offset=0)
def test_fail_line_names_the_job_its_retry_count_and_when_it_is_retried(
    redis: redis_py.Redis, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG, logger="limitd.job")
    jid = Flaky.perform_async("disk full")
    assert Capsule(CapsuleConfig(queues=["flaky"]), redis=redis).drain() == {"retry": 1}
    [warning] = fail_records(caplog, logging.WARNING)
    assert warning.getMessage() == (
        f"fail jid={jid} class=logs_test.Flaky queue=flaky retry_count=0 "
        "next=retry in 30s at 2030-01-02T03:04:35Z error=ValueError: disk full"
    )
    assert "\n" not in warning.getMessage()
    assert (warning.jid, warning.__dict__["class"], warning.queue) == (
        jid,
        "logs_test.Flaky",
        "flaky",
    )


def test_warning_shows_the_jobs_frames_and_debug_every_frame(
    redis: redis_py.Redis, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG, logger="limitd.job")
    Flaky.perform_async("disk full")
    Capsule(CapsuleConfig(queues=["flaky"]), redis=redis).drain()
    [warning] = fail_records(caplog, logging.WARNING)
    [debug] = fail_records(caplog, logging.DEBUG)
    short, full = traceback_of(warning), traceback_of(debug)
    assert "in raise_from_app_code" in short
    assert "in perform" in short
    assert LIMITD_DIR not in short
    assert short.rstrip().endswith("ValueError: disk full")
    assert "in raise_from_app_code" in full
    assert f"{LIMITD_DIR}supervisor{os.sep}executor.py" in full
    assert debug.getMessage() == warning.getMessage() + " (every frame)"


@pytest.mark.parametrize(
    ("job", "count", "next_step"),
    [(once, "0", "dead"), (never, "-", "discarded")],
)
def test_fail_line_says_dead_or_discarded(
    redis: redis_py.Redis,
    caplog: pytest.LogCaptureFixture,
    job: JobFunction,
    count: str,
    next_step: str,
) -> None:
    job.perform_async("bad input")
    queue = job.spec.queue
    assert Capsule(CapsuleConfig(queues=[queue]), redis=redis).drain() == {next_step: 1}
    [warning] = fail_records(caplog, logging.WARNING)
    assert f" queue={queue} retry_count={count} next={next_step} error=ValueError" in (
        warning.getMessage()
    )


def test_unknown_class_fails_without_a_traceback(
    redis: redis_py.Redis, caplog: pytest.LogCaptureFixture
) -> None:
    redis.lpush(keys.of(redis).queue("default"), json.dumps({"class": "nowhere.Job", "args": []}))
    Capsule(CapsuleConfig(), redis=redis).drain()
    [warning] = fail_records(caplog, logging.WARNING)
    assert "next=retry in " in warning.getMessage()
    assert "error=UnknownJob" in warning.getMessage()
    assert warning.exc_info is None


def test_own_frames_keeps_the_innermost_frame_when_all_are_limitds() -> None:
    with pytest.raises(MalformedPayload) as caught:
        parse(b"[1]")
    assert caught.value.__traceback__ is not None
    inside_limitd = caught.value.__traceback__.tb_next  # skip this test's own frame
    kept = own_frames(inside_limitd)
    assert kept is not None and kept.tb_next is None
    assert kept.tb_frame.f_code.co_filename.startswith(LIMITD_DIR)


# -- the running job on every record ----------------------------------------------------


def test_a_jobs_own_log_line_carries_its_jid_class_and_queue(
    redis: redis_py.Redis, tmp_path: Path, root_logging: None
) -> None:
    path = configured(tmp_path)
    jid = talk.perform_async("hello")
    Capsule(CapsuleConfig(queues=["talk"]), redis=redis).drain()
    app_log.warning("between jobs")
    lines = path.read_text().splitlines()
    [said] = [line for line in lines if "saying hello" in line]
    assert f"app.logs_test: jid={jid} class=logs_test.Talk queue=talk saying hello" in said
    [between] = [line for line in lines if "between jobs" in line]
    assert "jid=" not in between
    assert between.endswith("app.logs_test: between jobs")
    [done] = [line for line in lines if "limitd.job: done" in line]
    assert done.count("jid=") == 1  # limitd's own line names the job once


def test_each_processor_thread_logs_its_own_job(
    redis: redis_py.Redis, tmp_path: Path, root_logging: None
) -> None:
    path = configured(tmp_path, format="json")
    jids = {talk_together.perform_async(word): word for word in ("left", "right")}
    capsule = Capsule(CapsuleConfig(queues=["talk"], concurrency=2), redis=redis)
    capsule.start()
    try:
        wait_for(lambda: path.read_text().count("saying") == 2, message="both jobs' lines")
    finally:
        capsule.stop(timeout=5)
    said = [entry for entry in read_json_lines(path) if entry["logger"] == "app.logs_test"]
    assert {entry["jid"]: entry["message"] for entry in said} == {
        jid: f"saying {word}" for jid, word in jids.items()
    }
    assert len({entry["thread"] for entry in said}) == 2


def test_job_filter_leaves_records_outside_a_job_alone() -> None:
    record = logging.LogRecord("app", logging.INFO, __file__, 1, "idle", None, None)
    assert JobContext().filter(record)
    assert not hasattr(record, "jid")
    assert text_formatter().format(record).endswith("INFO app: idle")


# -- formats and levels -----------------------------------------------------------------


def read_json_lines(path: Path, *, complete_only: bool = False) -> list[dict[str, Any]]:
    """Every line of ``path`` as JSON; ``complete_only`` skips a line still being written
    (and a file not there yet), for polling a running process's log."""
    if complete_only:
        lines = path.read_text().split("\n")[:-1] if path.exists() else []
    else:
        lines = path.read_text().splitlines()
    return [json.loads(line) for line in lines]


def test_json_lines_carry_the_fields_and_the_traceback(
    redis: redis_py.Redis, tmp_path: Path, root_logging: None
) -> None:
    path = configured(tmp_path, format="json")
    talk_jid = talk.perform_async("hi")
    flaky_jid = Flaky.perform_async("disk full")
    Capsule(CapsuleConfig(queues=["talk", "flaky"]), redis=redis).drain()
    logging.getLogger("limitd").info("after")
    entries = read_json_lines(path)
    [said] = [e for e in entries if e["message"] == "saying hi"]
    assert {k: said[k] for k in ("level", "logger", "jid", "class", "queue")} == {
        "level": "INFO",
        "logger": "app.logs_test",
        "jid": talk_jid,
        "class": "logs_test.Talk",
        "queue": "talk",
    }
    assert said["pid"] == os.getpid()
    assert said["thread"] == threading.current_thread().name
    assert dt.datetime.fromisoformat(said["time"]).tzinfo is not None
    [fail] = [e for e in entries if e["message"].startswith("fail ")]
    assert (fail["level"], fail["jid"], fail["queue"]) == ("WARNING", flaky_jid, "flaky")
    assert "in raise_from_app_code" in fail["exc_info"]
    assert LIMITD_DIR not in fail["exc_info"]
    [after] = [e for e in entries if e["message"] == "after"]
    assert not {"jid", "class", "queue", "exc_info"} & after.keys()


def test_json_formatter_writes_one_parseable_line_per_record() -> None:
    try:
        raise KeyError("k")
    except KeyError:
        record = logging.LogRecord(
            "app", logging.ERROR, __file__, 1, "two\nlines %s", ("x",), sys.exc_info()
        )
    line = JsonFormatter().format(record)
    assert "\n" not in line
    entry = json.loads(line)
    assert entry["message"] == "two\nlines x"
    assert entry["exc_info"].startswith("Traceback")
    assert entry["exc_info"].rstrip().endswith("KeyError: 'k'")


def test_levels_per_logger_apply(tmp_path: Path, root_logging: None) -> None:
    path = configured(
        tmp_path, level="INFO", levels={"app.noisy": "WARNING", "limitd.fetch": "DEBUG"}
    )
    logging.getLogger("app.noisy").info("noisy info")
    logging.getLogger("app.noisy.sub").warning("noisy warning")
    logging.getLogger("limitd.fetch.limit").debug("fetch debug")
    logging.getLogger("limitd.other").debug("other debug")
    logging.getLogger("app").info("app info")
    text = path.read_text()
    assert "noisy info" not in text
    assert "noisy warning" in text
    assert "fetch debug" in text
    assert "other debug" not in text
    assert "app info" in text


def test_verbose_flag_lowers_the_configured_level_for_start(
    tmp_path: Path, root_logging: None
) -> None:
    """``limitd -v start`` must mean debug logging although the files say INFO: a flag
    overrides the files."""
    from limitd.commands.start import configure_logging

    path = tmp_path / "v.yml"
    path.write_text(f"logging: {{level: INFO, file: {tmp_path / 'v.log'}}}\n")
    configure_logging(load_config([path]), verbose=True)
    logging.getLogger("app").debug("debug line")
    assert "debug line" in (tmp_path / "v.log").read_text()


def test_logging_section_is_read(tmp_path: Path) -> None:
    path = tmp_path / "logs.yml"
    path.write_text(
        "logging:\n  level: warning\n  format: json\n"
        "  levels: {limitd.fetch: debug, app.noisy: ERROR, app.quiet: }\n"
    )
    settings = load_config([path], env={}).logging
    assert settings == LoggingSettings(
        level="WARNING", format="json", levels={"limitd.fetch": "DEBUG", "app.noisy": "ERROR"}
    )
    assert load_config([], env={}).logging == LoggingSettings()


BAD_LOGGING = {
    "format": ("logging: {format: xml}\n", "logging.format", "expected one of ['json', 'text']"),
    "levels not a mapping": ("logging: {levels: [app]}\n", "logging.levels", "a mapping"),
    "level of a logger": (
        "logging: {levels: {app.noisy: LOUD}}\n",
        "logging.levels.app.noisy",
        "expected one of ['DEBUG', 'INFO', 'WARNING', 'ERROR', 'CRITICAL'], got 'LOUD'",
    ),
    "logger name": ("logging: {levels: {'a b': INFO}}\n", "logging.levels.a b", "logger name"),
    "misspelt key": ("logging: {level: INFO, formats: json}\n", "logging.formats", "'format'"),
}


@pytest.mark.parametrize("case", BAD_LOGGING.values(), ids=list(BAD_LOGGING))
def test_bad_logging_config_names_file_and_key(tmp_path: Path, case: tuple[str, str, str]) -> None:
    text, key, words = case
    path = tmp_path / "bad.yml"
    path.write_text(text)
    with pytest.raises(ConfigError) as caught:
        load_config([path], env={})
    assert caught.value.file == str(path)
    assert caught.value.key == key
    assert words in caught.value.message


def test_limitd_start_with_a_bad_logging_config_exits_78(tmp_path: Path) -> None:
    (tmp_path / "bad.yml").write_text("logging: {format: xml}\n")
    done = subprocess.run(
        [sys.executable, "-m", "limitd.cli", "start", "bad.yml"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=30,
        check=False,
    )
    assert done.returncode == 78
    assert "bad.yml: logging.format: expected one of ['json', 'text'], got 'xml'" in done.stderr


# -- a real limitd start ------------------------------------------------------------------

APP = """
import logging
import limitd

@limitd.job(name="logs_app.Talk", queue="work")
def talk(word):
    logging.getLogger("app").info("saying %s", word)
"""


def test_limitd_start_writes_json_lines_that_survive_fork_and_reopen(
    tmp_path: Path, redis_server: RedisServer, redis: redis_py.Redis
) -> None:
    (tmp_path / "logs_app.py").write_text(APP)
    (tmp_path / "json.yml").write_text(
        "require: [logs_app]\nqueues: [work]\nlogging: {format: json, file: worker.log}\n"
    )
    proc = limitd_start(
        tmp_path, "json.yml", env={**os.environ, "LIMITD_REDIS_URL": redis_server.url}
    )
    log, rotated = tmp_path / "worker.log", tmp_path / "worker.log.1"
    try:
        first = enqueue_and_wait(redis, log, "before")
        log.rename(rotated)  # what logrotate does
        proc.send_signal(signal.SIGHUP)
        wait_for(
            lambda: any(
                e["message"] == "log files reopened" and e["pid"] != proc.pid
                for e in read_json_lines(log, complete_only=True)
            ),
            timeout=20,
            message="the child's reopened file",
        )
        second = enqueue_and_wait(redis, log, "after")
    finally:
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=15) == 0
    for entry in (first, second):
        assert entry["class"] == "logs_app.Talk"
        assert entry["queue"] == "work"
        assert entry["pid"] != proc.pid  # written by the forked capsule child
    entries = read_json_lines(rotated) + read_json_lines(log)  # every line is JSON
    assert {"time", "level", "logger", "message", "pid", "thread"} <= entries[0].keys()


def enqueue_and_wait(redis: redis_py.Redis, log: Path, word: str) -> dict[str, Any]:
    jid = os.urandom(12).hex()
    job = {"class": "logs_app.Talk", "args": [word], "queue": "work", "jid": jid}
    redis.lpush(keys.of(redis).queue("work"), json.dumps(job))
    message = f"saying {word}"

    def said() -> list[dict[str, Any]]:
        return [e for e in read_json_lines(log, complete_only=True) if e["message"] == message]

    wait_for(said, timeout=20, message=message)
    [entry] = said()
    assert entry["jid"] == jid
    return entry


# -- help texts -----------------------------------------------------------------------------


def all_help(parser: argparse.ArgumentParser, path: str = "limitd") -> Iterator[tuple[str, str]]:
    yield path, parser.format_help()
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, sub in action.choices.items():
                yield from all_help(sub, f"{path} {name}")


def test_no_help_text_has_markup() -> None:
    pages = dict(all_help(build_parser()))
    assert len(pages) > 15  # every command and subcommand was walked
    for path, text in pages.items():
        assert "``" not in text, path
        assert "`" not in text, path
        assert ":class:" not in text, path


@pytest.mark.parametrize("argv", [["--help"], ["start", "--help"], ["limit", "clear", "--help"]])
def test_help_printed_by_the_command_is_plain(argv: list[str]) -> None:
    out = subprocess.run(
        [sys.executable, "-m", "limitd.cli", *argv],
        capture_output=True,
        text=True,
        timeout=30,
        check=True,
    ).stdout
    assert out.startswith("usage: limitd")
    assert "`" not in out


def test_stream_handler_defaults_to_standard_error(root_logging: None) -> None:
    handler = configure(LoggingSettings(format="json"))
    assert isinstance(handler, logging.StreamHandler)
    assert handler.stream is sys.stderr
    handler.setStream(io.StringIO())
    logging.getLogger("app").warning("to the stream")
    assert isinstance(handler.stream, io.StringIO)
    assert json.loads(handler.stream.getvalue())["message"] == "to the stream"
