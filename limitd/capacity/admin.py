"""Limited-capacity jobs for operators: per class, the copies running and queued, the
maximum and the work left as the copies last reported them."""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

from limitd.capacity.store import read_states


@dataclass(frozen=True)
class CapacityStatus:
    """One class. ``max_running_jobs`` and ``remaining_work_count`` are the values read
    by the last refill or copy (None before any); ``updated_at`` is when (epoch
    seconds)."""

    name: str
    running: int
    queued: int
    max_running_jobs: int | None
    remaining_work_count: int | None
    updated_at: float | None

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


def capacity(redis: Any) -> list[CapacityStatus]:
    """Every limited-capacity class used in the last 30 days, by name, in two round
    trips."""
    return [
        CapacityStatus(
            state.name,
            state.running,
            state.queued,
            state.max_running_jobs,
            state.remaining_work_count,
            state.updated_at,
        )
        for state in read_states(redis)
    ]
