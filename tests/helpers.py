"""Helpers for tests that run threads or processes: wait on a condition with a deadline,
never sleep and hope."""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path


def wait_for(
    condition: Callable[[], object], timeout: float = 10.0, message: str = "condition"
) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout}s waiting for {message}")
        time.sleep(0.005)


def running(pid: int) -> bool:
    """Whether ``pid`` still runs: exited processes may linger as zombies (state Z or X)
    until whoever adopted them reaps them, and may vanish while we read."""
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return False
    return state not in ("Z", "X")
