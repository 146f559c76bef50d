"""A check of the config, run by ``limitd check`` and ``limitd start`` (see
``Feature.check_app``)."""

from __future__ import annotations

from collections.abc import Iterable

from limitd.config.app_checks import NO_FILE
from limitd.config.settings import Config, ConfigError
from limitd.fair_queues.section import KEY
from limitd.queues.order import QueueOrder
from limitd.spec import JobSpec


def check_fair_queue_fetch(config: Config, _jobs: Iterable[JobSpec]) -> None:
    """A capsule with ``fetch: basic`` pops a queue's list with BRPOP: on a fair queue
    it would take arrivals before they reach their tenant's line and never the jobs in
    the lines, so fairness would silently not hold. Refused."""
    fair = config.sections.get(KEY) or {}
    for spec in config.capsules:
        capsule = spec.config
        if capsule.fetch != "basic":
            continue
        clash = sorted(set(QueueOrder(capsule.queues).names) & set(fair))
        if clash:
            raise ConfigError(
                ", ".join(config.files) or NO_FILE,
                f"capsules.{capsule.name}.fetch" if capsule.name != "default" else "fetch",
                f"basic cannot fetch the fair queues {clash} (fair_queues): use fetch: limit",
            )
