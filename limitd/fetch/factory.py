"""The one place a capsule's fetch strategy is chosen: from its config and the topology.

``config.fetch`` picks the basic or the limit fetch; a Redis Cluster makes the limit
fetch the per-shard one. Each comes with the dispatch that serves it to the capsule's
threads, so nothing above this module names a strategy.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable

import redis as redis_py

from limitd import keys
from limitd.config import CapsuleConfig
from limitd.fetch import Dispatch, Fetch
from limitd.fetch.basic import BasicFetch
from limitd.fetch.direct import DirectDispatch
from limitd.fetch.dispatcher import Dispatcher
from limitd.fetch.limit import LimitFetch
from limitd.fetch.ready_index import SWEEP_PER_SECOND
from limitd.fetch.sharded import ShardedLimitFetch
from limitd.fetch.wakeup import IdleGate
from limitd.queues.limits import LimitSettings
from limitd.queues.order import QueueOrder


def build_fetch(
    config: CapsuleConfig, redis: redis_py.Redis, order: QueueOrder, gate: IdleGate
) -> tuple[Fetch, Dispatch]:
    """The capsule's fetch and the dispatch its processors take jobs from."""
    if config.fetch == "basic":
        basic = BasicFetch(redis, order)
        return basic, DirectDispatch(basic)
    fetch = limit_fetch(
        redis,
        order,
        config.capsule_id,
        gate=gate,
        blocking=config.blocking,
        dynamic=config.dynamic,
        limits=config.limit_settings,
        ready_index=config.ready_index,
        sweep_per_second=config.index_sweep,
    )
    return fetch, Dispatcher(fetch, gate)


def limit_fetch(
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
) -> LimitFetch:
    """A limit fetch for the topology of the connection: one call for all queues, or
    in a cluster one per queue's shard."""
    k = keys.of(redis)
    strategy = ShardedLimitFetch if k.cluster else LimitFetch
    return strategy(
        redis,
        order,
        capsule_id,
        gate=gate,
        blocking=blocking,
        dynamic=dynamic,
        rate_clock=rate_clock,
        limits=limits,
        ready_index=ready_index,
        sweep_per_second=sweep_per_second,
    )
