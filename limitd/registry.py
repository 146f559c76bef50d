"""Jobs known to this process, by wire name.

The server resolves a payload's ``class`` only here, never by importing a module the
payload names: a job runs only if the code the worker was told to load defined it.
"""

from __future__ import annotations

import importlib
import threading
from collections.abc import Sequence

from limitd.spec import JobSpec


class DuplicateJobName(ValueError):
    """Two different jobs claim the same wire name."""


class JobRegistry:
    """Thread-safe map of wire name -> job spec."""

    def __init__(self) -> None:
        self._jobs: dict[str, JobSpec] = {}
        self._lock = threading.Lock()

    def register(self, spec: JobSpec) -> None:
        """Add a job. Re-defining the same code object (a module re-import) replaces the
        old entry; a different job under an existing name is an error."""
        with self._lock:
            current = self._jobs.get(spec.name)
            if current is not None and current.origin != spec.origin:
                raise DuplicateJobName(
                    f"job name {spec.name!r} is used by both {current.origin} and "
                    f"{spec.origin}; give one of them an explicit name="
                )
            self._jobs[spec.name] = spec

    def resolve(self, name: str) -> JobSpec | None:
        return self._jobs.get(name)

    def names(self) -> list[str]:
        return sorted(self._jobs)

    def has_async(self) -> bool:
        """Whether any registered job is ``async def`` (a capsule then runs a loop)."""
        with self._lock:
            return any(spec.is_async for spec in self._jobs.values())


registry = JobRegistry()


def import_app(modules: Sequence[str]) -> None:
    """Import the modules that define the app's jobs: the only jobs this worker runs."""
    for module in modules:
        try:
            importlib.import_module(module)
        except ImportError as exc:
            raise ImportError(f"cannot import required module {module!r}: {exc}") from exc
