"""Iterable jobs, and cancelling a job.

An iterable job (:class:`limitd.IterableJob`, in ``job.py``) walks many items (rows of a
table, pages of an API) one at a time and keeps its cursor in Redis between them
(``store.py``), so a deploy does not start it over: when its capsule quiets (TERM, a
quiet from the dashboard, a memory recycle), it stops after the item it is on and goes
back to its queue, and the next run resumes after the last item done. A slice limit
(``max_slice_seconds``) makes a long walk give its thread and its queue slot to the
jobs queued behind it now and then.

A cancel (``limitd cancel JID``, ``limitd.api.cancel``) removes a job that waits in a
queue or the schedule, and sets the job's cancel flag: a running iterable job stops
after its current item; a plain job may look (:func:`limitd.cancelled`).

The pieces: ``job.py`` (the base class and its run loop), ``run.py`` (what one run
decides after each item), ``middleware.py`` (the server middleware that binds a run to
its capsule's Redis and quiet), ``store.py`` (the Redis side), ``app.py`` (a job's look
at its cancel flag), ``admin.py`` (progress for the admin API and the dashboard),
``commands.py`` (``limitd cancel``, ``limitd progress``); cancelling itself is
``limitd/api/cancel.py``, beside the queues and sets it searches.

This module is what ``import limitd`` loads of the feature: the names of the iterable
job classes, which the middleware asks about every job it is offered.
"""

from __future__ import annotations

# Wire names of the iterable job classes this process defined: the server middleware
# is concerned with these jobs only.
ITERABLE_CLASSES: set[str] = set()
