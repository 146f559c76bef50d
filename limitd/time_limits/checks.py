"""A check of the ``time_limits:`` section against the loaded config's capsules, run by
``limitd check`` and ``limitd start`` (see ``Feature.check_app``): a misspelt capsule
name under ``capsules`` would otherwise leave that capsule without its default."""

from __future__ import annotations

from collections.abc import Iterable

from limitd.config.app_checks import NO_FILE
from limitd.config.settings import Config, ConfigError
from limitd.spec import JobSpec
from limitd.time_limits.section import TimeLimitSettings


def check_time_limit_capsules(config: Config, jobs: Iterable[JobSpec]) -> None:
    settings = config.section("time_limits")
    if not isinstance(settings, TimeLimitSettings):
        return
    names = sorted(spec.config.name for spec in config.capsules)
    for name in sorted(settings.capsules):
        if name not in names:
            raise ConfigError(
                ", ".join(config.files) or NO_FILE,
                f"time_limits.capsules.{name}",
                f"no capsule is named {name!r}; expected one of {names}",
            )
