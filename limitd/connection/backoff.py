"""Pauses between retries while Redis does not answer (a restart, a failover, a network
cut): short at first, so a failover that takes a second costs about a second, then
doubling, so a hundred workers do not hammer a Redis that is down for minutes."""

from __future__ import annotations

import logging
import threading


class Backoff:
    """Counts consecutive failures of one activity (``what``, for the log) and says how
    long to pause after each. Thread-safe."""

    def __init__(
        self, log: logging.Logger, what: str, *, first: float = 0.25, cap: float = 8.0
    ) -> None:
        self.log = log
        self.what = what
        self.first = first
        self.cap = cap
        self.failures = 0
        self._lock = threading.Lock()

    def failed(self, exc: BaseException) -> float:
        """Log the failure with the pause that follows it, and return the pause."""
        with self._lock:
            self.failures += 1
            failures = self.failures
        pause = min(self.cap, self.first * 2 ** (failures - 1))
        self.log.warning(
            "%s failed (%d in a row), retrying in %.2gs: %s", self.what, failures, pause, exc
        )
        return pause

    def succeeded(self) -> None:
        """Call after each success: the first after failures is logged."""
        if not self.failures:  # the common case, without the lock
            return
        with self._lock:
            failures, self.failures = self.failures, 0
        if failures:
            self.log.warning("%s works again after %d failures", self.what, failures)
