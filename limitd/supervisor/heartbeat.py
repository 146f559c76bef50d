"""The heartbeat thread, and the Sidekiq-format process record it refreshes.

Record keys (Sidekiq's format): ``processes`` (set of identities); ``<identity>`` (hash:
``info`` JSON, ``busy``, ``beat``, ``quiet``; expires unless refreshed); and
``<identity>:work`` (hash: thread id -> JSON of the job that thread runs). A process that
dies stops beating, its hash expires, and the poller's cleanup drops it from
``processes``.
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

log = logging.getLogger("limitd.heartbeat")

MIN_RECORD_TTL = 60


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


class ProcessRecord:
    """The process as Sidekiq's web UI and API see it."""

    def __init__(
        self,
        identity: str,
        info: dict[str, object],
        work: Callable[[], list[WorkItem]],
        ttl: float = MIN_RECORD_TTL,
    ) -> None:
        self.identity = identity
        self.info = {**info, "identity": identity, "started_at": clock.now()}
        self.work = work
        self.ttl = max(MIN_RECORD_TTL, int(ttl))
        self.quiet = False

    def write(self, redis: redis_py.Redis) -> None:
        """Refresh the record, in one round trip."""
        work = self.work()
        work_key = keys.process_work(self.identity)
        pipe = redis.pipeline(transaction=True)
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
        pipe.expire(self.identity, self.ttl)
        pipe.delete(work_key)
        if work:
            pipe.hset(work_key, mapping={item.thread: _work_json(item) for item in work})
            pipe.expire(work_key, self.ttl)
        pipe.execute()

    def clear(self, redis: redis_py.Redis) -> None:
        """Remove the record: a stopped process is not a dead one."""
        pipe = redis.pipeline(transaction=True)
        pipe.srem(keys.PROCESSES, self.identity)
        pipe.delete(self.identity, keys.process_work(self.identity))
        pipe.execute()


class Heartbeat:
    """Calls ``beat`` every ``period`` seconds on its own thread (and once at start), and
    again as soon as ``beat_soon`` asks. A failing beat is logged and retried at the next
    period: the heartbeat never stops while work drains."""

    def __init__(self, beat: Callable[[], None], period: float) -> None:
        self.beat = beat
        self.period = period
        self._done = threading.Event()
        self._wake = threading.Event()
        self._thread = threading.Thread(target=self._run, name="limitd-heartbeat", daemon=True)

    def start(self) -> None:
        self._safe_beat()
        self._thread.start()

    def beat_soon(self) -> None:
        self._wake.set()

    def stop(self) -> None:
        self._done.set()
        self._wake.set()
        if self._thread.ident is not None:
            self._thread.join(5)

    def _run(self) -> None:
        while not self._done.is_set():
            self._wake.wait(self.period)
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
