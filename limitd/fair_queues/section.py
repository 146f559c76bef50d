"""The ``fair_queues:`` config section: which queues serve their tenants in turn.

    fair_queues:
      reports: {tenant_limit: 2, weights: {acme: 3}}
      exports: {}

or, with no options, a list: ``fair_queues: [reports, exports]``. Each capsule process
writes these settings where Redis has none, at start and at its housekeeping, like the
queue limits: a run-time change (``limitd fair``, ``Queue.fair``) wins, and ``limitd
fair reset`` returns a queue to its configured setting.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from limitd.config.values import Section, describe
from limitd.fair_queues.store import FairSetting, check_tenant, check_tenant_limit

KEY = "fair_queues"
QUEUE_KEYS = frozenset({"tenant_limit", "weights"})


def read_fair_queues(section: Section, _env: Mapping[str, str]) -> dict[str, FairSetting]:
    """The section (a mapping, or a list of queue names) as each queue's setting."""
    if isinstance(section.data, list):
        found = {}
        for index, item in enumerate(section.data):
            if not isinstance(item, str) or not item:
                raise section.error((index,), f"expected a queue name, got {describe(item)}")
            found[item] = FairSetting()
        return found
    return {
        str(queue): _setting(section, str(queue), section.data[queue]) for queue in section.data
    }


def _setting(section: Section, queue: str, raw: Any) -> FairSetting:
    if raw is None:
        return FairSetting()
    if not isinstance(raw, dict):
        raise section.error(
            queue, f"expected a mapping (tenant_limit, weights), got {describe(raw)}"
        )
    options = section.section(queue)
    options.check_keys(QUEUE_KEYS)
    tenant_limit = options.optional_integer("tenant_limit", 1)
    weights_section = options.section("weights")
    weights = {}
    for tenant in weights_section.data:
        try:
            check_tenant(tenant, "tenant")
        except ValueError as exc:
            raise weights_section.error(str(tenant), str(exc)) from None
        weights[str(tenant)] = weights_section.integer(str(tenant), 1, 1)
    check_tenant_limit(tenant_limit, queue)
    return FairSetting(tenant_limit=tenant_limit, weights=weights)


def as_dict(settings: dict[str, FairSetting]) -> dict[str, Any]:
    return {
        queue: {"tenant_limit": setting.tenant_limit, "weights": dict(setting.weights)}
        for queue, setting in settings.items()
    }
