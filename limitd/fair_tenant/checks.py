"""A check of the app's jobs against the loaded config, run by ``limitd check`` and
``limitd start`` (see ``Feature.check_app``)."""

from __future__ import annotations

from collections.abc import Iterable

from limitd.config.app_checks import NO_FILE
from limitd.config.settings import Config, ConfigError
from limitd.queues.order import QueueOrder
from limitd.spec import JobSpec


def check_fair_tenant_queues(config: Config, jobs: Iterable[JobSpec]) -> None:
    """A job's ``fair_tenant_queues`` rule routes jobs to its queue: some capsule must
    fetch that queue (list it, or be ``dynamic``), or those jobs never run. Nothing is
    checked when a capsule is dynamic: it fetches every queue it finds in Redis."""
    if any(spec.config.dynamic for spec in config.capsules):
        return
    fetched = {name for spec in config.capsules for name in QueueOrder(spec.config.queues).names}
    for job in sorted(jobs, key=lambda job: job.name):
        for index, rule in enumerate(job.options.get("fair_tenant_queues") or ()):
            if rule["queue"] not in fetched:
                raise ConfigError(
                    ", ".join(config.files) or NO_FILE,
                    f"job {job.name}",
                    f"fair_tenant_queues[{index}].queue {rule['queue']!r} is not in any "
                    "capsule's queues (jobs routed there would never run)",
                )
