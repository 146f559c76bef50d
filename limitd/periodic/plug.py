"""The periodic feature as registered in ``limitd.features``."""

from limitd.plugins import Feature

PERIODIC = Feature(name="periodic")
