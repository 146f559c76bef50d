"""The job history service of a capsule process: it puts
:class:`~limitd.job_history.middleware.JobHistory` in the capsule's server chain and
writes the tally every ``flush_interval`` seconds from a thread of its own, then once
more when the process stops, after its last job.

A write Redis refuses (down, out of memory, read-only) is logged and its counts go back
into the tally for the next write: the history is late, not lost, as long as the
process lives.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Sequence
from typing import Any

from redis.exceptions import RedisError

from limitd.job_history.middleware import JobHistory
from limitd.job_history.section import KEY, HistorySettings
from limitd.job_history.store import Tally, flush
from limitd.plugins import ProcessContext, Service

log = logging.getLogger("limitd.job_history")
JOIN_TIMEOUT = 2.0


class HistoryWriter:
    """Owns the process's tally and the thread that writes it."""

    def __init__(self, redis: Any, chain: Any, settings: HistorySettings) -> None:
        self.redis = redis
        self.chain = chain
        self.settings = settings
        self.tally = Tally()
        self.middleware = JobHistory(self.tally)
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def start(self) -> None:
        self.chain.prepend(self.middleware)
        self._thread = threading.Thread(
            target=self._run, name="limitd-job-history", daemon=True
        )
        self._thread.start()

    def stop(self) -> None:
        """Stop the thread, then write what the last jobs left (the capsule has
        stopped: nothing is tallied after this)."""
        thread, self._thread = self._thread, None
        if thread is None:
            return
        self._stop.set()
        thread.join(JOIN_TIMEOUT)
        self.write()

    def write(self) -> int:
        """Write the tally now; the number of commands sent (0: nothing, or it failed)."""
        taken = self.tally.take()
        try:
            return flush(self.redis, taken, self.settings.retention)
        except RedisError as exc:
            self.tally.give_back(taken)
            log.warning("could not write the job history (kept for the next write): %s", exc)
            return 0

    def _run(self) -> None:
        while not self._stop.wait(self.settings.flush_interval):
            self.write()


def process_services(context: ProcessContext) -> Sequence[Service]:
    """The writer when the config's ``job_history`` section enables it; nothing otherwise."""
    settings = context.section(KEY)
    if not isinstance(settings, HistorySettings) or not settings.enabled:
        return []
    return [HistoryWriter(context.redis, context.chain, settings)]
