"""The dashboard's ASGI application: the pages of ``limitd.web.views``, their static
files, and the guard (auth and CSRF, ``limitd.web.security``) in front of them."""

from __future__ import annotations

import redis as redis_py
from starlette.applications import Starlette
from starlette.middleware import Middleware
from starlette.routing import BaseRoute, Mount
from starlette.staticfiles import StaticFiles

from limitd.config import Config
from limitd.web import views
from limitd.web.rendering import environment
from limitd.web.security import Credentials, Guard

DEFAULT_REFRESH = 2.0  # seconds between live refreshes of a page


def build(
    redis: redis_py.Redis,
    *,
    credentials: Credentials | None = None,
    refresh_seconds: float = DEFAULT_REFRESH,
    config: Config | None = None,
) -> Starlette:
    """The dashboard on ``redis``. ``credentials``: ask for this user and password (HTTP
    Basic); ``refresh_seconds``: how often an open page updates itself; ``config``: the
    app's config, for the pages that read it as their command does with ``-C`` (the
    periodic entries, the tenant fairness settings)."""
    routes: list[BaseRoute] = [
        *views.routes(),
        Mount("/static", StaticFiles(packages=[("limitd.web", "static")]), name="static"),
    ]
    app = Starlette(routes=routes, middleware=[Middleware(Guard, credentials=credentials)])
    app.state.redis = redis
    app.state.config = config
    app.state.templates = environment()
    app.state.refresh_seconds = refresh_seconds
    app.state.navigation = views.navigation()
    return app
