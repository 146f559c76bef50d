"""Tracing with OpenTelemetry: a span for every push and every run, and the trace
context carried in the payload from one to the other (see ``docs/tracing.md``).

Optional: needs the ``otel`` extra (``opentelemetry-api``) and is turned on by the
``tracing:`` config section (``limitd start``) or by
:func:`limitd.tracing.app.instrument` (app code). ``import limitd`` loads only the
section and the plug, never OpenTelemetry.
"""
