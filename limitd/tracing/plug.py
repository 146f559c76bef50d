"""Tracing as a feature: the ``tracing:`` config section and, when it turns tracing on,
the per-process service that adds the tracing middleware to a capsule's chains.

Only the section is imported with ``import limitd``: the service, which imports
OpenTelemetry, is imported by ``limitd start`` when a process starts. App code that
pushes outside ``limitd start`` calls :func:`limitd.tracing.app.instrument`."""

from __future__ import annotations

from collections.abc import Sequence

from limitd.plugins import ConfigSection, Feature, ProcessContext, Service
from limitd.tracing import section


def services(context: ProcessContext) -> Sequence[Service]:
    """The tracing service of a capsule process, when the config turns tracing on."""
    settings = context.section(section.KEY)
    if not isinstance(settings, section.TracingSettings) or not settings.enabled:
        return []  # OpenTelemetry is not even imported
    from limitd.tracing.process import TracingService

    return [TracingService(context)]


TRACING = Feature(
    name="tracing",
    section=ConfigSection(section.KEY, section.read_tracing, section.as_dict),
    process_services=services,
)
