"""Each capsule process writes the configured fair queues where Redis has no setting,
at start and at each housekeeping (so a Redis that lost its data gets them back), as
the queue limits are written at each heartbeat."""

from __future__ import annotations

import logging
from collections.abc import Mapping

import redis as redis_py

from limitd.fair_queues.store import FairSetting, make_fair

log = logging.getLogger("limitd.fair_queues")

# The settings of this process's config, for housekeeping (which is given only Redis).
configured: dict[str, FairSetting] = {}


def apply_configured(redis: redis_py.Redis, settings: Mapping[str, FairSetting]) -> int:
    """Write each configured fair queue unless Redis has a value for it; returns how
    many were written."""
    return sum(
        make_fair(redis, queue, setting, only_if_unset=True) for queue, setting in settings.items()
    )


class ConfiguredFairQueues:
    """The process service: applies the section when the capsule starts."""

    def __init__(self, redis: redis_py.Redis, settings: Mapping[str, FairSetting]) -> None:
        self.redis = redis
        self.settings = dict(settings)

    def start(self) -> None:
        configured.clear()
        configured.update(self.settings)
        written = apply_configured(self.redis, self.settings)
        if written:
            log.info("made %d configured queues fair: %s", written, sorted(self.settings))

    def stop(self) -> None:
        """Nothing runs between start and stop."""
