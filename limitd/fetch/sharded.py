"""The limit fetch in a Redis Cluster: one call per queue, each on its queue's shard.

In a cluster every queue's keys (its list, limits, busy slots, in-progress lists) share
a hash tag, so no one script may touch two queues. :class:`ShardedLimitFetch` keeps what
:class:`~limitd.fetch.limit.LimitFetch` decides (the order, the jobs wanted, what to
settle) and replaces its single call with one script call per queue; limits stay exact,
as each queue's check, pop and count are one script on its shard.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any, cast

from limitd import clock, handoff
from limitd.connection import Conn, run_calls
from limitd.fetch import WakeHandler
from limitd.fetch.basic import UnitOfWork
from limitd.fetch.limit import ACK, JOB_FIELDS, JOBS_AT, LimitFetch
from limitd.fetch.limit_unit import calls_before_ack, forget_calls

# With wake-ups: a queue that gave nothing when asked is not asked again for this long,
# unless a wake-up names it (each ask is a round trip to its shard).
QUIET_SECONDS = 0.1


class ShardedLimitFetch(LimitFetch):
    """A limit fetch whose call is made queue by queue (see the module docstring)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._quiet_until: dict[str, float] = {}  # see QUIET_SECONDS
        # Set once wake-ups are heard (without them, a push into a quiet queue would
        # wait out the quiet time): see QUIET_SECONDS.
        self.quiet_seconds = 0.0

    def wake_handlers(self) -> dict[str, WakeHandler]:
        """Wake-ups name queues with news: one that gave nothing may rest meanwhile."""
        self.quiet_seconds = QUIET_SECONDS
        return super().wake_handlers()

    def woken(self, queue: str) -> None:
        """A wake-up named ``queue`` ("": any): ask it again at the next call."""
        if not self._quiet_until:
            return
        if queue:
            self._quiet_until.pop(queue, None)
        else:
            self._quiet_until.clear()

    def _held_queues(self) -> Iterable[str]:
        """Each shard has its own count of our queues: ask our queues directly."""
        return self.queue_names()

    def _forget_drained(self, names: list[str]) -> None:
        """Nothing to forget: each queue's set of ours holds that queue at most, and the
        orphan scan asks the queues we list, however many we took from."""

    def _call(
        self,
        settle: Sequence[UnitOfWork],
        mode: bytes,
        orders: list[list[str]],
        want: int,
        conn: Conn,
    ) -> list[Any]:
        """The call made once per queue, in the order drawn for this call (the first
        job's: weighted and random orders are drawn once per call here, not once per
        job), asking each queue for what the ones before it did not give, and settling
        each queue's finished jobs in its own call. A blocking queue that gives fewer
        jobs than asked while jobs wait in it (at its limit or rate) stops the asking, as
        in one call. The finished jobs' bookkeeping (batches, unique locks) is made
        first, on its own shard, and the callbacks it fires are pushed, so this very call
        can take them, as in one call. Returns the reply of one call for all."""
        if mode == ACK:
            self._bookkeeping_first(settle)
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
            asked = [[name]] if missing > 0 else []
            reply = self._script(units, mode, asked, missing, self.redis, shared=name)
            settled += int(reply[0])
            if reply[1] and (not room_in or int(reply[1]) < room_in):
                room_in = int(reply[1])
            if missing > 0 and len(reply) == JOBS_AT and self.quiet_seconds:
                self._quiet_until[name] = now + self.quiet_seconds
            if name in self.blocking and len(reply[JOBS_AT:]) // JOB_FIELDS < missing:
                held_back = self._holds_back(name)
            jobs += reply[JOBS_AT:]
        return [settled, room_in, [], *jobs]

    def _bookkeeping_first(self, settle: Sequence[UnitOfWork]) -> None:
        """The finished jobs' bookkeeping calls, before their acknowledgements, and the
        callbacks they fired pushed (so the fetch that follows can take them)."""
        calls = calls_before_ack(settle)
        if calls:
            run_calls(self.redis, calls)
            forget_calls(settle)
            handoff.push_waiting(self.redis, clock.now())

    def _holds_back(self, name: str) -> bool:
        """Whether a blocking queue that gave fewer jobs than asked has jobs waiting and
        is not paused: then it is at its limit (or rate), and the queues after it must
        not jump ahead (as in one call). One round trip, to its shard; a push or a freed
        slot in between only makes the fetch wait for the next call."""
        pipe = self.redis.pipeline(transaction=False)
        pipe.llen(self.keys.queue(name))
        pipe.sismember(self.keys.paused_of(name), name)
        waiting, paused = pipe.execute()
        return bool(waiting) and not paused
