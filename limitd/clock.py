"""The one place limitd reads the wall clock.

Every timestamp written to Redis (created_at, enqueued_at, retry and schedule scores)
comes from :func:`now`, so a test that freezes ``time.time`` (freezegun) controls all of
them, and Lua scripts receive "now" as an argument instead of asking the server.
Deadlines and intervals use :func:`monotonic`, which never jumps with NTP.
"""

from __future__ import annotations

import time


def now() -> float:
    """Current epoch time in float seconds, the unit limitd writes to Redis."""
    return time.time()


def monotonic() -> float:
    """A clock for measuring intervals and deadlines inside one process."""
    return time.monotonic()
