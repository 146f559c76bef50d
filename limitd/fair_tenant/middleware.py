"""Tenant fairness: reroute a greedy tenant's jobs to slower, weighted queues.

A job declares rules with the ``fair_tenant_queues`` option::

    @limitd.job(queue="default", tenant=lambda account_id, *_: f"account-{account_id}",
                fair_tenant_queues=[{"queue": "throttled_2x", "threshold": 100, "per": 3600},
                                    {"queue": "throttled_4x", "threshold": 10, "per": 60}])
    def sync_account(account_id, since): ...

Each enqueue of a tenant's job is counted in a sorted set (member jid, score time). A
rule matches when the tenant's enqueues of that job in the last ``per`` seconds, *the
one being enqueued included*, exceed ``threshold``: with ``threshold: 100`` the first 100
of a window keep their queue and the 101st is rerouted. All rules are checked and the
last matching one decides, so order them from least to most restrictive. Capsules then
fetch the throttled queues with lower weights: the greedy tenant keeps its throughput
when others are idle, and stops crowding them out when they are not.

The tenant is, in order: ``.set(fair_tenant=...)`` at enqueue time, a ``fair_tenant``
value an earlier middleware put in the payload, or the job's ``tenant`` hook called with
the job's arguments. No tenant: the job is not tracked.

Scheduled jobs are counted and routed when they are scheduled (the time of the request
is what a tenant controls), so scheduling in bulk does not dodge the rules. Retries keep
the queue their first run had: a throttled job retries in its throttled queue.
"""

from __future__ import annotations

import contextvars
import json
import logging
import math
import os
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, cast

from limitd import clock, keys, options
from limitd.connection import LuaScript, ScriptCall
from limitd.middleware.base import ClientMiddleware
from limitd.payload import Payload
from limitd.spec import JobSpec

FAIR_TENANT = LuaScript(__package__ or "limitd.fair_tenant", "fair_tenant.lua")
ENV_PREFIX = "LIMITD_FAIR_TENANT_"
DEFAULT_MAX_WINDOW = 86_400


@dataclass(frozen=True)
class Rule:
    queue: str
    threshold: int
    per: float


def _rules_option(value: Any) -> list[dict[str, Any]]:
    """Validate ``fair_tenant_queues`` at definition time; stored as plain dicts so the
    payload stays JSON."""
    if not isinstance(value, (list, tuple)) or not value:
        raise ValueError("expected a non-empty list of {queue, threshold, per} rules")
    return [_rule(entry, index) for index, entry in enumerate(value)]


def _rule(entry: Any, index: int) -> dict[str, Any]:
    if not isinstance(entry, Mapping) or set(entry) != {"queue", "threshold", "per"}:
        raise ValueError(f"rule {index}: expected exactly the keys queue, threshold, per")
    queue = options.non_empty_str(entry["queue"])
    threshold = entry["threshold"]
    if isinstance(threshold, bool) or not isinstance(threshold, int) or threshold < 0:
        raise ValueError(f"rule {index}: threshold must be an integer >= 0")
    return {"queue": queue, "threshold": threshold, "per": options.seconds(entry["per"])}


options.declare("fair_tenant_queues", _rules_option, owner="limitd.fair_tenant")
options.declare("fair_tenant", options.tenant_id, owner="limitd.fair_tenant")
options.declare_hook("tenant", method="fair_tenant", owner="limitd.fair_tenant")

# Called with the job's arguments; returns the tenant (None: no tenant).
TenantHook = Callable[..., Any]


def tenant_hook(spec: JobSpec | None) -> TenantHook | None:
    """The job's ``tenant=`` hook (a class job's ``fair_tenant`` method), if it has one."""
    return None if spec is None else spec.hooks.get("tenant")


@dataclass(frozen=True)
class FairTenantSettings:
    """``max_throttling_window``: the longest window kept (entries older are trimmed,
    and the key expires after it); ``enqueues_key``: the sorted set's name, with the
    placeholders ``{queue}``, ``{job_class}``, ``{fair_tenant}``; ``logger``: where
    reroutes are logged (at debug level)."""

    max_throttling_window: float = DEFAULT_MAX_WINDOW
    enqueues_key: str = keys.FAIR_TENANT_DEFAULT_KEY
    logger: str = "limitd.fair_tenant"

    def __post_init__(self) -> None:
        """Checked here too, not only by the YAML loader: a client built from the
        environment alone must fail at start, not at every enqueue."""
        window = self.max_throttling_window
        if not (isinstance(window, (int, float)) and math.isfinite(window) and window > 0):
            raise ValueError(
                f"fair_tenant max_throttling_window: expected a number of "
                f"seconds > 0, got {window!r}"
            )
        problem = keys.fair_tenant_template_problem(self.enqueues_key)
        if problem:
            raise ValueError(f"fair_tenant enqueues_key: {problem}")

    @classmethod
    def from_env(
        cls, base: FairTenantSettings | None = None, env: Mapping[str, str] | None = None
    ) -> FairTenantSettings:
        """``LIMITD_FAIR_TENANT_<KEY>`` variables, over ``base`` (the YAML section)."""
        env = os.environ if env is None else env
        settings = base or cls()
        window = env.get(ENV_PREFIX + "MAX_THROTTLING_WINDOW")
        try:
            seconds = float(window) if window else settings.max_throttling_window
        except ValueError:
            raise ValueError(
                f"{ENV_PREFIX}MAX_THROTTLING_WINDOW: expected a number of "
                f"seconds > 0, got {window!r}"
            ) from None
        return cls(
            max_throttling_window=seconds,
            enqueues_key=env.get(ENV_PREFIX + "ENQUEUES_KEY") or settings.enqueues_key,
            logger=env.get(ENV_PREFIX + "LOGGER") or settings.logger,
        )


class FairTenant(ClientMiddleware):
    """The client middleware. Halts nothing; only chooses the queue."""

    def __init__(
        self,
        settings: FairTenantSettings | None = None,
        layout: keys.KeyLayout = keys.STANDALONE,
    ) -> None:
        self.settings = settings or FairTenantSettings.from_env()
        self.keys = layout  # the chain gives each connection's its own (for_layout)
        self.log = logging.getLogger(self.settings.logger)
        # The queues decided for a bulk chunk, by jid: a context variable, so threads
        # and the tasks of one event loop each keep their own chunk's.
        self._routed: contextvars.ContextVar[dict[str, str] | None] = contextvars.ContextVar(
            f"limitd_fair_tenant_routed_{id(self)}", default=None
        )

    def for_layout(self, layout: keys.KeyLayout) -> FairTenant:
        return self if layout is self.keys else FairTenant(self.settings, layout)

    def concerns(self, spec: JobSpec | None, payload: Payload) -> bool:
        return "fair_tenant_queues" in payload

    def push_work(self, spec: JobSpec | None, payload: Payload) -> ScriptCall | None:
        """The call that counts this job and picks its queue (None: most jobs, which
        have no rules, and jobs whose bulk chunk decided already, or without tenant)."""
        if "fair_tenant_queues" not in payload:
            return None  # most jobs: nothing to count
        call = self._pending(spec, payload)
        if call is None:
            payload.pop("fair_tenant_queues", None)  # definition data: not needed downstream
        return call

    def admit(self, spec: JobSpec | None, payload: Payload, reply: Any) -> bool:
        """Route by the counting call's reply. Halts nothing; only chooses the queue."""
        self._route_by(payload, reply)
        payload.pop("fair_tenant_queues", None)
        return True

    def bulk_work(self, spec: JobSpec | None, payloads: list[Payload]) -> list[ScriptCall]:
        """Count and route a whole chunk in one round trip (one script call per tenant,
        pipelined); each job is still counted on its own, in order."""
        groups = self._groups(spec, payloads)
        if not groups:
            return []
        decided: dict[str, str] = {}
        self._routed.set(decided)

        def decide(members: list[Payload]) -> Callable[[Any], None]:
            def on_reply(choices: Any) -> None:
                for payload, choice in zip(members, choices, strict=True):
                    decided[payload["jid"]] = self._queue_for(payload, int(choice))

            return on_reply

        return [
            self._count_call(members[0], tenant, [p["jid"] for p in members], decide(members))
            for tenant, members in groups.items()
        ]

    def _pending(self, spec: JobSpec | None, payload: Payload) -> ScriptCall | None:
        """For a job with rules: its queue, if its bulk chunk decided it (applied now),
        else the script call that counts it and decides (None: no tenant to count)."""
        routed = self._routed.get()
        if routed is not None and payload["jid"] in routed:
            payload["queue"] = routed.pop(payload["jid"])  # decided for the whole bulk
            return None
        if not payload.get("fair_tenant_queues"):
            return None
        tenant = self.tenant_of(spec, payload)
        return None if tenant is None else self._count_call(payload, tenant, [payload["jid"]])

    def _route_by(self, payload: Payload, reply: Any) -> None:
        [choice] = cast("list[int]", reply)
        payload["queue"] = self._queue_for(payload, int(choice))

    def _groups(
        self, spec: JobSpec | None, payloads: Sequence[Payload]
    ) -> dict[str, list[Payload]]:
        """A chunk's jobs with rules and a tenant, by tenant (one counting call each)."""
        by_tenant: dict[str, list[Payload]] = {}
        for payload in payloads:
            tenant = self.tenant_of(spec, payload) if payload.get("fair_tenant_queues") else None
            if tenant is not None:
                by_tenant.setdefault(tenant, []).append(payload)
        return by_tenant

    def tenant_of(self, spec: JobSpec | None, payload: Payload) -> str | None:
        tenant = payload.get("fair_tenant")
        hook = tenant_hook(spec) if tenant is None else None
        if hook is not None:
            tenant = hook(*payload["args"])
            if tenant is not None:
                payload["fair_tenant"] = str(tenant)
        return None if tenant is None else str(tenant)

    def _count_call(
        self,
        payload: Payload,
        tenant: str,
        jids: list[str],
        on_reply: Callable[[Any], None] | None = None,
    ) -> ScriptCall:
        """The call that counts ``jids`` (one tenant's) and returns each one's rule."""
        rules = payload["fair_tenant_queues"]
        k = self.keys
        key = k.fair_tenant_enqueues(
            self.settings.enqueues_key,
            queue=payload["queue"],
            job_class=payload["class"],
            tenant=tenant,
        )
        window = max([self.settings.max_throttling_window, *(r["per"] for r in rules)])
        args: list[Any] = [
            clock.now(),
            window,
            payload["class"],
            tenant,
            json.dumps(rules, separators=(",", ":")),
            len(rules),
        ]
        for rule in rules:
            args += [rule["per"], rule["threshold"], rule["queue"]]
        return FAIR_TENANT.later(
            [key, k.FAIR_TENANT_TENANTS, k.FAIR_TENANT_REROUTES, k.FAIR_TENANT_RULES],
            [*args, *jids],
            on_reply,
        )

    def _queue_for(self, payload: Payload, choice: int) -> str:
        if choice == 0:
            return str(payload["queue"])
        queue = str(payload["fair_tenant_queues"][choice - 1]["queue"])
        self.log.debug(
            "rerouted jid=%s class=%s tenant=%s to %s",
            payload["jid"],
            payload["class"],
            payload.get("fair_tenant"),
            queue,
        )
        return queue
