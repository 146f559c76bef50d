"""Process titles, so ``ps`` shows what each limitd process is doing, as it does for
Sidekiq: the supervisor with its tag and children, each capsule with busy/concurrency
and its queues.

A capsule's title follows its work: processors call :meth:`CapsuleTitle.changed` when a
job starts or ends (cheap: it sets an event), and a small thread rewrites the title at
most ten times a second.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Sequence

import setproctitle

MIN_INTERVAL = 0.1
REFRESH = 5.0
TITLE_QUEUES = 20  # queue names a capsule's title shows at most


def set_title(title: str) -> None:
    setproctitle.setproctitle(title)


def supervisor_title(tag: str, children: int, stopping: bool = False) -> str:
    state = " stopping" if stopping else ""
    return f"limitd supervisor{_tag(tag)} [{children} children]{state}"


def capsule_title(
    name: str, tag: str, busy: int, concurrency: int, queues: Sequence[str], *, quiet: bool = False
) -> str:
    state = " quiet" if quiet else ""
    return (
        f"limitd capsule {name}{_tag(tag)} [{busy} of {concurrency} busy]{state} "
        f"queues: {_queue_list(queues)}"
    )


def _queue_list(queues: Sequence[str]) -> str:
    """The first few queues and how many more: a capsule of 10,000 queues would
    otherwise join them all up to ten times a second for a title ps cuts short."""
    if len(queues) <= TITLE_QUEUES:
        return ", ".join(queues)
    return f"{', '.join(queues[:TITLE_QUEUES])} and {len(queues) - TITLE_QUEUES:,} more"


def _tag(tag: str) -> str:
    return f" {tag}" if tag else ""


class CapsuleTitle:
    """Keeps a capsule process's title current."""

    def __init__(self, render: Callable[[], str]) -> None:
        self.render = render
        self._changed = threading.Event()
        self._done = threading.Event()
        self._thread = threading.Thread(target=self._run, name="limitd-title", daemon=True)
        self._current = ""

    def start(self) -> None:
        self._thread.start()

    def changed(self) -> None:
        """Called twice per job by every processor: an Event already set is left alone
        (reading the flag is free; setting it takes the Event's lock)."""
        if not self._changed.is_set():
            self._changed.set()

    def stop(self) -> None:
        self._done.set()
        self._changed.set()

    def _run(self) -> None:
        while not self._done.is_set():
            self._update()
            self._changed.wait(REFRESH)
            self._changed.clear()
            self._done.wait(MIN_INTERVAL)  # coalesce a burst of changes
        self._update()

    def _update(self) -> None:
        title = self.render()
        if title != self._current:
            set_title(title)
            self._current = title
