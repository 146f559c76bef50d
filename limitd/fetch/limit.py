"""Limit fetch: the default fetch, aware of queue limits and reliable.

One Lua call (``limit_fetch.lua``) settles the jobs the capsule just finished and takes
the next ones: for each, it picks the first eligible queue in this fetch's order, moves
the job into this capsule's in-progress list and counts the busy slot. A capsule makes
one such call at a time, for every processor thread waiting: see :class:`~limitd.fetch.
dispatcher.Dispatcher` for who makes it and why. The job stays in
Redis until it is settled (acknowledged or requeued), so a capsule killed with SIGKILL
loses nothing: the reaper returns its in-progress jobs to their queues.

A queue is skipped when it is paused, when this capsule runs ``process_limit`` jobs of
it, when all capsules together run ``limit``, or when its rate limit (``limitd.fetch.
rates``) allows no job yet. A *blocking* queue that has jobs but is at its limit (or its
rate) stops the fetch there: queues after it wait too. When a rate limit is all that
holds jobs back, the call says how long until it allows one (``room_in``), and an idle
capsule sleeps exactly that long instead of polling blindly.
"""

from __future__ import annotations

import logging
import threading
from collections import Counter
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any, ClassVar, cast

import redis as redis_py
from redis.exceptions import NoScriptError

from limitd import clock, handoff, keys, replication
from limitd.fetch import recoveries
from limitd.fetch.basic import UnitOfWork
from limitd.fetch.order import QueueOrder
from limitd.fetch.wakeup import IdleGate
from limitd.payload import Payload
from limitd.redis import (
    Conn,
    LuaScript,
    ScriptCall,
    pack_command,
    run_calls,
    send_calls_then,
    send_packed,
    set_members,
)

log = logging.getLogger("limitd.fetch")

LIMIT_FETCH = LuaScript(__package__ or "limitd.fetch", "limit_fetch.lua")
DYNAMIC_REFRESH_SECONDS = 5.0
SHORTFALL_LOG_EVERY = 60.0
# Cluster mode, with wake-ups: a queue that gave nothing when asked is not asked again
# for this long, unless a wake-up names it (each ask is a round trip to its shard).
QUIET_SECONDS = 0.1  # seconds between warnings of fetches replicas did not confirm
ACK, REQUEUE = b"ack", b"requeue"
JOB_FIELDS = 4  # each job in a fetch reply: queue, job, crashes, crashes alone


@dataclass
class LimitUnitOfWork(UnitOfWork):
    fetch: LimitFetch  # type: ignore[assignment]
    after_run: list[ScriptCall] = field(default_factory=list)
    defer_is_io: ClassVar[bool] = False

    def defer(self, calls: Sequence[ScriptCall]) -> None:
        """Keep ``calls`` to send with this job's acknowledgement, in the same round
        trip (they run first)."""
        self.after_run.extend(calls)

    def acknowledge(self) -> None:
        """Remove the job from the in-progress list and free its slot now. (Processors
        instead hand the finished unit to their next fetch: same effect, one call.)"""
        self.fetch.release(self, requeue=False)

    def requeue(self) -> None:
        self.fetch.release(self, requeue=True)

    def give_back(self, reason: str) -> None:
        """Requeue and count a recovery beside the job, in one call."""
        recoveries.recover(self.fetch.redis, self.fetch.capsule_id, self.queue, self.job, reason)

    def recovery_reason(self, payload: Payload) -> str:
        if self.recoveries:
            return recoveries.last_reason(self.fetch.redis, self.job, self.queue)
        return super().recovery_reason(payload)

    def forget_recoveries(self) -> None:
        if self.recoveries:
            recoveries.forget(self.fetch.redis, self.fetch.capsule_id, self.job, self.queue)

    def suspect_started(self) -> None:
        """Say in Redis that this suspect runs now, so that a crash is charged to it."""
        if self.recoveries:
            recoveries.started(self.fetch.redis, self.fetch.capsule_id, self.job, self.queue)


class LimitFetch:
    """Fetches for one capsule, identified by ``capsule_id``."""

    def __init__(
        self,
        redis: redis_py.Redis,
        order: QueueOrder,
        capsule_id: str,
        *,
        gate: IdleGate | None = None,
        blocking: Iterable[str] = (),
        dynamic: bool = False,
        rate_clock: Callable[[], int] | None = None,
    ) -> None:
        """``rate_clock``: for tests, the time (microseconds) rate limits are checked
        at; by default the script reads Redis's clock, the one all capsules share."""
        self.redis = redis
        self.rate_clock = rate_clock
        # After each fetch call: seconds until a queue that has jobs waiting only for its
        # rate limit may give one, or None (read by the one thread that fetches).
        self.room_in: float | None = None
        self.order = order
        self.capsule_id = capsule_id
        self.gate = gate or IdleGate()
        self.blocking = frozenset(blocking)
        self.dynamic = dynamic
        # One call for all queues, or in cluster mode one per queue (see _call_per_queue).
        self.per_queue = keys.is_cluster_layout()
        self._shared_of: dict[str, tuple[list[bytes], bytes]] = {}
        self._fixed_keys, self._recoveries_key = self._shared_keys("")
        self._id = capsule_id.encode()
        self._channel = keys.WAKE_CHANNEL.encode()
        self._per_queue: dict[str, tuple[bytes, bytes, bytes, bytes, bytes]] = {}
        self._extra_queues: list[str] = []
        self._extra_refreshed = float("-inf")
        self._lock = threading.Lock()
        self._suspects: Counter[tuple[str, bytes]] = Counter()
        # WAIT after every call that takes or settles jobs (see limitd.replication).
        self._wait = replication.of(redis)
        self._wait_command: tuple[bytes, ...] = ()
        if self._wait is not None:
            self._wait_command = (
                pack_command(b"WAIT", self._wait.replicas, self._wait.timeout_ms),
            )
        self._last_shortfall_log = float("-inf")
        self._quiet_until: dict[str, float] = {}  # cluster mode, see QUIET_SECONDS
        # Set by a capsule that hears wake-ups (without them, a push into a quiet queue
        # would wait out the quiet time): see QUIET_SECONDS.
        self.quiet_seconds = 0.0

    @property
    def block_seconds(self) -> float:
        return self.gate.poll_range[1]

    def retrieve_work(self, done: UnitOfWork | None = None) -> LimitUnitOfWork | None:
        """Settle ``done`` and take a job; if there is none, wait on the idle gate until
        there may be one (the caller then asks again)."""
        unit = self.try_retrieve(done)
        if unit is None:
            self.gate.wait(at_most=self.room_in)
        else:
            self.gate.wake_one_more()
        return unit

    def try_retrieve(self, done: UnitOfWork | None = None) -> LimitUnitOfWork | None:
        """Settle ``done`` and make one fetch attempt, without waiting."""
        found = self.settle_and_take([done] if done is not None else [], 1)
        return found[0] if found else None

    def settle_and_take(
        self, finished: Sequence[UnitOfWork], want: int, conn: Conn | None = None
    ) -> list[LimitUnitOfWork]:
        """Acknowledge ``finished`` and take up to ``want`` jobs, in one call (on
        ``conn``, a dispatcher's own connection, else the pool)."""
        reply = self._call(finished, ACK, self._orders(want), want, conn or self.redis)
        self.room_in = int(reply[1]) / 1000 if reply[1] else None
        return [
            LimitUnitOfWork(reply[i].decode(), reply[i + 1], self, reply[i + 2], reply[i + 3])
            for i in range(2, len(reply), JOB_FIELDS)
        ]

    def _orders(self, want: int) -> list[list[str]]:
        """One queue order per job to take: weighted and random orders are drawn for
        each job, as if each were fetched on its own; a strict order is the same for all."""
        if want <= 0:
            return []
        draws = 1 if self.order.mode == "strict" else want
        return [self.queue_names() for _ in range(draws)]

    def queue_names(self) -> list[str]:
        """This fetch's order; with ``dynamic``, queues known to Redis but not configured
        follow the configured ones."""
        names = self.order.next_order()
        if self.dynamic:
            names += self._dynamic_queues()
        return names

    def wants(self, queue: str) -> bool:
        """Whether a wake-up for ``queue`` concerns this fetch ("" means any queue)."""
        return not queue or self.dynamic or queue in self.order.weights

    def release(self, unit: UnitOfWork, *, requeue: bool) -> bool:
        """Acknowledge or requeue one unit now; False when it was no longer this
        capsule's (it was reaped and requeued already)."""
        return bool(self._call([unit], REQUEUE if requeue else ACK, [], 0, self.redis)[0])

    def bulk_requeue(self, units: Iterable[UnitOfWork]) -> None:
        """Requeue several units in one round trip (hard shutdown, a quieting dispatcher),
        the first given ending up first in line again."""
        batch = list(units)
        if batch:
            self._call(batch[::-1], REQUEUE, [], 0, self.redis)

    def recover_orphans(self, held: Iterable[UnitOfWork]) -> int:
        """Requeue in-progress entries that no thread of this capsule holds, once they
        have been unclaimed on two consecutive calls (heartbeats).

        An entry is orphaned when Redis ran a fetch whose reply never arrived (the
        connection broke, Redis restarted): the job is counted busy but nobody runs it.
        A fetch in flight is claimed within milliseconds, so waiting one heartbeat tells
        the two apart. Returns how many jobs were requeued."""
        claimed = Counter((unit.queue, unit.job) for unit in held)
        unclaimed: Counter[tuple[str, bytes]] = Counter()
        held_queues = (
            self.queue_names()
            if self.per_queue
            else set_members(self.redis, keys.capsule_queues(self.capsule_id))
        )
        for name in held_queues:
            entries = cast("list[bytes]", self.redis.lrange(self._queue(name)[1], 0, -1))
            unclaimed.update((name, job) for job in entries)
        unclaimed -= claimed
        orphans = unclaimed & self._suspects
        self._suspects = unclaimed - orphans
        requeued = sum(
            self.release(LimitUnitOfWork(name, job, self), requeue=True)
            for (name, job), count in orphans.items()
            for _ in range(count)
        )
        if requeued:
            log.warning("requeued %d jobs this capsule held in Redis but no thread ran", requeued)
        return requeued

    def woken(self, queue: str) -> None:
        """A wake-up named ``queue`` ("": any): ask it again at the next call."""
        if not self._quiet_until:
            return
        if queue:
            self._quiet_until.pop(queue, None)
        else:
            self._quiet_until.clear()

    def refresh_dynamic(self) -> None:
        """Forget the cached queue list (a wake-up named a queue we do not know yet)."""
        with self._lock:
            self._extra_refreshed = float("-inf")

    def _shared_keys(self, queue: str) -> tuple[list[bytes], bytes]:
        """The keys every call passes first, and its last one (the recoveries hash):
        shared by all queues, or in cluster mode ``queue``'s own (built once a queue)."""
        cached = self._shared_of.get(queue)
        if cached is not None:
            return cached
        fixed = [
            keys.limits_of(queue),
            keys.process_limits_of(queue),
            keys.paused_of(queue),
            keys.busy_of(queue),
            keys.capsule_queues(self.capsule_id, queue),
            keys.capsules_of(queue),
            keys.rate_limits_of(queue),
        ]
        cached = [key.encode() for key in fixed], keys.recoveries_of(queue).encode()
        self._shared_of[queue] = cached
        return cached

    def _call(
        self,
        settle: Sequence[UnitOfWork],
        mode: bytes,
        orders: list[list[str]],
        want: int,
        conn: Conn,
    ) -> list[Any]:
        """``orders``: the queue order of each job to take (one order: all alike)."""
        if self.per_queue:
            return self._call_per_queue(settle, mode, orders, want)
        return self._one_call(settle, mode, orders, want, conn)

    def _call_per_queue(
        self, settle: Sequence[UnitOfWork], mode: bytes, orders: list[list[str]], want: int
    ) -> list[Any]:
        """Cluster mode: every queue's keys live on its own shard, so the call is made
        once per queue, in the order drawn for this call (the first job's: weighted and
        random orders are drawn once per call here, not once per job), asking each queue
        for what the ones before it did not give, and settling each queue's finished
        jobs in its own call. A blocking queue that gives fewer jobs than asked while
        jobs wait in it (at its limit or rate) stops the asking, as in one call. The
        finished jobs' bookkeeping (batches, unique locks) is made first, on its own
        shard, and the callbacks it fires are pushed, so this very call can take them,
        as in one call. Limits stay exact: each queue's check, pop and count are one
        script on its shard. Returns the reply of one call for all."""
        calls = _calls_before_ack(settle) if mode == ACK else []
        if calls:  # first, as in one call: what they fire (batch callbacks) is fetchable
            run_calls(self.redis, calls)
            _forget_calls(settle)
            handoff.push_waiting(self.redis, clock.now())
        by_queue: dict[str, list[UnitOfWork]] = {}
        for unit in settle:
            by_queue.setdefault(unit.queue, []).append(unit)
        order = orders[0] if orders else []
        settled, room_in, jobs = 0, 0, cast("list[Any]", [])
        now = clock.monotonic()
        held_back = False  # a blocking queue at its limit holds back the ones after it
        for name in dict.fromkeys([*order, *by_queue]):
            missing = want - len(jobs) // JOB_FIELDS if name in order and not held_back else 0
            if missing > 0 and self._quiet_until.get(name, 0.0) > now:
                missing = 0  # it gave nothing a moment ago and no wake-up named it since
            units = by_queue.get(name, [])
            if not units and missing <= 0:
                continue
            reply = self._one_call(
                units, mode, [[name]] if missing > 0 else [], missing, self.redis
            )
            settled += int(reply[0])
            if reply[1] and (not room_in or int(reply[1]) < room_in):
                room_in = int(reply[1])
            if missing > 0 and len(reply) == 2 and self.quiet_seconds:
                self._quiet_until[name] = now + self.quiet_seconds
            if name in self.blocking and len(reply[2:]) // JOB_FIELDS < missing:
                held_back = self._holds_back(name)
            jobs += reply[2:]
        return [settled, room_in, *jobs]

    def _holds_back(self, name: str) -> bool:
        """Cluster mode: whether a blocking queue that gave fewer jobs than asked has
        jobs waiting and is not paused: then it is at its limit (or rate), and the
        queues after it must not jump ahead (as in one call). One round trip, to its
        shard; a push or a freed slot in between only makes the fetch wait for the next
        call."""
        pipe = self.redis.pipeline(transaction=False)
        pipe.llen(keys.queue(name))
        pipe.sismember(keys.paused_of(name), name)
        waiting, paused = pipe.execute()
        return bool(waiting) and not paused

    def _one_call(
        self,
        settle: Sequence[UnitOfWork],
        mode: bytes,
        orders: list[list[str]],
        want: int,
        conn: Conn,
    ) -> list[Any]:
        script_keys, args = self._script_input(settle, mode, orders, want)
        if self.per_queue:  # its calls were made first (_call_per_queue)
            return cast("list[Any]", LIMIT_FETCH(conn, script_keys, args))
        calls = _calls_before_ack(settle) if mode == ACK else []
        if not calls and self._wait is None:
            return cast("list[Any]", LIMIT_FETCH(conn, script_keys, args))
        try:
            replies = send_calls_then(
                conn, calls, LIMIT_FETCH.packed(script_keys, args), *self._wait_command
            )
        except NoScriptError:  # the calls were made; only the fetch script was missing
            replies = [LIMIT_FETCH(conn, script_keys, args)]
            if self._wait_command:
                replies.append(send_packed(conn, self._wait_command[0]))
        _forget_calls(settle)
        if self._wait is not None:
            self._check_replicated(replies)
        return cast("list[Any]", replies[0])

    def _script_input(
        self, settle: Sequence[UnitOfWork], mode: bytes, orders: list[list[str]], want: int
    ) -> tuple[list[bytes], list[Any]]:
        """KEYS and ARGV of one ``limit_fetch.lua`` call (see its header)."""
        names = list(dict.fromkeys(name for order in orders for name in order))
        fixed, recoveries_key = self._fixed_keys, self._recoveries_key
        if self.per_queue:  # one queue per call: its own keys
            fixed, recoveries_key = self._shared_keys((names or [settle[0].queue])[0])
        script_keys = list(fixed)
        now = b"" if self.rate_clock is None else self.rate_clock()
        args = [self._id, self._channel, mode, len(settle), want, len(names), now]
        for unit in settle:
            queue_key, in_progress_key, name, _, _ = self._queue(unit.queue)
            script_keys += [in_progress_key, queue_key]
            args += [unit.job, name]
        for queue_name in names:
            queue_key, in_progress_key, name, blocking, rate_key = self._queue(queue_name)
            script_keys += [queue_key, in_progress_key, rate_key]
            args += [name, blocking]
        script_keys.append(recoveries_key)
        if len(orders) > 1:
            number = {name: str(index) for index, name in enumerate(names, 1)}
            args += [",".join(number[name] for name in order) for order in orders]
        return script_keys, args

    def _check_replicated(self, replies: list[Any]) -> None:
        """Log, at most once a minute, fetches replicas did not confirm in time: their
        jobs run (a replica down must not stop the work), but a failover now could let
        another capsule take their slots."""
        assert self._wait is not None
        if replication.confirmed(replies, self._wait):
            return
        now = clock.monotonic()
        if now - self._last_shortfall_log >= SHORTFALL_LOG_EVERY:
            self._last_shortfall_log = now
            log.warning(
                "%s (logged once a minute)",
                replication.shortfall(
                    self._wait, int(replies[-1]), f"capsule {self.capsule_id}'s fetch"
                ),
            )

    def _queue(self, name: str) -> tuple[bytes, bytes, bytes, bytes, bytes]:
        """Encoded once: keys and arguments are rebuilt for every fetch."""
        cached = self._per_queue.get(name)
        if cached is None:
            cached = (
                keys.queue(name).encode(),
                keys.in_progress(self.capsule_id, name).encode(),
                name.encode(),
                b"1" if name in self.blocking else b"0",
                keys.rate_state(name).encode(),
            )
            self._per_queue[name] = cached
        return cached

    def _dynamic_queues(self) -> list[str]:
        now = clock.monotonic()
        with self._lock:
            if now - self._extra_refreshed >= DYNAMIC_REFRESH_SECONDS:
                known = self.order.weights
                names = set_members(self.redis, keys.QUEUES)
                self._extra_queues = [name for name in names if name not in known]
                self._extra_refreshed = now
            return list(self._extra_queues)


def _forget_calls(units: Sequence[UnitOfWork]) -> None:
    """The units' bookkeeping calls were made: they must not be made again."""
    for unit in units:
        if isinstance(unit, LimitUnitOfWork):
            unit.after_run = []


def _calls_before_ack(units: Sequence[UnitOfWork]) -> list[ScriptCall]:
    """The bookkeeping server middleware left on these units (see ``ScriptCall``)."""
    return [call for unit in units if isinstance(unit, LimitUnitOfWork) for call in unit.after_run]
