"""Keeps the leases of the limited-capacity copies this process runs.

A running copy's place is a lease (see :mod:`limitd.capacity.store`), so a copy killed
by SIGKILL frees its place by itself: it stops renewing. While a copy runs, one daemon
thread per process renews every lease the process holds, a third of the shortest lease
before it runs out, in one script call per class. A copy can therefore run far longer
than its lease; only a process that stops running Python for a whole lease (stopped,
or a C call that holds the GIL) loses its places, and then at most one more copy may
start than ``max_running_jobs`` until it finishes.
"""

from __future__ import annotations

import logging
import math
import os
import threading
import time
from collections import defaultdict

import redis as redis_py

from limitd.capacity.store import CapacityStore

log = logging.getLogger("limitd.capacity")


class LeaseKeeper:
    """The process's renewal thread, started on the first lease it is given."""

    def __init__(self) -> None:
        self._held: dict[tuple[int, str], tuple[CapacityStore, set[str]]] = {}
        self._lock = threading.Lock()
        self._changed = threading.Event()
        self._thread: threading.Thread | None = None

    def hold(self, store: CapacityStore, jid: str) -> None:
        """Renew ``jid``'s lease until :meth:`drop`."""
        with self._lock:
            key = (id(store.redis), store.name)
            entry = self._held.setdefault(key, (store, set()))
            entry[1].add(jid)
            if self._thread is None or not self._thread.is_alive():
                self._thread = threading.Thread(
                    target=self._run, name="limitd-capacity-leases", daemon=True
                )
                self._thread.start()
        self._changed.set()

    def drop(self, store: CapacityStore, jid: str) -> None:
        with self._lock:
            key = (id(store.redis), store.name)
            entry = self._held.get(key)
            if entry is not None:
                entry[1].discard(jid)
                if not entry[1]:
                    del self._held[key]

    def held(self) -> dict[str, set[str]]:
        """Class name -> jids whose leases this process renews (for tests and dumps)."""
        with self._lock:
            merged: dict[str, set[str]] = defaultdict(set)
            for store, jids in self._held.values():
                merged[store.name] |= jids
            return dict(merged)

    def _run(self) -> None:
        """Renew every ``lease / 3`` (the shortest held). A new hold only brings the
        next renewal closer when its lease is shorter: a fresh lease needs none yet.
        Real monotonic time paces the thread; the deadlines written use limitd.clock."""
        next_at = math.inf
        while True:
            timeout = None if next_at == math.inf else max(0.0, next_at - time.monotonic())
            changed = self._changed.wait(timeout)
            self._changed.clear()
            with self._lock:
                entries = [(store, sorted(jids)) for store, jids in self._held.values()]
            if not entries:
                next_at = math.inf
                continue
            period = min(store.timing.lease for store, _ in entries) / 3
            now = time.monotonic()
            if changed and now < next_at:
                next_at = min(next_at, now + period)
                continue
            self._renew(entries)
            next_at = now + period

    @staticmethod
    def _renew(entries: list[tuple[CapacityStore, list[str]]]) -> None:
        for store, jids in entries:
            try:
                renewed = store.renew(jids)
            except redis_py.RedisError as exc:
                log.warning("could not renew %d leases of class=%s: %s", len(jids), store.name, exc)
                continue
            if renewed < len(jids):
                log.warning(
                    "%d of %d copies of class=%s lost their place (lease ran out)",
                    len(jids) - renewed,
                    len(jids),
                    store.name,
                )


keeper = LeaseKeeper()


def _reset_after_fork() -> None:
    """A forked child inherits the held set but not the thread: start afresh."""
    global keeper
    keeper = LeaseKeeper()


os.register_at_fork(after_in_child=_reset_after_fork)
