"""Limiters in job code: ``with limitd.Limiter.window("shopify", 100, "minute").within_limit():``.

A feature folder, one module per layer: ``store`` (kinds, definitions, the Lua scripts
that check and take room atomically, statistics), ``middleware`` (server: a job that
lets ``OverLimit`` escape is rescheduled, not failed), ``limiter`` (``limitd.Limiter``,
the waiting), ``admin`` (``limitd.api.limiters()``), ``commands`` (``limitd
limiters``) and ``plug`` (registers the feature). Import ``limitd.Limiter`` rather than
these modules.
"""
