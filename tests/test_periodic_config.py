"""The ``periodic`` config section, its check against the app's jobs, ``limitd check``
on a bad entry (exit 78, the file and key named), and ``limitd periodic``."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import pytest
import redis as redis_py

import limitd
from limitd.cli import main
from limitd.config import ConfigError, load_config
from limitd.config.app_checks import check_app
from limitd.config.files import Layers
from limitd.config.values import Section
from limitd.connection.embedded import RedisServer
from limitd.periodic.scheduler import PeriodicScheduler
from limitd.periodic.section import PeriodicSettings, read_periodic
from limitd.registry import registry
from limitd.spec import JobSpec

EX_CONFIG = 78


@limitd.job(name="periodic_config_test.Report")
def report(*args: Any) -> None:
    """A job periodic entries may name, by wire name or dotted path."""


def write(tmp_path: Path, text: str, name: str = "a.yml") -> str:
    path = tmp_path / name
    path.write_text(textwrap.dedent(text))
    return str(path)


def periodic(tmp_path: Path, entry: str) -> PeriodicSettings:
    """The section of a file holding one entry ``refill`` (the mapping form)."""
    body = textwrap.indent(textwrap.dedent(entry), "    ")
    settings: PeriodicSettings = load_config(
        [write(tmp_path, "periodic:\n  refill:\n" + body)]
    ).section("periodic")
    return settings


def entries_list(items: list[Any], file: str = "conf/a.yml") -> PeriodicSettings:
    """The list form, read as the section reader is given it: a Section of the list."""
    layers = Layers(files=[file], origins={("periodic",): file})
    return read_periodic(Section(items, ("periodic",), layers), {})  # type: ignore[arg-type]


# --- reading the section -----------------------------------------------------------


def test_an_entry_with_every_key(tmp_path: Path) -> None:
    settings = periodic(
        tmp_path,
        """
        cron: "*/5 * * * *"
        job: periodic_config_test.Report
        args: [1, "two"]
        capacity: false
        tz: Europe/Berlin
        missed: skip
        """,
    )
    [entry] = settings.entries
    assert (entry.name, entry.cron, entry.job, entry.args) == (
        "refill",
        "*/5 * * * *",
        "periodic_config_test.Report",
        [1, "two"],
    )
    assert (entry.tz, entry.missed, entry.capacity) == ("Europe/Berlin", "skip", False)


def test_defaults_utc_missed_once_no_args(tmp_path: Path) -> None:
    [entry] = periodic(tmp_path, "cron: '0 3 * * *'\njob: x.Y\n").entries
    assert (entry.tz, entry.missed, entry.args, entry.capacity) == ("UTC", "once", [], False)


def test_the_list_form_names_an_entry_after_its_job() -> None:
    settings = entries_list(
        [{"cron": "* * * * *", "job": "a.B"}, {"name": "c", "cron": "* * * * * *", "job": "a.B"}]
    )
    assert [entry.name for entry in settings.entries] == ["a.B", "c"]


@pytest.mark.parametrize(
    ("entry", "key", "expected"),
    [
        ("cron: '61 * * * *'\njob: a.B", "cron", "expected a cron expression"),
        ("cron: '* * *'\njob: a.B", "cron", "got 3 field(s)"),
        ("cron: '* * * * *'\njob: a.B\ntz: Mars/Olympus", "tz", "expected an IANA time zone"),
        ("cron: '* * * * *'\njob: a.B\nmissed: all", "missed", "expected one of ['once', 'skip']"),
        ("cron: '* * * * *'\njob: a.B\nargs: 7", "args", "expected a list of arguments"),
        ("cron: '* * * * *'\njob: a.B\nargs: [2024-01-01]", "args", "expected JSON values"),
        ("cron: '* * * * *'\njob: a.B\ncapacity: maybe", "capacity", "expected true or false"),
        ("cron: '* * * * *'\njob: a.B\ncorn: x", "corn", "unknown key"),
        ("cron: '* * * * *'", "job", "expected a job name"),
        ("job: a.B", "cron", "expected a cron expression"),
    ],
)
def test_a_mistake_names_the_file_the_key_and_what_was_expected(
    tmp_path: Path, entry: str, key: str, expected: str
) -> None:
    with pytest.raises(ConfigError) as caught:
        periodic(tmp_path, entry)
    assert caught.value.file == str(tmp_path / "a.yml")
    assert caught.value.key == f"periodic.refill.{key}"
    assert expected in caught.value.message


@pytest.mark.parametrize(
    ("items", "key", "expected"),
    [
        ([{"cron": "bad", "job": "a.B"}], "periodic[0].cron", "expected a cron expression"),
        (["* * * * *"], "periodic[0]", "expected a mapping with cron and job"),
        (
            [{"cron": "* * * * *", "job": "a.B"}, {"cron": "0 * * * *", "job": "a.B"}],
            "periodic[1].name",
            "name 'a.B' is used twice (also periodic[0])",
        ),
        ([{"cron": "* * * * *", "job": "a.B", "tz": "nowhere"}], "periodic[0].tz", "IANA"),
        ([{"cron": "* * * * *", "job": "a.B", "name": "two words"}], "periodic[0].name", "space"),
    ],
)
def test_a_mistake_in_the_list_form_names_its_index(
    items: list[Any], key: str, expected: str
) -> None:
    with pytest.raises(ConfigError) as caught:
        entries_list(items)
    assert (caught.value.file, caught.value.key) == ("conf/a.yml", key)
    assert expected in caught.value.message


def test_check_prints_the_section_in_a_form_that_reads_back(tmp_path: Path) -> None:
    from limitd.config.schema import config_as_dict

    first = load_config([write(tmp_path, "periodic:\n  r:\n    cron: '0 3 * * *'\n    job: a.B\n")])
    printed = config_as_dict(first)["periodic"]
    assert printed == {
        "r": {
            "cron": "0 3 * * *",
            "job": "a.B",
            "args": [],
            "capacity": False,
            "tz": "UTC",
            "missed": "once",
        }
    }
    again = load_config([write(tmp_path, json.dumps({"periodic": printed}), "b.yml")])
    assert again.section("periodic") == first.section("periodic")


def test_the_list_form_loads_from_a_file(tmp_path: Path) -> None:
    config = load_config(
        [write(tmp_path, "periodic:\n  - cron: '* * * * *'\n    job: a.B\n    args: [1]\n")]
    )
    [entry] = config.section("periodic").entries
    assert (entry.name, entry.args) == ("a.B", [1])


def own_jobs() -> list[JobSpec]:
    """This module's job only: other test modules define jobs other checks refuse."""
    spec = registry.resolve("periodic_config_test.Report")
    assert spec is not None
    return [spec]


# --- the check against the app's jobs ----------------------------------------------------


def test_the_job_may_be_named_by_wire_name_or_dotted_path(tmp_path: Path) -> None:
    for job in ("periodic_config_test.Report", f"{__name__}.report"):
        file = write(tmp_path, f"periodic:\n  r:\n    cron: '0 3 * * *'\n    job: {job}\n")
        check_app(load_config([file]), own_jobs())


def test_an_unknown_job_is_a_config_error(tmp_path: Path) -> None:
    file = write(tmp_path, "periodic:\n  r:\n    cron: '0 3 * * *'\n    job: app.Nope\n")
    with pytest.raises(ConfigError) as caught:
        check_app(load_config([file]), own_jobs())
    assert (caught.value.file, caught.value.key) == (file, "periodic.r.job")
    assert "'app.Nope' is not a registered job" in caught.value.message


def test_capacity_on_a_job_that_is_not_limited_capacity_is_a_config_error(
    tmp_path: Path,
) -> None:
    file = write(
        tmp_path,
        "periodic:\n  r:\n    cron: '0 3 * * *'\n    job: periodic_config_test.Report\n"
        "    capacity: true\n",
    )
    with pytest.raises(ConfigError) as caught:
        check_app(load_config([file]), own_jobs())
    assert caught.value.key == "periodic.r.capacity"
    assert "needs a LimitedCapacityJob" in caught.value.message


# --- the command line -------------------------------------------------------------------


def limitd_check(tmp_path: Path, config: str) -> subprocess.CompletedProcess[str]:
    (tmp_path / "periodic_check_app.py").write_text(
        "import limitd\n\n@limitd.job(name='Nightly')\ndef nightly():\n    pass\n"
    )
    write(tmp_path, config, "app.yml")
    env = {**os.environ, "PYTHONPATH": str(tmp_path)}
    env.pop("LIMITD_CONFIG", None)
    return subprocess.run(
        [sys.executable, "-m", "limitd.cli", "check", "app.yml"],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        check=False,
        timeout=60,
    )


def test_limitd_check_exits_78_naming_file_and_key_of_a_bad_cron(tmp_path: Path) -> None:
    done = limitd_check(
        tmp_path,
        """
        require: [periodic_check_app]
        periodic:
          nightly:
            cron: "0 25 * * *"
            job: Nightly
        """,
    )
    assert done.returncode == EX_CONFIG
    assert "app.yml: periodic.nightly.cron: expected a cron expression" in done.stderr


def test_limitd_check_exits_78_for_a_job_the_app_does_not_define(tmp_path: Path) -> None:
    done = limitd_check(
        tmp_path,
        """
        require: [periodic_check_app]
        periodic:
          nightly:
            cron: "0 3 * * *"
            job: Nighty
        """,
    )
    assert done.returncode == EX_CONFIG
    assert "app.yml: periodic.nightly.job: job 'Nighty' is not a registered job" in done.stderr


def test_limitd_check_accepts_a_good_entry(tmp_path: Path) -> None:
    done = limitd_check(
        tmp_path,
        """
        require: [periodic_check_app]
        periodic:
          nightly:
            cron: "0 3 * * *"
            job: periodic_check_app.nightly
            tz: Europe/Berlin
        """,
    )
    assert done.returncode == 0, done.stderr
    assert "tz: Europe/Berlin" in done.stdout


LISTED = """
    periodic:
      nightly:
        cron: "0 3 * * *"
        job: periodic_config_test.Report
        tz: Europe/Berlin
      often:
        cron: "*/10 * * * * *"
        job: periodic_config_test.Report
"""


def test_limitd_periodic_lists_last_and_next_runs(
    tmp_path: Path,
    redis_server: RedisServer,
    redis: redis_py.Redis,
    capsys: pytest.CaptureFixture[str],
) -> None:
    file = write(tmp_path, LISTED)
    entries = load_config([file]).section("periodic").entries
    now = 1_800_000_000.0  # 2027-01-15 08:00:00 UTC
    [jid] = PeriodicScheduler(redis, entries).fire(entries[0], entries[0].latest_tick(now)) or []
    assert main(["--redis", redis_server.url, "-C", file, "periodic"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].split() == [
        "NAME",
        "CRON",
        "TZ",
        "JOB",
        "LAST",
        "JID",
        "LAST",
        "RUN",
        "NEXT",
        "RUN",
    ]
    assert lines[1].split()[:9] == [
        "nightly", "0", "3", "*", "*", "*", "Europe/Berlin", "periodic_config_test.Report", jid,
    ]  # fmt: skip
    assert re.search(r" 03:00:00\+0[12]:00$", lines[1]), "the next run, in the entry's zone"
    assert lines[2].split()[:3] == ["often", "*/10", "*"] and " - " in lines[2]


def test_limitd_periodic_json(
    tmp_path: Path,
    redis_server: RedisServer,
    redis: redis_py.Redis,
    capsys: pytest.CaptureFixture[str],
) -> None:
    file = write(tmp_path, LISTED)
    entries = load_config([file]).section("periodic").entries
    tick = entries[1].latest_tick(1_800_000_000.0)
    [jid] = PeriodicScheduler(redis, entries).fire(entries[1], tick) or []
    assert main(["--redis", redis_server.url, "-C", file, "periodic", "--json"]) == 0
    nightly, often = json.loads(capsys.readouterr().out)
    assert nightly["name"] == "nightly" and nightly["last_jid"] is None
    assert nightly["last_run_at"] is None and nightly["next_run"] > 0
    assert (often["last_jid"], often["last_tick"], often["tz"]) == (jid, tick, "UTC")
    assert set(often) == {
        "name", "cron", "tz", "job", "last_tick", "last_jid", "last_run_at", "next_run",
    }  # fmt: skip


def test_limitd_periodic_without_config_lists_what_schedulers_recorded(
    redis_server: RedisServer, redis: redis_py.Redis, capsys: pytest.CaptureFixture[str]
) -> None:
    entries = entries_list(
        [{"name": "n", "cron": "0 3 * * *", "job": "periodic_config_test.Report"}]
    )
    PeriodicScheduler(redis, entries.entries).catch_up(1_800_000_000.0)
    env_config = os.environ.pop("LIMITD_CONFIG", None)
    try:
        assert main(["--redis", redis_server.url, "periodic", "--json"]) == 0
    finally:
        if env_config is not None:
            os.environ["LIMITD_CONFIG"] = env_config
    [status] = json.loads(capsys.readouterr().out)
    assert (status["name"], status["cron"], status["job"]) == (
        "n",
        "0 3 * * *",
        "periodic_config_test.Report",
    )
