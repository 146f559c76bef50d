"""One run of an iterable job: where it resumes, and after each item whether it goes on.

The decisions are in :class:`Run`, written once; the sync and async loops below it
(``run_sync``, ``run_async``, which an iterable job's ``perform`` calls) differ only in
how they call the job and Redis. After each item a run

- stops if its capsule quiets (the job goes back to the front of its queue),
- stops when its slice is used up (``max_slice_seconds``: back to the end of its
  queue, so the jobs queued behind it get their turn),
- saves its cursor (after every item, or every ``save_every_seconds``) and with it
  learns whether the job was cancelled (then it ends, ``cancelled``, not to run again).

The cursor saved is always that of an item whose ``each_item`` returned, so a run that
resumes starts after it: across a graceful stop each item is done exactly once. A
process killed mid-item (SIGKILL, a crash) redoes the items done since the last save:
with the default, at most the one it was on.
"""

from __future__ import annotations

import logging
from collections.abc import AsyncIterable, Awaitable, Iterable
from typing import TYPE_CHECKING, Any

import redis as redis_py

from limitd import clock
from limitd.connection import loop_twin
from limitd.expiry.middleware import JobExpired, check_deadline
from limitd.iteration import store
from limitd.iteration.middleware import binding
from limitd.iteration.store import IterationStore, Resume
from limitd.middleware.chain import Dropped, Interrupted
from limitd.payload import Payload

if TYPE_CHECKING:
    from limitd.iteration.job import IterableJob

log = logging.getLogger("limitd.iteration")

STOPPING, SLICE_USED, CANCELLED = "capsule stopping", "slice used", "cancelled"


class JobCancelled(Dropped):
    """An iterable job that was cancelled stops here: outcome ``cancelled`` (not a
    failure; it does not run again, its batch counts it as done)."""

    def __init__(self, message: str) -> None:
        super().__init__("cancelled", message)


class Run:
    """The state of one run (see the module docstring). ``save_every`` and
    ``max_slice`` come from the job class; without a binding the run keeps nothing and
    never stops early."""

    def __init__(
        self,
        jid: str,
        job_class: str,
        *,
        save_every: float,
        max_slice: float | None,
        payload: Payload | None = None,
    ) -> None:
        self.jid = jid
        self.payload = payload  # for its deadline (``expires_in``), checked before run 1
        self.job_class = job_class
        bound = binding()
        self.redis = bound.redis if bound is not None else None
        self.stopping = bound.stopping if bound is not None else None
        self.store = IterationStore(self.redis, jid, job_class) if bound is not None else None
        self.save_every = save_every
        # A slice yields to the jobs queued behind only where progress is kept to
        # resume from: unbound (a test calling perform), the walk runs to its end.
        self.max_slice = max_slice if bound is not None else None
        self.resume = store.FRESH
        self.items = 0
        self.pending = ""  # the encoded cursor not saved yet ("" when saved)
        self.started = clock.monotonic()
        self.last_save = self.started

    # -- the start ----------------------------------------------------------------

    def started_from(self, resume: Resume) -> bool:
        """Take the state read at the start; False when there is nothing to run (the
        job completed already). A cancelled job raises :class:`JobCancelled`, one that
        expired before its first run ``JobExpired`` (the caller records that)."""
        self.resume = resume
        self.items = resume.items
        if resume.state in (store.COMPLETED, store.EXPIRED):
            log.warning(
                "iterable jid=%s class=%s %s already (run %d): nothing to do",
                self.jid, self.job_class, resume.state, resume.runs,
            )  # fmt: skip
            return False
        if resume.cancelled or resume.state == store.CANCELLED:
            raise JobCancelled(f"job {self.jid} was cancelled before this run started")
        if not resume.state and self.payload is not None:  # not started yet: it may expire
            check_deadline(self.payload, str(self.payload.get("queue", "")))
        return True

    def stop_at_once(self) -> str | None:
        """A run that starts while its capsule quiets goes straight back."""
        return STOPPING if self.stopping is not None and self.stopping.is_set() else None

    # -- after each item ----------------------------------------------------------

    def item_done(self, cursor: Any) -> tuple[str | None, bool]:
        """Count the item and decide: (why the run stops, or None; whether to save now,
        which the caller does with :meth:`save_args`)."""
        self.items += 1
        self.pending = store.encode_cursor(cursor)
        why = self.stop_at_once()
        now = clock.monotonic()
        if why is None and self.max_slice is not None and now - self.started >= self.max_slice:
            why = SLICE_USED
        due = why is not None or now - self.last_save >= self.save_every
        return why, due and self.store is not None

    def save_args(self, state: str) -> tuple[str, int, float, str]:
        """What a save writes (``IterationStore.save``'s arguments)."""
        pending, self.pending = self.pending, ""
        self.last_save = clock.monotonic()
        return pending, self.items, self.runtime(), state

    def runtime(self) -> float:
        return self.resume.runtime + clock.monotonic() - self.started

    # -- the end ------------------------------------------------------------------

    def stopped(self, why: str) -> BaseException:
        """The exception that ends a run stopped early (the caller raises it)."""
        if why == CANCELLED:
            log.warning(
                "cancelled jid=%s class=%s after %d items", self.jid, self.job_class, self.items
            )
            return JobCancelled(f"job {self.jid} was cancelled after {self.items} items")
        log.info(
            "interrupted jid=%s class=%s after %d items (%s): back in line",
            self.jid, self.job_class, self.items, why,
        )  # fmt: skip
        return Interrupted(f"{why} after {self.items} items", back=why == SLICE_USED)

    def end_state(self, why: str | None) -> str:
        """The state a run that ends saves: completed (``why`` None) or why it stopped."""
        if why is None:
            return store.COMPLETED
        return store.CANCELLED if why == CANCELLED else store.INTERRUPTED


# -- the loops ------------------------------------------------------------------


def run_sync(job: IterableJob, args: tuple[Any, ...]) -> None:
    """One run of ``job`` in this thread: start (or resume), walk, end; an early end
    raises what the executor turns into ``interrupted`` or ``cancelled``."""
    run = job._new_run()
    resume = run.store.begin() if run.store is not None else store.FRESH
    try:
        if not run.started_from(resume):
            return
    except JobExpired:
        if run.store is not None:
            run.store.save(*run.save_args(store.EXPIRED))
        raise
    _call_hook(job, job._resumed(run), args)
    why = run.stop_at_once()
    if why is None:
        try:
            why = _walk(job, run, args)
        except Exception:
            _save_failure(run)
            raise
    if why is None:
        _call_hook(job, "on_complete", args)
    why = _save_end(run, why)
    _stop(job, run, why, args)


def _walk(job: IterableJob, run: Run, args: tuple[Any, ...]) -> str | None:
    items = job._items(args, run.resume.cursor)
    if not isinstance(items, Iterable):
        raise TypeError(
            f"{type(job).__name__}.build_items returned no iterable: {items!r} (an async "
            "build_items needs an async each_item, which makes the job an async job)"
        )
    for item, cursor in items:
        job._do(item, args)
        why, save = job._item_done(run, cursor)
        if why is not None:
            return why
        if save and run.store is not None and run.store.save(*run.save_args(store.RUNNING)):
            return CANCELLED
    return None


def _save_end(run: Run, why: str | None) -> str | None:
    """The run's last save; a cancel seen by it turns a stop into a cancel."""
    if run.store is None:
        return why
    cancelled = run.store.save(*run.save_args(run.end_state(why)))
    if cancelled and why in (STOPPING, SLICE_USED):
        run.store.save(*run.save_args(store.CANCELLED))
        return CANCELLED
    return why


def _save_failure(run: Run) -> None:
    """The job raised: keep the cursor of the last item done, so its retry resumes
    there. A save that fails too is logged; the job's own error goes on."""
    if run.store is None:
        return
    try:
        run.store.save(*run.save_args(store.FAILED))
    except redis_py.RedisError:
        log.exception(
            "could not save the progress of failed jid=%s class=%s (%d items): its retry "
            "resumes from the last cursor saved",
            run.jid, run.job_class, run.items,
        )  # fmt: skip


def _stop(job: IterableJob, run: Run, why: str | None, args: tuple[Any, ...]) -> None:
    if why is None:
        return
    _call_hook(job, "on_cancel" if why == CANCELLED else "on_stop", args)
    raise run.stopped(why)


def _call_hook(job: IterableJob, hook: str, args: tuple[Any, ...]) -> Any:
    method = getattr(job, hook, None)
    return method(*args) if method is not None else None


async def run_async(job: IterableJob, args: tuple[Any, ...]) -> None:
    """:func:`run_sync` on the event loop: the same steps, Redis through the loop's
    twin of the capsule's client."""
    run = job._new_run()
    conn = loop_twin(run.redis) if run.redis is not None else None
    resume = await run.store.abegin(conn) if run.store and conn else store.FRESH
    try:
        if not run.started_from(resume):
            return
    except JobExpired:
        if run.store is not None and conn is not None:
            await run.store.asave(conn, *run.save_args(store.EXPIRED))
        raise
    await _maybe(_call_hook(job, job._resumed(run), args))
    why = run.stop_at_once()
    if why is None:
        try:
            why = await _awalk(job, run, args, conn)
        except Exception:
            await _asave_failure(run, conn)
            raise
    if why is None:
        await _maybe(_call_hook(job, "on_complete", args))
    why = await _asave_end(run, why, conn)
    if why is not None:
        await _maybe(_call_hook(job, "on_cancel" if why == CANCELLED else "on_stop", args))
        raise run.stopped(why)


async def _awalk(job: IterableJob, run: Run, args: tuple[Any, ...], conn: Any) -> str | None:
    items = job._items(args, run.resume.cursor)
    async for item, cursor in _each(items):
        await _maybe(job._do(item, args))
        why, save = job._item_done(run, cursor)
        if why is not None:
            return why
        if save and run.store and await run.store.asave(conn, *run.save_args(store.RUNNING)):
            return CANCELLED
    return None


async def _asave_end(run: Run, why: str | None, conn: Any) -> str | None:
    if run.store is None:
        return why
    cancelled = await run.store.asave(conn, *run.save_args(run.end_state(why)))
    if cancelled and why in (STOPPING, SLICE_USED):
        await run.store.asave(conn, *run.save_args(store.CANCELLED))
        return CANCELLED
    return why


async def _asave_failure(run: Run, conn: Any) -> None:
    if run.store is None:
        return
    try:
        await run.store.asave(conn, *run.save_args(store.FAILED))
    except redis_py.RedisError:
        log.exception(
            "could not save the progress of failed jid=%s class=%s (%d items)",
            run.jid, run.job_class, run.items,
        )  # fmt: skip


async def _each(items: Iterable[Any] | AsyncIterable[Any]) -> Any:
    """Items from a sync or an async iterable, alike."""
    if isinstance(items, AsyncIterable):
        async for pair in items:
            yield pair
    elif isinstance(items, Iterable):
        for pair in items:
            yield pair
    else:
        raise TypeError(f"build_items returned neither an iterable nor an async one: {items!r}")


async def _maybe(value: Any) -> Any:
    return await value if isinstance(value, Awaitable) else value
