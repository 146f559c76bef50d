"""Every Redis key name limitd uses, built in one place.

Core keys match Sidekiq's data model, so Ruby Sidekiq clients and tools can share the
same Redis; everything limitd adds lives under the ``limitd:`` prefix. Lua scripts never
build key names: callers pass the names built here through ``KEYS[]``.

Two layouts, the two instances of :class:`KeyLayout`. The layout travels with the
connection: ``limitd.connection.connect`` attaches it to the client it returns, and
:func:`of` answers for any client, pipeline or own connection, so code asks the
connection it is about to use (``k = keys.of(redis)``, then ``k.SCHEDULE``,
``k.queue(name)``). :data:`STANDALONE` is Sidekiq's layout; in :data:`CLUSTER`, for a
Redis Cluster, every key an atomic operation touches shares one hash slot:

- everything about one queue carries the queue's hash tag: ``queue:{mail}``, and per
  queue what are shared hashes and sets standalone (``limitd:{mail}:limits`` holds the
  one field ``mail``), so the limit fetch is one Lua call per queue, on that queue's
  shard, with the script unchanged;
- everything else (schedule, retry, dead, stats, process records, batches, unique
  locks, limiters...) carries the tag ``{limitd}``: one slot, one shard.

Sidekiq's key names cannot carry tags: in cluster mode Ruby Sidekiq cannot share the
data, and ``limitd.cluster`` refuses a Redis that holds the standalone layout.

Names that are the same in both layouts (channels, prefixes, TTLs, templates, the
per-process hashes named after an identity) stay module constants and functions.
"""

from __future__ import annotations

import string
from typing import Any

from redis.cluster import AbstractRedisCluster

QUEUE_PREFIX = "queue:"
LIMITD_PREFIX = "limitd:"  # the standalone prefix; a layout's own is KeyLayout.LIMITD_PREFIX
CLUSTER_TAG = "{limitd}"  # the slot of every key not about one queue, in cluster mode

WAKE_CHANNEL = LIMITD_PREFIX + "wake"  # pub/sub: a queue name whose jobs may be fetchable
# pub/sub: the earliest due time (epoch seconds) of jobs just added to schedule or retry
DUE_CHANNEL = LIMITD_PREFIX + "wake:due"

MINUTE_STAT_TTL = 7200  # seconds a per-minute counter is kept (the dashboard shows an hour)


def daily_stat(stat_key: str, day: str) -> str:
    """Per-day counter beside a total, e.g. ``stat:processed:2026-11-21``."""
    return f"{stat_key}:{day}"


def minute_stat(stat_key: str, minute: int) -> str:
    """Per-minute counter (``minute`` = epoch seconds // 60), e.g.
    ``limitd:stat:processed:29405123``; Sidekiq has no such key, hence the prefix."""
    return f"limitd:{stat_key}:{minute}"


def process_signals(identity: str) -> str:
    """List of signals sent to a process from afar (Sidekiq's ``<identity>-signals``):
    ``TSTP`` (quiet) or ``TERM`` (stop), read by its record's next write."""
    return f"{identity}-signals"


def process_work(identity: str) -> str:
    """Hash of what each processor thread of a process is running (Sidekiq 7's ``:work``)."""
    return f"{identity}:work"


def process_workers(identity: str) -> str:
    """The same hash under Sidekiq 6's name, which its ``Workers`` API and Busy page read."""
    return f"{identity}:workers"


def queue_of_in_progress(key: str) -> str:
    """The queue an ``in_progress`` name of the cluster layout belongs to."""
    return key.split("{", 1)[1].split("}", 1)[0]


# Tenant fairness: the default template of the enqueues sets, and its placeholders.
FAIR_TENANT_DEFAULT_KEY = LIMITD_PREFIX + "fair_tenant:enqueued:{job_class}:tenant:{fair_tenant}"
FAIR_TENANT_PLACEHOLDERS = ("queue", "job_class", "fair_tenant")

# Batches: the member of a parent's sets that stands for a child batch.
BATCH_CHILD_PREFIX = "batch:"

# Limiters (limitd.limiters). The limiter's name comes last, after a fixed part without
# a colon, so any name (colons, spaces, "*") maps to its own keys and never to another
# limiter's: names are data, never patterns.
LIMITER_PARTS = ("stats", "holders", "wake", "window", "leaky")


class KeyLayout:
    """The key names of one layout: fixed names as attributes, the rest as methods.
    There are exactly two, :data:`STANDALONE` and :data:`CLUSTER`; :func:`of` gives a
    connection's. Immutable: a process may talk to a standalone Redis and a cluster at
    once, each through its own connection and so its own layout."""

    __slots__ = (
        "BATCHES", "BATCH_INDEX_PRUNE_LOCK", "BUSY", "CAPSULES", "DEAD",
        "FAIR_QUEUES", "FAIR_TENANT_REROUTES", "FAIR_TENANT_RULES", "FAIR_TENANT_TENANTS",
        "LIMITD_PREFIX",
        "LIMITERS", "LIMITS", "LIMITS_APPLIED", "MOVING", "PAUSED", "PROCESSES",
        "PROCESS_CLEANUP_LOCK", "PROCESS_LIMITS", "QUEUES", "RATE_LIMITS", "RECOVERIES",
        "RETRY", "SCHEDULE", "STAT_FAILED", "STAT_PROCESSED", "UNIQUE_SKIPPED", "cluster", "tag",
    )  # fmt: skip

    cluster: bool
    tag: str  # what the cluster layout puts before every name not about one queue
    BATCHES: str
    BATCH_INDEX_PRUNE_LOCK: str
    BUSY: str
    CAPSULES: str
    DEAD: str
    FAIR_QUEUES: str
    FAIR_TENANT_REROUTES: str
    FAIR_TENANT_RULES: str
    FAIR_TENANT_TENANTS: str
    LIMITD_PREFIX: str
    LIMITERS: str
    LIMITS: str
    LIMITS_APPLIED: str
    MOVING: str
    PAUSED: str
    PROCESSES: str
    PROCESS_CLEANUP_LOCK: str
    PROCESS_LIMITS: str
    QUEUES: str
    RATE_LIMITS: str
    RECOVERIES: str
    RETRY: str
    SCHEDULE: str
    STAT_FAILED: str
    STAT_PROCESSED: str
    UNIQUE_SKIPPED: str

    def __init__(self, cluster: bool) -> None:
        tag = CLUSTER_TAG if cluster else ""
        prefix = tag + LIMITD_PREFIX
        names = {
            "cluster": cluster,
            "tag": tag,
            "QUEUES": tag + "queues",
            "SCHEDULE": tag + "schedule",
            "RETRY": tag + "retry",
            "DEAD": tag + "dead",
            "PROCESSES": tag + "processes",
            "PROCESS_CLEANUP_LOCK": tag + "process_cleanup",
            "STAT_PROCESSED": tag + "stat:processed",
            "STAT_FAILED": tag + "stat:failed",
            "LIMITD_PREFIX": prefix,
            # cluster mode: zset member -> claim time, of jobs on their way from
            # schedule/retry to a queue on another shard (see limitd.retry.moves)
            "MOVING": prefix + "moving",
            # Limit fetch, standalone: per-queue settings and counts are fields of a few
            # hashes, so a fetch over 200 queues passes a handful of fixed keys plus two
            # keys per queue. In cluster mode each queue has its own (the *_of methods).
            "LIMITS": prefix + "limits",  # hash: queue -> global limit ("none" = cleared)
            "PROCESS_LIMITS": prefix + "process_limits",  # hash: queue -> per-capsule limit
            # set of digests of configured limits written since Redis last lost them (or a
            # reset asked for the defaults again): the heartbeat skips those
            "LIMITS_APPLIED": prefix + "limits:applied",
            "PAUSED": prefix + "paused",  # set of paused queue names
            # hash: queue -> "fair", "fair/<tenant limit>" or "off" (limitd.fair_queues)
            "FAIR_QUEUES": prefix + "fair_queues",
            "BUSY": prefix + "busy",  # hash: queue -> jobs in progress, all capsules
            "CAPSULES": prefix + "capsules",  # set of capsule ids that may hold jobs
            # hash: sha1 of a job -> times it was returned to its queue unfinished
            # (and <sha1>:error)
            "RECOVERIES": prefix + "recoveries",
            # hash: queue -> rate limit "count/seconds" ("none" = cleared)
            "RATE_LIMITS": prefix + "rate_limits",
            # zset JSON [job, tenant] -> last seen
            "FAIR_TENANT_TENANTS": prefix + "fair_tenant:tenants",
            # hash JSON [job, tenant, queue, rule number] -> jobs rerouted
            "FAIR_TENANT_REROUTES": prefix + "fair_tenant:reroutes",
            "FAIR_TENANT_RULES": prefix + "fair_tenant:rules",  # hash job -> rules JSON
            "UNIQUE_SKIPPED": prefix + "unique:skipped",  # counter of duplicates not pushed
            # zset bid -> created_at: the index the admin API lists
            "BATCHES": prefix + "batches",
            "BATCH_INDEX_PRUNE_LOCK": prefix + "batches:prune_lock",  # one pruner an hour
            # zset name -> last use: the index the admin API lists
            "LIMITERS": prefix + "limiters",
        }
        for name, value in names.items():
            object.__setattr__(self, name, value)

    def __setattr__(self, name: str, value: Any) -> None:
        raise AttributeError(f"a KeyLayout is immutable (tried to set {name})")

    def __repr__(self) -> str:
        return "keys.CLUSTER" if self.cluster else "keys.STANDALONE"

    def __reduce__(self) -> tuple[Any, ...]:
        return (_layout, (self.cluster,))

    # Queues and the limit fetch.

    def queue(self, name: str) -> str:
        """The list holding a queue's jobs: producers LPUSH, fetchers take from the right."""
        return f"{QUEUE_PREFIX}{{{name}}}" if self.cluster else QUEUE_PREFIX + name

    def queue_name(self, key: str) -> str:
        """Inverse of :meth:`queue`."""
        name = key[len(QUEUE_PREFIX) :] if key.startswith(QUEUE_PREFIX) else key
        if self.cluster and name.startswith("{") and name.endswith("}"):
            return name[1:-1]
        return name

    def capsule_heartbeat(self, capsule_id: str) -> str:
        """Liveness key of a capsule, with a TTL: while it exists the capsule is not reaped."""
        return f"{self.LIMITD_PREFIX}capsule:{capsule_id}:heartbeat"

    def capsule_queues(self, capsule_id: str, queue_name: str = "") -> str:
        """Set of queues a capsule has taken jobs from: where its in-progress lists are.
        In cluster mode one per queue (holding at most that queue), in the queue's slot."""
        if self.cluster:
            return f"limitd:{{{queue_name}}}:capsule:{capsule_id}:queues"
        return f"{LIMITD_PREFIX}capsule:{capsule_id}:queues"

    def in_progress(self, capsule_id: str, queue_name: str) -> str:
        """List of jobs of one queue that one capsule is running (newest at the left)."""
        if self.cluster:
            return f"limitd:{{{queue_name}}}:capsule:{capsule_id}:inprogress"
        return f"{LIMITD_PREFIX}capsule:{capsule_id}:inprogress:{queue_name}"

    def ready_index(self, capsule_id: str) -> str:
        """Sorted set of the queues a capsule's limit fetch looks at (standalone only):
        those that may have a job it can take, scored by their place in its order."""
        return f"{self.LIMITD_PREFIX}capsule:{capsule_id}:ready"

    def rate_wait(self, capsule_id: str) -> str:
        """Sorted set of queues out of a capsule's ready index until their rate limit
        allows a job: ``<rank>:<name>`` scored by that time (Redis clock, microseconds)."""
        return f"{self.LIMITD_PREFIX}capsule:{capsule_id}:rate_wait"

    def rate_state(self, queue_name: str) -> str:
        """A rate-limited queue's schedule: the earliest time (Redis clock, microseconds)
        its next job may be fetched. Expires once that time has passed."""
        if self.cluster:
            return f"limitd:{{{queue_name}}}:rate"
        return f"{LIMITD_PREFIX}rate:{queue_name}"

    # The per-queue state the limit fetch reads and writes: standalone, one hash or set
    # for all queues (the attributes above); in cluster mode, one per queue in its slot.

    def limits_of(self, queue_name: str) -> str:
        return self._per_queue(self.LIMITS, "limits", queue_name)

    def process_limits_of(self, queue_name: str) -> str:
        return self._per_queue(self.PROCESS_LIMITS, "process_limits", queue_name)

    def paused_of(self, queue_name: str) -> str:
        return self._per_queue(self.PAUSED, "paused", queue_name)

    def busy_of(self, queue_name: str) -> str:
        return self._per_queue(self.BUSY, "busy", queue_name)

    def capsules_of(self, queue_name: str) -> str:
        return self._per_queue(self.CAPSULES, "capsules", queue_name)

    def fair_queues_of(self, queue_name: str) -> str:
        return self._per_queue(self.FAIR_QUEUES, "fair_queues", queue_name)

    def fair_queue(self, queue_name: str) -> str:
        """The base of a fair queue's keys: ``<base>:turns``, ``:backlog``, ``:state``,
        ``:weights``, ``:head`` and one line per tenant, ``<base>:t:<tenant>``
        (limitd/fetch/fair_lib.lua, which builds them from the base alike)."""
        return self.fair_template % queue_name

    def fair_part(self, queue_name: str, part: str) -> str:
        """One of a fair queue's keys: ``part`` is ``turns``, ``backlog``, ``state``,
        ``weights`` or ``head`` (see :meth:`fair_queue`)."""
        return f"{self.fair_queue(queue_name)}:{part}"

    def fair_line(self, queue_name: str, tenant: str) -> str:
        """A tenant's line in a fair queue (see :meth:`fair_queue`)."""
        return f"{self.fair_queue(queue_name)}:t:{tenant}"

    @property
    def fair_template(self) -> str:
        """:meth:`fair_queue` with ``%s`` for the queue name: the fetch script builds a
        fair queue's keys from it (which queues are fair is read inside the script)."""
        return "limitd:{%s}:fair" if self.cluster else LIMITD_PREFIX + "fair:%s"

    def rate_limits_of(self, queue_name: str) -> str:
        return self._per_queue(self.RATE_LIMITS, "rate_limits", queue_name)

    def recoveries_of(self, queue_name: str) -> str:
        return self._per_queue(self.RECOVERIES, "recoveries", queue_name)

    def _per_queue(self, shared: str, part: str, queue_name: str) -> str:
        return f"limitd:{{{queue_name}}}:{part}" if self.cluster else shared

    # Processes, tenants, unique jobs, batches, limiters.

    def process_identity(self, identity: str) -> str:
        """A process's identity as its record's key (and the prefix of its other keys):
        in cluster mode in the ``{limitd}`` slot, with the ``processes`` set."""
        return self.tag + identity

    def fair_tenant_enqueues(
        self, template: str, *, queue: str, job_class: str, tenant: str
    ) -> str:
        """Sorted set of one tenant's recent enqueues of one job (member jid, score time).
        The template is configurable; its placeholders are queue, job_class, fair_tenant.
        In cluster mode the name is put in the ``{limitd}`` slot, with the other
        fair-tenant keys its script touches."""
        return self.tag + template.format(queue=queue, job_class=job_class, fair_tenant=tenant)

    def unique_lock(self, job_class: str, queue_name: str, args_digest: str) -> str:
        """The lock a unique job holds: one per job class, queue and arguments (hashed)."""
        return f"{self.LIMITD_PREFIX}unique:{job_class}:{queue_name}:{args_digest}"

    # A batch is four keys; the Lua scripts find a parent's keys in the child's hash
    # (written there from these methods), so they still never build a name.

    def batch(self, bid: str) -> str:
        """Hash: description, counters, timestamps, callbacks, parent."""
        return f"{self.LIMITD_PREFIX}batch:{bid}"

    def batch_pending(self, bid: str) -> str:
        """Set of jids (and child batches) that have not succeeded yet."""
        return f"{self.LIMITD_PREFIX}batch:{bid}:pending"

    def batch_unfinished(self, bid: str) -> str:
        """Set of jids (and child batches) that have neither succeeded nor failed yet."""
        return f"{self.LIMITD_PREFIX}batch:{bid}:unfinished"

    def batch_failures(self, bid: str) -> str:
        """Hash jid -> error of the batch's jobs whose last run failed."""
        return f"{self.LIMITD_PREFIX}batch:{bid}:failures"

    def batch_keys(self, bid: str) -> list[str]:
        """A batch's keys in the order every batch script takes them."""
        return [
            self.batch(bid),
            self.batch_pending(bid),
            self.batch_unfinished(bid),
            self.batch_failures(bid),
        ]

    def limiter(self, part: str, name: str) -> str:
        """One key of the limiter ``name``: ``stats`` (hash: definition and counters),
        ``holders`` (zset token -> lock expiry), ``wake`` (list released slots are
        announced on), ``window`` (zset of call times) or ``leaky`` (hash: level and
        last update)."""
        if part not in LIMITER_PARTS:
            raise ValueError(f"unknown limiter key part {part!r}")
        return f"{self.LIMITD_PREFIX}limiter:{part}:{name}"

    def limiter_bucket(self, name: str, interval_start: str) -> str:
        """The counter of one calendar interval of a bucket limiter (it expires with it)."""
        return f"{self.LIMITD_PREFIX}limiter:bucket:{interval_start}:{name}"

    def iteration(self, jid: str) -> str:
        """Hash of an iterable job's progress: its cursor, items done, runs, state
        (``limitd.iteration``)."""
        return f"{self.LIMITD_PREFIX}iteration:{jid}"

    def cancel_flag(self, jid: str) -> str:
        """Set while a job is asked to stop (``limitd cancel``): an iterable job stops at
        its next item, a plain one may look (``limitd.cancelled()``)."""
        return f"{self.LIMITD_PREFIX}cancel:{jid}"

    def job_history(self, minute: int) -> str:
        """The hash of one minute's job history (``minute`` = epoch seconds // 60): per
        job class its processed, failed, milliseconds and duration buckets."""
        return f"{self.LIMITD_PREFIX}job_history:{minute}"


STANDALONE = KeyLayout(cluster=False)
CLUSTER = KeyLayout(cluster=True)


def _layout(cluster: bool) -> KeyLayout:
    return CLUSTER if cluster else STANDALONE


# The attribute a client (or pipeline, or own connection) carries its layout in.
_ATTRIBUTE = "limitd_keys"


def attach(conn: Any, layout: KeyLayout) -> None:
    """Record ``layout`` as the key layout of ``conn`` (``connect`` and the wrappers
    of the connection layer do this)."""
    setattr(conn, _ATTRIBUTE, layout)


def of(conn: Any) -> KeyLayout:
    """The key layout of ``conn``: a sync or asyncio client, cluster client, pipeline or
    own connection. What ``connect`` attached, else by kind: a Redis Cluster client
    (or its pipeline) has the cluster layout, anything else (a ``redis.Redis(...)`` built
    by hand) the standalone one."""
    layout: KeyLayout | None = getattr(conn, _ATTRIBUTE, None)
    if layout is not None:
        return layout
    return CLUSTER if isinstance(conn, AbstractRedisCluster) else STANDALONE


def fair_tenant_template_problem(template: str) -> str | None:
    """Why ``template`` cannot name the enqueues sets, or None when it can. It must hold
    ``{fair_tenant}`` (without it every tenant shares one count) and no placeholder but
    those of :meth:`KeyLayout.fair_tenant_enqueues` (any other fails at every enqueue)."""
    try:
        parts = list(string.Formatter().parse(template))
    except ValueError as exc:  # a lone "{" or "}"
        return f"{exc} in {template!r} (write {{{{ and }}}} for literal braces)"
    allowed = ", ".join("{" + name + "}" for name in FAIR_TENANT_PLACEHOLDERS)
    names = set()
    for _, name, spec, conversion in parts:
        if name is None:  # literal text only
            continue
        if name not in FAIR_TENANT_PLACEHOLDERS or spec or conversion:
            shown = name + (f"!{conversion}" if conversion else "") + (f":{spec}" if spec else "")
            return f"placeholder {{{shown}}} in {template!r} is not one of {allowed}"
        names.add(name)
    if "fair_tenant" not in names:
        return f"{template!r} must contain {{fair_tenant}}: without it all tenants share one count"
    return None
