"""The ``tracing:`` config section: whether ``limitd start`` traces the jobs it runs.

::

    tracing:
      enabled: true

No section, or ``enabled: false``: capsule processes add nothing to their chains, so
jobs pay nothing for tracing. Turned on, the processes trace every job they run and
every job those jobs push (see :mod:`limitd.tracing.process`).

Why a switch rather than tracing whenever OpenTelemetry is importable: the API is in
many environments as a dependency of something else, and an app with an SDK set up
for its web requests has not necessarily asked for a span per job (thousands a second
on a busy capsule). Celery's and RQ's instrumentations are opt-in for the same reason.
"""

from __future__ import annotations

import importlib.util
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from limitd.config.values import Section

KEY = "tracing"
TRACING_KEYS = frozenset({"enabled"})
INSTALL_HINT = "pip install 'limitd[otel]'"


@dataclass(frozen=True)
class TracingSettings:
    """``enabled``: whether capsule processes trace their jobs."""

    enabled: bool = False


def read_tracing(section: Section, env: Mapping[str, str]) -> TracingSettings:
    """The ``tracing`` section (``env`` is unused: ``${VAR}`` in the file covers a
    deployment's switch). Turning tracing on without OpenTelemetry's API installed is
    an error here, when the config is read, not a surprise in every capsule later."""
    del env
    section.check_keys(TRACING_KEYS)
    enabled = section.boolean("enabled", False)
    if enabled and not otel_installed():
        raise section.error(
            "enabled", f"expected false: OpenTelemetry's API is not installed ({INSTALL_HINT})"
        )
    return TracingSettings(enabled=enabled)


def otel_installed() -> bool:
    """Whether ``opentelemetry-api`` can be imported (without importing it)."""
    try:
        return importlib.util.find_spec("opentelemetry.trace") is not None
    except ModuleNotFoundError:  # no ``opentelemetry`` namespace at all
        return False


def as_dict(settings: TracingSettings) -> dict[str, Any]:
    """The section as ``limitd check`` prints it (and reads it back)."""
    return {"enabled": settings.enabled}
