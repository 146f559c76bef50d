"""Prometheus metrics as a feature: the ``metrics:`` config section (and the check that
every process gets a port), the per-process job metrics service, and ``limitd
metrics``, the cluster exporter. Features add their families to the exporter with
their own ``Feature.metrics``."""

from limitd.metrics import section
from limitd.metrics.commands import add_metrics_command
from limitd.metrics.process import process_services
from limitd.plugins import ConfigSection, Feature

METRICS = Feature(
    name="metrics",
    section=ConfigSection(section.KEY, section.read_metrics, section.as_dict),
    add_commands=add_metrics_command,
    check_app=section.check_ports,
    process_services=process_services,
)
