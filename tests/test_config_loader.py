"""Config files to a checked Config: merging, interpolation, capsules, and one clear
error per mistake naming the file and the key path."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import yaml

from limitd.config import CapsuleSpec, Config, ConfigError, config_as_dict, load_config
from limitd.retry import DeadSetPolicy

DAY = 86_400


def write(tmp_path: Path, name: str, text: str) -> Path:
    path = tmp_path / name
    path.write_text(text)
    return path


def load(tmp_path: Path, *texts: str, env: dict[str, str] | None = None) -> Config:
    names = ("base.yml", "prod.yml", "local.yml")[: len(texts)]
    paths = [write(tmp_path, name, text) for name, text in zip(names, texts, strict=True)]
    return load_config(paths, env=env or {})


def capsule(config: Config, name: str) -> CapsuleSpec:
    found = [spec for spec in config.capsules if spec.config.name == name]
    assert len(found) == 1, [spec.config.name for spec in config.capsules]
    return found[0]


def names(config: Config) -> list[str]:
    return [spec.config.name for spec in config.capsules]


BASE = """
concurrency: 5
timeout: 10
queues: [critical, default]
limits: {critical: 2}
capsules:
  mail:
    queues: [mail, bulk_mail]
    concurrency: 3
    limits: {mail: 1}
  reports:
    queues: [reports]
"""

PROD = """
timeout: 30
queues: [critical, default, low]
capsules:
  mail:
    concurrency: 8
    queues: [mail]
"""


def test_later_file_overrides_scalars_merges_capsules_by_name_and_replaces_lists(
    tmp_path: Path,
) -> None:
    config = load(tmp_path, BASE, PROD)
    assert names(config) == ["default", "mail", "reports"]
    default = capsule(config, "default").config
    assert default.timeout == 30.0
    assert default.concurrency == 5  # not in prod.yml: base.yml's value stays
    assert list(default.queues) == ["critical", "default", "low"]
    mail = capsule(config, "mail").config
    assert mail.concurrency == 8
    assert list(mail.queues) == ["mail"]  # the list is replaced, not appended to
    assert dict(mail.limits) == {"mail": 1}  # merged by name: base's limit stays
    assert capsule(config, "reports").config.timeout == 30.0  # inherited from prod.yml


def test_files_and_base_dir(tmp_path: Path) -> None:
    (tmp_path / "conf").mkdir()
    base = write(tmp_path, "conf/base.yml", "concurrency: 2\n")
    other = write(tmp_path, "prod.yml", "concurrency: 3\n")
    config = load_config([base, str(other)], env={})
    assert config.files == [str(base), str(other)]
    assert config.base_dir == str(tmp_path / "conf")
    assert capsule(config, "default").config.concurrency == 3


def test_no_file_gives_the_defaults() -> None:
    config = load_config([], env={})
    assert config.files == []
    assert config.base_dir == "."
    assert names(config) == ["default"]
    spec = config.capsules[0]
    assert list(spec.config.queues) == ["default"]
    assert (spec.config.concurrency, spec.config.timeout, spec.processes) == (10, 25.0, 1)


def test_queue_entries_in_every_form(tmp_path: Path) -> None:
    config = load(tmp_path, 'queues: [critical, "default, 2", [low, 1]]\n')
    spec = capsule(config, "default").config
    assert list(spec.queues) == ["critical", ["default", 2], ["low", 1]]


def test_interpolation_with_and_without_default(tmp_path: Path) -> None:
    text = """
tag: ${TAG}
redis: {url: "redis://${REDIS_HOST:-localhost}:6379/${DB:-0}"}
logging: {file: "${LOG_DIR:-/var/log}/limitd.log"}
require: ["${APP}.jobs"]
"""
    config = load(tmp_path, text, env={"TAG": "web", "DB": "", "APP": "shop"})
    assert config.tag == "web"
    assert config.redis.url == "redis://localhost:6379/0"  # unset and empty: the default
    assert config.logging.file == "/var/log/limitd.log"
    assert config.require == ["shop.jobs"]


def test_interpolated_text_takes_the_type_its_key_expects(tmp_path: Path) -> None:
    text = """
concurrency: ${THREADS}
timeout: ${TIMEOUT}
dynamic: ${DYNAMIC}
poll_range: ["${LOW}", 2]
tag: ${TAG}
limits: {default: "${LIMIT}"}
processes: ${PROCS:-}
"""
    env = {"THREADS": "12", "TIMEOUT": "2.5", "DYNAMIC": "yes", "LOW": "1", "TAG": "on"}
    spec = capsule(load(tmp_path, text, env={**env, "LIMIT": "3"}), "default")
    assert spec.config.concurrency == 12
    assert spec.config.timeout == 2.5
    assert spec.config.dynamic is True
    assert spec.config.poll_range == (1.0, 2.0)
    assert spec.config.tag == "on"  # a string key keeps the text: not YAML's true
    assert dict(spec.config.limits) == {"default": 3}
    assert spec.processes == 1  # empty after interpolation: the default


def test_literal_strings_are_not_numbers_and_dollar_escape(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=r"concurrency: expected an integer >= 1, got '12'"):
        load(tmp_path, 'concurrency: "12"\n')
    config = load(tmp_path, "tag: cost-$${HOME}\n", env={"HOME": "/root"})
    assert config.tag == "cost-${HOME}"


def test_limitd_redis_url_overrides_the_file(tmp_path: Path) -> None:
    text = "redis: {url: 'redis://files:6379/0', pool_size: 20, socket_timeout: 3}\n"
    config = load(tmp_path, text, env={"LIMITD_REDIS_URL": "redis://env:6380/1"})
    assert config.redis.url == "redis://env:6380/1"
    assert (config.redis.pool_size, config.redis.socket_timeout) == (20, 3.0)
    assert load(tmp_path, text, env={}).redis.url == "redis://files:6379/0"
    assert load(tmp_path, "tag: x\n", env={}).redis.url is None


def test_only_named_capsules_means_no_default_capsule(tmp_path: Path) -> None:
    config = load(tmp_path, "timeout: 5\ncapsules:\n  mail:\n    queues: [mail]\n")
    assert names(config) == ["mail"]


def test_top_level_queues_and_named_capsules_make_both(tmp_path: Path) -> None:
    config = load(tmp_path, "queues: [a]\ncapsules:\n  mail:\n    queues: [mail]\n")
    assert names(config) == ["default", "mail"]
    assert list(capsule(config, "default").config.queues) == ["a"]


def test_empty_capsules_section_keeps_the_default_capsule(tmp_path: Path) -> None:
    config = load(tmp_path, "concurrency: 4\ncapsules: {}\n")
    assert names(config) == ["default"]
    assert capsule(config, "default").config.concurrency == 4


def test_named_capsule_inherits_shared_settings_not_queues_or_limits(tmp_path: Path) -> None:
    text = """
require: [app.jobs]
queues: [a, b]
concurrency: 20
limits: {a: 1}
timeout: 40
heartbeat_period: 5
poll_range: [1, 2]
fetch: basic
tag: web
dead: {max_jobs: 50, timeout_days: 7}
capsules:
  plain:
    queues: [b]
  own:
    queues: [c]
    require: [app.more]
    timeout: 3
    fetch: limit
    tag: own
    dead: {max_jobs: 5}
"""
    config = load(tmp_path, text)
    plain = capsule(config, "plain").config
    assert (plain.timeout, plain.heartbeat_period, plain.poll_range) == (40.0, 5.0, (1.0, 2.0))
    assert (plain.fetch, plain.tag, list(plain.require)) == ("basic", "web", ["app.jobs"])
    assert plain.dead_set == DeadSetPolicy(timeout_seconds=7 * DAY, max_jobs=50)
    assert plain.concurrency == 10  # top-level concurrency belongs to the default capsule
    assert dict(plain.limits) == {}
    own = capsule(config, "own").config
    assert (own.timeout, own.fetch, own.tag) == (3.0, "limit", "own")
    assert list(own.require) == ["app.jobs", "app.more"]  # adds to the top-level list
    assert own.dead_set == DeadSetPolicy(timeout_seconds=7 * DAY, max_jobs=5)
    assert config.require == ["app.jobs"]
    assert config.tag == "web"


def test_processes_and_max_memory(tmp_path: Path) -> None:
    text = """
queues: [a]
processes: 3
max_memory_mb: 512
capsules:
  big: {queues: [b], processes: 2, max_memory_mb: 2048}
  small: {queues: [c]}
"""
    config = load(tmp_path, text)
    assert (capsule(config, "default").processes, capsule(config, "default").max_memory_mb) == (
        3,
        512,
    )
    assert (capsule(config, "big").processes, capsule(config, "big").max_memory_mb) == (2, 2048)
    assert (capsule(config, "small").processes, capsule(config, "small").max_memory_mb) == (
        1,
        None,
    )


def test_dynamic_capsule_may_limit_and_block_queues_it_does_not_list(tmp_path: Path) -> None:
    text = "queues: [a]\ndynamic: true\nlimits: {found: 2}\nblocking: [found]\n"
    spec = capsule(load(tmp_path, text), "default").config
    assert dict(spec.limits) == {"found": 2}
    assert list(spec.blocking) == ["found"]


def test_null_in_a_later_file_puts_back_the_default(tmp_path: Path) -> None:
    base = "timeout: 40\nqueues: [a]\nlimits: {a: 1}\ncapsules:\n  m: {queues: [m], timeout: 3}\n"
    prod = "limits: {a: null}\ncapsules:\n  m: {timeout: null}\n"
    config = load(tmp_path, base, prod)
    assert dict(capsule(config, "default").config.limits) == {}
    assert capsule(config, "m").config.timeout == 40.0  # inherited again


def test_yaml_anchors_and_merge_keys(tmp_path: Path) -> None:
    text = """
capsules:
  mail: &common {queues: [mail], concurrency: 4, timeout: 9}
  bulk:
    <<: *common
    queues: [bulk]
"""
    bulk = capsule(load(tmp_path, text), "bulk").config
    assert (list(bulk.queues), bulk.concurrency, bulk.timeout) == (["bulk"], 4, 9.0)


def test_later_file_that_drops_a_limited_queue_is_named(tmp_path: Path) -> None:
    base = "queues: [mail, other]\nlimits: {mail: 1}\n"
    with pytest.raises(ConfigError) as caught:
        load(tmp_path, base, "queues: [other]\n")
    assert caught.value.key == "limits.mail"
    assert f"from {tmp_path / 'prod.yml'}" in str(caught.value)


GOOD = "queues: [a, b]\n"
MAIL = "capsules:\n  mail:\n    queues: [mail]\n"

# (files' texts, index of the file to blame, key path, words of the message)
BAD_CONFIGS = {
    "unknown top-level key": (["sidekiq: {}\n"], 0, "sidekiq", "unknown key"),
    "misspelt key": (["concurency: 3\n"], 0, "concurency", "did you mean 'concurrency'"),
    "unknown capsule key": ([MAIL + "    concurency: 3\n"], 0, "capsules.mail.concurency", ""),
    "unknown redis key": (["redis: {host: x}\n"], 0, "redis.host", "unknown key"),
    "unknown logging key": (["logging: {colour: x}\n"], 0, "logging.colour", "unknown key"),
    "unknown dead key": (["dead: {max: 3}\n"], 0, "dead.max", "unknown key"),
    "unknown capsule dead key": (
        [MAIL + "    dead: {days: 3}\n"],
        0,
        "capsules.mail.dead.days",
        "",
    ),
    "concurrency not an integer": (["concurrency: ten\n"], 0, "concurrency", "an integer >= 1"),
    "negative concurrency": (
        [MAIL, "capsules:\n  mail:\n    concurrency: -2\n"],
        1,
        "capsules.mail.concurrency",
        "expected an integer >= 1, got -2",
    ),
    "zero concurrency": (["concurrency: 0\n"], 0, "concurrency", "got 0"),
    "queues not a list": (["queues: a\n"], 0, "queues", "a non-empty list"),
    "queues empty": (["queues: []\n"], 0, "queues", "a non-empty list of queues, got []"),
    "bad weight": (["queues: [a, 'b,x']\n"], 0, "queues[1]", "integer weight"),
    "negative weight": (["queues: [[a, -1]]\n"], 0, "queues[0]", "got ['a', -1]"),
    "three-item queue": (["queues: [[a, 1, 2]]\n"], 0, "queues[0]", "[name, weight]"),
    "queue listed twice": (["queues: [a, 'a,2']\n"], 0, "queues[1]", "listed twice"),
    "limits not a mapping": ([GOOD + "limits: [a]\n"], 0, "limits", "a mapping"),
    "negative limit": ([GOOD + "limits: {a: -1}\n"], 0, "limits.a", "an integer >= 0"),
    "limit on unlisted queue": ([GOOD + "limits: {c: 1}\n"], 0, "limits.c", "not in this"),
    "process limit on unlisted queue": (
        [MAIL, "capsules:\n  mail:\n    process_limits: {x: 1}\n"],
        1,
        "capsules.mail.process_limits.x",
        "not in this capsule's queues ['mail']",
    ),
    "blocking unlisted queue": ([GOOD + "blocking: [b, c]\n"], 0, "blocking[1]", "'c'"),
    "dynamic not a bool": (["dynamic: 'yes'\n"], 0, "dynamic", "true or false"),
    "tag not a string": (["tag: 5\n"], 0, "tag", "a string"),
    "fetch unknown": (["fetch: fast\n"], 0, "fetch", "['basic', 'limit']"),
    "require not a list": (["require: {app: jobs}\n"], 0, "require", "a list of module names"),
    "require a file path": (["require: [app/jobs.py]\n"], 0, "require[0]", "a module name"),
    "negative timeout": (["timeout: -1\n"], 0, "timeout", "seconds >= 0"),
    "zero heartbeat": (["heartbeat_period: 0\n"], 0, "heartbeat_period", "seconds > 0"),
    "poll_range one value": (["poll_range: [1]\n"], 0, "poll_range", "[low, high]"),
    "poll_range reversed": (
        ["poll_range: [2, 1]\n"],
        0,
        "poll_range",
        "0 < low <= high, got [2, 1]",
    ),
    "poll_range zero": (["poll_range: [0, 1]\n"], 0, "poll_range", "0 < low"),
    "poll_range not a list": (["poll_range: fast\n"], 0, "poll_range", "[low, high]"),
    "zero processes": (["processes: 0\n"], 0, "processes", "an integer >= 1"),
    "negative capsule processes": (
        [MAIL + "    processes: -1\n"],
        0,
        "capsules.mail.processes",
        "an integer >= 1",
    ),
    "zero max memory": (["max_memory_mb: 0\n"], 0, "max_memory_mb", "an integer >= 1"),
    "dead days zero": (["dead: {timeout_days: 0}\n"], 0, "dead.timeout_days", "days > 0"),
    "dead max negative": (["dead: {max_jobs: -1}\n"], 0, "dead.max_jobs", "an integer >= 0"),
    "redis not a mapping": (["redis: 'redis://x'\n"], 0, "redis", "a mapping"),
    "redis url scheme": (["redis: {url: 'x:6379'}\n"], 0, "redis.url", "redis://"),
    "redis pool size": (["redis: {pool_size: 0}\n"], 0, "redis.pool_size", ">= 1"),
    "logging level": (["logging: {level: LOUD}\n"], 0, "logging.level", "'INFO'"),
    "capsules not a mapping": (["capsules: [mail]\n"], 0, "capsules", "a mapping"),
    "capsule null": (["capsules: {mail: }\n"], 0, "capsules.mail", "got null"),
    "capsule without queues": (["capsules: {mail: {concurrency: 2}}\n"], 0, "", "required"),
    "capsule bad name": (["capsules: {'a b': {queues: [q]}}\n"], 0, "capsules.a b", "name"),
    "default twice": ([GOOD + "capsules: {default: {queues: [x]}}\n"], 0, "capsules.default", ""),
    "default capsule key without one": (
        [MAIL, "concurrency: 4\n"],
        1,
        "concurrency",
        "default capsule",
    ),
    "unset variable": (["tag: ${NOPE}\n"], 0, "tag", "NOPE is not set"),
    "unset variable in a list": (["require: [a, '${NOPE}']\n"], 0, "require[1]", "NOPE"),
    "bad reference": (["tag: ${1X}\n"], 0, "tag", "bad reference"),
    "unclosed reference": (["tag: 'a${B'\n"], 0, "tag", "unclosed"),
    "interpolated not a number": (["timeout: ${T}\n"], 0, "timeout", "got 'soon' (from '${T}')"),
    "not YAML": (["queues: [a\n"], 0, "", "not valid YAML"),
    "top level a list": (["- a\n"], 0, "", "expected a mapping"),
    "top level a scalar": (["hello\n"], 0, "", "expected a mapping"),
    "duplicate key": (["concurrency: 1\nconcurrency: 2\n"], 0, "", "duplicate key 'concurrency'"),
    "non-string key": (["limits: {1: 2}\n"], 0, "", "keys must be strings"),
    "later file's bad value": ([GOOD, "timeout: -5\n"], 1, "timeout", "seconds >= 0"),
    "earlier file's bad value": (["timeout: -5\n", "tag: x\n"], 0, "timeout", ""),
}


@pytest.mark.parametrize(
    ("texts", "blamed", "key", "words"), BAD_CONFIGS.values(), ids=BAD_CONFIGS.keys()
)
def test_bad_config_is_one_error_naming_file_and_key(
    tmp_path: Path, texts: list[str], blamed: int, key: str, words: str
) -> None:
    with pytest.raises(ConfigError) as caught:
        load(tmp_path, *texts, env={"T": "soon"})
    error = caught.value
    file = str(tmp_path / ("base.yml", "prod.yml")[blamed])
    assert error.file == file
    assert str(error).startswith(f"{file}: ")
    if key:
        assert error.key == key
        assert f": {key}: " in str(error)
    assert words in error.message
    assert "\n" not in str(error)


def test_capsule_without_queues_names_its_key(tmp_path: Path) -> None:
    with pytest.raises(ConfigError) as caught:
        load(tmp_path, "capsules: {mail: {concurrency: 2}}\n")
    assert caught.value.key == "capsules.mail.queues"


def test_missing_file(tmp_path: Path) -> None:
    path = tmp_path / "missing.yml"
    with pytest.raises(ConfigError) as caught:
        load_config([write(tmp_path, "base.yml", "tag: x\n"), path], env={})
    assert caught.value.file == str(path)
    assert str(caught.value) == f"{path}: file not found"


def test_directory_instead_of_file(tmp_path: Path) -> None:
    with pytest.raises(ConfigError) as caught:
        load_config([tmp_path], env={})
    assert str(caught.value) == f"{tmp_path}: is a directory, expected a YAML file"


def test_unreadable_file_is_named(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = write(tmp_path, "secret.yml", "tag: x\n")

    def refuse(self: Path, encoding: str | None = None) -> str:
        raise PermissionError(13, "Permission denied", str(self))

    monkeypatch.setattr(Path, "read_text", refuse)
    with pytest.raises(ConfigError) as caught:
        load_config([path], env={})
    assert str(caught.value) == f"{path}: not readable: permission denied"


def test_file_that_is_not_utf8(tmp_path: Path) -> None:
    path = tmp_path / "latin1.yml"
    path.write_bytes(b"tag: caf\xe9\n")
    with pytest.raises(ConfigError) as caught:
        load_config([path], env={})
    assert str(caught.value) == f"{path}: not UTF-8 text"


@pytest.mark.skipif(os.geteuid() == 0, reason="root reads any file")
def test_file_without_read_permission(tmp_path: Path) -> None:
    path = write(tmp_path, "secret.yml", "tag: x\n")
    path.chmod(0)
    with pytest.raises(ConfigError, match="not readable"):
        load_config([path], env={})


def test_empty_file_is_an_empty_mapping(tmp_path: Path) -> None:
    config = load(tmp_path, "# nothing yet\n")
    assert names(config) == ["default"]


ROUND_TRIP = """
require: [app.jobs]
tag: ${TAG}
redis: {url: "redis://localhost:6379/${DB:-2}", pool_size: 16}
logging: {level: debug, file: /tmp/limitd.log, format: json, levels: {app.noisy: warning}}
queues: [critical, "default,3", [low, 1]]
concurrency: ${THREADS}
limits: {critical: 2}
process_limits: {default: 1}
blocking: [critical]
processes: 2
max_memory_mb: 1024
dead: {max_jobs: 100, timeout_days: 30}
capsules:
  mail:
    queues: [mail]
    dynamic: true
    limits: {anything: 0}
    poll_range: [1, 3]
    require: [app.mail]
    fetch: basic
"""


def test_config_as_dict_round_trips_through_yaml(tmp_path: Path) -> None:
    env = {"TAG": "web", "THREADS": "7"}
    first = config_as_dict(load(tmp_path, ROUND_TRIP, env=env))
    dumped = write(tmp_path, "effective.yml", yaml.safe_dump(first))
    again = config_as_dict(load_config([dumped], env={}))
    assert again == first
    default = first["capsules"]["default"]
    assert default["queues"] == ["critical", ["default", 3], ["low", 1]]
    assert (default["concurrency"], default["processes"], default["max_memory_mb"]) == (7, 2, 1024)
    assert default["dead"] == {"max_jobs": 100, "timeout_days": 30.0}
    assert first["capsules"]["mail"]["require"] == ["app.jobs", "app.mail"]
    assert first["redis"]["url"] == "redis://localhost:6379/2"
    assert first["logging"] == {
        "level": "DEBUG",
        "levels": {"app.noisy": "WARNING"},
        "format": "json",
        "file": "/tmp/limitd.log",
    }


# A sidekiq.yml as Sidekiq 7 and sidekiq-limit_fetch document it, and limitd's spelling.
SIDEKIQ_YML = """
:concurrency: 5
:timeout: 8
:tag: blue
:verbose: true
:logfile: log/sidekiq.log
:dead_max_jobs: 500
:dead_timeout_in_seconds: 1209600
:queues:
  - [critical, 2]
  - default
:limits:
  critical: 3
:process_limits:
  default: 1
:blocking:
  - critical
:capsules:
  :single:
    :queues: [serial]
    :concurrency: 1
"""
LIMITD_YML = """
concurrency: 5
timeout: 8
tag: blue
logging: {level: DEBUG, file: log/sidekiq.log}
dead: {max_jobs: 500, timeout_days: 14}
queues: [[critical, 2], default]
limits: {critical: 3}
process_limits: {default: 1}
blocking: [critical]
capsules:
  single:
    queues: [serial]
    concurrency: 1
"""


def test_a_sidekiq_yml_loads_to_the_same_config_as_limitds_spelling(tmp_path: Path) -> None:
    sidekiq = load_config([write(tmp_path, "sidekiq.yml", SIDEKIQ_YML)], env={})
    ours = load_config([write(tmp_path, "limitd.yml", LIMITD_YML)], env={})
    assert config_as_dict(sidekiq) == config_as_dict(ours)
    default = capsule(sidekiq, "default").config
    assert default.concurrency == 5 and default.timeout == 8
    assert list(default.queues) == [["critical", 2], "default"]


def test_the_smallest_sidekiq_yml_is_the_issues(tmp_path: Path) -> None:
    sidekiq = write(tmp_path, "sidekiq.yml", ":concurrency: 5\n:queues: [[critical, 2], default]\n")
    ours = write(tmp_path, "limitd.yml", "concurrency: 5\nqueues: [[critical, 2], default]\n")
    assert config_as_dict(load_config([sidekiq], env={})) == config_as_dict(
        load_config([ours], env={})
    )


def test_sidekiq_yml_merges_with_a_limitd_file_key_by_key(tmp_path: Path) -> None:
    config = load(tmp_path, ":concurrency: 5\n:queues: [a]\n", "concurrency: 7\n")
    assert capsule(config, "default").config.concurrency == 7


def test_require_as_one_module_name_is_a_list_of_one(tmp_path: Path) -> None:
    assert load(tmp_path, ":require: myapp.jobs\n").require == ["myapp.jobs"]


def test_verbose_false_is_the_default_level(tmp_path: Path) -> None:
    assert load(tmp_path, ":verbose: false\n").logging.level == "INFO"


SIDEKIQ_MISTAKES = {
    "pidfile": (":pidfile: tmp/pids/sidekiq.pid\n", "pidfile", "writes no pid file"),
    "environment": (":environment: production\n", "environment", "no environments"),
    "environment section": (
        "production:\n  :concurrency: 25\n",
        "production",
        "limitd start base.yml production.yml",
    ),
    "strict": (":strict: false\n", "strict", "Sidekiq ignores it too"),
    "labels": (":labels: [a]\n", "labels", "set tag"),
    "max_retries": (":max_retries: 5\n", "max_retries", "retry=N"),
    "poll interval": (
        ":average_scheduled_poll_interval: 2\n",
        "average_scheduled_poll_interval",
        "until the next scheduled job is due",
    ),
    "handlers": (":error_handlers: []\n", "error_handlers", "limitd.configure_server"),
    "require a path": (":require: ./app.rb\n", "require", "imports Python modules by name"),
    "require a directory": (":require: .\n", "require", "is a path"),
    "erb": (
        ":concurrency: <%= ENV['RAILS_MAX_THREADS'] %>\n",
        "concurrency",
        "${VAR} or ${VAR:-default}",
    ),
    "both spellings": (":concurrency: 5\nconcurrency: 6\n", "concurrency", "given twice"),
    "renamed and new key": (
        ":dead_max_jobs: 5\ndead: {max_jobs: 6}\n",
        "dead_max_jobs",
        "spelling of dead.max_jobs, which is set too",
    ),
    "verbose not a boolean": (":verbose: loud\n", "verbose", "expected true or false"),
    "dead timeout not a number": (
        ":dead_timeout_in_seconds: soon\n",
        "dead_timeout_in_seconds",
        "a number of seconds",
    ),
}


@pytest.mark.parametrize(
    ("text", "key", "words"), SIDEKIQ_MISTAKES.values(), ids=SIDEKIQ_MISTAKES.keys()
)
def test_sidekiq_keys_limitd_has_no_meaning_for_are_refused_saying_what_to_do(
    tmp_path: Path, text: str, key: str, words: str
) -> None:
    with pytest.raises(ConfigError) as caught:
        load(tmp_path, text)
    assert caught.value.file == str(tmp_path / "base.yml")
    assert caught.value.key == key
    assert words in caught.value.message


def test_cpu_affinity_is_inherited_and_none_undoes_it(tmp_path: Path) -> None:
    """CPUs per capsule process: ``auto`` by default, a number or ``auto`` at the top
    level is every capsule's unless one sets its own, and ``none`` gives a capsule back
    to the kernel."""
    assert load(tmp_path, "queues: [a]\n").capsules[0].config.cpu_affinity == "auto"
    text = """
queues: [a]
cpu_affinity: 2
capsules:
  plain:
    queues: [b]
  own:
    queues: [c]
    cpu_affinity: 1
  free:
    queues: [d]
    cpu_affinity: none
  watched:
    queues: [e]
    cpu_affinity: auto
"""
    config = load(tmp_path, text)
    found = {spec.config.name: spec.config.cpu_affinity for spec in config.capsules}
    assert found == {"default": 2, "plain": 2, "own": 1, "free": None, "watched": "auto"}
    again = load(tmp_path, yaml.safe_dump(config_as_dict(config)))
    assert {spec.config.name: spec.config.cpu_affinity for spec in again.capsules} == found


def test_async_loop_names_the_event_loop_and_says_what_is_missing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    assert capsule(load(tmp_path, "queues: [a]\n"), "default").config.async_loop == "asyncio"
    chosen = load(tmp_path, "queues: [a]\nasync_loop: uvloop\n")
    assert capsule(chosen, "default").config.async_loop == "uvloop"
    with pytest.raises(ConfigError, match=r"async_loop: expected one of \['asyncio', 'uvloop'\]"):
        load(tmp_path, "queues: [a]\nasync_loop: trio\n")
    import importlib.util

    real = importlib.util.find_spec
    monkeypatch.setattr(
        importlib.util, "find_spec", lambda name, *a: None if name == "uvloop" else real(name, *a)
    )
    with pytest.raises(ConfigError, match=r"base.yml.*async_loop: uvloop is not installed here"):
        load(tmp_path, "queues: [a]\nasync_loop: uvloop\n")


def test_a_capsule_config_built_in_code_refuses_an_unknown_async_loop() -> None:
    from limitd.supervisor import CapsuleConfig

    with pytest.raises(ValueError, match=r"async_loop must be one of \('asyncio', 'uvloop'\)"):
        CapsuleConfig(async_loop="trio")


def test_a_config_of_10000_queues_and_their_limits_loads_through_libyaml(tmp_path: Path) -> None:
    """Every listed queue's limit is checked against the list (a set, not a scan per
    limit), a limit on an unlisted one is still refused, and the file is parsed by
    libyaml where PyYAML has it (its pure-Python parser took seconds of a start here),
    refusing a key twice as the Python one does."""
    from limitd.config import files

    queues = [f"tenant_{n:05d}" for n in range(10_000)]
    limits = ", ".join(f"{name}: {n % 7 + 1}" for n, name in enumerate(queues))
    text = f"queues: [{', '.join(queues)}]\nlimits: {{{limits}}}\n"
    config = load(tmp_path, text)
    spec = config.capsules[0].config
    assert len(spec.limits) == 10_000 and spec.limits["tenant_09999"] == 9_999 % 7 + 1
    with pytest.raises(ConfigError, match="queue 'typo' is not in this capsule's queues"):
        load(tmp_path, text.replace("tenant_00000: 1", "typo: 1"))
    if yaml.__with_libyaml__:
        assert issubclass(files._StrictLoader, yaml.CSafeLoader)
    with pytest.raises(ConfigError, match="duplicate key 'tenant_00001'"):
        load(tmp_path, text.replace("tenant_00000: 1", "tenant_00001: 1"))
