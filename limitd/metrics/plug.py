"""The metrics feature as registered in ``limitd.features``."""

from limitd.plugins import Feature

METRICS = Feature(name="metrics")
