"""How ``limitd start`` combines files and flags, and builds its Redis clients."""

from __future__ import annotations

import argparse
from pathlib import Path

import pytest

from limitd.commands.start import POOL_EXTRA, connect_for
from limitd.commands.start_flags import add_override_flags, add_timing_flags, apply_flags
from limitd.config import CapsuleConfig, ConfigError, RedisSettings, load_config

TWO_CAPSULES = """
queues: [work]
concurrency: 3
limits: {work: 2}
capsules:
  side:
    queues: [side]
    timeout: 60
"""


def flags(*argv: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    add_override_flags(parser)
    add_timing_flags(parser)
    return parser.parse_args(list(argv))


@pytest.fixture
def conf(tmp_path: Path) -> str:
    path = tmp_path / "app.yml"
    path.write_text(TWO_CAPSULES)
    return str(path)


def test_queue_flags_shape_the_default_capsule_only(conf: str) -> None:
    config = apply_flags(
        load_config([conf]),
        flags("-c", "7", "-p", "2", "--limit", "work=5", "--timeout", "9", "--tag", "blue"),
    )
    default, side = config.capsules
    assert (default.config.name, side.config.name) == ("default", "side")
    assert default.config.concurrency == 7
    assert default.processes == 2
    assert default.config.limits == {"work": 5}
    assert side.config.concurrency == 10
    assert {default.config.timeout, side.config.timeout} == {9.0}
    assert {default.config.tag, side.config.tag, config.tag} == {"blue"}


def test_flags_alone_describe_one_capsule() -> None:
    config = apply_flags(load_config([]), flags("-q", "a", "-q", "b,2", "-c", "4"))
    [spec] = config.capsules
    assert spec.config.queues == ["a", "b,2"]
    assert spec.config.concurrency == 4


def test_queue_flags_need_a_default_capsule(tmp_path: Path) -> None:
    path = tmp_path / "named.yml"
    path.write_text("capsules:\n  side:\n    queues: [side]\n")
    with pytest.raises(ConfigError, match="command line: queue flags"):
        apply_flags(load_config([str(path)]), flags("-c", "3"))


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (("--limit", "work"), "--limit: 'work': expected QUEUE=N"),
        (("--limit", "nowhere=2"), "not in this capsule's queues"),
        (("-p", "0"), "--processes: expected an integer >= 1"),
        (("-c", "0"), "concurrency must be an integer >= 1"),
    ],
)
def test_bad_flags_are_config_errors(conf: str, argv: tuple[str, ...], message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        apply_flags(load_config([conf]), flags(*argv))


def test_clients_use_the_configured_timeouts_and_a_big_enough_pool() -> None:
    settings = RedisSettings(pool_size=3, socket_timeout=4.0, connect_timeout=2.0)
    client = connect_for(settings, "redis://127.0.0.1:1/0", pool_for=CapsuleConfig(concurrency=10))
    pool = client.connection_pool
    assert pool.max_connections == 10 + POOL_EXTRA
    assert pool.connection_kwargs["socket_timeout"] == 4.0
    assert pool.connection_kwargs["socket_connect_timeout"] == 2.0
    roomy = connect_for(
        RedisSettings(pool_size=50), "redis://127.0.0.1:1/0", pool_for=CapsuleConfig(concurrency=10)
    )
    assert roomy.connection_pool.max_connections == 50
    client.close()
    roomy.close()
