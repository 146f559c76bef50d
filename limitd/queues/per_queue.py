"""Reading per-queue fetch state in either key layout (see ``limitd.keys``): one shared
hash for all queues standalone, one hash per queue in cluster mode.

The shared hashes every fetch call reads a field of per queue it looks at (the global
limits and the busy counts) carry one extra field, ``HASHTABLE_FIELD``, whose value is
too long for Redis's compact encoding. Redis keeps a hash of up to 512 short fields
(``hash-max-listpack-entries``) as one flat list and reads a field by scanning it: an
HGET of the last of 500 fields ran 66,000 instructions against 3,800 in a hash table
(valgrind, Redis 7.0), so a deployment of a few hundred limited queues paid that on
every field every call reads. A value longer than ``hash-max-listpack-value`` (64
bytes by default) turns the hash into a hash table for good. The field's name starts
with a NUL, which no queue name has, and its value reads as the number 0; every reader
of these hashes leaves it out (``queue_fields``), and the scripts only ever ask for
fields by queue name.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import cast

import redis as redis_py

from limitd import keys
from limitd.connection import set_members

HASHTABLE_FIELD = "\x00hashtable"
# Longer than hash-max-listpack-value, and read as 0 by anyone who sums a hash's values
# as numbers (a busy count of 0, a limit nobody has): Redis keeps it as a string, since
# leading zeros are not an integer's canonical form.
HASHTABLE_VALUE = "0" * 80


def keep_hashtables(redis: redis_py.Redis) -> None:
    """Standalone, give the shared limits and busy hashes their marker field (see the
    module docstring) unless they have it: at each capsule's start and heartbeat, so a
    hash lost with Redis's data gets it back within a heartbeat. In cluster mode each
    queue's hash holds that queue alone, and stays small."""
    k = keys.of(redis)
    if k.cluster:
        return
    pipe = redis.pipeline(transaction=False)
    for key in (k.LIMITS, k.BUSY):
        pipe.hsetnx(key, HASHTABLE_FIELD, HASHTABLE_VALUE)
    pipe.execute()


def queue_fields(raw: dict[bytes, bytes]) -> dict[bytes, bytes]:
    """A shared per-queue hash as HGETALL read it, without the marker field."""
    raw.pop(HASHTABLE_FIELD.encode(), None)
    return raw


def hash_by_queue(redis: redis_py.Redis, key_of: Callable[[str], str]) -> dict[bytes, bytes]:
    """A per-queue hash (``KeyLayout.limits_of``, ``busy_of``...) as HGETALL reads the shared
    one: ``{queue: value}``. In cluster mode each queue has its own, in its own slot:
    read for every queue Redis knows (the ``queues`` set)."""
    k = keys.of(redis)
    if not k.cluster:
        return queue_fields(cast("dict[bytes, bytes]", redis.hgetall(key_of(""))))
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
