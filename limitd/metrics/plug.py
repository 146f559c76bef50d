"""Prometheus metrics as a feature: the ``metrics:`` config section (and the check that
every process gets a port), the per-process job metrics service, and ``limitd
metrics``, the cluster exporter. Features add their families to the exporter with
their own ``Feature.metrics``.

Only the section is imported with ``import limitd``: the service and the command,
which need prometheus-client, are imported by ``limitd start`` and the command line."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

from limitd.metrics import section
from limitd.plugins import ConfigSection, Feature, ProcessContext, Service

if TYPE_CHECKING:
    from limitd.commands.common import ResolveRedis, Subparsers


def add_commands(subparsers: Subparsers, resolve_redis: ResolveRedis) -> None:
    """``limitd metrics``."""
    from limitd.metrics.commands import add_metrics_command

    add_metrics_command(subparsers, resolve_redis)


def services(context: ProcessContext) -> Sequence[Service]:
    """The job metrics endpoint of a capsule process, when the config asks for one."""
    from limitd.metrics.process import process_services

    return process_services(context)


METRICS = Feature(
    name="metrics",
    section=ConfigSection(section.KEY, section.read_metrics, section.as_dict),
    add_commands=add_commands,
    check_app=section.check_ports,
    process_services=services,
)
