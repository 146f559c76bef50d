"""The ready index: the queues a capsule's limit fetch looks at, so that a fetch costs
what the work needs and not what the queue list is long.

Without it, every fetch call would check every queue the capsule lists (an LLEN each,
and three keys each to pass): fine for ten queues, ruinous for ten thousand, most of
them empty. With it, each capsule keeps, in Redis, a sorted set of the queues that may
have a job it can take (``limitd:capsule:<id>:ready``), scored by the queue's place in
its order, and a call is given only the first few of them (strict order) or a random
few (weighted and random orders), with their keys, and returns the next few with its
jobs. The script checks those queues exactly as it always did (limits, rates, pauses,
all atomic), so the index only has to be a *superset* of the queues with work and room:

- *in*: every limitd write that may make a queue fetchable publishes its name on
  ``limitd:wake`` (pushes, scheduled jobs coming due, requeues, freed slots of a full
  queue, limit and pause changes, reaped capsules). The capsule's wake-up listener
  keeps those names as *hints*, and its next call adds them. Pub/sub loses messages
  only while the subscriber is disconnected, and every (re)subscription re-checks every
  listed queue (an LLEN each, pipelined): that, or a capsule without wake-ups (tests,
  ``limitd drain``), which re-checks before every call, closes the gap.
- *out*: the script takes a queue out when it finds it empty, paused, at its global
  limit, or out of rate (kept aside until its rate allows a job, then put back by the
  capsule's own next call). A queue at this capsule's process limit stays: other
  capsules may take from it, and this capsule will again soon.
- Clients that push without publishing (Ruby Sidekiq, a bare LPUSH) reach a queue
  that is already in the index at once; an empty queue they push to is found by the
  *sweep*, which re-checks the next few listed queues before a call (at most every
  ``SWEEP_EVERY`` seconds: at each idle poll), ``sweep_per_second`` of them per second
  and capsule, so its cost does not grow with the queue count but its period does (a
  capsule of 20 queues re-checks them all at every poll, as before the index). While
  they are empty, the queues a sweep covers are asked in one EXISTS of all their keys:
  an idle capsule sends the same few commands a second whatever it lists.

Standalone Redis and Sentinel only: in a cluster the fetch is one call per queue on its
own shard (``limitd.fetch.sharded``), and no one key could index queues of every shard.
"""

from __future__ import annotations

import random
import threading
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any, cast

import redis as redis_py

from limitd import clock, keys
from limitd.connection import each_pipelined
from limitd.queues.order import QueueOrder

# A dynamic capsule's queues that its config does not list come after those it does,
# among themselves by name (equal ranks sort by member).
DYNAMIC_RANK = 1_000_000_000
# Queues a call is given beyond those it is expected to need: room for the queues it
# will skip (at this capsule's process limit) or find drained by another capsule since.
SLACK = 4
# How fast the estimate of the queues a call needs per job follows the calls (the share
# of each new call's figure), and its bounds: a queue deep enough gives a whole call's
# jobs, so a call needs 1/want of a queue per job; over many shallow queues that other
# capsules drain too, it looks at a queue or two per job.
PER_JOB_WEIGHT = 0.25
PER_JOB_RANGE = (1 / 64, 4.0)
MAX_SLACK = 4096
# A weighted or random order is drawn, per job, among this many queues at least: all of
# those with work while there are no more, a random sample of them beyond.
MIN_SAMPLE = 32
# What a capsule keeps of its index between calls, at most: the first queues by rank
# (or a random few), so that following it costs the same with 10,000 queues with work.
MAX_KNOWN = 256
# A call that reads the index afresh reads this many times the queues it was given, so
# that the calls after it follow the index by what they take out, without reading it,
# until fewer than a call's worth are left.
REFILL_FACTOR = 4
NO_HINTS: dict[str, int] = {}  # shared, never written: a call without hints
SWEEP_PER_SECOND = 50
# Queues a re-check asks in one EXISTS before asking them one by one (two keys each).
CHECK_AT_ONCE = 500
# The sweep runs before a call at most this often: an idle capsule sweeps at each poll
# (0.4 to 0.5 s), a busy one costs one pipelined round trip more every half second.
SWEEP_EVERY = 0.4
MAX_SWEEP_SECONDS = 30.0  # a sweep after a long pause catches up this much at most


@dataclass(slots=True)
class CallPlan:
    """One call's part of the index (see ``ReadyIndex.plan``)."""

    orders: list[list[str]]  # the queues given, in each job's order
    hints: dict[str, int]  # queue -> rank, to add
    complete: bool  # the queues given are all the index holds
    rate_state: int  # queues set aside for their rate: 0 none, 1 some, 2 maybe due
    size: int  # how many queues to return when the reply reads the index afresh
    spare: int  # queues known to be in the index beyond those given

    def args(self, mode: bytes) -> list[Any]:
        """The script's ARGV for the index (after the queues; see its header)."""
        args: list[Any] = [
            mode,
            len(self.hints),
            int(self.complete),
            self.rate_state,
            self.size,
            self.spare,
        ]
        for name, rank in self.hints.items():
            args += [name, rank]
        return args


class ReadyIndex:
    """One capsule's ready index (see the module docstring), for :class:`~limitd.fetch.
    limit.LimitFetch`: what each call passes for it, and what it keeps from the reply."""

    def __init__(
        self,
        redis: redis_py.Redis,
        order: QueueOrder,
        capsule_id: str,
        *,
        dynamic: bool = False,
        sweep_per_second: float = SWEEP_PER_SECOND,
        exact_rates: bool = False,
    ) -> None:
        """``exact_rates``: rate limits run on a clock the caller sets (tests), so every
        call looks for queues whose rate allows a job again, rather than this process's
        clock deciding when."""
        k = keys.of(redis)
        self.keys = [k.ready_index(capsule_id).encode(), k.rate_wait(capsule_id).encode()]
        self.order = order
        self.dynamic = dynamic
        self.sampled = order.mode != "strict"
        self.mode = b"sample" if self.sampled else b"strict"  # the script's word for it
        self.ranks = {name: rank for rank, name in enumerate(order.names, 1)}
        self.sweep_per_second = sweep_per_second
        self.exact_rates = exact_rates
        # Set once the capsule hears wake-ups; until then every call re-checks all.
        self.listening = False
        self.slack = SLACK
        # The queues a call looks at per job it takes (see ``after_call``); 1 at first.
        self.per_job = 1.0
        # What this capsule knows its index holds: all of it (``_complete``), else every
        # queue ranked up to ``_bound`` (None: none), by (rank, name).
        self._known: dict[str, int] = {}
        self._complete = True  # a new capsule's index is empty
        self._bound: tuple[int, str] | None = None
        self._sorted: list[str] | None = None  # _known by rank, while it is unchanged
        self._forget = False
        # When (monotonic) the first queue set aside for its rate may give a job again.
        self._rate_due_at: float | None = None
        self._hints: dict[str, int] = {}  # queue -> rank, for the next call to add
        self._lock = threading.Lock()
        self._recheck_all = True
        self._sweep_position = 0  # in the listed names
        self._scan_cursor = 0  # in the queues Redis knows (dynamic)
        self._swept_at = clock.monotonic()
        self._rng = random.Random()

    # -- hints -----------------------------------------------------------------------

    def rank(self, name: str) -> int | None:
        """The queue's place in this capsule's order; None if it does not fetch it."""
        rank = self.ranks.get(name)
        if rank is None and self.dynamic:
            return DYNAMIC_RANK
        return rank

    def hint(self, name: str) -> None:
        """A wake-up named ``name``: the next call adds it; "" (resubscribed, or asked to
        look everywhere): the next call re-checks every listed queue first."""
        if not name:
            self._recheck_all = True
            return
        rank = self.rank(name)
        if rank is not None:
            with self._lock:
                self._hints[name] = rank

    def hinted(self) -> set[str]:
        """The queues named by wake-ups since the last call (what it will add)."""
        with self._lock:
            return set(self._hints)

    def take_hints(self, redis: redis_py.Redis) -> dict[str, int]:
        """The hints for the call about to be made (re-checking every queue first when
        that is due); give them back with ``restore`` if the call fails."""
        if self._recheck_all or not self.listening:
            self._recheck_all = False
            self._check(redis, self._listed(redis))
        elif clock.monotonic() - self._swept_at >= SWEEP_EVERY:
            self.sweep(redis)
        if not self._hints:  # most calls under load: nothing heard since the last one
            return NO_HINTS
        with self._lock:
            hints, self._hints = self._hints, {}
        return hints

    def restore(self, hints: dict[str, int]) -> None:
        """A call failed: its hints were maybe not added, so the next call adds them."""
        with self._lock:
            self._hints.update(hints)

    # -- the call ----------------------------------------------------------------------

    def plan(self, want: int, hints: dict[str, int]) -> CallPlan:
        """What the next call is given: the hints to add (those not known to be in the
        index), the queues to look at with the order of each job, and whether those are
        the whole index. The queues are those this index knows it holds: its first ones
        by rank (strict: the script takes them in this order, and never one past them,
        where an unknown queue could rank higher), or a random few (sample)."""
        if self._forget:
            self._forget = False
            self.failed()
        added = self._add_hints(hints) if hints else hints
        if len(self._known) > MAX_KNOWN:
            self._trim()
        given = max(1, round(want * self.per_job)) + self.slack
        if self._sorted is None:  # kept until what is known changes
            self._sorted = sorted(self._known, key=self._key)
        known = self._sorted
        if self.sampled:
            given = max(given, MIN_SAMPLE)
            if len(known) > given:
                known = self._rng.sample(known, given)
            listed = [name for name in known if name in self.ranks]
            found = [name for name in known if name not in self.ranks]
            orders = [self.order.order_of(listed) + found for _ in range(want)]
        else:
            known = known[:given]
            orders = [known]
        complete = self._complete and len(known) == len(self._known)
        size = min(given * REFILL_FACTOR, MAX_KNOWN)
        spare = len(self._known) - len(known)
        return CallPlan(orders, added, complete, self._rate_state(), size, spare)

    def _rate_state(self) -> int:
        """0: no queue is set aside for its rate; 1: some are; 2: and one may be due."""
        if self._rate_due_at is None:
            return 0
        return 2 if self.exact_rates or clock.monotonic() >= self._rate_due_at else 1

    def _trim(self) -> None:
        """Keep the first ``MAX_KNOWN`` queues by rank (a random ``MAX_KNOWN``, when
        sampled): what is known is then every queue up to the last one kept."""
        if self.sampled:
            kept = self._rng.sample(list(self._known), MAX_KNOWN)
            self._bound = None
        else:
            kept = sorted(self._known, key=self._key)[:MAX_KNOWN]
            self._bound = self._key(kept[-1])
        self._known = {name: self._known[name] for name in kept}
        self._complete = False
        self._sorted = None

    def _add_hints(self, hints: dict[str, int]) -> dict[str, int]:
        """The hints the call must add; those within what this index knows join it."""
        added = {}
        for name, rank in hints.items():
            if name in self._known:
                continue  # in the index already: nothing to write
            added[name] = rank
            if self._complete or (
                self._bound is not None and not self.sampled and (rank, name) <= self._bound
            ):
                self._known[name] = rank
                self._sorted = None
        return added

    def after_call(self, reply: Sequence[Any], plan: CallPlan, taken: Sequence[bytes] = ()) -> bool:
        """Follow the index by the reply's part (see ``limit_fetch.lua``); True when the
        call stopped short while the index may hold queues it was not given (the caller
        asks again at once). ``taken``: the queue of each job the call took."""
        stale, refilled, rate_in = int(reply[0]), int(reply[1]), reply[2]
        if taken and not refilled:
            self._learn_per_job(reply, taken)
        names = [name.decode() for name in reply[3:]]
        if refilled:
            ranks = self.ranks  # _rank_or_last's rule, inline: a refill reads 256 names
            self._known = {name: ranks.get(name, DYNAMIC_RANK) for name in names}
            # The index's first queues come in its order, by score (the rank) and then
            # name, which is the order plan() keeps: not sorted again (a random few are).
            self._sorted = None if self.sampled else names
            self._complete = len(names) < plan.size
            # A sample: nothing known beyond it; the first queues: all up to the last.
            self._bound = None if self.sampled or not names else self._key(names[-1])
        else:
            left = sum(self._known.pop(name, None) is not None for name in names)
            if left and self._sorted is not None:
                given = len(plan.orders[0]) if plan.orders else 0
                self._sorted = self._without_left(self._sorted, left, given)
        if rate_in not in (b"", ""):
            ms = int(rate_in)
            self._rate_due_at = None if ms < 0 else clock.monotonic() + ms / 1000
        self.slack = min(self.slack * 2, MAX_SLACK) if stale else max(SLACK, self.slack - 1)
        return bool(stale)

    def _learn_per_job(self, reply: Sequence[Any], taken: Sequence[bytes]) -> None:
        """Follow how many queues a call needs per job, from the queues it took jobs
        from and those it took out of the index: every queue given costs the script its
        three keys and name whether it is looked at or not, and a queue deep enough
        gives the whole call from one. (Queues the call passed over with jobs, at this
        capsule's process limit, are not seen here: a call given too few for that stops
        short, and the slack doubles.)"""
        looked = len(set(taken).union(reply[3:]))
        low, high = PER_JOB_RANGE
        figure = min(high, max(low, looked / len(taken)))
        self.per_job += (figure - self.per_job) * PER_JOB_WEIGHT

    def _without_left(self, ranked: list[str], left: int, given: int) -> list[str]:
        """``ranked`` (the known queues by rank) without the ``left`` of them that a
        call took out: filtered, not sorted again, since a call over many queues takes
        some out every time. A strict call takes out only queues it was given, the first
        ``given``, so only those are looked at, unless the count says otherwise."""
        known = self._known
        if not self.sampled:
            head = [name for name in ranked[:given] if name in known]
            if given - len(head) == left:
                return head + ranked[given:]
        return [name for name in ranked if name in known]

    def failed(self) -> None:
        """A call failed: the script may have run, so what it took out is unknown."""
        self._known, self._complete, self._bound, self._sorted = {}, False, None, None

    def forget(self) -> None:
        """From any thread (each heartbeat): the next call reads the index afresh, so
        that what changed it from outside (a reaper that took this capsule for dead,
        FLUSHALL) is not followed for longer than a heartbeat."""
        self._forget = True

    def _key(self, name: str) -> tuple[int, str]:
        return (self._rank_or_last(name), name)

    def _rank_or_last(self, name: str) -> int:
        # A queue this capsule does not list ranks last whether it is dynamic or not.
        return self.ranks.get(name, DYNAMIC_RANK)

    # -- re-checks ---------------------------------------------------------------------

    def sweep(self, redis: redis_py.Redis) -> int:
        """Before a call, at most every ``SWEEP_EVERY`` seconds: re-check the next few
        listed queues (``sweep_per_second`` for every second since the last sweep), for
        jobs pushed by clients that do not publish. Returns how many were checked."""
        now = clock.monotonic()
        budget = int(min(now - self._swept_at, MAX_SWEEP_SECONDS) * self.sweep_per_second)
        if budget <= 0:
            return 0  # less than one queue's worth of time: it adds up until it is one
        self._swept_at = now
        names = self._next_swept(redis, budget)
        self._check(redis, names)
        return len(names)

    def _next_swept(self, redis: redis_py.Redis, budget: int) -> list[str]:
        listed = self.order.names
        count = min(budget, len(listed))
        start = self._sweep_position % len(listed)
        names = listed[start : start + count]  # (not the whole list rotated: 10,000 names)
        names += listed[: count - len(names)]
        self._sweep_position = start + count
        if self.dynamic and budget > count:
            cursor, found = cast(
                "tuple[int, list[bytes]]",
                redis.sscan(keys.of(redis).QUEUES, self._scan_cursor, count=budget - count),
            )
            self._scan_cursor = int(cursor)
            names += [name.decode() for name in found]
        return names

    def _listed(self, redis: redis_py.Redis) -> list[str]:
        """Every queue this capsule fetches: those listed, and with ``dynamic`` every one
        Redis knows."""
        names = list(self.order.names)
        if self.dynamic:
            known = cast("set[bytes]", redis.smembers(keys.of(redis).QUEUES))
            names += [name.decode() for name in known if name.decode() not in self.ranks]
        return names

    def _check(self, redis: redis_py.Redis, names: Iterable[str]) -> None:
        """Hint every queue of ``names`` that holds jobs: its list, or for a fair queue
        its tenants' turns. A few hundred queues are asked in one EXISTS of all their
        keys first, and only a part where some exist is asked queue by queue (pipelined):
        an idle capsule's sweep is then one command however many queues it covers."""
        k = keys.of(redis)
        listed = list(names)
        for first in range(0, len(listed), CHECK_AT_ONCE):
            part = listed[first : first + CHECK_AT_ONCE]
            both = [key for name in part for key in (k.queue(name), k.fair_part(name, "turns"))]
            if redis.exists(*both):
                self._check_each(redis, part)

    def _check_each(self, redis: redis_py.Redis, names: list[str]) -> None:
        """Hint each queue of ``names`` that holds jobs (one EXISTS per queue, pipelined)."""
        k = keys.of(redis)

        def ask(pipe: Any, name: str) -> None:
            pipe.exists(k.queue(name), k.fair_part(name, "turns"))

        for name, found in each_pipelined(redis, names, ask):
            if found:
                self.hint(name)
