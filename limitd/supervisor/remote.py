"""What an operator asks of a capsule from afar, read back as its process record is
written.

The capsule rewrites its Sidekiq-format process record (``heartbeat.ProcessRecord``)
every ``record_period`` and at every heartbeat; the same round trip pops one signal sent
through the admin API, the dashboard or Sidekiq's own tools (``Process#quiet!``,
``stop!``). ``TSTP`` quiets the capsule; ``TERM`` calls its ``on_remote_stop`` (alone,
a graceful stop of the capsule; under a supervisor, the supervisor's TERM, as if sent by
hand, since this child alone would just be restarted); ``USR2`` calls its
``on_remote_restart`` (a rolling restart, which only a supervisor can run).
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from typing import Protocol

import redis as redis_py

from limitd import keys
from limitd.config import CapsuleConfig
from limitd.fetch import liveness
from limitd.supervisor.heartbeat import ProcessRecord, WorkItem, new_identity

log = logging.getLogger("limitd.capsule")


class Steered(Protocol):
    """What the signals act on: the capsule (whoever runs it may replace the handlers)."""

    on_remote_stop: Callable[[], None]
    on_remote_restart: Callable[[], None]

    def quiet(self) -> None: ...


class RemoteControl:
    """Writes the capsule's process record and obeys the signal that comes back with it.
    The capsule owns one; its heartbeat calls ``write``. Unrefreshed, the record expires
    when the capsule's liveness key would (at least a minute after its last write)."""

    def __init__(
        self,
        capsule: Steered,
        redis: redis_py.Redis,
        config: CapsuleConfig,
        info: dict[str, object],
        work: Callable[[], list[WorkItem]],
    ) -> None:
        identity = new_identity(config.capsule_id, keys.of(redis))
        ttl = liveness.EXPIRY_PERIODS * config.heartbeat_period
        self.record = ProcessRecord(identity, info, work, ttl=ttl)
        self.redis = redis
        self.capsule = capsule

    def write(self) -> None:
        """The process record, then the signal sent from afar, if any."""
        signal = self.record.write(self.redis)
        if signal is not None:
            self.obey(signal)

    def obey(self, signal: str) -> None:
        if signal == "TSTP":
            log.warning("quiet requested from afar (TSTP)")
            self.capsule.quiet()
        elif signal == "TERM":
            log.warning("stop requested from afar (TERM)")
            self.capsule.on_remote_stop()
        elif signal == "USR2":
            log.warning("rolling restart requested from afar (USR2)")
            self.capsule.on_remote_restart()
        else:
            log.error("ignored an unknown signal sent from afar: %r", signal)


def stop_in_background(stop: Callable[[], object]) -> Callable[[], None]:
    """A capsule's own stop, asked from afar: on a thread of its own, since the thread
    that read the signal (the heartbeat's) is one that the stop waits for."""
    return lambda: threading.Thread(target=stop, name="limitd-remote-stop", daemon=True).start()


def no_supervisor() -> None:
    """A rolling restart asked of a capsule that no supervisor runs."""
    log.error("rolling restart requested from afar (USR2), but no supervisor runs this capsule")
