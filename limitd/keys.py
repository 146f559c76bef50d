"""Every Redis key name limitd uses, built in one place.

Core keys match Sidekiq's data model, so Ruby Sidekiq clients and tools can share the
same Redis; everything limitd adds lives under the ``limitd:`` prefix. Lua scripts never
build key names: callers pass the names built here through ``KEYS[]``.

Two layouts. The standalone one above, and the cluster layout (``use_cluster_layout``,
set by ``limitd.connection.connect`` for a Redis Cluster), in which every key an atomic
operation touches shares one hash slot:

- everything about one queue carries the queue's hash tag: ``queue:{mail}``, and per
  queue what are shared hashes and sets standalone (``limitd:{mail}:limits`` holds the
  one field ``mail``), so the limit fetch is one Lua call per queue, on that queue's
  shard, with the script unchanged;
- everything else (schedule, retry, dead, stats, process records, batches, unique
  locks, limiters...) carries the tag ``{limitd}``: one slot, one shard.

Sidekiq's key names cannot carry tags: in cluster mode Ruby Sidekiq cannot share the
data, and ``limitd.cluster`` refuses a Redis that holds the standalone layout.
"""

from __future__ import annotations

import string

QUEUES = "queues"
SCHEDULE = "schedule"
RETRY = "retry"
DEAD = "dead"
PROCESSES = "processes"
PROCESS_CLEANUP_LOCK = "process_cleanup"
STAT_PROCESSED = "stat:processed"
STAT_FAILED = "stat:failed"

QUEUE_PREFIX = "queue:"
LIMITD_PREFIX = "limitd:"

CLUSTER_TAG = "{limitd}"  # the slot of every key not about one queue, in cluster mode
_cluster = False


def queue(name: str) -> str:
    """The list holding a queue's jobs: producers LPUSH, fetchers take from the right."""
    return f"{QUEUE_PREFIX}{{{name}}}" if _cluster else QUEUE_PREFIX + name


def queue_name(key: str) -> str:
    """Inverse of :func:`queue`."""
    name = key[len(QUEUE_PREFIX) :] if key.startswith(QUEUE_PREFIX) else key
    if _cluster and name.startswith("{") and name.endswith("}"):
        return name[1:-1]
    return name


def daily_stat(stat_key: str, day: str) -> str:
    """Per-day counter beside a total, e.g. ``stat:processed:2026-11-21``."""
    return f"{stat_key}:{day}"


MINUTE_STAT_TTL = 7200  # seconds a per-minute counter is kept (the dashboard shows an hour)


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


# cluster mode: zset member -> claim time, of jobs on their way from schedule/retry to a
# queue on another shard (see limitd.retry.moves)
MOVING = LIMITD_PREFIX + "moving"

# Limit fetch (everything under the limitd: prefix). Per-queue settings and counts are
# fields of a few hashes, so a fetch over 200 queues passes a handful of fixed keys plus
# two keys per queue (its list and this capsule's in-progress list).
LIMITS = LIMITD_PREFIX + "limits"  # hash: queue -> global limit ("none" = cleared)
PROCESS_LIMITS = LIMITD_PREFIX + "process_limits"  # hash: queue -> per-capsule limit
PAUSED = LIMITD_PREFIX + "paused"  # set of paused queue names
BUSY = LIMITD_PREFIX + "busy"  # hash: queue -> jobs in progress, all capsules
CAPSULES = LIMITD_PREFIX + "capsules"  # set of capsule ids that may hold jobs
WAKE_CHANNEL = LIMITD_PREFIX + "wake"  # pub/sub: a queue name whose jobs may be fetchable
# pub/sub: the earliest due time (epoch seconds) of jobs just added to schedule or retry
DUE_CHANNEL = LIMITD_PREFIX + "wake:due"
# hash: sha1 of a job -> times it was returned to its queue unfinished (and <sha1>:error)
RECOVERIES = LIMITD_PREFIX + "recoveries"
# hash: queue -> rate limit "count/seconds" ("none" = cleared), checked by the limit fetch
RATE_LIMITS = LIMITD_PREFIX + "rate_limits"


def capsule_heartbeat(capsule_id: str) -> str:
    """Liveness key of a capsule, with a TTL: while it exists the capsule is not reaped."""
    return f"{LIMITD_PREFIX}capsule:{capsule_id}:heartbeat"


def capsule_queues(capsule_id: str, queue_name: str = "") -> str:
    """Set of queues a capsule has taken jobs from: where its in-progress lists are. In
    cluster mode one per queue (holding at most that queue), in the queue's slot."""
    if _cluster:
        return f"limitd:{{{queue_name}}}:capsule:{capsule_id}:queues"
    return f"{LIMITD_PREFIX}capsule:{capsule_id}:queues"


def in_progress(capsule_id: str, queue_name: str) -> str:
    """List of jobs of one queue that one capsule is running (newest at the left)."""
    if _cluster:
        return f"limitd:{{{queue_name}}}:capsule:{capsule_id}:inprogress"
    return f"{LIMITD_PREFIX}capsule:{capsule_id}:inprogress:{queue_name}"


def queue_of_in_progress(key: str) -> str:
    """The queue an :func:`in_progress` name (cluster layout) belongs to."""
    return key.split("{", 1)[1].split("}", 1)[0]


def rate_state(queue_name: str) -> str:
    """A rate-limited queue's schedule: the earliest time (Redis clock, microseconds) its
    next job may be fetched. Expires once that time has passed."""
    if _cluster:
        return f"limitd:{{{queue_name}}}:rate"
    return f"{LIMITD_PREFIX}rate:{queue_name}"


# The per-queue state the limit fetch reads and writes. Standalone, one hash or set for
# all queues (the constants above); in cluster mode, one per queue in the queue's slot.
def limits_of(queue_name: str) -> str:
    return _per_queue(LIMITS, "limits", queue_name)


def process_limits_of(queue_name: str) -> str:
    return _per_queue(PROCESS_LIMITS, "process_limits", queue_name)


def paused_of(queue_name: str) -> str:
    return _per_queue(PAUSED, "paused", queue_name)


def busy_of(queue_name: str) -> str:
    return _per_queue(BUSY, "busy", queue_name)


def capsules_of(queue_name: str) -> str:
    return _per_queue(CAPSULES, "capsules", queue_name)


def rate_limits_of(queue_name: str) -> str:
    return _per_queue(RATE_LIMITS, "rate_limits", queue_name)


def recoveries_of(queue_name: str) -> str:
    return _per_queue(RECOVERIES, "recoveries", queue_name)


def _per_queue(shared: str, part: str, queue_name: str) -> str:
    return f"limitd:{{{queue_name}}}:{part}" if _cluster else shared


def is_cluster_layout() -> bool:
    return _cluster


# Names rebound by use_cluster_layout: the standalone value of each, kept here. (The
# pub/sub channels keep their names: a channel has no slot.)
_GLOBAL_NAMES = (
    "QUEUES", "SCHEDULE", "RETRY", "DEAD", "PROCESSES", "PROCESS_CLEANUP_LOCK",
    "STAT_PROCESSED", "STAT_FAILED", "LIMITD_PREFIX", "LIMITS", "PROCESS_LIMITS", "PAUSED",
    "BUSY", "CAPSULES", "RECOVERIES", "RATE_LIMITS",
    "FAIR_TENANT_TENANTS", "FAIR_TENANT_REROUTES", "MOVING",
    "FAIR_TENANT_RULES", "UNIQUE_SKIPPED", "BATCHES", "BATCH_INDEX_PRUNE_LOCK", "LIMITERS",
)  # fmt: skip


def use_cluster_layout(on: bool) -> None:
    """Switch every name to the cluster layout (or back). A process talks to one Redis:
    ``limitd.connection.connect`` calls this for the kind it connects to, before anything
    builds a key. The per-queue hashes (``LIMITS``...) are not used in cluster mode:
    their ``*_of(queue)`` functions name each queue's own."""
    global _cluster
    if on == _cluster:
        return
    _cluster = on
    names = globals()
    for name in _GLOBAL_NAMES:
        standalone = _STANDALONE[name]
        names[name] = CLUSTER_TAG + standalone if on else standalone


# Tenant fairness.
FAIR_TENANT_DEFAULT_KEY = LIMITD_PREFIX + "fair_tenant:enqueued:{job_class}:tenant:{fair_tenant}"
FAIR_TENANT_TENANTS = LIMITD_PREFIX + "fair_tenant:tenants"  # zset JSON [job, tenant] -> last seen
# hash JSON [job, tenant, queue, rule number] -> jobs rerouted
FAIR_TENANT_REROUTES = LIMITD_PREFIX + "fair_tenant:reroutes"
FAIR_TENANT_RULES = LIMITD_PREFIX + "fair_tenant:rules"  # hash job -> rules JSON
FAIR_TENANT_PLACEHOLDERS = ("queue", "job_class", "fair_tenant")


def fair_tenant_enqueues(template: str, *, queue: str, job_class: str, tenant: str) -> str:
    """Sorted set of one tenant's recent enqueues of one job (member jid, score time).
    The template is configurable; its placeholders are queue, job_class, fair_tenant.
    In cluster mode the name is put in the ``{limitd}`` slot, with the other
    fair-tenant keys its script touches."""
    name = template.format(queue=queue, job_class=job_class, fair_tenant=tenant)
    return CLUSTER_TAG + name if _cluster else name


def fair_tenant_template_problem(template: str) -> str | None:
    """Why ``template`` cannot name the enqueues sets, or None when it can. It must hold
    ``{fair_tenant}`` (without it every tenant shares one count) and no placeholder but
    those of :func:`fair_tenant_enqueues` (any other fails at every enqueue)."""
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


# Unique jobs.
UNIQUE_SKIPPED = LIMITD_PREFIX + "unique:skipped"  # counter of duplicates not pushed


def unique_lock(job_class: str, queue_name: str, args_digest: str) -> str:
    """The lock a unique job holds: one per job class, queue and arguments (hashed)."""
    return f"{LIMITD_PREFIX}unique:{job_class}:{queue_name}:{args_digest}"


# Batches. A batch is four keys; the Lua scripts find a parent's keys in the child's
# hash (written there from these functions), so they still never build a name.
BATCHES = LIMITD_PREFIX + "batches"  # zset bid -> created_at: the index the admin API lists
BATCH_INDEX_PRUNE_LOCK = LIMITD_PREFIX + "batches:prune_lock"  # one pruner an hour
BATCH_CHILD_PREFIX = "batch:"  # member of a parent's sets that stands for a child batch


def batch(bid: str) -> str:
    """Hash: description, counters, timestamps, callbacks, parent."""
    return f"{LIMITD_PREFIX}batch:{bid}"


def batch_pending(bid: str) -> str:
    """Set of jids (and child batches) that have not succeeded yet."""
    return f"{LIMITD_PREFIX}batch:{bid}:pending"


def batch_unfinished(bid: str) -> str:
    """Set of jids (and child batches) that have neither succeeded nor failed yet."""
    return f"{LIMITD_PREFIX}batch:{bid}:unfinished"


def batch_failures(bid: str) -> str:
    """Hash jid -> error of the batch's jobs whose last run failed."""
    return f"{LIMITD_PREFIX}batch:{bid}:failures"


def batch_keys(bid: str) -> list[str]:
    """A batch's keys in the order every batch script takes them."""
    return [batch(bid), batch_pending(bid), batch_unfinished(bid), batch_failures(bid)]


# Limiters (limitd.limiters). The limiter's name comes last, after a fixed part without
# a colon, so any name (colons, spaces, "*") maps to its own keys and never to another
# limiter's: names are data, never patterns.
LIMITERS = LIMITD_PREFIX + "limiters"  # zset name -> last use: the index the admin API lists
LIMITER_PARTS = ("stats", "holders", "wake", "window", "leaky")


def limiter(part: str, name: str) -> str:
    """One key of the limiter ``name``: ``stats`` (hash: definition and counters),
    ``holders`` (zset token -> lock expiry), ``wake`` (list released slots are announced
    on), ``window`` (zset of call times) or ``leaky`` (hash: level and last update)."""
    if part not in LIMITER_PARTS:
        raise ValueError(f"unknown limiter key part {part!r}")
    return f"{LIMITD_PREFIX}limiter:{part}:{name}"


def limiter_bucket(name: str, interval_start: int) -> str:
    """The counter of one calendar interval of a bucket limiter (it expires with it)."""
    return f"{LIMITD_PREFIX}limiter:bucket:{interval_start}:{name}"


_STANDALONE = {name: globals()[name] for name in _GLOBAL_NAMES}
