"""``limitd web`` as a user runs it: a subprocess on a free port against the test Redis,
and its refusals (listening beyond loopback without credentials, a bad --auth)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import httpx2 as httpx
import redis as redis_py

from limitd.connection.embedded import RedisServer
from tests.helpers import wait_for
from tests.web import free_port

EX_USAGE = 64


def web(*args: str, env: dict[str, str] | None = None) -> subprocess.Popen[bytes]:
    """``limitd --redis URL web ARGS``: ``args`` start with ``--redis URL``."""
    return subprocess.Popen(
        [sys.executable, "-m", "limitd.cli", *args[:2], "web", *args[2:]],
        env=env or dict(os.environ),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )


def served(url: str, **options: object) -> bool:
    try:
        return httpx.get(url, timeout=1, **options).status_code < 500  # type: ignore[arg-type]
    except httpx.TransportError:
        return False


def test_it_serves_the_dashboard_and_asks_for_the_password(
    redis_server: RedisServer, redis: redis_py.Redis
) -> None:
    port = free_port()
    env = {**os.environ, "OPS_AUTH": "ops:s3cret"}
    proc = web("--redis", redis_server.url, "--port", str(port), "--auth-env", "OPS_AUTH", env=env)
    try:
        url = f"http://127.0.0.1:{port}/queues"
        wait_for(lambda: served(url), timeout=20, message="limitd web listening")
        assert httpx.get(url).status_code == 401
        assert httpx.get(url, auth=("ops", "s3cret")).status_code == 200
    finally:
        proc.terminate()
        _, err = proc.communicate(timeout=10)
    assert b"asks for a user and password" in err
    assert proc.returncode == 0, "a TERM is a clean stop, not a death by the signal"


def test_it_refuses_to_listen_beyond_loopback_without_credentials(
    redis_server: RedisServer, tmp_path: Path
) -> None:
    proc = web("--redis", redis_server.url, "--bind", "0.0.0.0", "--port", str(free_port()))
    _, err = proc.communicate(timeout=20)
    assert proc.returncode == EX_USAGE
    assert b"--bind 0.0.0.0 listens beyond this machine" in err


def test_a_bad_auth_value_names_the_flag(redis_server: RedisServer) -> None:
    proc = web("--redis", redis_server.url, "--auth", "no-colon", "--port", str(free_port()))
    _, err = proc.communicate(timeout=20)
    assert proc.returncode == EX_USAGE
    assert b"--auth: expected USER:PASSWORD" in err
