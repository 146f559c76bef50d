"""Busy: the live worker processes (host, pid, tag, capsule, busy threads, last beat,
quiet flag) and the jobs they run now, as Sidekiq's Busy page shows them (with, for an
iterable job, its progress: items done, cursor, run and state); per process,
Quiet (take no new jobs), Stop (stop gracefully) and Restart (a rolling restart of its
supervisor: every process it runs replaced, one at a time, by one with the app's code
imported anew).

The actions do not reach the process directly: ``Processes.quiet`` / ``.stop`` leave a
signal in Redis that the process picks up at its next record write (within 5 s), so the
page works from any host that reaches Redis, as the CLI does.
"""

from __future__ import annotations

from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from limitd.api import Processes
from limitd.api.work import running_jobs
from limitd.iteration.admin import iteration_progress_of
from limitd.web.forms import require
from limitd.web.rendering import back, render

ORDER = 30
NAV = ("/busy", "Busy")


def index(request: Request) -> Response:
    redis = request.app.state.redis
    processes = Processes(redis)
    hosts = {process.identity: process for process in processes}
    jobs = running_jobs(list(hosts), redis)
    # One round trip for all: a plain job has no progress hash and is left out.
    jids = list(dict.fromkeys(job.jid for job in jobs if job.jid))
    return render(
        request,
        "busy.html",
        {
            "processes": processes,
            "jobs": jobs,
            "hosts": hosts,
            "progress": iteration_progress_of(jids, redis),
        },
    )


async def quiet(request: Request) -> Response:
    form = await request.form()
    Processes(request.app.state.redis).quiet(require(form, "identity"))
    return back(request, "/busy")


async def stop(request: Request) -> Response:
    form = await request.form()
    Processes(request.app.state.redis).stop(require(form, "identity"))
    return back(request, "/busy")


async def restart(request: Request) -> Response:
    form = await request.form()
    Processes(request.app.state.redis).restart(require(form, "identity"))
    return back(request, "/busy")


ROUTES = [
    Route("/busy", index, name="busy"),
    Route("/busy/quiet", quiet, methods=["POST"]),
    Route("/busy/stop", stop, methods=["POST"]),
    Route("/busy/restart", restart, methods=["POST"]),
]
