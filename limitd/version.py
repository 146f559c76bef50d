"""The package version, at the bottom so that any layer may report it."""

__version__ = "0.1.0"
