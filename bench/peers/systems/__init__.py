"""The benchmarked systems, in the order they run and are reported. Adding a system is a
driver module here (a ``SYSTEMS`` list of ``System``), its job module in ``apps/``, and
its name in ``MODULES``."""

from __future__ import annotations

import importlib

from systems.base import System

MODULES = (
    "limitd_system",
    "floor_system",
    "celery_system",
    "rq_system",
    "dramatiq_system",
    "arq_system",
    "huey_system",
    "saq_system",
    "sidekiq_system",
)


def all_systems() -> list[System]:
    """Every system of every driver module, in ``MODULES`` order."""
    found: list[System] = []
    for name in MODULES:
        found.extend(importlib.import_module(f"systems.{name}").SYSTEMS)
    return found


def by_name(name: str) -> System:
    for system in all_systems():
        if system.name == name:
            return system
    raise KeyError(name)
