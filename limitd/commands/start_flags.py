"""The flags of ``limitd start``, and how they go on top of the files: queue flags shape
the default capsule, timing flags every capsule. ``limitd.commands.fresh`` reads the same
flags again (:data:`CONFIG_FLAGS`) in a process that imports the app anew.
"""

from __future__ import annotations

import argparse
import dataclasses

from limitd.config import CapsuleConfig, CapsuleSpec, Config, ConfigError

COMMAND_LINE = "command line"

# The flags a process that imports the app anew reads again (``limitd.commands.fresh``).
CONFIG_FLAGS = (
    "require",
    "queue",
    "concurrency",
    "processes",
    "limit",
    "process_limit",
    "blocking",
    "dynamic",
    "timeout",
    "heartbeat_period",
    "fetch",
    "tag",
)


def add_override_flags(parser: argparse.ArgumentParser) -> None:
    """Flags that shape the default capsule."""
    add = parser.add_argument
    add(
        "-r",
        "--require",
        action="append",
        default=[],
        metavar="MODULE",
        help="module defining jobs (repeatable; added to the config's require)",
    )
    add(
        "-q",
        "--queue",
        action="append",
        metavar="NAME[,WEIGHT]",
        help="queue of the default capsule, in order, optionally weighted (repeatable)",
    )
    add("-c", "--concurrency", type=int, help="threads per process of the default capsule")
    add("-p", "--processes", type=int, help="processes of the default capsule")
    add(
        "--limit",
        action="append",
        default=[],
        metavar="QUEUE=N",
        help="jobs of QUEUE running at once in all processes (repeatable)",
    )
    add(
        "--process-limit",
        action="append",
        default=[],
        metavar="QUEUE=N",
        help="jobs of QUEUE running at once in each process (repeatable)",
    )
    add(
        "--blocking",
        action="append",
        default=[],
        metavar="QUEUE",
        help="QUEUE at its limit with jobs waiting holds back later queues",
    )
    add(
        "--dynamic",
        action="store_true",
        default=None,
        help="also fetch queues that exist in Redis but are not listed",
    )


def add_timing_flags(parser: argparse.ArgumentParser) -> None:
    """Flags that apply to every capsule."""
    add = parser.add_argument
    add("-t", "--timeout", type=float, help="seconds to finish jobs on TERM (every capsule)")
    add(
        "--heartbeat-period",
        type=float,
        metavar="SECONDS",
        help="liveness beat; a silent capsule is reaped after 4 periods (every capsule)",
    )
    add("--fetch", choices=("limit", "basic"), help="fetch strategy (every capsule)")
    add("-g", "--tag", help="label shown in process lists and titles")


def add_sidekiq_flags(parser: argparse.ArgumentParser) -> None:
    """The flags a Sidekiq user types after the command that limitd has no other place
    for: ``-v`` (as ``limitd -v start``) and ``-e``, which limitd refuses with what to
    do instead rather than argparse's bare "unrecognized arguments"."""
    parser.add_argument(
        "-v",
        "--verbose",
        action="store_true",
        default=argparse.SUPPRESS,  # unset unless given: 'limitd -v start' still counts
        help="debug logging, as 'limitd -v start'",
    )
    parser.add_argument(
        "-e",
        "--environment",
        action=_NoEnvironment,
        metavar="ENV",
        help="refused: limitd has no environments; give the environment's file instead",
    )


class _NoEnvironment(argparse.Action):
    """Sidekiq's ``-e production`` picks a section of sidekiq.yml (and the Rails
    environment). limitd's files have no such sections: the environment's settings go
    in a file of their own, named after the base one."""

    def __call__(
        self,
        parser: argparse.ArgumentParser,
        namespace: argparse.Namespace,
        values: object,
        option_string: str | None = None,
    ) -> None:
        parser.error(
            f"{option_string} {values}: limitd has no environments; put that "
            f"environment's settings in a file of their own and name it after the base "
            f"one (limitd start base.yml {values}.yml), and set the app's own "
            f"environment variable (e.g. APP_ENV) yourself"
        )


def apply_flags(config: Config, args: argparse.Namespace) -> Config:
    """Command-line flags on top of the files."""
    config.require = [*config.require, *args.require]
    if args.tag is not None:
        config.tag = args.tag
    specs = _default_capsule_first(config, args)
    queue_changes = _queue_flags(args)
    has_default = bool(specs) and specs[0].config.name == "default"
    if (queue_changes or args.processes is not None) and not has_default:
        raise ConfigError(
            COMMAND_LINE,
            "",
            "queue flags (-c, -p, --limit, ...) shape the "
            "default capsule, and this config has none: add -q QUEUE",
        )
    for index, spec in enumerate(specs):
        changes = _timing_flags(args, tag=config.tag)
        if index == 0 and has_default:
            changes.update(queue_changes)
            if args.processes is not None:
                spec.processes = _positive(args.processes, "--processes")
        spec.config = _replace(spec.config, changes)
    config.capsules = specs
    return config


def _default_capsule_first(config: Config, args: argparse.Namespace) -> list[CapsuleSpec]:
    specs = list(config.capsules)
    if args.queue and not any(spec.config.name == "default" for spec in specs):
        specs.insert(0, CapsuleSpec(CapsuleConfig(queues=args.queue)))
    specs.sort(key=lambda spec: spec.config.name != "default")
    return specs


def _timing_flags(args: argparse.Namespace, *, tag: str) -> dict[str, object]:
    changes: dict[str, object] = {"tag": tag}
    for flag in ("timeout", "heartbeat_period", "fetch"):
        if getattr(args, flag) is not None:
            changes[flag] = getattr(args, flag)
    return changes


def _queue_flags(args: argparse.Namespace) -> dict[str, object]:
    changes: dict[str, object] = {}
    if args.queue:
        changes["queues"] = args.queue
    if args.concurrency is not None:
        changes["concurrency"] = args.concurrency
    if args.dynamic:
        changes["dynamic"] = True
    if args.blocking:
        changes["blocking"] = args.blocking
    if args.limit:
        changes["limits"] = parse_limits(args.limit, "--limit")
    if args.process_limit:
        changes["process_limits"] = parse_limits(args.process_limit, "--process-limit")
    return changes


def _replace(config: CapsuleConfig, changes: dict[str, object]) -> CapsuleConfig:
    try:
        return dataclasses.replace(config, **changes)  # type: ignore[arg-type]
    except ValueError as exc:
        raise ConfigError(COMMAND_LINE, "", str(exc)) from exc


def _positive(value: int, flag: str) -> int:
    if value < 1:
        raise ConfigError(COMMAND_LINE, flag, f"expected an integer >= 1, got {value}")
    return value


def parse_limits(values: list[str], flag: str) -> dict[str, int]:
    limits: dict[str, int] = {}
    for value in values:
        queue, sep, number = value.partition("=")
        if not sep or not queue or not number.strip().isdigit():
            raise ConfigError(
                COMMAND_LINE, flag, f"{value!r}: expected QUEUE=N with N an integer >= 0"
            )
        limits[queue] = int(number)
    return limits
