"""The base class of iterable jobs, and their run loop::

    class BackfillAvatars(limitd.IterableJob, queue="migrations"):
        def build_items(self, team_id, *, cursor):
            # the items after ``cursor`` (None: from the start), each with its cursor
            rows = db.execute(
                "SELECT id, email FROM users WHERE team_id = %s AND id > %s ORDER BY id",
                (team_id, cursor or 0),
            )
            return ((row, row.id) for row in rows)

        def each_item(self, row, team_id):
            store_avatar(row.id, fetch_gravatar(row.email))

    BackfillAvatars.perform_async(42)

``build_items(*args, cursor=...)`` returns an iterable (or async iterable) of ``(item,
cursor)`` pairs: the cursor of an item is where the walk resumes *after* it, a JSON
value (an id, an offset, a page token...). ``each_item(item, *args)`` does the work of
one item. Both may be ``async def`` (an async ``each_item`` makes the job an async job,
run on the capsule's event loop). Helpers build items from a list or a range
(:func:`items_of`, :func:`numbers`). Optional hooks, with the job's arguments:
``on_start`` (first run), ``on_resume`` (a later run), ``on_stop`` (a run stopped early:
a quiet, or its slice used up), ``on_complete`` (the last item done), ``on_cancel``.

The class attributes ``max_slice_seconds`` (None: no slice) and ``save_every_seconds``
(0: after every item) tune a run (see ``run.py``). During a run the instance has
``cursor`` (the cursor of the last item done), ``items_done`` and ``run_number``.
"""

from __future__ import annotations

import inspect
from collections.abc import Iterable
from typing import TYPE_CHECKING, Any, ClassVar

from limitd.iteration import ITERABLE_CLASSES
from limitd.job import Job

if TYPE_CHECKING:
    from limitd.iteration.run import Run

class IterableJob(Job, abstract=True):
    """Base class of iterable jobs (see the module docstring): define ``build_items``
    and ``each_item``, not ``perform``."""

    max_slice_seconds: ClassVar[float | None] = None
    save_every_seconds: ClassVar[float] = 0.0

    cursor: Any = None
    items_done: int = 0
    run_number: int = 0

    def __init_subclass__(
        cls, name: str | None = None, abstract: bool = False, **job_options: Any
    ) -> None:
        if not abstract:
            cls.perform = _perform_for(cls)  # type: ignore[method-assign]
        super().__init_subclass__(name=name, abstract=abstract, **job_options)
        if not abstract:
            ITERABLE_CLASSES.add(cls.spec.name)

    # ``build_items`` and ``each_item`` are the subclass's, with its own parameters: not
    # declared here, so that a type checker takes each class's as they are written.

    if TYPE_CHECKING:  # what type checkers see of the generated ``perform``

        def perform(self, *args: Any, **kwargs: Any) -> Any: ...

    def _items(self, args: tuple[Any, ...], cursor: Any) -> Any:
        """The subclass's ``build_items`` (which type checkers know by its own
        parameters, the base class declaring none)."""
        return self.build_items(*args, cursor=cursor)  # type: ignore[attr-defined]

    def _do(self, item: Any, args: tuple[Any, ...]) -> Any:
        """The subclass's ``each_item``."""
        return self.each_item(item, *args)  # type: ignore[attr-defined]

    def _new_run(self) -> Run:
        from limitd.iteration.run import Run

        name = str(self.payload.get("class", type(self).__name__))
        return Run(
            self.jid,
            name,
            save_every=float(self.save_every_seconds),
            max_slice=self.max_slice_seconds,
            payload=self.payload,
        )

    def _resumed(self, run: Run) -> str:
        """Set the instance's progress from where the run resumes; the hook to call."""
        self.cursor = run.resume.cursor
        self.items_done = run.items
        self.run_number = run.resume.runs
        return "on_resume" if run.resume.state else "on_start"

    def _item_done(self, run: Run, cursor: Any) -> tuple[str | None, bool]:
        self.cursor = cursor
        why, save = run.item_done(cursor)
        self.items_done = run.items
        return why, save


def items_of(items: Iterable[Any], cursor: int | None) -> Iterable[tuple[Any, int]]:
    """``build_items`` for a list (or any iterable in a stable order): each item with
    its index as its cursor, from the one after ``cursor``."""
    start = 0 if cursor is None else int(cursor) + 1
    for index, item in enumerate(items):
        if index >= start:
            yield item, index


def numbers(start: int, stop: int, cursor: int | None) -> Iterable[tuple[int, int]]:
    """``build_items`` for ``range(start, stop)``: each number is its own cursor."""
    first = start if cursor is None else int(cursor) + 1
    return ((n, n) for n in range(first, stop))


# -- perform ------------------------------------------------------------------------


def _perform_for(cls: type[IterableJob]) -> Any:
    """The ``perform`` of an iterable job class: sync or async as its ``each_item``, with
    ``build_items``' parameters less ``cursor`` (enqueue calls place keyword arguments
    by them)."""
    _check_class(cls)
    is_async = inspect.iscoroutinefunction(cls.each_item)  # type: ignore[attr-defined]

    def perform(self: IterableJob, *args: Any) -> None:
        from limitd.iteration.run import run_sync

        run_sync(self, args)

    async def perform_async(self: IterableJob, *args: Any) -> None:
        from limitd.iteration.run import run_async

        await run_async(self, args)

    chosen: Any = perform_async if is_async else perform
    signature = inspect.signature(cls.build_items)  # type: ignore[attr-defined]
    params = [p for p in signature.parameters.values() if p.name != "cursor"]
    chosen.__signature__ = signature.replace(parameters=params)
    chosen.__qualname__ = f"{cls.__qualname__}.perform"
    return chosen


def _check_class(cls: type[IterableJob]) -> None:
    where = f"iterable job class {cls.__qualname__}"
    if "perform" in vars(cls):
        raise TypeError(f"{where} defines perform: define build_items and each_item instead")
    for method in ("build_items", "each_item"):
        if not callable(getattr(cls, method, None)):
            raise TypeError(f"{where} must define {method}")
    if "cursor" not in inspect.signature(cls.build_items).parameters:  # type: ignore[attr-defined]
        raise TypeError(f"{where}: build_items must take a cursor keyword argument")
