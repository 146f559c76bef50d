"""Checks that need the app's code as well as the config files.

``load_config`` checks what the files say on their own. Some mistakes only show once the
app's modules are imported and its jobs defined: ``limitd check`` and ``limitd start``
import them (every module any capsule requires) and run :func:`check_app` before anything
starts, so the mistake stops the start with one line (exit 78), like any other config
mistake, instead of jobs piling up where nothing fetches them.
"""

from __future__ import annotations

from collections.abc import Iterable

from limitd.config.settings import Config, ConfigError
from limitd.fetch.order import QueueOrder
from limitd.registry import registry
from limitd.spec import JobSpec

NO_FILE = "command line"  # what errors name when no file was given (flags only)


def app_modules(config: Config) -> list[str]:
    """Every module that defines the app's jobs: the top-level ``require`` and each
    capsule's own, in order, once each."""
    modules = [*config.require]
    for spec in config.capsules:
        modules += spec.config.require
    return list(dict.fromkeys(modules))


def registered_jobs() -> list[JobSpec]:
    """The jobs this process knows, by name."""
    return [spec for name in registry.names() if (spec := registry.resolve(name)) is not None]


def check_app(config: Config, jobs: Iterable[JobSpec] | None = None) -> None:
    """Every check of ``config`` against the app's ``jobs`` (default: every registered
    job). Raises ``ConfigError`` for the first mistake."""
    check_fair_tenant_queues(config, registered_jobs() if jobs is None else jobs)


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
