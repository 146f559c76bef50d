"""The capacity feature as registered in ``limitd.features``."""

from limitd.plugins import Feature

CAPACITY = Feature(name="capacity")
