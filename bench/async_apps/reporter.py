"""Counts kept in a worker process and sent to Redis by one thread of that process, so
that a benchmark's job costs no I/O to say it started or finished. Used by tally.py
(bench/async_io.py's jobs) and by bench/capsule_memory.py's app."""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Callable
from typing import Any

Counts = dict[str, int]


class Reporter:
    """``count(name)`` from any thread; a reporter thread, one per process and started by
    the first count after a fork, calls ``send(client, counts, sent_before)`` every
    ``every`` seconds while the counts changed, on a client it made with ``connect()``."""

    def __init__(
        self,
        connect: Callable[[], Any],
        send: Callable[[Any, Counts, Counts], object],
        every: float,
        *names: str,
    ) -> None:
        self._connect, self._send, self._every = connect, send, every
        self._lock = threading.Lock()
        self._counts: Counts = dict.fromkeys(names, 0)
        self._pid = 0

    def count(self, name: str) -> None:
        with self._lock:
            self._counts[name] += 1
        if self._pid != os.getpid():
            self._start()

    def _start(self) -> None:
        with self._lock:
            if self._pid == os.getpid():
                return
            self._pid = os.getpid()
        threading.Thread(target=self._run, name="bench-reporter", daemon=True).start()

    def _run(self) -> None:
        client = self._connect()
        sent = dict.fromkeys(self._counts, 0)
        while True:
            time.sleep(self._every)
            with self._lock:
                current = dict(self._counts)
            if current != sent:
                self._send(client, current, sent)
                sent = current
