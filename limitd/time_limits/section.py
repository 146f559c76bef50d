"""The ``time_limits:`` config section::

    time_limits:
      default: 300          # seconds a job without its own time_limit may run (none if unset)
      grace: 10             # seconds past a limit before a process stuck in C code is recycled
      capsules:             # a capsule's own default, over ``default``
        reports: 3600

Errors name the file, the key and the value expected, like every config error.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from limitd.config.values import Section
from limitd.time_limits import TIME_LIMITS_KEYS

DEFAULT_GRACE = 10.0


@dataclass(frozen=True)
class TimeLimitSettings:
    """The section read: ``default`` None means jobs without a ``time_limit`` have none."""

    default: float | None = None
    grace: float = DEFAULT_GRACE
    capsules: dict[str, float] = field(default_factory=dict)

    def default_for(self, capsule: str) -> float | None:
        """The limit a job of ``capsule`` gets when it sets none."""
        return self.capsules.get(capsule, self.default)


def read_time_limits(section: Section, env: Mapping[str, str]) -> TimeLimitSettings:
    """Check and read the section (an empty one gives the defaults: no limit)."""
    section.check_keys(TIME_LIMITS_KEYS)
    default = section.number("default", 0.0, 0.0, above=True) if section.given("default") else None
    grace = section.number("grace", DEFAULT_GRACE, 0.0, above=True)
    per_capsule = section.section("capsules")
    capsules = {
        str(name): per_capsule.number(str(name), 0.0, 0.0, above=True) for name in per_capsule.data
    }
    return TimeLimitSettings(default, grace, capsules)


def as_dict(settings: TimeLimitSettings) -> dict[str, Any]:
    """The section as ``limitd check`` prints it."""
    return {"default": settings.default, "grace": settings.grace, "capsules": settings.capsules}
