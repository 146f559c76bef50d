"""Limited-capacity jobs as a feature: ``limitd.LimitedCapacityJob`` in app code,
``limitd capacity``, and three gauges for ``limitd metrics``. The admin call is
``limitd.capacity.admin.capacity`` (``limitd.api.capacity``)."""

from limitd.capacity.commands import add_capacity_command
from limitd.capacity.metrics import capacity_metrics
from limitd.plugins import Feature

CAPACITY = Feature(name="capacity", add_commands=add_capacity_command, metrics=capacity_metrics)
