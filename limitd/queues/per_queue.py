"""Reading per-queue fetch state in either key layout (see ``limitd.keys``): one shared
hash for all queues standalone, one hash per queue in cluster mode."""

from __future__ import annotations

from collections.abc import Callable
from typing import cast

import redis as redis_py

from limitd import keys
from limitd.connection import set_members


def hash_by_queue(redis: redis_py.Redis, key_of: Callable[[str], str]) -> dict[bytes, bytes]:
    """A per-queue hash (``KeyLayout.limits_of``, ``busy_of``...) as HGETALL reads the shared
    one: ``{queue: value}``. In cluster mode each queue has its own, in its own slot:
    read for every queue Redis knows (the ``queues`` set)."""
    k = keys.of(redis)
    if not k.cluster:
        return cast("dict[bytes, bytes]", redis.hgetall(key_of("")))
    names = set_members(redis, k.QUEUES)
    pipe = redis.pipeline(transaction=False)
    for name in names:
        pipe.hget(key_of(name), name)
    found = pipe.execute()
    return {name.encode(): value for name, value in zip(names, found, strict=True) if value}


def forget_applied(redis: redis_py.Redis) -> None:
    """After a reset of a runtime value: every capsule writes its configured limits and
    rates again at its next heartbeat, where Redis has none (``LimitSettings.
    apply_defaults``)."""
    k = keys.of(redis)
    if not k.cluster:
        redis.delete(k.LIMITS_APPLIED)
