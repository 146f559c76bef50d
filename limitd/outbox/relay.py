"""The outbox relay: pushes the jobs committed into the outbox table, and deletes them.

One chunk is one database transaction::

    DELETE FROM limitd_outbox WHERE id IN
        (SELECT id FROM limitd_outbox ORDER BY id LIMIT :n FOR UPDATE SKIP LOCKED)
    RETURNING id, jid, payload

then each row, in id order, goes through the client middleware chain (unique jobs,
tenant fairness: as for any enqueue, and as the pushes held in memory do after their
commit) and is written by ``outbox_push.lua``; then COMMIT. If a push fails (Redis is
down), the transaction rolls back: the rows stay for the next try. ``SKIP LOCKED`` lets
several relays run at once, each taking rows the others do not hold.

Exactly once: the script writes a marker per row (``limitd:outbox:pushed:<jid>:<id>``,
kept a day) in the same atomic step as the push, and pushes nothing when the marker is
there. A relay that pushed rows and died before its COMMIT leaves them in the table;
the next one finds their markers and only deletes them. (The middleware run again for
such a row: a unique job then finds its own lock and is skipped, a fair-tenant enqueue
is counted twice in its window; neither pushes the job twice.)

A row no middleware accepts (a payload that is not a job, a middleware that raises
for it) would block every row behind it: it goes to the dead set with the reason,
logged with its jid and class, and the relay goes on.
"""

from __future__ import annotations

import functools
import logging
import threading
from typing import Any

import redis as redis_py

from limitd import clock, handoff, keys
from limitd.client import Client
from limitd.connection import LuaScript, retry_on_failover
from limitd.outbox.section import DEFAULT_CHUNK, DEFAULT_POLL_INTERVAL
from limitd.outbox.table import DEFAULT_TABLE, PUSHED_MARKER_TTL, outbox_table, pushed_marker
from limitd.payload import MalformedPayload, Payload, dead_entry, dumps, parse
from limitd.registry import registry

log = logging.getLogger("limitd.outbox")

PUSH_ONCE = LuaScript(__package__ or "limitd.outbox", "outbox_push.lua")
STOP_TIMEOUT = 2.0
MAX_BACKOFF = 30.0


class Relay:
    """Moves rows of one outbox table (on ``engine``) to the Redis of ``client``."""

    def __init__(
        self,
        engine: Any,
        client: Client,
        table: str = DEFAULT_TABLE,
        chunk: int = DEFAULT_CHUNK,
    ) -> None:
        if chunk < 1:
            raise ValueError("chunk must be at least 1")
        self.engine = engine
        self.client = client
        self.table = table
        self.chunk = chunk

    def relay_chunk(self) -> int:
        """Push and delete up to ``chunk`` rows, oldest first, in one transaction.
        Returns how many rows it took (0: the table is empty, or every row is being
        relayed by someone else); raises, leaving the rows, if a push failed."""
        with self.engine.begin() as conn:
            rows = conn.execute(self._claim()).all()
            for row in sorted(rows, key=lambda row: row.id):
                self._push_row(row)
        return len(rows)

    def drain(self) -> int:
        """Relay until no row is left to take. Returns the rows taken."""
        total = 0
        while taken := self.relay_chunk():
            total += taken
        return total

    def _claim(self) -> Any:
        from sqlalchemy import delete, select

        table = outbox_table(self.table)
        oldest = (
            select(table.c.id)
            .order_by(table.c.id)
            .limit(self.chunk)
            .with_for_update(skip_locked=True)
        )
        return (
            delete(table)
            .where(table.c.id.in_(oldest.scalar_subquery()))
            .returning(table.c.id, table.c.jid, table.c.payload)
        )

    def _push_row(self, row: Any) -> None:
        try:
            payload = parse(row.payload)
        except MalformedPayload as exc:
            self._bury(row, "", MalformedPayload.wire_name, str(exc))
            return
        write = functools.partial(self._write_once, int(row.id))
        spec = registry.resolve(str(payload["class"]))
        try:
            pushed = self.client.middleware.invoke(spec, payload, self.client.redis, write)
        except redis_py.RedisError:
            raise  # Redis is away: the whole chunk stays for the next try
        except Exception as exc:
            log.exception(
                "outbox row %s jid=%s class=%s: refused", row.id, row.jid, payload["class"]
            )
            self._bury(row, str(payload.get("queue", "")), type(exc).__name__, str(exc))
            return
        if pushed is None:
            log.info(
                "outbox row %s jid=%s class=%s: halted by a middleware",
                row.id,
                row.jid,
                payload["class"],
            )

    def _write_once(self, row_id: int, payload: Payload) -> Payload:
        """The end of the chain: ``outbox_push.lua``, as ``Client._write`` would write
        the job, unless this row was pushed already."""
        k = keys.of(self.client.redis)
        at = payload.get("at")
        handed_off = at is None and k.cluster
        if handed_off:  # the queue is on another shard: through the hand-off set
            target, due, channel = k.MOVING, repr(handoff.UNCLAIMED), keys.DUE_CHANNEL
        elif at is None:
            payload["enqueued_at"] = clock.now()
            target, due, channel = k.queue(payload["queue"]), "", keys.WAKE_CHANNEL
        else:
            payload = {key: value for key, value in payload.items() if key != "at"}
            target, due, channel = k.SCHEDULE, repr(float(at)), keys.DUE_CHANNEL
        marker = pushed_marker(k, str(payload["jid"]), row_id)
        script_keys = [marker, target, k.QUEUES]
        args = [PUSHED_MARKER_TTL, dumps(payload), due, str(payload["queue"]), channel]
        redis = self.client.redis
        if not retry_on_failover(redis, lambda: PUSH_ONCE(redis, script_keys, args)):
            log.info("outbox row %s jid=%s: pushed before, not again", row_id, payload["jid"])
        elif handed_off:
            handoff.push_waiting(redis, clock.now())
        return payload

    def _bury(self, row: Any, queue: str, error_class: str, reason: str) -> None:
        k = keys.of(self.client.redis)
        now = clock.now()
        entry = dead_entry(row.payload, queue, error_class, f"outbox relay: {reason}", now)
        self.client.redis.zadd(k.DEAD, {entry: now})
        log.error("outbox row %s jid=%s moved to the dead set: %s", row.id, row.jid, reason)


class RelayService:
    """A relay in a thread (a ``limitd.plugins.Service``, and the foreground loop of
    ``limitd outbox relay``): relays while there are rows, sleeps ``poll_interval``
    when there are none. A failure (Redis or the database away) is logged and tried
    again after a growing pause: the thread never dies of it."""

    def __init__(self, relay: Relay, poll_interval: float = DEFAULT_POLL_INTERVAL) -> None:
        self.relay = relay
        self.poll_interval = poll_interval
        self.stopping = threading.Event()
        self._thread: threading.Thread | None = None

    def start(self) -> None:
        self._thread = threading.Thread(target=self.run, name="limitd-outbox-relay", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        """Wake the thread and wait for it briefly (it sleeps only in an Event)."""
        self.stopping.set()
        if self._thread is not None:
            self._thread.join(STOP_TIMEOUT)

    def run(self) -> None:
        """Relay until :meth:`stop`."""
        failures = 0
        while not self.stopping.is_set():
            try:
                taken = self.relay.relay_chunk()
            except Exception:
                failures += 1
                log.exception("outbox relay of %s failed (%d in a row)", self.relay.table, failures)
                self.stopping.wait(min(self.poll_interval * 2 ** min(failures, 8), MAX_BACKOFF))
                continue
            failures = 0
            if not taken:
                self.stopping.wait(self.poll_interval)
