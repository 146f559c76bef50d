"""A capsule process that imports the app anew: what a rolling restart starts.

The supervisor forks and execs ``python -m limitd.commands.fresh`` with, in the
``LIMITD_FRESH_CAPSULE`` environment variable, what ``limitd start`` was given (config
files, flags, the Redis URL), a digest of the configuration it runs, and this process's
capsule, capsule id and readiness pipe (see ``limitd.supervisor.spawn``). The process
reads the files again, imports the app's modules as they are now on disk, runs its one
capsule, and writes on the pipe once that capsule runs.

Anything that goes wrong before (the new code fails to import, the files no longer give
the supervisor's configuration) ends the process with status 78 and a line saying why,
before it has taken any job: the supervisor then stops the roll and keeps the processes
it has. A changed configuration is refused rather than half applied: the supervisor's
own settings (timeouts, heartbeat, memory limits, capsule list) would disagree with it.
"""

from __future__ import annotations

import argparse
import dataclasses
import functools
import json
import logging
import os
import sys
import traceback
from typing import Any

from limitd.commands.start import (
    EX_CONFIG,
    config_digest,
    configure_logging,
    run_capsule,
)
from limitd.commands.start_flags import apply_flags
from limitd.config import CapsuleConfig, Config, app_modules, check_app, load_config
from limitd.registry import import_app
from limitd.supervisor.signals import die_with_parent
from limitd.supervisor.spawn import FRESH_ENV, report_ready

log = logging.getLogger("limitd.cli")


def main() -> int:
    settings: dict[str, Any] = json.loads(os.environ.pop(FRESH_ENV, "{}") or "{}")
    if "supervisor" not in settings:
        print("limitd: this module is started by the limitd supervisor only", file=sys.stderr)
        return EX_CONFIG
    ready_fd = int(settings["ready_fd"])
    os.set_inheritable(ready_fd, False)  # not for what the app or its jobs start
    die_with_parent()
    if os.getppid() != settings["supervisor"]:
        return 0  # the supervisor is gone already
    sys.path.insert(0, os.getcwd())
    config = load_anew(settings)
    if config is None:
        return EX_CONFIG
    capsule = capsule_config(config, settings)
    if capsule is None:
        return EX_CONFIG
    ready = functools.partial(report_ready, ready_fd)
    return run_capsule(capsule, config.redis, settings["url"], config.sections, ready=ready)


def load_anew(settings: dict[str, Any]) -> Config | None:
    """The configuration from the files, the app imported as it is now; None (said on
    stderr) if either fails: any exception the new code raises, not only ImportError."""
    capsule = settings.get("capsule", "?")
    try:
        config = apply_flags(
            load_config(settings["files"]), argparse.Namespace(**settings["flags"])
        )
        import_app(app_modules(config))
        check_app(config)
    except Exception as exc:  # the new code's fault, whatever it is: the roll stops
        reason = "".join(traceback.format_exception_only(exc)).strip()
        print(f"limitd: new process of capsule {capsule} cannot start: {reason}", file=sys.stderr)
        return None
    configure_logging(config, verbose=settings.get("verbose", False))
    if config_digest(config) != settings["digest"]:
        log.error(
            "new process of capsule %s cannot start: the config files changed since the "
            "supervisor started; a rolling restart loads new code, not new config: "
            "restart limitd to apply them",
            capsule,
        )
        return None
    return config


def capsule_config(config: Config, settings: dict[str, Any]) -> CapsuleConfig | None:
    """This process's capsule, with the id the supervisor vouches for."""
    spec = next((s for s in config.capsules if s.config.name == settings["capsule"]), None)
    if spec is None:  # the digest matched, so this would be a supervisor bug
        log.error("new process: no capsule %r in the config", settings["capsule"])
        return None
    return dataclasses.replace(
        spec.config,
        capsule_id=settings["capsule_id"],
        process_number=settings["process_number"],
        # a supervisor older than the setting does not say: auto then pins as for one
        process_count=settings.get("process_count", 1),
    )


if __name__ == "__main__":
    sys.exit(main())
