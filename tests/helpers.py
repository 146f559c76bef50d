"""Helpers for tests that run threads or processes: wait on a condition with a deadline,
never sleep and hope."""

from __future__ import annotations

import time
from collections.abc import Callable


def wait_for(
    condition: Callable[[], object], timeout: float = 10.0, message: str = "condition"
) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout}s waiting for {message}")
        time.sleep(0.005)
