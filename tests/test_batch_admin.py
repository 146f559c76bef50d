"""Batches for operators: the admin API's list (newest first, expired entries dropped
from the index) and ``limitd batches``."""

from __future__ import annotations

import pytest
import redis as redis_py
from freezegun import freeze_time

import limitd
from limitd import keys
from limitd.api import batch_detail, batch_status, list_batches
from limitd.batch import store
from limitd.supervisor import Capsule, CapsuleConfig
from tests.test_batch import callback, doomed, work
from tests.test_cli_admin import Cli, columns, make_cli


@pytest.fixture
def cli(redis: redis_py.Redis, capsys: pytest.CaptureFixture[str]) -> Cli:
    return make_cli(lambda args: redis, capsys)


def make_batches(redis: redis_py.Redis) -> tuple[str, str, str]:
    """An older finished batch with a dead job, a running one and one being built."""
    with freeze_time("2026-11-20 10:00:00"):
        old = limitd.Batch("nightly import")
        with old.jobs():
            doomed.perform_async(1)
            work.perform_async(2)
        Capsule(CapsuleConfig(queues=["default"]), redis=redis).drain()
    with freeze_time("2026-11-21 10:00:00"):
        running = limitd.Batch("reports")
        with running.jobs():
            work.perform_bulk([[3], [4]])
    with freeze_time("2026-11-22 10:00:00"):
        # A batch another process is still adding jobs to: its block is open.
        building = store.NewBatch("b-building", "still adding", expires_in=60)
        store.open_batch(redis, building.bid, building)
    return old.bid, running.bid, building.bid


def test_list_is_newest_first_and_forgets_expired_batches(redis) -> None:
    old, running, building = make_batches(redis)
    assert [s.bid for s in list_batches(redis)] == [building, running, old]
    assert [s.bid for s in list_batches(redis, limit=2)] == [building, running]
    redis.delete(*keys.of(redis).batch_keys(running))  # its data expired
    assert [s.bid for s in list_batches(redis)] == [building, old]
    assert redis.zscore(keys.of(redis).BATCHES, running) is None
    assert batch_status(redis, running) is None


def test_the_status_of_a_batch_with_a_dead_job(redis) -> None:
    old, _, _ = make_batches(redis)
    status = batch_status(redis, old)
    assert (status.total, status.pending, status.complete, status.success) == (2, 1, True, False)
    [error] = status.failures.values()
    assert error == "RuntimeError: never works"
    assert status.death_at is not None
    assert status.as_dict()["complete"] is True


def test_cli_lists_batches_with_their_state(cli: Cli, redis) -> None:
    old, running, building = make_batches(redis)
    result = cli("batches")
    assert result.code == 0
    header, *rows = result.out.splitlines()
    assert columns(header) == ["BID", "DESCRIPTION", "TOTAL", "PENDING", "FAILURES", "STATE",
                               "CREATED"]  # fmt: skip
    assert [columns(row)[:6] for row in rows] == [
        [building, "still adding", "0", "0", "0", "building"],
        [running, "reports", "2", "2", "0", "running"],
        [old, "nightly import", "2", "1", "1", "complete+death"],
    ]


def test_cli_shows_one_batch_with_its_failures(cli: Cli, redis) -> None:
    old, _, _ = make_batches(redis)
    result = cli("batches", old)
    assert result.code == 0
    assert "RuntimeError: never works" in result.out.splitlines()[-1]
    as_json = cli("batches", old, "--json").json()
    assert (as_json["bid"], as_json["total"], as_json["success"]) == (old, 2, False)
    missing = cli("batches", "nope")
    assert missing.code == 1
    assert "no batch nope" in missing.err


def test_new_bids_never_read_as_flags() -> None:
    bids = {limitd.Batch().bid for _ in range(1_000)}
    assert len(bids) == 1_000
    assert all(len(bid) == 24 and int(bid, 16) >= 0 for bid in bids)


def test_cli_shows_a_batch_whose_bid_starts_with_a_dash(cli: Cli, redis) -> None:
    # Sidekiq's bids are URL-safe base64, so one made elsewhere may begin with "-".
    made_elsewhere = store.NewBatch("-Zx9_q2", "from ruby", expires_in=60)
    store.open_batch(redis, made_elsewhere.bid, made_elsewhere)
    result = cli("batches", "--", made_elsewhere.bid)
    assert result.code == 0
    assert "from ruby" in result.out


def test_cli_with_no_batches(cli: Cli) -> None:
    assert cli("batches").out.strip() == "no batches"
    assert cli("batches", "--json").json() == []
    assert cli("batches", "--limit", "0").code == 64


def test_batch_detail_reads_a_bounded_page_of_failures_and_the_callbacks(redis) -> None:
    batch = limitd.Batch("three doomed")
    batch.on("complete", callback, {"to": "finance"})
    batch.on("success", callback)
    batch.on("death", callback)
    with batch.jobs():
        doomed.perform_bulk([[1], [2], [3]])
        work.perform_async(4)
    Capsule(CapsuleConfig(queues=["default"]), redis=redis).drain()
    detail = batch_detail(redis, batch.bid, failures_shown=2)
    status = batch_status(redis, batch.bid)
    assert detail is not None and status is not None
    assert (detail.failure_count, len(detail.status.failures)) == (3, 2)
    assert detail.status.failures.items() <= status.failures.items()
    assert {**detail.status.as_dict(), "failures": {}} == {**status.as_dict(), "failures": {}}
    shown = [(c.event, c.job, c.queue, c.options, c.fired) for c in detail.callbacks]
    assert shown == [
        ("success", "batch_test.Callback", "callbacks", {}, False),
        ("complete", "batch_test.Callback", "callbacks", {"to": "finance"}, True),
        ("death", "batch_test.Callback", "callbacks", {}, True),
    ]
    assert detail.callbacks[1].fired_at == status.complete_at
    assert batch_detail(redis, "0123456789abcdef01234567") is None
