"""A limited-capacity job with its periodic refill, for the quick start.

Pending imports wait in a table (SQLite here, from the standard library; a real app
would use its own database). At most 3 copies of ``ImportBacklog`` run at once, each
importing one row, handing its place on while rows remain; conf/example.yml refills
the capacity every 10 seconds through a ``periodic`` entry, which also replaces
copies that failed (about 1 in 20 does)::

    limitd start conf/example.yml
    limitd -C conf/example.yml enqueue examples.imports.add_imports '[60]'
    limitd -C conf/example.yml capacity     # 3 running; the queue never holds more
    limitd -C conf/example.yml periodic     # the refill: last and next run
"""

from __future__ import annotations

import logging
import os
import random
import sqlite3
import tempfile
import time
from contextlib import closing
from pathlib import Path

import limitd

log = logging.getLogger("imports")
DATABASE = Path(os.environ.get("IMPORTS_DB", Path(tempfile.gettempdir()) / "limitd-imports.db"))
STALE_SECONDS = 300  # a row taken by a copy that died is offered again after this


def connect() -> sqlite3.Connection:
    """One connection per call: copies run in several threads and processes."""
    conn = sqlite3.connect(DATABASE, timeout=30, isolation_level=None)
    conn.execute(
        "CREATE TABLE IF NOT EXISTS imports (id INTEGER PRIMARY KEY, source TEXT NOT NULL,"
        " taken_at REAL, done_at REAL)"
    )
    return conn


@limitd.job
def add_imports(count: int) -> None:
    """Queue ``count`` pending imports in the table (not in limitd: the refill finds them)."""
    sources = [f"https://files.example.com/{random.getrandbits(32):08x}.csv" for _ in range(count)]
    with closing(connect()) as conn:
        conn.executemany("INSERT INTO imports (source) VALUES (?)", [(s,) for s in sources])
    log.info("%d imports pending; the next refill starts them", count)


class ImportBacklog(
    limitd.LimitedCapacityJob, name="examples.imports.ImportBacklog", queue="imports"
):
    """Imports one pending row per run, at most 3 at once."""

    def perform_work(self) -> None:
        row = self._take_row()
        if row is None:
            return
        row_id, source = row
        time.sleep(random.uniform(0.3, 0.8))  # pretend to download and load the file
        if random.random() < 0.05:
            raise RuntimeError(f"import {row_id}: {source} answered 503")
        with closing(connect()) as conn:
            conn.execute("UPDATE imports SET done_at = ? WHERE id = ?", (time.time(), row_id))
        log.info("import %d done (%s)", row_id, source)

    def remaining_work_count(self) -> int:
        with closing(connect()) as conn:
            (count,) = conn.execute(
                "SELECT count(*) FROM imports WHERE done_at IS NULL AND"
                " (taken_at IS NULL OR taken_at < ?)",
                (time.time() - STALE_SECONDS,),
            ).fetchone()
        return int(count)

    def max_running_jobs(self) -> int:
        return 3

    @staticmethod
    def _take_row() -> tuple[int, str] | None:
        """Mark the oldest pending row taken, in one statement (SQLite serialises
        writers, so two copies never take the same row)."""
        with closing(connect()) as conn:
            found = conn.execute(
                "UPDATE imports SET taken_at = ? WHERE id = (SELECT id FROM imports"
                " WHERE done_at IS NULL AND (taken_at IS NULL OR taken_at < ?)"
                " ORDER BY id LIMIT 1) RETURNING id, source",
                (time.time(), time.time() - STALE_SECONDS),
            ).fetchone()
        return None if found is None else (int(found[0]), str(found[1]))
