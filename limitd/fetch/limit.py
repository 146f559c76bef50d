"""Limit fetch: the default fetch, aware of queue limits and reliable.

One Lua call (``limit_fetch.lua``) settles the jobs the capsule just finished and takes
the next ones: for each, it picks the first eligible queue in this fetch's order, moves
the job into this capsule's in-progress list and counts the busy slot. A capsule makes
one such call at a time, for every processor thread waiting: see :class:`~limitd.fetch.
dispatcher.Dispatcher` for who makes it and why. The job stays in Redis until it is
settled or requeued, so a capsule killed with SIGKILL loses nothing: the reaper returns
its in-progress jobs to their queues, and at each heartbeat (``maintain``) this fetch
reaps capsules that stopped beating and requeues jobs it holds that no thread runs.

:class:`LimitFetch` makes one call for all queues (standalone Redis, Sentinel); in a
cluster every queue's keys live on a shard of their own, and
:class:`~limitd.fetch.sharded.ShardedLimitFetch` makes the call once per queue.

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
from dataclasses import dataclass
from typing import Any, NamedTuple, cast

import redis as redis_py
from redis.exceptions import ResponseError

from limitd import clock, keys
from limitd.connection import (
    BULK,
    Conn,
    LuaFunction,
    LuaScript,
    OwnConnection,
    bulk,
    each_pipelined,
    pack_command,
    replication,
    send_calls_then,
    send_packed,
    set_members,
)
from limitd.fetch import WakeHandler, liveness, recoveries
from limitd.fetch.basic import UnitOfWork, as_units
from limitd.fetch.limit_unit import LimitUnitOfWork, calls_before_ack, forget_calls
from limitd.fetch.ready_index import SWEEP_PER_SECOND, CallPlan, ReadyIndex
from limitd.fetch.wakeup import IdleGate
from limitd.queues.limits import LimitSettings
from limitd.queues.order import QueueOrder
from limitd.queues.per_queue import keep_hashtables

log = logging.getLogger("limitd.fetch")

LIMIT_FETCH = LuaFunction(
    __package__ or "limitd.fetch", "limit_fetch.lua", ("fair_lib.lua",), entry="limit_fetch"
)
FORGET_DRAINED = LuaScript(__package__ or "limitd.fetch", "forget_drained.lua")
FORGET_PER_CALL = 1000  # drained queues a forget_drained call takes out of the set
DYNAMIC_REFRESH_SECONDS = 5.0
SHORTFALL_LOG_EVERY = 60.0
ACK, REQUEUE, YIELD = b"ack", b"requeue", b"yield"
JOB_FIELDS = 4  # each job in a fetch reply: queue, job, crashes, crashes alone
JOBS_AT = 3  # a reply: settled, room in, the index's part, then the jobs
MAX_ASKS = 4  # calls one take makes at most while the index holds queues it was not given
# An in-progress entry no thread holds is requeued once it has been so this long: a
# fetch's reply or a settlement in flight is never that late.
ORPHAN_SECONDS = 2.0


_MODES = {mode: bulk(mode) for mode in (ACK, REQUEUE, YIELD)}
_NONE_BLOCKING = bulk(b"")  # the blocking queues' numbers of a call that gives none


@dataclass(frozen=True, slots=True)
class _CallParts:
    """What every packed fetch call of one fetch passes whatever its queues, packed."""

    fixed_keys: bytes  # KEYS[1..7]
    index_keys: bytes  # the ready index's two, when a call uses it
    last_keys: bytes  # the fair queues' settings and the recoveries hash
    key_count: int  # keys in fixed_keys and last_keys
    head: bytes  # ARGV[1..2]: the capsule's id, the wake-up channel
    fair_template: bytes
    no_index: bytes  # the index's arguments of a call without it


class _QueueParts(NamedTuple):
    """One queue's keys and arguments in a packed fetch call. (A tuple: over thousands
    of shallow queues a capsule meets most of them for the first time in the call that
    passes them, and a frozen dataclass took longer to build than the call to pack.)"""

    settle_keys: bytes  # a queue with jobs to settle: its in-progress list, its queue
    name: bytes  # its name as an argument (to settle jobs of, or to fetch from)
    keys: bytes  # a queue to fetch from: its list, its in-progress list, its rate key


def _by_queue(settle: Sequence[UnitOfWork]) -> dict[str, list[bytes]]:
    """The jobs to settle, by queue (in the order met, each queue's in its own order):
    a call passes a queue's keys and name once for all its jobs."""
    settled: dict[str, list[bytes]] = {}
    for unit in settle:
        jobs = settled.get(unit.queue)
        if jobs is None:
            settled[unit.queue] = [unit.job]
        else:
            jobs.append(unit.job)
    return settled


class LimitFetch:
    """Fetches for one capsule, identified by ``capsule_id``, with one call for all its
    queues. Implements ``limitd.fetch.Fetch``; build it with ``limit_fetch`` (or the
    capsule's ``build_fetch``), which picks the strategy the topology needs."""

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
        limits: LimitSettings | None = None,
        ready_index: bool = True,
        sweep_per_second: float = SWEEP_PER_SECOND,
    ) -> None:
        """``rate_clock``: for tests, the time (microseconds) rate limits are checked
        at; by default the script reads Redis's clock, the one all capsules share.
        ``limits``: the configured limits, re-applied at each heartbeat.
        ``ready_index``: look only at the queues that may have work (``limitd.fetch.
        ready_index``; standalone and Sentinel), else at every listed queue each call;
        ``sweep_per_second``: how many listed queues its sweep re-checks a second."""
        self.redis = redis
        self.keys = keys.of(redis)  # the key layout of its connection
        self.rate_clock = rate_clock
        # After each fetch call: seconds until a queue that has jobs waiting only for its
        # rate limit may give one, or None (read by the one thread that fetches).
        self.room_in: float | None = None
        self.order = order
        self.capsule_id = capsule_id
        self.gate = gate or IdleGate()
        self.blocking = frozenset(blocking)
        self.dynamic = dynamic
        self.limits = limits
        self._shared_of: dict[str, tuple[list[bytes], bytes, bytes]] = {}
        self._id = capsule_id.encode()
        self._channel = keys.WAKE_CHANNEL.encode()
        self._per_queue: dict[str, tuple[bytes, bytes, bytes, bytes]] = {}
        self._parts_of: dict[str, _QueueParts] = {}  # packed for the wire, by queue
        self._call_parts: _CallParts | None = None
        self._extra_queues: list[str] = []
        self._extra_refreshed = float("-inf")
        self._lock = threading.Lock()
        self._suspects: Counter[tuple[str, bytes]] = Counter()
        self._suspected_at = clock.monotonic()
        # WAIT after every call that takes or settles jobs (see limitd.replication).
        self._wait = replication.of(redis)
        self._wait_command: tuple[bytes, ...] = ()
        if self._wait is not None:
            self._wait_command = (
                pack_command(b"WAIT", self._wait.replicas, self._wait.timeout_ms),
            )
        self._last_shortfall_log = float("-inf")
        self._fair_template = self.keys.fair_template.encode()
        self.index: ReadyIndex | None = None
        if ready_index and not self.keys.cluster:
            self.index = ReadyIndex(
                redis,
                order,
                capsule_id,
                dynamic=dynamic,
                sweep_per_second=sweep_per_second,
                exact_rates=rate_clock is not None,
            )

    @property
    def block_seconds(self) -> float:
        return self.gate.poll_range[1]

    # -- take / settle / requeue ----------------------------------------------------

    def take(
        self,
        want: int = 1,
        finished: Sequence[UnitOfWork] = (),
        *,
        wait: bool = False,
        conn: Conn | None = None,
    ) -> list[LimitUnitOfWork]:
        """Settle ``finished`` and take up to ``want`` jobs, in one call (on ``conn``, a
        dispatcher's own connection, else the pool). With ``wait``, when there was none,
        wait on the idle gate until there may be one (the caller then asks again)."""
        units: list[LimitUnitOfWork] = []
        for _ in range(MAX_ASKS):
            missing = want - len(units)
            orders = self._orders(missing) if self.index is None else []
            try:
                reply = self._call(finished, ACK, orders, missing, conn or self.redis)
            except redis_py.RedisError:
                if not units:
                    raise
                break  # keep what the earlier asks took; the next take asks again
            finished = ()
            self.room_in = int(reply[1]) / 1000 if reply[1] else None
            units += [
                LimitUnitOfWork(reply[i].decode(), reply[i + 1], self, reply[i + 2], reply[i + 3])
                for i in range(JOBS_AT, len(reply), JOB_FIELDS)
            ]
            if not reply[2] or len(units) >= want:  # not stopped short (see _call)
                break
        if wait and units:
            self.gate.wake_one_more()
        elif wait:
            self.gate.wait(at_most=self.room_in)
        return units

    def settle(self, units: Sequence[UnitOfWork]) -> int:
        """Remove finished jobs from the in-progress list and free their slots now;
        returns how many were still this capsule's (a reaped one was requeued already)."""
        return int(self._call(units, ACK, [], 0, self.redis)[0]) if units else 0

    def requeue(
        self,
        units: UnitOfWork | Iterable[UnitOfWork],
        *,
        reason: str | None = None,
        back: bool = False,
    ) -> int:
        """Put jobs back, the first given first in line again, in one round trip; with
        ``back``, at the end of their queues instead (a job giving way to those queued
        after it); with a ``reason`` (their outcome could not be recorded), one call
        each that also charges the job a recovery (``fetch/recoveries.py``). Returns how
        many were still this capsule's to give back."""
        batch = as_units(units)
        if reason is not None:
            return sum(
                recoveries.recover(self.redis, self.capsule_id, u.queue, u.job, reason) > 0
                for u in batch
            )
        if not batch:
            return 0
        if back:
            return int(self._call(batch, YIELD, [], 0, self.redis)[0])
        return int(self._call(batch[::-1], REQUEUE, [], 0, self.redis)[0])

    # -- heartbeat time ------------------------------------------------------------

    def vouch(self, period: float) -> None:
        """Keep this capsule's liveness key: the reapers leave its jobs alone."""
        liveness.vouch(self.redis, [self.capsule_id], period)

    def maintain(self, held: Callable[[], list[UnitOfWork]], *, reap: bool) -> None:
        """The heartbeat's work on Redis: re-apply configured limits Redis lost (and the
        field that keeps the shared per-queue hashes fast, see ``queues/per_queue``),
        reap the capsules that stopped beating (``reap``: unless our own beats failed
        lately), and requeue what this capsule holds but no thread runs (``held``: what
        runs)."""
        if self.limits is not None:
            self.limits.apply_defaults(self.redis)
        keep_hashtables(self.redis)
        if reap:
            liveness.reap_dead(self.redis)
        self.recover_orphans(held())
        if self.index is not None:
            self.index.forget()

    def retire(self) -> int:
        """At stop: no liveness any more, and what is still in progress (a requeue that
        failed) goes back to its queues. Returns how many jobs that was."""
        return liveness.retire(self.redis, self.capsule_id)

    def recover_orphans(self, held: Iterable[UnitOfWork]) -> int:
        """Requeue in-progress entries that no thread of this capsule holds, once they
        have been unclaimed on two calls (heartbeats) ORPHAN_SECONDS apart at least.

        An entry is orphaned when Redis ran a fetch whose reply never arrived (the
        connection broke, Redis restarted): the job is counted busy but nobody runs it.
        A fetch or a settlement in flight is claimed (or gone) within milliseconds, so
        waiting tells the two apart; but a beat asked for early (a capsule told to quiet
        beats at once) can follow the last one by milliseconds, so the wait is counted in
        seconds, not in beats. Returns how many jobs were requeued."""
        claimed = Counter((unit.queue, unit.job) for unit in held)
        unclaimed: Counter[tuple[str, bytes]] = Counter()
        lists = each_pipelined(
            self.redis,
            list(self._held_queues()),
            lambda pipe, name: pipe.lrange(self._queue(name)[1], 0, -1),
        )
        drained = []
        for name, entries in lists:  # a thousand queues per round trip
            unclaimed.update((name, job) for job in entries)
            if not entries:
                drained.append(name)
        self._forget_drained(drained)
        unclaimed -= claimed
        now = clock.monotonic()
        if now - self._suspected_at < ORPHAN_SECONDS:
            self._suspects &= unclaimed  # those claimed since are cleared; none is new
            return 0
        orphans = unclaimed & self._suspects
        self._suspects, self._suspected_at = unclaimed - orphans, now
        requeued = sum(
            self.requeue(LimitUnitOfWork(name, job, self))
            for (name, job), count in orphans.items()
            for _ in range(count)
        )
        if requeued:
            log.warning("requeued %d jobs this capsule held in Redis but no thread ran", requeued)
        return requeued

    # -- wake-ups ------------------------------------------------------------------

    def wake_handlers(self) -> dict[str, WakeHandler]:
        """The channel pushes and freed slots are announced on, and what to do then."""
        if self.index is not None:
            self.index.listening = True
        return {keys.WAKE_CHANNEL: self.on_wake}

    def on_wake(self, queues: Sequence[str]) -> None:
        """Wake-ups named ``queues`` ("": any): note those that concern us, and wake a
        waiting call once for all of them (it serves every idle processor)."""
        wanted = [queue for queue in queues if self.wants(queue)]
        if not wanted:
            return
        if self.dynamic and any(queue and queue not in self.order.weights for queue in wanted):
            self.refresh_dynamic()
        for queue in wanted:
            self.woken(queue)
        self.gate.wake()

    def wants(self, queue: str) -> bool:
        """Whether a wake-up for ``queue`` concerns this fetch ("" means any queue)."""
        return not queue or self.dynamic or queue in self.order.weights

    def woken(self, queue: str) -> None:
        """A wake-up named ``queue`` ("": any): the ready index takes note (without
        one, every call asks every queue: nothing to remember)."""
        if self.index is not None:
            self.index.hint(queue)

    def refresh_dynamic(self) -> None:
        """Forget the cached queue list (a wake-up named a queue we do not know yet)."""
        with self._lock:
            self._extra_refreshed = float("-inf")

    # -- the call ------------------------------------------------------------------

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

    def _held_queues(self) -> Iterable[str]:
        """The queues this capsule may hold jobs of, as Redis counts them."""
        return set_members(self.redis, self.keys.capsule_queues(self.capsule_id))

    def _forget_drained(self, names: list[str]) -> None:
        """Take the queues whose in-progress list the orphan scan found empty out of the
        held set (``forget_drained.lua``), so the next scan reads the queues this capsule
        runs jobs of, not every queue it ever took one from: at 10,000 queues the scan
        of all of them took a third of a capsule's GIL at each beat. The fetch adds a
        queue back when it takes from it again."""
        held = self.keys.capsule_queues(self.capsule_id)
        for first in range(0, len(names), FORGET_PER_CALL):
            part = names[first : first + FORGET_PER_CALL]
            in_progress = [self._queue(name)[1] for name in part]
            FORGET_DRAINED(self.redis, [held, *in_progress], part)

    def _call(
        self,
        settle: Sequence[UnitOfWork],
        mode: bytes,
        orders: list[list[str]],
        want: int,
        conn: Conn,
    ) -> list[Any]:
        """One round trip: the finished jobs' bookkeeping (with ``ACK``), the script,
        and WAIT when replicas must confirm. ``orders``: the queue order of each job to
        take (one order: all alike); with the ready index, it gives them instead."""
        index, plan, hints = self.index, None, {}
        if index is not None and want > 0:  # the index gives the queues to look at
            hints = index.take_hints(self.redis)
            plan = index.plan(want, hints)
            orders = plan.orders
        try:
            reply = self._round_trip(settle, mode, orders, want, conn, plan=plan)
        except BaseException:
            if index is not None and plan is not None:
                index.failed()
                index.restore(hints)
            raise
        if index is not None and plan is not None:
            # The index's part of the reply, followed: whether the call stopped short.
            reply[2] = index.after_call(reply[2], plan, reply[3::4])
        return reply

    def _round_trip(
        self,
        settle: Sequence[UnitOfWork],
        mode: bytes,
        orders: list[list[str]],
        want: int,
        conn: Conn,
        *,
        plan: CallPlan | None,
    ) -> list[Any]:
        calls = calls_before_ack(settle) if mode == ACK else []
        if isinstance(conn, OwnConnection):  # a dispatcher's: packed from cached parts
            command = self._packed_input(settle, mode, orders, want, plan)
        else:  # a pool's client, or a pipeline's or transaction's wrapper
            script_keys, args = self._script_input(settle, mode, orders, want, "", plan=plan)
            if not calls and self._wait is None:
                return cast("list[Any]", LIMIT_FETCH(conn, script_keys, args))
            command = LIMIT_FETCH.packed(script_keys, args)
        if not calls and self._wait is None:
            return cast("list[Any]", LIMIT_FETCH.send(conn, command))
        command = LIMIT_FETCH.fitted(conn, command)
        try:
            replies = send_calls_then(conn, calls, command, *self._wait_command)
        except ResponseError as exc:  # the calls were made; only the fetch call failed
            if not LIMIT_FETCH.is_missing(exc):
                raise
            replies = [LIMIT_FETCH.recover(conn, command, exc)]
            if self._wait_command:
                replies.append(send_packed(conn, self._wait_command[0]))
        forget_calls(settle)
        if self._wait is not None:
            self._check_replicated(replies)
        return cast("list[Any]", replies[0])

    def _script(
        self,
        settle: Sequence[UnitOfWork],
        mode: bytes,
        orders: list[list[str]],
        want: int,
        conn: Conn,
        *,
        shared: str = "",
    ) -> list[Any]:
        """``limit_fetch.lua`` alone, with the shared keys of ``shared`` (a queue in a
        cluster, where each has its own; "" where all queues share them)."""
        script_keys, args = self._script_input(settle, mode, orders, want, shared)
        return cast("list[Any]", LIMIT_FETCH(conn, script_keys, args))

    def _script_input(
        self,
        settle: Sequence[UnitOfWork],
        mode: bytes,
        orders: list[list[str]],
        want: int,
        shared: str,
        *,
        plan: CallPlan | None = None,
    ) -> tuple[list[bytes], list[Any]]:
        """KEYS and ARGV of one ``limit_fetch.lua`` call (see its header); with a
        ``plan``, the call uses the ready index."""
        names = list(dict.fromkeys(name for order in orders for name in order))
        fixed, fair_key, recoveries_key = self._shared_keys(shared)
        script_keys = list(fixed)
        now = b"" if self.rate_clock is None else self.rate_clock()
        settled = _by_queue(settle)
        args = [self._id, self._channel, mode, len(settled), want, len(names), now]
        for queue_name, jobs in settled.items():
            queue_key, in_progress_key, name, _ = self._queue(queue_name)
            script_keys += [in_progress_key, queue_key]
            args += [name, len(jobs)]
        for jobs in settled.values():
            args += jobs
        for queue_name in names:
            queue_key, in_progress_key, name, rate_key = self._queue(queue_name)
            script_keys += [queue_key, in_progress_key, rate_key]
            args.append(name)
        args += [self._blocking_numbers(names), self._fair_template]
        if plan is not None and self.index is not None:
            script_keys += self.index.keys
            args += plan.args(self.index.mode)
        else:
            args += [b"", 0]
        script_keys += [fair_key, recoveries_key]
        if len(orders) > 1:
            number = {name: str(index) for index, name in enumerate(names, 1)}
            args += [",".join(number[name] for name in order) for order in orders]
        return script_keys, args

    def _packed_input(
        self,
        settle: Sequence[UnitOfWork],
        mode: bytes,
        orders: list[list[str]],
        want: int,
        plan: CallPlan | None,
    ) -> bytes:
        """The call ``_script_input`` describes (with the keys all queues share), packed
        for the wire from parts packed once: each queue's keys and arguments repeat call
        after call, and packing the hundred arguments of a call over many queues anew
        each time cost a capsule more than building them (bench/profile_capsule.py
        --queues 10000). tests/test_fetch_packing.py holds the two to the same bytes."""
        names = list(dict.fromkeys(name for order in orders for name in order))
        parts = self._packed_parts
        key_parts, arg_parts = [parts.fixed_keys], [parts.head, _MODES[mode]]
        now = b"" if self.rate_clock is None else self.rate_clock()
        settled = _by_queue(settle)
        arg_parts += [bulk(len(settled)), bulk(want), bulk(len(names)), bulk(now)]
        for queue_name, jobs in settled.items():
            queue = self._queue_parts(queue_name)
            key_parts.append(queue.settle_keys)
            arg_parts += [queue.name, bulk(len(jobs))]
        for jobs in settled.values():
            arg_parts += [BULK % (len(job), job) for job in jobs]  # bulk(), inlined
        for name in names:
            queue = self._queue_parts(name)
            key_parts.append(queue.keys)
            arg_parts.append(queue.name)
        blocking = bulk(self._blocking_numbers(names)) if self.blocking else _NONE_BLOCKING
        arg_parts += [blocking, parts.fair_template]
        keys_count, index_args = parts.key_count + 2 * len(settled) + 3 * len(names), 2
        if plan is not None and self.index is not None:
            key_parts.append(parts.index_keys)
            keys_count += len(self.index.keys)
            index = plan.args(self.index.mode)
            arg_parts += [bulk(arg) for arg in index]
            index_args = len(index)
        else:
            arg_parts.append(parts.no_index)
        key_parts.append(parts.last_keys)
        if len(orders) > 1:
            number = {name: str(index) for index, name in enumerate(names, 1)}
            arg_parts += [bulk(",".join(number[name] for name in order)) for order in orders]
        per_job = len(orders) if len(orders) > 1 else 0  # the orders' own arguments
        args_count = 9 + 2 * len(settled) + len(settle) + len(names) + index_args + per_job
        return LIMIT_FETCH.packed_from(keys_count, key_parts, args_count, arg_parts)

    @property
    def _packed_parts(self) -> _CallParts:
        """The parts of every packed call that do not depend on its queues (built once)."""
        parts = self._call_parts
        if parts is None:
            fixed, fair_key, recoveries_key = self._shared_keys("")
            index_keys = self.index.keys if self.index is not None else []
            parts = self._call_parts = _CallParts(
                fixed_keys=b"".join(bulk(key) for key in fixed),
                index_keys=b"".join(bulk(key) for key in index_keys),
                last_keys=bulk(fair_key) + bulk(recoveries_key),
                key_count=len(fixed) + 2,
                head=bulk(self._id) + bulk(self._channel),
                fair_template=bulk(self._fair_template),
                no_index=bulk(b"") + bulk(0),
            )
        return parts

    def _queue_parts(self, name: str) -> _QueueParts:
        """A queue's keys and arguments as ``_packed_input`` passes them (packed once)."""
        found = self._parts_of.get(name)
        if found is None:
            found = self._parts_of[name] = self._new_queue_parts(name)
        return found

    def _new_queue_parts(self, name: str) -> _QueueParts:
        # Packed as bulk() packs, inline: over thousands of shallow queues a call meets
        # a few queues for the first time, and calling bulk() was much of their cost.
        k, packed = self.keys, BULK
        queue, in_progress, rate, encoded = (
            k.queue(name).encode(),
            k.in_progress(self.capsule_id, name).encode(),
            k.rate_state(name).encode(),
            name.encode(),
        )
        queue = packed % (len(queue), queue)
        in_progress = packed % (len(in_progress), in_progress)
        encoded = packed % (len(encoded), encoded)
        return _QueueParts(
            in_progress + queue,
            encoded,
            queue + in_progress + packed % (len(rate), rate),
        )

    def _shared_keys(self, queue: str) -> tuple[list[bytes], bytes, bytes]:
        """The keys every call passes first, and its last two (the fair queues' settings
        and the recoveries hash), of ``queue`` (built once a queue; "" names the ones all
        queues share)."""
        cached = self._shared_of.get(queue)
        if cached is not None:
            return cached
        fixed = [
            self.keys.limits_of(queue),
            self.keys.process_limits_of(queue),
            self.keys.paused_of(queue),
            self.keys.busy_of(queue),
            self.keys.capsule_queues(self.capsule_id, queue),
            self.keys.capsules_of(queue),
            self.keys.rate_limits_of(queue),
        ]
        cached = (
            [key.encode() for key in fixed],
            self.keys.fair_queues_of(queue).encode(),
            self.keys.recoveries_of(queue).encode(),
        )
        self._shared_of[queue] = cached
        return cached

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

    def _queue(self, name: str) -> tuple[bytes, bytes, bytes, bytes]:
        """Encoded once: keys and arguments are rebuilt for every fetch."""
        cached = self._per_queue.get(name)
        if cached is None:
            cached = (
                self.keys.queue(name).encode(),
                self.keys.in_progress(self.capsule_id, name).encode(),
                name.encode(),
                self.keys.rate_state(name).encode(),
            )
            self._per_queue[name] = cached
        return cached

    def _blocking_numbers(self, names: list[str]) -> bytes:
        """The blocking queues among the ``names`` a call gives, by number ("2,5"), as
        the script takes them: one argument for all, empty in most calls."""
        if not self.blocking:
            return b""
        blocking = self.blocking
        return ",".join(str(i) for i, name in enumerate(names, 1) if name in blocking).encode()

    def _dynamic_queues(self) -> list[str]:
        now = clock.monotonic()
        with self._lock:
            if now - self._extra_refreshed >= DYNAMIC_REFRESH_SECONDS:
                known = self.order.weights
                names = set_members(self.redis, self.keys.QUEUES)
                self._extra_queues = [name for name in names if name not in known]
                self._extra_refreshed = now
            return list(self._extra_queues)
