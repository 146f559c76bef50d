"""The job history as a feature: the ``job_history:`` config section and, when it is
enabled, a writer in every capsule process (``limitd.job_history.process``), imported
only by ``limitd start``. The admin call is ``job_history.admin.job_history``; the
dashboard's Metrics page and ``limitd history`` read it.

``import limitd`` imports this module alone of the feature: the section's reader is
imported when a config is read, the writer when a capsule process starts."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

from limitd.job_history import HISTORY_KEYS, KEY
from limitd.plugins import ConfigSection, Feature, ProcessContext, Service

if TYPE_CHECKING:
    from limitd.commands.common import ResolveRedis, Subparsers

__all__ = ["HISTORY_KEYS", "JOB_HISTORY", "KEY"]  # HISTORY_KEYS: the docs test reads it here


def read_section(data: Any, env: Mapping[str, str]) -> Any:
    """The ``job_history`` section (``limitd.job_history.section.read_history``)."""
    from limitd.job_history.section import read_history

    return read_history(data, env)


def section_as_dict(settings: Any) -> dict[str, Any]:
    from limitd.job_history.section import as_dict

    return as_dict(settings)


def services(context: ProcessContext) -> Sequence[Service]:
    """The history writer of a capsule process, when the config enables it."""
    from limitd.job_history.process import process_services

    return process_services(context)


def add_commands(subparsers: Subparsers, resolve_redis: ResolveRedis) -> None:
    """``limitd history``."""
    from limitd.job_history.commands import add_history_command

    add_history_command(subparsers, resolve_redis)


JOB_HISTORY = Feature(
    name="job_history",
    section=ConfigSection(KEY, read_section, section_as_dict),
    add_commands=add_commands,
    process_services=services,
)
