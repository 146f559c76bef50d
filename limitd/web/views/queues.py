"""Queues: size, latency, limits, busy, paused; pause / resume, set and clear limits;
one queue's jobs a page at a time, and deleting one.

The pattern every page follows: a GET view reads through ``limitd.api`` and renders;
each change is a POST that calls the same API and redirects back (``rendering.back``).
"""

from __future__ import annotations

from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from limitd.api import Queue, fair_queue_status, queue_overview
from limitd.web.forms import optional_count, page_number, require
from limitd.web.rendering import back, render

ORDER = 20
NAV = ("/queues", "Queues")
JOBS_PER_PAGE = 25


def index(request: Request) -> Response:
    rows = queue_overview(request.app.state.redis)
    return render(request, "queues.html", {"queues": rows})


def show(request: Request) -> Response:
    queue = Queue(request.path_params["name"], request.app.state.redis)
    number = page_number(request)
    jobs = queue.page((number - 1) * JOBS_PER_PAGE, JOBS_PER_PAGE)
    return render(
        request,
        "queue.html",
        {
            "queue": queue,
            "fair": fair_queue_status(queue.name, redis=request.app.state.redis),
            "size": queue.size(),
            "jobs": jobs,
            "page": number,
            "pages": max(1, -(-queue.size() // JOBS_PER_PAGE)),
        },
    )


def pause(request: Request) -> Response:
    Queue(request.path_params["name"], request.app.state.redis).pause()
    return back(request, "/queues")


def resume(request: Request) -> Response:
    Queue(request.path_params["name"], request.app.state.redis).resume()
    return back(request, "/queues")


async def set_limits(request: Request) -> Response:
    """Both limits from one form; an empty field clears that limit."""
    form = await request.form()
    queue = Queue(request.path_params["name"], request.app.state.redis)
    queue.limit = optional_count(form, "limit")
    queue.process_limit = optional_count(form, "process_limit")
    return back(request, "/queues")


async def delete_job(request: Request) -> Response:
    form = await request.form()
    queue = Queue(request.path_params["name"], request.app.state.redis)
    entry = queue.find_job(require(form, "jid"))
    if entry is not None:
        entry.delete()
    return back(request, f"/queues/{queue.name}")


ROUTES = [
    Route("/queues", index, name="queues"),
    Route("/queues/{name}", show, name="queue"),
    Route("/queues/{name}/pause", pause, methods=["POST"]),
    Route("/queues/{name}/resume", resume, methods=["POST"]),
    Route("/queues/{name}/limits", set_limits, methods=["POST"]),
    Route("/queues/{name}/delete", delete_job, methods=["POST"]),
]
