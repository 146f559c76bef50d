"""Batches: the newest first with their counts and state, and one batch with its
failures (jid and error) and its callbacks per event, fired or not.

Read-only: ``limitd batches`` changes nothing, so neither does this page. The figures
are the CLI's: the list is ``list_batches`` (what ``limitd batches --json`` prints), one
batch is ``batch_detail`` (the same status, a bounded page of its failures).
"""

from __future__ import annotations

from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from limitd.api import BatchStatus, batch_detail, list_batches
from limitd.batch.admin import state
from limitd.web.rendering import render

ORDER = 70
NAV = ("/batches", "Batches")
LISTED = 50  # batches on the list page, newest first
FAILURES_SHOWN = 100  # failures listed on one batch's page


def state_tag(status: BatchStatus) -> tuple[str, str]:
    """The CLI's state word and the tag class that colours it."""
    word = state(status)
    if status.death_at is not None:
        return word, "bad"
    if status.building or not status.complete:
        return word, "quiet"
    return word, ""


def index(request: Request) -> Response:
    statuses = list_batches(request.app.state.redis, LISTED)
    rows = [(status, *state_tag(status)) for status in statuses]
    return render(request, "batches.html", {"rows": rows, "listed": LISTED})


def show(request: Request) -> Response:
    bid = request.path_params["bid"]
    detail = batch_detail(request.app.state.redis, bid, FAILURES_SHOWN)
    context = {"bid": bid, "detail": detail}
    if detail is None:
        return render(request, "batch.html", context, status=404)
    word, css = state_tag(detail.status)
    return render(request, "batch.html", {**context, "state": word, "state_css": css})


ROUTES = [
    Route("/batches", index, name="batches"),
    Route("/batches/{bid}", show, name="batch"),
]
