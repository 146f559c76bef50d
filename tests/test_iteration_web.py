"""The progress of iterable jobs on the dashboard's Busy page: a real capsule in this
process runs an iterable job held mid-walk (and a plain job beside it), and the page,
fetched without a browser, shows the walk's items done, cursor, run and state in its
row of "Jobs running now", and "-" in the plain job's."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from html.parser import HTMLParser

import pytest
import redis as redis_py
from starlette.testclient import TestClient

import limitd
from limitd.api import Processes, iteration_progress
from limitd.api.work import running_jobs
from limitd.iteration.job import numbers
from limitd.supervisor import Capsule, CapsuleConfig
from limitd.web import app
from tests.helpers import wait_for

QUEUE = "iteration_web"
HELD_AT = 1234  # the walk waits in this item: 1,234 items done, the last cursor 1233

release = threading.Event()
holding = threading.Event()


class HeldWalk(limitd.IterableJob, name="iteration_web_test.HeldWalk", queue=QUEUE):
    def build_items(self, count: int, *, cursor: int | None) -> Iterator[tuple[int, int]]:
        return iter(numbers(0, count, cursor))

    def each_item(self, item: int, count: int) -> None:
        if item == HELD_AT:
            holding.set()
            release.wait(30)


@limitd.job(name="iteration_web_test.Plain", queue=QUEUE)
def plain(label: str) -> None:
    release.wait(30)


@pytest.fixture(autouse=True)
def _release_after() -> Iterator[None]:
    release.clear()
    holding.clear()
    yield
    release.set()


class JobsTable(HTMLParser):
    """The "Jobs running now" table (``#jobs``) of a page: its header cells, and per
    row with a ``data-jid`` its cells' text and attributes."""

    def __init__(self, page: str) -> None:
        super().__init__()
        self.headers: list[str] = []
        self.rows: dict[str, list[tuple[str, dict[str, str]]]] = {}
        self.empty_colspan: int | None = None
        self._in_table = False
        self._row: list[tuple[str, dict[str, str]]] | None = None
        self._cell: list[str] | None = None
        self._cell_attrs: dict[str, str] = {}
        self._header: list[str] | None = None
        self.feed(page)

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        found = {name: value or "" for name, value in attrs}
        if tag == "table":
            self._in_table = found.get("id") == "jobs"
        elif not self._in_table:
            return
        elif tag == "tr" and "data-jid" in found:
            self._row = self.rows.setdefault(found["data-jid"], [])
        elif tag == "th":
            self._header = []
        elif tag == "td" and self._row is not None:
            self._cell, self._cell_attrs = [], found
        elif tag == "td" and "empty" in found.get("class", ""):
            self.empty_colspan = int(found["colspan"])

    def handle_endtag(self, tag: str) -> None:
        if tag == "table":
            self._in_table = False
        elif tag == "tr":
            self._row = None
        elif tag == "th" and self._header is not None:
            self.headers.append("".join(self._header).strip())
            self._header = None
        elif tag == "td" and self._row is not None and self._cell is not None:
            self._row.append((" ".join("".join(self._cell).split()), self._cell_attrs))
            self._cell = None

    def handle_data(self, data: str) -> None:
        if self._cell is not None:
            self._cell.append(data)
        elif self._header is not None:
            self._header.append(data)


def busy_page(redis: redis_py.Redis) -> JobsTable:
    with TestClient(app(redis)) as client:
        page = client.get("/busy")
    assert page.status_code == 200
    return JobsTable(page.text)


def test_busy_shows_an_iterable_jobs_progress_and_a_dash_for_a_plain_job(
    redis: redis_py.Redis,
) -> None:
    config = CapsuleConfig(
        queues=[QUEUE], concurrency=2, timeout=5, record_period=0.05, heartbeat_period=0.2
    )
    capsule = Capsule(config, redis=redis)
    walk = HeldWalk.perform_async(HELD_AT + 50)
    other = plain.perform_async("beside it")
    assert walk is not None and other is not None
    capsule.start()
    try:
        assert holding.wait(30), "the walk reached the item it waits in"

        def progress_saved() -> bool:
            progress = iteration_progress(walk, redis)
            return progress is not None and progress.items >= HELD_AT

        def both_listed() -> bool:
            identities = [process.identity for process in Processes(redis)]
            return {job.jid for job in running_jobs(identities, redis)} == {walk, other}

        wait_for(progress_saved, timeout=30, message=f"{HELD_AT} items saved")
        wait_for(both_listed, timeout=30, message="both jobs in the process record")

        table = busy_page(redis)
        assert table.headers[-1] == "progress"
        assert set(table.rows) == {walk, other}
        assert all(len(cells) == len(table.headers) for cells in table.rows.values())
        shown, attributes = table.rows[walk][-1]
        assert shown == "1,234 items · cursor 1233"
        assert attributes["title"] == "run 1, running"
        assert table.rows[other][-1][0] == "-"
    finally:
        release.set()
        capsule.stop(timeout=10)


def test_nothing_running_spans_every_column(redis: redis_py.Redis) -> None:
    table = busy_page(redis)
    assert table.rows == {}
    assert table.headers[-1] == "progress"
    assert table.empty_colspan == len(table.headers)
