"""Checks that need the app's code as well as the config files.

``load_config`` checks what the files say on their own. Some mistakes only show once the
app's modules are imported and its jobs defined: ``limitd check`` and ``limitd start``
import them (every module any capsule requires) and run :func:`check_app` before anything
starts, so the mistake stops the start with one line (exit 78), like any other config
mistake, instead of jobs piling up where nothing fetches them.
"""

from __future__ import annotations

from collections.abc import Iterable

from limitd.config.settings import Config
from limitd.plugins import registered
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
    job): each feature's (``Feature.check_app``). Raises ``ConfigError`` for the first
    mistake."""
    known = registered_jobs() if jobs is None else list(jobs)
    for feature in registered():
        if feature.check_app is not None:
            feature.check_app(config, known)
