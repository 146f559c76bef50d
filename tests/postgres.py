"""The PostgreSQL that tests keep work in: 127.0.0.1:5432, trust auth, database
``test`` (``LIMITD_TEST_POSTGRES_URL`` overrides). Where it cannot be reached the test
skips with the reason, except under CI, where PostgreSQL is part of the machine and
its absence must fail the run rather than hide the test."""

from __future__ import annotations

import os
import secrets
from collections.abc import Iterator

import pytest

DEFAULT_URL = "postgresql://postgres@127.0.0.1:5432/test"


def postgres_url() -> str:
    return os.environ.get("LIMITD_TEST_POSTGRES_URL", DEFAULT_URL)


@pytest.fixture
def postgres_table() -> Iterator[tuple[str, str]]:
    """(url, name) of a fresh table name, dropped after the test."""
    import psycopg

    url = postgres_url()
    try:
        conn = psycopg.connect(url, connect_timeout=5, autocommit=True)
    except psycopg.OperationalError as exc:
        if os.environ.get("CI"):
            raise
        pytest.skip(f"PostgreSQL not reachable at {url}: {exc}")
    name = f"limitd_test_{secrets.token_hex(4)}"
    try:
        yield url, name
    finally:
        conn.execute("SET lock_timeout = '10s'")  # a transaction left open fails, not hangs
        conn.execute(f"DROP TABLE IF EXISTS {name}")
        conn.close()
