"""Limited-capacity jobs as a feature: ``limitd.LimitedCapacityJob`` in app code,
``limitd capacity``, and three gauges for ``limitd metrics``. The admin call is
``limitd.capacity.admin.capacity`` (``limitd.api.capacity``).

The command and the gauges are imported when they are used (they need argparse and
prometheus-client, which app code that only enqueues does not)."""

from __future__ import annotations

from collections.abc import Iterable
from typing import TYPE_CHECKING, Any

from limitd.plugins import Feature

if TYPE_CHECKING:
    from limitd.commands.common import ResolveRedis, Subparsers


def add_commands(subparsers: Subparsers, resolve_redis: ResolveRedis) -> None:
    """``limitd capacity``."""
    from limitd.capacity.commands import add_capacity_command

    add_capacity_command(subparsers, resolve_redis)


def metrics(redis: Any) -> Iterable[Any]:
    """The capacity gauges of ``limitd metrics``."""
    from limitd.capacity.metrics import capacity_metrics

    return capacity_metrics(redis)


CAPACITY = Feature(name="capacity", add_commands=add_commands, metrics=metrics)
