"""What ``within_limit`` decides, apart from how it talks to Redis and sleeps.

The sync form (:mod:`limitd.limiters.limiter`) and the async form
(:mod:`limitd.limiters.aio`) both follow one :class:`Tries`: it builds each try's
script call and reads its reply, and says whether to go in, give up or wait and for how
long. The two forms only carry out what it says, each with its own I/O, so they cannot
drift apart: they admit the same calls, wait the same time and raise the same
``OverLimit``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from limitd import clock, keys
from limitd.limiters import store
from limitd.limiters.store import Call, Definition, OverLimit


@dataclass(frozen=True)
class Pause:
    """Wait ``seconds`` before trying again: blocked on the wake list ``wake_key``
    (BLPOP, cut short by a release) for a concurrent limiter, else a plain sleep."""

    seconds: float
    wake_key: str | None = None


class Tries:
    """One ``within_limit``'s tries for room, from its start to its deadline."""

    def __init__(
        self,
        definition: Definition,
        wait_timeout: float,
        token: str,
        max_block: float,
        layout: keys.KeyLayout,
    ) -> None:
        self.definition = definition
        self.keys = layout  # of the connection the tries are made on
        self.token = token
        self.max_block = max_block  # one BLPOP at most this long
        self.started = clock.monotonic()
        self.deadline = self.started + wait_timeout
        self.attempt = 0
        self.waited = 0.0

    def call(self) -> Call:
        """The next try's script call: the scripts count attempts and the time waited."""
        self.attempt += 1
        self.waited = clock.monotonic() - self.started
        return store.acquire_call(
            self.keys,
            self.definition,
            clock.now(),
            self.token,
            attempt=self.attempt,
            waited=self.waited,
        )

    def after(self, reply: Any) -> Pause | OverLimit | None:
        """What the last try's reply means: None when it took room; the ``OverLimit`` to
        raise (once counted in the statistics) when the deadline has passed; else the
        pause before the next try. The pause is exactly as long as the script says room
        cannot appear, capped by the deadline: no polling."""
        taken, wait = store.acquire_reply(reply)
        if taken:
            return None
        remaining = self.deadline - clock.monotonic()
        if remaining <= 0:
            return OverLimit(self.definition.name, self.definition.kind, self.waited)
        seconds = min(wait, remaining)
        if self.definition.kind != "concurrent":
            return Pause(seconds)
        # BLPOP reads a timeout of 0 as "forever".
        wake = store.wake_key(self.keys, self.definition)
        return Pause(max(0.001, min(seconds, self.max_block)), wake)
