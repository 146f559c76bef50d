"""The process record Sidekiq's tools read, refreshed on every beat.

Keys (Sidekiq's format): ``processes`` (set of identities); ``<identity>`` (hash: ``info``
JSON, ``busy``, ``beat``, ``quiet``; expires after 60 s without a beat); and
``<identity>:work`` (hash: thread id -> JSON of the job that thread runs). The beat also
flushes the job counters. A process that dies stops beating, its hash expires, and the
poller's cleanup removes it from ``processes``.
"""

from __future__ import annotations

import json
import logging
import os
import secrets
import socket
import threading
from collections.abc import Callable
from dataclasses import dataclass

import redis as redis_py

from limitd import clock, keys
from limitd.supervisor.stats import JobStats

log = logging.getLogger("limitd.heartbeat")

RECORD_TTL = 60


@dataclass(frozen=True)
class WorkItem:
    """What one processor thread is running, as shown in the ``:work`` hash."""

    thread: str
    queue: str
    payload: bytes
    run_at: float


def new_identity() -> str:
    """``hostname:pid:random``, unique even when a pid is reused after a restart."""
    return f"{socket.gethostname()}:{os.getpid()}:{secrets.token_hex(6)}"


class Heartbeat:
    def __init__(
        self,
        redis: redis_py.Redis,
        identity: str,
        info: dict[str, object],
        work: Callable[[], list[WorkItem]],
        stats: JobStats,
        *,
        interval: float = 10.0,
    ) -> None:
        self.redis = redis
        self.identity = identity
        self.info = {**info, "identity": identity, "started_at": clock.now()}
        self.work = work
        self.stats = stats
        self.interval = interval
        self.quiet = False
        self._done = threading.Event()
        self._wake = threading.Event()
        self._thread = threading.Thread(target=self._run, name="limitd-heartbeat", daemon=True)

    def start(self) -> None:
        self._safe_beat()
        self._thread.start()

    def beat(self) -> None:
        """Write the process record and flush counters, in one round trip."""
        work = self.work()
        work_key = keys.process_work(self.identity)
        pipe = self.redis.pipeline(transaction=True)
        pipe.sadd(keys.PROCESSES, self.identity)
        pipe.hset(
            self.identity,
            mapping={
                "info": json.dumps(self.info),
                "busy": len(work),
                "beat": clock.now(),
                "quiet": "true" if self.quiet else "false",
            },
        )
        pipe.expire(self.identity, RECORD_TTL)
        pipe.delete(work_key)
        if work:
            pipe.hset(work_key, mapping={item.thread: _work_json(item) for item in work})
            pipe.expire(work_key, RECORD_TTL)
        pipe.execute()
        self.stats.flush(self.redis)

    def stop(self) -> None:
        """Last flush, then remove the record: a stopped process is not a dead one."""
        self._done.set()
        self._wake.set()
        if self._thread.ident is not None:
            self._thread.join(5)
        try:
            self.stats.flush(self.redis)
            pipe = self.redis.pipeline(transaction=True)
            pipe.srem(keys.PROCESSES, self.identity)
            pipe.delete(self.identity, keys.process_work(self.identity))
            pipe.execute()
        except redis_py.RedisError as exc:
            log.error("could not clear process record %s: %s", self.identity, exc)

    def beat_soon(self) -> None:
        """Beat now rather than at the next interval (e.g. to publish ``quiet``)."""
        self._wake.set()

    def _run(self) -> None:
        while not self._done.is_set():
            self._wake.wait(self.interval)
            self._wake.clear()
            if not self._done.is_set():
                self._safe_beat()

    def _safe_beat(self) -> None:
        try:
            self.beat()
        except redis_py.RedisError as exc:
            log.warning("heartbeat failed: %s", exc)


def _work_json(item: WorkItem) -> str:
    return json.dumps(
        {
            "queue": item.queue,
            "run_at": item.run_at,
            "payload": item.payload.decode("utf-8", "backslashreplace"),
        }
    )
