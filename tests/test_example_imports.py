"""The quick start's limited-capacity example drains its table through a capsule."""

from __future__ import annotations

from pathlib import Path

import pytest
import redis as redis_py

from examples import imports
from limitd.config import CapsuleConfig
from limitd.supervisor.capsule import Capsule


def test_the_example_imports_every_row(
    redis: redis_py.Redis, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(imports, "DATABASE", tmp_path / "imports.db")
    monkeypatch.setattr(imports.time, "sleep", lambda seconds: None)
    monkeypatch.setattr(imports.random, "random", lambda: 0.5)  # no 503 this time
    imports.add_imports(12)
    assert imports.ImportBacklog().remaining_work_count() == 12
    assert len(imports.ImportBacklog.perform_with_capacity()) == 3
    Capsule(CapsuleConfig(queues=["imports"]), redis=redis).drain()
    assert imports.ImportBacklog().remaining_work_count() == 0
    with imports.closing(imports.connect()) as conn:
        assert conn.execute("SELECT count(*) FROM imports WHERE done_at IS NULL").fetchone() == (0,)
