"""Iterable jobs and cancelling as a feature: the server middleware that ties an
iterable job's run to its capsule, and the ``limitd cancel`` / ``limitd progress``
commands. No config section and no job option: an iterable job is a class
(``limitd.IterableJob``) and tunes itself with class attributes.

``import limitd`` loads this module and the package (the base class and
``limitd.cancelled`` are public); the commands are imported when the command line is
built."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from limitd.plugins import Feature

if TYPE_CHECKING:
    from limitd.commands.common import ResolveRedis, Subparsers


def server_middleware(redis: Any) -> Any:
    from limitd.iteration.middleware import IterationControl

    return IterationControl(redis)


def add_commands(subparsers: Subparsers, resolve_redis: ResolveRedis) -> None:
    """``limitd cancel`` and ``limitd progress``."""
    from limitd.iteration.commands import add_iteration_commands

    add_iteration_commands(subparsers, resolve_redis)


ITERATION = Feature(
    name="iteration",
    server_middleware=server_middleware,
    add_commands=add_commands,
)
