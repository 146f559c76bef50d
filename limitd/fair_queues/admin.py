"""Fair queues in the admin API (re-exported by ``limitd.api``)::

    from limitd.api import make_fair, fair_queue_status

    make_fair("reports", tenant_limit=2)       # tenants in turn, 2 jobs each at most
    set_tenant_weight("reports", "acme", 3)    # acme takes 3 turns per round
    print(fair_queue_status("reports"))        # jobs and tenants waiting, the largest
    make_plain("reports")                      # lines back into the queue, in turn order
"""

from __future__ import annotations

import redis as redis_py

from limitd.client import connection_or_default
from limitd.fair_queues import store
from limitd.fair_queues.store import FairQueueStatus, FairSetting

__all__ = [
    "FairQueueStatus",
    "FairSetting",
    "fair_queue_status",
    "make_fair",
    "make_plain",
    "reset_fairness",
    "set_tenant_weight",
]


def make_fair(
    queue: str,
    *,
    tenant_limit: int | None = None,
    weights: dict[str, int] | None = None,
    redis: redis_py.Redis | None = None,
) -> None:
    """Serve ``queue``'s tenants in turn from the next fetch on. Refused (ValueError)
    while a Ruby Sidekiq process fetches the queue: it would pop arrivals past the
    tenants' lines, and fairness would silently not hold."""
    conn = connection_or_default(redis)
    where = f"queue {queue!r}"
    store.check_tenant_limit(tenant_limit, where)
    for tenant, weight in (weights or {}).items():
        store.check_weight(tenant, weight, where)
    sidekiq = foreign_fetchers(conn, queue)
    if sidekiq:
        raise ValueError(
            f"{where} cannot be made fair: Sidekiq processes that are not limitd fetch it "
            f"({', '.join(sidekiq)}); they would take its jobs past the tenants' lines"
        )
    store.make_fair(conn, queue, FairSetting(tenant_limit, dict(weights or {})))


def make_plain(queue: str, *, redis: redis_py.Redis | None = None) -> int:
    """Serve ``queue`` in plain order again (kept so over the config): the jobs waiting
    in its tenants' lines go back into it, in turn order. Returns how many moved."""
    return store.make_plain(connection_or_default(redis), queue)


def set_tenant_weight(
    queue: str, tenant: str, weight: int, *, redis: redis_py.Redis | None = None
) -> None:
    """``tenant`` takes ``weight`` turns per round in ``queue`` (1 by default)."""
    store.set_weight(connection_or_default(redis), queue, tenant, weight)


def reset_fairness(queue: str, *, redis: redis_py.Redis | None = None) -> None:
    """Forget the run-time setting: the configured one applies again."""
    store.reset(connection_or_default(redis), queue)


def fair_queue_status(
    queue: str, *, top: int = 10, redis: redis_py.Redis | None = None
) -> FairQueueStatus | None:
    """The queue's tenants at a glance, the ``top`` largest first; None if not fair."""
    return store.status(connection_or_default(redis), queue, top=top)


def foreign_fetchers(redis: redis_py.Redis, queue: str) -> list[str]:
    """Identities of live process records that are not limitd's (no ``capsule_id``:
    Ruby Sidekiq) and list ``queue``."""
    from limitd.api.processes import Processes  # limitd.api re-exports this module

    return [
        process.identity
        for process in Processes(redis)
        if process.capsule_id is None and queue in process.queues
    ]
