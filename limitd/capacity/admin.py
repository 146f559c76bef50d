"""Limited-capacity jobs for operators: per class, the copies running and queued, the
maximum and the work left as the copies last reported them."""

from __future__ import annotations

from typing import Any

from limitd.capacity.store import CapacityState, read_states

CapacityStatus = CapacityState  # the admin API's name for it, like LimiterStatus


def capacity(redis: Any) -> list[CapacityStatus]:
    """Every limited-capacity class refilled in the last 30 days, by name, in two
    round trips."""
    return read_states(redis)
