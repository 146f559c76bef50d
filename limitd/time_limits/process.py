"""The time-limit service of a capsule process: it puts :class:`TimeLimits` innermost
in the capsule's chain, with the capsule's default limit, and stops its watchdog with
the process."""

from __future__ import annotations

from limitd.plugins import ProcessContext
from limitd.time_limits.middleware import TimeLimits
from limitd.time_limits.plug import KEY
from limitd.time_limits.section import TimeLimitSettings


class TimeLimitService:
    def __init__(self, context: ProcessContext) -> None:
        settings = context.section(KEY)
        if not isinstance(settings, TimeLimitSettings):
            settings = TimeLimitSettings()
        default = settings.default_for(context.capsule.name)
        self.middleware = TimeLimits(context.redis, default, settings.grace)
        context.chain.add(self.middleware)

    def start(self) -> None:
        """Nothing to start: the watchdog thread starts with the first limited job."""

    def stop(self) -> None:
        self.middleware.stop()
