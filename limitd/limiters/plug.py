"""Limiters as a feature: ``limitd.Limiter`` in job code, a server middleware that
reschedules a job ``OverLimit`` escapes, and ``limitd limiters``. The admin call is
``limitd.limiters.admin.limiters`` (``limitd.api.limiters``)."""

from limitd.limiters.commands import add_limiters_command
from limitd.limiters.middleware import OverLimitReschedule
from limitd.plugins import Feature

LIMITERS = Feature(
    name="limiters",
    server_middleware=OverLimitReschedule,
    add_commands=add_limiters_command,
)
