"""``limitd web``: a dashboard to watch and steer what limitd keeps in Redis.

Run it with ``limitd web conf/app.yml`` (see ``limitd.web.commands``), or mount it in
an ASGI app of your own::

    from limitd.web import app, wsgi_app
    dashboard = app(redis)                        # a Starlette (ASGI) application
    main_app.mount("/limitd", dashboard)
    flask_or_django_wsgi = wsgi_app(redis)        # the same, as a WSGI application

Every figure it shows is read through ``limitd.api`` (as the CLI's ``--json`` reads
them), and every change is a POST through the same calls the CLI makes. It needs the
``web`` extra (``pip install 'limitd[web]'``): importing this package does not, so the
command line loads without it.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import redis as redis_py
    from a2wsgi import ASGIMiddleware
    from starlette.applications import Starlette


def app(redis: redis_py.Redis, **options: Any) -> Starlette:
    """The dashboard as an ASGI application on ``redis`` (options: see
    ``limitd.web.application.build``)."""
    from limitd.web.application import build

    return build(redis, **options)


def wsgi_app(redis: redis_py.Redis, **options: Any) -> ASGIMiddleware:
    """The dashboard as a WSGI application, for Flask, Django or any WSGI server
    (a2wsgi runs the ASGI app on an event loop of its own)."""
    from a2wsgi import ASGIMiddleware

    return ASGIMiddleware(app(redis, **options))  # type: ignore[arg-type]
