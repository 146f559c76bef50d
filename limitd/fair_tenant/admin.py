"""Tenant fairness as an operator sees it: which tenants enqueue the most, which rule
routes their jobs now, and how many of their jobs were rerouted (what ``limitd tenants``
prints)::

    from limitd.api import top_tenants

    for status in top_tenants(limit=5):
        rule = status.rule_now
        print(status.tenant, status.job, status.enqueues, rule and rule.queue)

Read from what the ``fair_tenant`` client middleware writes (``fair_tenant.lua`` lists
it): the ``limitd:fair_tenant:tenants`` index (JSON ``[job, tenant]`` -> last enqueue
time), the ``limitd:fair_tenant:rules`` hash (each job's rules, as last enqueued), each
tenant's sorted set of enqueues, and the ``limitd:fair_tenant:reroutes`` counters (JSON
``[job, tenant, queue, rule number]`` -> jobs that rule rerouted there since the counter
was created; they are never reset). Three round trips however many tenants: the rules,
the tenants seen within the window, then every count and the reroutes in one pipeline.

Limitation: the enqueues sets are named by the settings' ``enqueues_key`` template. When
it uses ``{queue}``, the middleware filled in the queue each job was enqueued to, before
rerouting; this module can only use the job's declared queue (from the registry when the
job is defined in this process, e.g. ``limitd tenants -r app.jobs``, else ``default``),
so enqueues made with ``.set(queue=...)`` are not counted here. Likewise the rules shown
are the ones the job's last enqueue carried.
"""

from __future__ import annotations

import dataclasses
import json
from typing import Any, cast

import redis as redis_py

from limitd import clock, keys
from limitd.client import connection_or_default, default_client
from limitd.connection import decode_name
from limitd.fair_tenant.middleware import FairTenant, FairTenantSettings, Rule
from limitd.payload import DEFAULT_QUEUE
from limitd.registry import registry

Reroutes = dict[tuple[str, str, str, int], int]


@dataclasses.dataclass(frozen=True)
class RuleWindow:
    """One rule of a job, with the tenant's enqueues in its window (the last ``per``
    seconds) now."""

    queue: str
    threshold: int
    per: float
    enqueues: int

    @property
    def routes_next(self) -> bool:
        """Whether an enqueue made now would match this rule. A job counts toward its
        own threshold, so the rule matches once its window already holds ``threshold``
        enqueues (the next one is the ``threshold + 1``-th)."""
        return self.enqueues >= self.threshold


@dataclasses.dataclass(frozen=True)
class TenantStatus:
    """One tenant of one job. ``windows``: each rule of the job, in the job's order, with
    the tenant's enqueues in its window. ``rerouted``: queue -> jobs rerouted there;
    ``rerouted_by_rule``: rule number (1-based, the job's order) -> jobs it rerouted."""

    job: str
    tenant: str
    last_enqueued_at: float
    windows: tuple[RuleWindow, ...]
    rerouted: dict[str, int]
    rerouted_by_rule: dict[int, int] = dataclasses.field(default_factory=dict)

    @property
    def rule_now(self) -> RuleWindow | None:
        """The rule an enqueue made now would be routed by: the last one that matches
        (as the middleware decides), or None when it would keep its queue."""
        matching = [window for window in self.windows if window.routes_next]
        return matching[-1] if matching else None

    @property
    def enqueues(self) -> int:
        """Enqueues in the job's longest rule window: what tenants are ranked by."""
        longest = max(self.windows, key=lambda window: window.per, default=None)
        return 0 if longest is None else longest.enqueues

    def as_dict(self) -> dict[str, Any]:
        """The tenant as plain data, for JSON output; ``rule_now`` is the rule's queue."""
        rule = self.rule_now
        return {
            "job": self.job,
            "tenant": self.tenant,
            "last_enqueued_at": self.last_enqueued_at,
            "enqueues": [dataclasses.asdict(window) for window in self.windows],
            "rule_now": None if rule is None else rule.queue,
            "rerouted": dict(self.rerouted),
            "rerouted_by_rule": {str(rule): n for rule, n in self.rerouted_by_rule.items()},
        }


def top_tenants(
    redis: redis_py.Redis | None = None,
    limit: int | None = 20,
    window: float | None = None,
    *,
    settings: FairTenantSettings | None = None,
) -> list[TenantStatus]:
    """The tenants that enqueued in the last ``window`` seconds (default: the longest
    window the middleware keeps, so every tenant with an enqueue still counted), most
    enqueues in the longest rule window first, then the most recent; at most ``limit``
    (None: all). ``settings`` name the enqueues sets (default: those of the default
    client's ``FairTenant``, else the environment's)."""
    if limit is not None and limit < 1:
        raise ValueError(f"limit must be at least 1 (None: no limit), got {limit}")
    conn = connection_or_default(redis)
    settings = _client_settings() if settings is None else settings
    now = clock.now()
    rules = job_rules(conn)
    if window is None:
        window = max([settings.max_throttling_window, *_rule_windows(rules)])
    statuses = _statuses(conn, settings, now, rules, _tracked(conn, since=now - window))
    statuses.sort(key=lambda s: (-s.enqueues, -s.last_enqueued_at, s.job, s.tenant))
    return statuses if limit is None else statuses[:limit]


def reroutes(redis: redis_py.Redis | None = None) -> Reroutes:
    """Every reroute counter: (job, tenant, queue, rule number) -> jobs that rule
    rerouted to that queue."""
    conn = connection_or_default(redis)
    return _reroutes(conn.hgetall(keys.of(conn).FAIR_TENANT_REROUTES))


def job_rules(redis: redis_py.Redis | None = None) -> dict[str, list[Rule]]:
    """Each job's rules, as its last enqueue carried them (jobs never enqueued with a
    tenant are not there)."""
    conn = connection_or_default(redis)
    stored = conn.hgetall(keys.of(conn).FAIR_TENANT_RULES)
    return {decode_name(job): _rules(raw) for job, raw in stored.items()}


def _tracked(conn: redis_py.Redis, since: float) -> list[tuple[str, str, float]]:
    """(job, tenant, last enqueue) of every tenant that enqueued since ``since``."""
    k = keys.of(conn)
    seen = cast(
        "list[tuple[bytes, float]]",
        conn.zrangebyscore(k.FAIR_TENANT_TENANTS, since, "+inf", withscores=True),
    )
    tracked = []
    for raw, score in seen:
        member = _member(raw, 2)
        if member is not None:
            tracked.append((member[0], member[1], float(score)))
    return tracked


def _statuses(
    conn: redis_py.Redis,
    settings: FairTenantSettings,
    now: float,
    rules: dict[str, list[Rule]],
    tracked: list[tuple[str, str, float]],
) -> list[TenantStatus]:
    """Counts of every tracked tenant in each of its job's rule windows, and the
    reroutes, in one pipeline."""
    k = keys.of(conn)
    pipe = conn.pipeline(transaction=False)
    for job, tenant, _ in tracked:
        key = _enqueues_key(k, settings, job, tenant)
        for rule in rules.get(job, []):
            pipe.zcount(key, f"({now - rule.per}", "+inf")  # the middleware's window
    pipe.hgetall(k.FAIR_TENANT_REROUTES)
    *counts, raw_reroutes = pipe.execute()
    rerouted: dict[tuple[str, str], dict[str, int]] = {}
    by_rule: dict[tuple[str, str], dict[int, int]] = {}
    for (job, tenant, queue, number), count in _reroutes(raw_reroutes).items():
        per_queue = rerouted.setdefault((job, tenant), {})
        per_queue[queue] = per_queue.get(queue, 0) + count
        by_rule.setdefault((job, tenant), {})[number] = count
    remaining = iter(counts)
    return [
        TenantStatus(
            job=job,
            tenant=tenant,
            last_enqueued_at=last,
            windows=tuple(
                RuleWindow(rule.queue, rule.threshold, rule.per, int(next(remaining)))
                for rule in rules.get(job, [])
            ),
            rerouted=dict(sorted(rerouted.get((job, tenant), {}).items())),
            rerouted_by_rule=dict(sorted(by_rule.get((job, tenant), {}).items())),
        )
        for job, tenant, last in tracked
    ]


def _enqueues_key(
    layout: keys.KeyLayout, settings: FairTenantSettings, job: str, tenant: str
) -> str:
    spec = registry.resolve(job)
    queue = spec.queue if spec is not None else DEFAULT_QUEUE  # see the module's limitation
    return layout.fair_tenant_enqueues(
        settings.enqueues_key, queue=queue, job_class=job, tenant=tenant
    )


def _client_settings() -> FairTenantSettings:
    for middleware in default_client().middleware:
        if isinstance(middleware, FairTenant):
            return middleware.settings
    return FairTenantSettings.from_env()


def _rule_windows(rules: dict[str, list[Rule]]) -> list[float]:
    return [rule.per for listed in rules.values() for rule in listed]


def _rules(raw: bytes | str) -> list[Rule]:
    """A job's stored rules; an unreadable entry (not written by limitd) as none."""
    try:
        entries = json.loads(decode_name(raw))
        return [Rule(str(r["queue"]), int(r["threshold"]), float(r["per"])) for r in entries]
    except (ValueError, TypeError, KeyError):
        return []


def _reroutes(raw: dict[Any, Any]) -> Reroutes:
    counts: Reroutes = {}
    for field, count in raw.items():
        member = _member(field, 4)
        if member is not None and member[3].isdigit():
            job, tenant, queue, rule = member
            counts[(job, tenant, queue, int(rule))] = int(count)
    return counts


def _member(raw: bytes | str, size: int) -> tuple[str, ...] | None:
    """A JSON list of ``size`` strings, as the script encodes its members and fields;
    None for anything else."""
    try:
        value = json.loads(decode_name(raw))
    except ValueError:
        return None
    if not isinstance(value, list) or len(value) != size:
        return None
    return tuple(str(item) for item in value)


UNITS = ((86_400, "d"), (3_600, "h"), (60, "m"))


def window_label(seconds: float) -> str:
    """A rule's window as people write it: 3600 -> ``1h``, 90 -> ``90s``."""
    for size, unit in UNITS:
        if seconds >= size and seconds % size == 0:
            return f"{int(seconds // size)}{unit}"
    return f"{seconds:g}s"
