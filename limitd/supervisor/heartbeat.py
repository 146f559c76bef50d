"""The heartbeat thread, and the Sidekiq-format process record it refreshes.

Record keys (Sidekiq's format): ``processes`` (set of identities); ``<identity>`` (hash:
``info`` JSON, ``busy``, ``beat``, ``quiet``; expires unless refreshed); and the hash of
thread id -> JSON of the job that thread runs (``queue``, ``payload`` as the job's JSON
text, ``run_at`` in integer epoch seconds), written twice: ``<identity>:work`` for
Sidekiq 7+ and ``<identity>:workers`` for Sidekiq 6, whose ``Workers`` API and Busy page
read only that name. A process that stops removes its record; one that dies has it
removed by whoever reaps its capsule (``limitd.fetch.liveness.forget_process``: the
supervisor that saw it die, or the reaper that saw its heartbeat expire); failing both,
its keys expire and the poller's cleanup drops it from ``processes``.

The capsule refreshes the record every ``CapsuleConfig.record_period`` (5 s, as Sidekiq
does), so ``busy`` and the Busy page follow the jobs closely; its heavier heartbeat
(liveness, reaping, counters) keeps its own, usually longer, ``heartbeat_period``.
"""

from __future__ import annotations

import json
import logging
import os
import socket
import threading
from collections.abc import Callable
from dataclasses import dataclass

import redis as redis_py

from limitd import clock, keys
from limitd.config import CapsuleConfig
from limitd.supervisor import cpu_affinity
from limitd.supervisor.refusals import REFUSALS
from limitd.version import __version__

log = logging.getLogger("limitd.heartbeat")

MIN_RECORD_TTL = 60


@dataclass(frozen=True)
class WorkItem:
    """What one processor thread is running, as shown in the ``:work``/``:workers`` hashes."""

    thread: str
    queue: str
    payload: bytes
    run_at: float


def new_identity(capsule_id: str, layout: keys.KeyLayout) -> str:
    """``hostname:pid:capsule_id``: unique even when a pid is reused after a restart
    (Sidekiq's last part is random; the capsule id is too, and it lets whoever reaps
    the capsule, knowing only its id, find the record). The identity is also the name of
    the process's keys: in cluster mode it starts with the ``{limitd}`` tag, so they
    share the slot of the ``processes`` set."""
    identity = f"{socket.gethostname()}:{os.getpid()}:{capsule_id}"
    return layout.process_identity(identity)


def process_info(
    config: CapsuleConfig, weights: dict[str, int], async_slots: int
) -> dict[str, object]:
    """The record's ``info``: Sidekiq's fields, and the capsule's (``capsule_id`` names
    the capsule that reapers know; ``cpus``, the CPUs it may run on, shows where
    ``cpu_affinity`` put it)."""
    return {
        "hostname": socket.gethostname(),
        "pid": os.getpid(),
        "tag": config.tag,
        "capsule": config.name,
        "capsule_id": config.capsule_id,
        "concurrency": config.concurrency,
        "async_concurrency": async_slots,
        "cpus": cpu_affinity.current(),
        "queues": list(weights),
        "weights": [weights],
        "labels": [],
        "version": __version__,
    }


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
        # It names every queue: encoded once, not at every refresh (at 40,000 queues that
        # was 7% of a busy capsule's GIL), and again only if the process's CPUs change.
        self._info = {**info, "identity": identity, "started_at": clock.now()}
        self._info_json = json.dumps(self._info)
        self.work = work
        self.ttl = max(MIN_RECORD_TTL, int(ttl))
        self.quiet = False

    def _current_info(self) -> str:
        """The info JSON, with ``cpus`` as they are now: ``cpu_affinity: auto`` moves a
        process, or lets it go, when another process needs its CPU."""
        if "cpus" in self._info and self._info.get("pid") == os.getpid():  # ours to tell
            cpus = cpu_affinity.current()
            if cpus != self._info["cpus"]:
                self._info["cpus"] = cpus
                self._info_json = json.dumps(self._info)
        return self._info_json

    def write(self, redis: redis_py.Redis) -> str | None:
        """Refresh the record, in one round trip, and take the oldest signal sent to this
        process from afar (``limitd.api.Processes.quiet`` / ``stop``), if any."""
        k = keys.of(redis)
        work = self.work()
        pipe = redis.pipeline(transaction=True)
        pipe.sadd(k.PROCESSES, self.identity)
        pipe.hset(
            self.identity,
            mapping={
                "info": self._current_info(),
                "busy": len(work),
                "beat": clock.now(),
                "quiet": "true" if self.quiet else "false",
            },
        )
        pipe.expire(self.identity, self.ttl)
        work_keys = self._work_keys()
        pipe.delete(*work_keys)
        if work:
            rows = [(item.thread, _work_json(item)) for item in work]
            for work_key in work_keys:
                pipe.hset(work_key, mapping={thread: row for thread, row in rows})
                pipe.expire(work_key, self.ttl)
        pipe.rpop(keys.process_signals(self.identity))
        signal = pipe.execute()[-1]
        return signal.decode("utf-8", "replace") if signal else None

    def clear(self, redis: redis_py.Redis) -> None:
        """Remove the record: a stopped process is not a dead one."""
        k = keys.of(redis)
        pipe = redis.pipeline(transaction=True)
        pipe.srem(k.PROCESSES, self.identity)
        pipe.delete(self.identity, *self._work_keys())
        pipe.execute()

    def _work_keys(self) -> tuple[str, str]:
        """Sidekiq 7 reads ``:work``, Sidekiq 6 ``:workers``: both get the same rows."""
        return keys.process_work(self.identity), keys.process_workers(self.identity)


class Heartbeat:
    """Calls ``beat`` every ``period`` seconds on its own thread (and once at start), and
    again as soon as ``beat_soon`` asks. Between beats, ``refresh`` (a lighter write, such
    as the process record alone) runs every ``refresh_period`` seconds (default: never
    between beats); a beat is expected to include it, so a tick never writes it twice. A
    failing call is logged and retried at the next tick: the heartbeat never stops while
    work drains. Both are expected to write (the record at least): one that succeeds
    tells ``REFUSALS`` that Redis accepts writes."""

    def __init__(
        self,
        beat: Callable[[], None],
        period: float,
        *,
        refresh: Callable[[], None] | None = None,
        refresh_period: float | None = None,
    ) -> None:
        self.beat = beat
        self.period = period
        self.refresh = refresh
        self.refresh_period = refresh_period if refresh and refresh_period else period
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
        next_beat = clock.monotonic() + self.period
        next_refresh = clock.monotonic() + self.refresh_period
        while not self._done.is_set():
            self._wake.wait(max(0.0, min(next_beat, next_refresh) - clock.monotonic()))
            asked = self._wake.is_set()
            self._wake.clear()
            if self._done.is_set():
                return
            now = clock.monotonic()
            if asked or now >= next_beat:
                self._safe_beat()
                next_beat = now + self.period
            elif self.refresh is not None:
                self._safe(self.refresh, "record refresh")
            next_refresh = now + self.refresh_period

    def _safe_beat(self) -> None:
        self._safe(self.beat, "heartbeat")

    @staticmethod
    def _safe(call: Callable[[], None], what: str) -> None:
        """Redis refusing writes is told by ``REFUSALS`` (once a minute at most); any
        other failure at each tick."""
        try:
            call()
        except redis_py.RedisError as exc:
            if not REFUSALS.note(exc, what):
                log.warning("%s failed: %s", what, exc)
        else:
            REFUSALS.accepted()


def _work_json(item: WorkItem) -> str:
    return json.dumps(
        {
            "queue": item.queue,
            "run_at": int(item.run_at),
            "payload": item.payload.decode("utf-8", "backslashreplace"),
        }
    )
