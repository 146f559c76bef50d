"""Every Redis key name limitd uses, built in one place.

Core keys match Sidekiq's data model, so Ruby Sidekiq clients and tools can share the
same Redis; everything limitd adds lives under the ``limitd:`` prefix. Lua scripts never
build key names: callers pass the names built here through ``KEYS[]``.
"""

from __future__ import annotations

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


def queue(name: str) -> str:
    """The list holding a queue's jobs: producers LPUSH, fetchers take from the right."""
    return QUEUE_PREFIX + name


def queue_name(key: str) -> str:
    """Inverse of :func:`queue`."""
    return key[len(QUEUE_PREFIX) :] if key.startswith(QUEUE_PREFIX) else key


def daily_stat(stat_key: str, day: str) -> str:
    """Per-day counter beside a total, e.g. ``stat:processed:2026-11-21``."""
    return f"{stat_key}:{day}"


def process_work(identity: str) -> str:
    """Hash of what each processor thread of a process is running (Sidekiq's ``:work``)."""
    return f"{identity}:work"
