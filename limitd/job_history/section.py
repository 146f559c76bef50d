"""The ``job_history:`` config section: whether capsule processes record the job
history, how often they write it and how long Redis keeps it.

::

    job_history:
      enabled: true          # default false: no tally, no writes
      flush_interval: 5      # seconds between two writes of a process's tally
      retention: 28800       # seconds a minute's figures are kept (8 hours)
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from limitd.config.values import Section
from limitd.job_history import HISTORY_KEYS, KEY
from limitd.job_history.store import DEFAULT_RETENTION

__all__ = ["HISTORY_KEYS", "KEY", "HistorySettings", "as_dict", "read_history"]
DEFAULT_FLUSH_INTERVAL = 5.0
SHORTEST_RETENTION = 60  # a minute's hash must outlive the minute


@dataclass(frozen=True)
class HistorySettings:
    enabled: bool = False
    flush_interval: float = DEFAULT_FLUSH_INTERVAL
    retention: int = DEFAULT_RETENTION


def read_history(section: Section, env: Mapping[str, str]) -> HistorySettings:
    """The ``job_history`` section, every value checked (``env`` is unused)."""
    del env
    section.check_keys(HISTORY_KEYS)
    return HistorySettings(
        enabled=section.boolean("enabled", False),
        flush_interval=section.number("flush_interval", DEFAULT_FLUSH_INTERVAL, 0.0, above=True),
        retention=section.integer("retention", DEFAULT_RETENTION, SHORTEST_RETENTION),
    )


def as_dict(settings: HistorySettings) -> dict[str, Any]:
    return {
        "enabled": settings.enabled,
        "flush_interval": settings.flush_interval,
        "retention": settings.retention,
    }
