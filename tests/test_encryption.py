"""Encrypted arguments on real Redis: what Redis holds (queue, retry set, dead set) never
contains the clear arguments; the job runs with them; keys rotate; a missing, wrong or
tampered key sends the job to the dead set with the reason, and ``limitd dead retry``
runs it once the key is back; the CLI and the admin API show ``[encrypted]``; and a real
``limitd start`` opens arguments with the key from its environment."""

from __future__ import annotations

import base64
import json
import os
import shutil
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
import redis as redis_py

import limitd
from limitd import api, keys
from limitd.config import ConfigError, load_config
from limitd.encryption.cipher import PREFIX, SHOWN, Keyring, new_key
from limitd.encryption.section import CURRENT_VARIABLE, KEYS_VARIABLE, keyring_from_environment
from limitd.supervisor import Capsule, CapsuleConfig
from tests.helpers import LimitdProcesses, wait_for

SECRET = "4111-1111-1111-1111"
KEY_1, KEY_2, OTHER = new_key(), new_key(), new_key()
ran: list[tuple[object, ...]] = []
failures_left: list[int] = []


@limitd.job(name="encryption_test.Charge", encrypt=True)
def charge(account: int, card: str) -> None:
    if failures_left:
        failures_left.pop()
        raise RuntimeError("gateway down")
    ran.append((account, card))


@limitd.job(name="encryption_test.Doomed", encrypt=True, retry=0)
def doomed(card: str) -> None:
    raise RuntimeError("declined")


@limitd.job(name="encryption_test.Once", encrypt=True, unique_for=600)
def once(card: str) -> None:
    ran.append((card,))


@limitd.job(name="encryption_test.AsyncCharge", encrypt=True)
async def async_charge(account: int, card: str) -> None:
    ran.append(("async", account, card))


@limitd.job(name="encryption_test.Plain")
def plain(card: str) -> None:
    ran.append((card,))


def discard_it(payload: dict[str, object], exc: BaseException) -> str:
    ran.append(("told", type(exc).__name__))
    return "discard"


@limitd.job(name="encryption_test.Discarding", encrypt=True, retries_exhausted=discard_it)
def discarding(card: str) -> None:
    ran.append((card,))


def use_keys(monkeypatch: pytest.MonkeyPatch, keys_text: str, current: str = "") -> None:
    """Keys from the environment, for the clients and capsules built after."""
    monkeypatch.setenv(KEYS_VARIABLE, keys_text)
    if current:
        monkeypatch.setenv(CURRENT_VARIABLE, current)
    else:
        monkeypatch.delenv(CURRENT_VARIABLE, raising=False)
    limitd.set_default_client(limitd.Client(limitd.default_client().redis))


def fresh_capsule(redis: redis_py.Redis) -> Capsule:
    """A capsule whose chain reads the keys the environment has now."""
    return Capsule(CapsuleConfig(queues=["default"]), redis=redis)


def everything_in(redis: redis_py.Redis) -> bytes:
    """Every value Redis holds in the queue and the sorted sets, as raw bytes."""
    k = keys.of(redis)
    values = redis.lrange(k.queue("default"), 0, -1)
    for name in (k.SCHEDULE, k.RETRY, k.DEAD):
        values += redis.zrange(name, 0, -1)
    return b"\n".join(values)


@pytest.fixture(autouse=True)
def clean(monkeypatch: pytest.MonkeyPatch, redis: redis_py.Redis) -> Iterator[None]:
    ran.clear()
    failures_left.clear()
    use_keys(monkeypatch, f"1:{KEY_1}")
    yield


def test_the_queue_holds_only_the_sealed_arguments(redis: redis_py.Redis) -> None:
    charge.perform_async(7, SECRET)
    [raw] = redis.lrange(keys.of(redis).queue("default"), 0, -1)
    payload = json.loads(raw)
    assert SECRET.encode() not in raw
    assert payload["encrypt"] is True
    [sealed] = payload["args"]  # one sealed string: the 7 is not there either
    assert sealed.startswith(PREFIX + "1:")
    assert fresh_capsule(redis).drain() == {"done": 1}
    assert ran == [(7, SECRET)]


def test_an_async_job_gets_its_arguments_in_clear(redis: redis_py.Redis) -> None:
    async_charge.perform_async(8, SECRET)
    assert SECRET.encode() not in everything_in(redis)
    assert fresh_capsule(redis).drain() == {"done": 1}
    assert ran == [("async", 8, SECRET)]


def test_a_bulk_push_seals_each_job(redis: redis_py.Redis) -> None:
    charge.perform_bulk([[1, SECRET], [2, SECRET]])
    assert SECRET.encode() not in everything_in(redis)
    assert fresh_capsule(redis).drain() == {"done": 2}
    assert sorted(ran) == [(1, SECRET), (2, SECRET)]


def test_the_fake_testing_mode_records_sealed_and_runs_clear_arguments() -> None:
    from limitd import testing

    with testing.fake() as jobs:
        charge.perform_async(9, SECRET)
        [[sealed]] = jobs.args_for(charge)
        assert sealed.startswith(PREFIX)
        jobs.drain()
    assert ran == [(9, SECRET)]


def test_a_plain_job_is_left_in_clear(redis: redis_py.Redis) -> None:
    plain.perform_async(SECRET)
    assert SECRET.encode() in everything_in(redis)


def test_retry_and_dead_sets_keep_the_sealed_arguments(redis: redis_py.Redis) -> None:
    failures_left.append(1)
    charge.perform_async(7, SECRET)
    doomed.perform_async(SECRET)
    capsule = fresh_capsule(redis)
    assert capsule.drain() == {"retry": 1, "dead": 1}
    held = everything_in(redis)
    assert held.count(PREFIX.encode()) == 2
    assert SECRET.encode() not in held
    k = keys.of(redis)
    retry = json.loads(redis.zrange(k.RETRY, 0, -1)[0])
    assert retry["args"][0].startswith(PREFIX) and "_limitd_sealed_args" not in retry
    redis.zadd(k.RETRY, {redis.zrange(k.RETRY, 0, -1)[0]: 0})  # due now
    assert capsule.drain(scheduled=True) == {"done": 1}
    assert ran == [(7, SECRET)]


def test_a_job_sealed_with_an_old_key_runs_after_rotation(
    redis: redis_py.Redis, monkeypatch: pytest.MonkeyPatch
) -> None:
    charge.perform_async(1, SECRET)
    use_keys(monkeypatch, f"1:{KEY_1},2:{KEY_2}", current="2")
    charge.perform_async(2, SECRET)
    versions = [
        json.loads(raw)["args"][0].split(":")[2]
        for raw in redis.lrange(keys.of(redis).queue("default"), 0, -1)
    ]
    assert sorted(versions) == ["v1", "v2"]
    assert fresh_capsule(redis).drain() == {"done": 2}
    assert sorted(ran) == [(1, SECRET), (2, SECRET)]


def test_a_missing_key_sends_the_job_to_the_dead_set_until_it_is_back(
    redis: redis_py.Redis, monkeypatch: pytest.MonkeyPatch
) -> None:
    jid = charge.perform_async(7, SECRET)
    use_keys(monkeypatch, f"2:{KEY_2}")
    assert fresh_capsule(redis).drain() == {"dead": 1}  # at once: no retry burned
    assert ran == []
    [entry] = list(api.DeadSet())
    assert entry.jid == jid
    assert entry.get("error_class") == "limitd.encryption.cipher.UndecryptableArguments"
    assert "key version 1, which is not configured" in entry.get("error_message")
    assert entry.args == [SHOWN]
    assert SECRET.encode() not in everything_in(redis)

    use_keys(monkeypatch, f"1:{KEY_1},2:{KEY_2}")
    url = redis.connection_pool.connection_kwargs
    env = {"LIMITD_REDIS_URL": f"redis://{url['host']}:{url['port']}/{url.get('db', 0)}"}
    out = subprocess.run(
        [sys.executable, "-m", "limitd.cli", "dead", "retry", str(jid)],
        capture_output=True,
        text=True,
        env={**os.environ, **env},
        check=False,
    )
    assert out.returncode == 0, out.stderr
    assert fresh_capsule(redis).drain() == {"done": 1}
    assert ran == [(7, SECRET)]


def test_a_hook_that_discards_dead_jobs_does_not_lose_one_whose_key_is_missing(
    redis: redis_py.Redis, monkeypatch: pytest.MonkeyPatch
) -> None:
    jid = discarding.perform_async(SECRET)
    use_keys(monkeypatch, f"2:{KEY_2}")
    assert fresh_capsule(redis).drain() == {"dead": 1}
    assert ran == [("told", "UndecryptableArguments")], "the hook hears of it"
    assert [entry.jid for entry in api.DeadSet()] == [jid], "kept for its key's return"


def test_a_wrong_key_or_a_tampered_job_goes_dead_with_the_reason(
    redis: redis_py.Redis, monkeypatch: pytest.MonkeyPatch
) -> None:
    charge.perform_async(7, SECRET)
    k = keys.of(redis)
    [raw] = redis.lrange(k.queue("default"), 0, -1)
    moved = {**json.loads(raw), "jid": "0" * 24}  # the sealed args copied to another job
    redis.lpush(k.queue("default"), json.dumps(moved))
    use_keys(monkeypatch, f"1:{OTHER}")
    assert fresh_capsule(redis).drain() == {"dead": 2}
    use_keys(monkeypatch, f"1:{KEY_1}")
    capsule = fresh_capsule(redis)
    for entry in api.DeadSet():
        assert "do not open with key version 1" in entry.get("error_message")
        assert entry.retry()
    assert capsule.drain() == {"done": 1, "dead": 1}  # the moved copy never opens
    assert ran == [(7, SECRET)]


def test_unique_jobs_still_match_on_the_clear_arguments(redis: redis_py.Redis) -> None:
    assert once.perform_async(SECRET) is not None
    assert once.perform_async(SECRET) is None
    assert once.perform_async("another card") is not None


def test_the_cli_lists_encrypted_arguments_as_such(redis: redis_py.Redis) -> None:
    doomed.perform_async(SECRET)
    assert fresh_capsule(redis).drain() == {"dead": 1}
    url = redis.connection_pool.connection_kwargs
    out = subprocess.run(
        [sys.executable, "-m", "limitd.cli", "dead", "list", "--json"],
        capture_output=True,
        text=True,
        env={**os.environ, "LIMITD_REDIS_URL": f"redis://{url['host']}:{url['port']}/0"},
        check=False,
    )
    assert out.returncode == 0, out.stderr
    assert SHOWN in out.stdout and SECRET not in out.stdout and PREFIX not in out.stdout


def test_the_dashboard_shows_encrypted_arguments_as_such(redis: redis_py.Redis) -> None:
    from starlette.testclient import TestClient

    from limitd.web import app

    charge.perform_async(7, SECRET)
    doomed.perform_async(SECRET)
    assert fresh_capsule(redis).drain() == {"done": 1, "dead": 1}
    charge.perform_async(8, SECRET)
    with TestClient(app(redis)) as client:
        pages = [client.get(path).text for path in ("/dead", "/queues/default")]
    for page in pages:
        assert SHOWN in page and SECRET not in page and PREFIX not in page


def test_pushing_without_a_key_fails_at_the_caller(
    redis: redis_py.Redis, monkeypatch: pytest.MonkeyPatch
) -> None:
    use_keys(monkeypatch, "")
    monkeypatch.delenv(KEYS_VARIABLE)
    with pytest.raises(ValueError, match="no encryption key is configured"):
        charge.perform_async(7, SECRET)
    assert everything_in(redis) == b""


def test_the_config_section_gives_versioned_keys(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv(KEYS_VARIABLE)
    monkeypatch.setenv("APP_KEY_1", KEY_1)
    monkeypatch.setenv("APP_KEY_2", KEY_2)
    path = tmp_path / "app.yml"
    path.write_text("encryption:\n  keys:\n    v1: ${APP_KEY_1}\n    '2': ${APP_KEY_2}\n")
    keyring = load_config([str(path)]).sections["encryption"]
    assert isinstance(keyring, Keyring)
    assert keyring.current == 2 and sorted(keyring.keys) == [1, 2]
    assert KEY_1 not in repr(keyring)


@pytest.mark.parametrize(
    ("text", "key", "expected"),
    [
        ("encryption:\n  keys:\n    v1: short\n", "encryption.keys.v1", "32 random bytes"),
        ("encryption:\n  keys:\n    one: {key}\n", "encryption.keys.one", "key version"),
        ("encryption:\n  keys:\n    v1: {key}\n  current: 3\n", "encryption.current", "[1]"),
        ("encryption:\n  key: {key}\n", "encryption.key", "unknown key"),
    ],
)
def test_config_mistakes_name_the_file_and_key(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, text: str, key: str, expected: str
) -> None:
    monkeypatch.delenv(KEYS_VARIABLE)
    path = tmp_path / "bad.yml"
    path.write_text(text.format(key=KEY_1))
    with pytest.raises(ConfigError) as raised:
        load_config([str(path)])
    assert (raised.value.file, raised.value.key) == (str(path), key)
    assert expected in raised.value.message and KEY_1 not in str(raised.value)


@pytest.mark.parametrize(
    ("variables", "name", "expected"),
    [
        ({KEYS_VARIABLE: "1=abc"}, KEYS_VARIABLE, "VERSION:BASE64KEY"),
        ({KEYS_VARIABLE: "1:" + base64.b64encode(b"x" * 16).decode()}, KEYS_VARIABLE, "32"),
        ({KEYS_VARIABLE: f"1:{KEY_1}", CURRENT_VARIABLE: "2"}, CURRENT_VARIABLE, "[1]"),
    ],
)
def test_environment_mistakes_name_the_variable(
    variables: dict[str, str], name: str, expected: str
) -> None:
    with pytest.raises(ConfigError) as raised:
        keyring_from_environment(variables)
    assert raised.value.key == name and expected in raised.value.message


APP = """
import json, limitd

@limitd.job(name="sealed_app.Charge", encrypt=True)
def charge(account, card):
    with open("ran.jsonl", "a") as out:
        out.write(json.dumps([account, card]) + "\\n")
"""


@pytest.mark.parametrize("source", ["environment", "config"])
def test_limitd_start_opens_arguments_with_its_keys(
    tmp_path: Path, redis: redis_py.Redis, redis_server: object, source: str
) -> None:
    (tmp_path / "sealed_app.py").write_text(APP)
    config = "require: [sealed_app]\nqueues: [default]\n"
    processes = LimitdProcesses(tmp_path, redis_server.url)  # type: ignore[attr-defined]
    if source == "environment":
        processes.env[KEYS_VARIABLE] = f"1:{KEY_1}"
    else:
        config += "encryption:\n  keys: {v1: '${APP_KEY}'}\n"
        processes.env["APP_KEY"] = KEY_1
        processes.env.pop(KEYS_VARIABLE, None)
    (tmp_path / "app.yml").write_text(config)
    proc = processes.start("app.yml")
    try:
        client = limitd.Client(redis)
        client.push({"class": "sealed_app.Charge", "args": [3, SECRET], "encrypt": True})
        done = tmp_path / "ran.jsonl"
        wait_for(done.exists, timeout=30, message="the job to run under limitd start")
        wait_for(lambda: done.read_text().endswith("\n"), message="the job's line")
        assert json.loads(done.read_text()) == [3, SECRET]
        assert SECRET not in (tmp_path / "limitd.log").read_text()
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=30) == 0
    finally:
        processes.kill_all()


def test_limitd_enqueue_seals_with_the_configs_keys_or_says_none_is_there(
    tmp_path: Path, redis: redis_py.Redis, redis_server: object
) -> None:
    (tmp_path / "sealed_app.py").write_text(APP)
    with_keys = "require: [sealed_app]\nencryption:\n  keys: {v1: '${APP_KEY}'}\n"
    (tmp_path / "keys.yml").write_text(with_keys)
    (tmp_path / "nokeys.yml").write_text("require: [sealed_app]\n")
    env = {k: v for k, v in os.environ.items() if k != KEYS_VARIABLE}
    env |= {"APP_KEY": KEY_1, "LIMITD_REDIS_URL": redis_server.url}  # type: ignore[attr-defined]

    def enqueue(config: str) -> subprocess.CompletedProcess[str]:
        argv = ["-C", config, "enqueue", "sealed_app.Charge", f'[5, "{SECRET}"]']
        command = [sys.executable, "-m", "limitd.cli", *argv]
        return subprocess.run(
            command, cwd=tmp_path, env=env, capture_output=True, text=True, check=False
        )

    sealed = enqueue("keys.yml")
    assert sealed.returncode == 0, sealed.stderr
    [raw] = redis.lrange(keys.of(redis).queue("default"), 0, -1)
    assert SECRET.encode() not in raw and json.loads(raw)["args"][0].startswith(PREFIX)
    refused = enqueue("nokeys.yml")
    assert refused.returncode == 64 and "Traceback" not in refused.stderr
    assert refused.stderr.startswith("limitd enqueue: ") and "key" in refused.stderr
    assert redis.llen(keys.of(redis).queue("default")) == 1, "nothing more written"


def test_an_encrypted_job_cannot_be_a_batch_callback(redis: redis_py.Redis) -> None:
    batch = limitd.Batch()
    with pytest.raises(ValueError, match=r"batch callback encryption_test\.Charge has encrypt"):
        batch.on("success", charge, {"card": SECRET})
        with batch.jobs():
            plain.perform_async("x")


RUBY_APP = """
require "sidekiq"
require "json"

class RubyEcho
  include Sidekiq::Worker
  def perform(*args)
    Sidekiq.redis { |c| c.rpush("ruby_ran", JSON.generate(args)) }
  end
end
"""


@pytest.mark.skipif(not shutil.which("sidekiq"), reason="ruby and sidekiq not installed")
def test_a_ruby_sidekiq_worker_sees_one_sealed_string(
    tmp_path: Path, redis: redis_py.Redis, redis_server: object
) -> None:
    (tmp_path / "app.rb").write_text(RUBY_APP)
    url = redis_server.url  # type: ignore[attr-defined]
    proc = subprocess.Popen(
        ["sidekiq", "-r", "./app.rb", "-q", "ruby", "-c", "1"],
        cwd=tmp_path,
        env={**os.environ, "REDIS_URL": url},
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        limitd.Client(redis).push(
            {"class": "RubyEcho", "queue": "ruby", "args": [7, SECRET], "encrypt": True}
        )
        wait_for(lambda: redis.llen("ruby_ran") == 1, timeout=60, message="sidekiq to run it")
        [seen] = json.loads(redis.lindex("ruby_ran", 0))
        assert seen.startswith(PREFIX + "1:") and SECRET not in seen
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.wait(timeout=30)
