"""A bulk chunk that is not written gives back what its jobs reserved before the write:
unique locks and places in a batch, as a single push does when it raises. Chunks
written before the failure stay as they are."""

from __future__ import annotations

import datetime as dt

import pytest
import redis as redis_py

import limitd
from limitd import keys
from limitd.unique import middleware as unique


@limitd.job(name="bulk_test.Sync", queue="bulk", unique_for=600)
def sync(account: object) -> None: ...


def lock_holder(redis: redis_py.Redis, account: object) -> bytes | None:
    return redis.get(
        keys.of(redis).unique_lock("bulk_test.Sync", "bulk", unique.args_digest([account]))
    )


def test_a_chunk_whose_arguments_fail_frees_its_locks_and_batch_places(redis) -> None:
    batch = limitd.Batch("import")
    with pytest.raises(TypeError), batch.jobs():
        # The second job's argument is not JSON: the chunk raises before its write.
        sync.perform_bulk([[1], [dt.datetime(2026, 11, 22)], [3]])
    assert redis.llen("queue:bulk") == 0
    assert lock_holder(redis, 1) is None
    status = limitd.Batch.status(batch.bid)
    assert (status.total, status.pending) == (0, 0)
    assert status.success  # nothing of it was pushed: an empty batch, done at its close
    assert sync.perform_async(1) is not None  # no lock left behind for a job never pushed


def test_a_chunk_whose_write_fails_frees_its_locks_but_earlier_chunks_stay(redis) -> None:
    redis.set("queue:bulk", "not a list")  # the write's LPUSH fails with WRONGTYPE
    batch = limitd.Batch("import")
    with pytest.raises(redis_py.ResponseError, match="WRONGTYPE"), batch.jobs():
        sync.set(queue="other").perform_bulk([[10], [11]])  # written
        sync.perform_bulk([[1], [2]])  # not written
    assert redis.llen("queue:other") == 2
    assert lock_holder(redis, 1) is None and lock_holder(redis, 2) is None
    status = limitd.Batch.status(batch.bid)
    assert (status.total, status.pending, status.success) == (2, 2, False)


def test_an_undo_that_fails_is_logged_and_the_original_error_raised(
    redis, caplog: pytest.LogCaptureFixture
) -> None:
    class BrokenUndo:
        def __call__(self, spec, payload, conn, call_next):
            return call_next(payload)

        def abandon_bulk(self, spec, payloads, conn) -> None:
            raise RuntimeError("undo failed")

    client = limitd.Client(redis)
    client.middleware.prepend(BrokenUndo())
    redis.set("queue:bulk", "not a list")
    with pytest.raises(redis_py.ResponseError, match="WRONGTYPE"):
        sync.set(client=client).perform_bulk([[1]])
    assert "BrokenUndo could not undo its reservations for 1 jobs" in caplog.text
    assert lock_holder(redis, 1) is None  # the other middleware still gave theirs back


def test_a_later_middleware_failing_to_prepare_the_chunk_gives_back_the_batch_places(
    redis,
) -> None:
    class FailsToPrepare:
        def __call__(self, spec, payload, conn, call_next):
            return call_next(payload)

        def prepare_bulk(self, spec, payloads, conn) -> None:
            raise redis_py.ConnectionError("lost Redis while preparing")

    client = limitd.Client(redis)
    client.middleware.add(FailsToPrepare())  # after BatchMembership, which registered them
    batch = limitd.Batch("import", client=client)
    with pytest.raises(redis_py.ConnectionError), batch.jobs():
        sync.set(client=client).perform_bulk([[1], [2]])
    status = limitd.Batch.status(batch.bid)
    assert (status.total, status.pending) == (0, 0)
