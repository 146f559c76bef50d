"""The dashboard's pages, one module each, in the order of the navigation bar.

A page module defines ``NAV`` (its entry in the bar: ``(path, title)``, or None for a
page reached only by links) and ``ROUTES`` (its Starlette routes: a GET that renders
through ``limitd.web.rendering.render``, and a POST per change, each answering with a
redirect back). Adding a page: a module here and one line in ``PAGES``.
"""

from __future__ import annotations

from types import ModuleType

from starlette.routing import BaseRoute

from limitd.web.views import queues

PAGES: tuple[ModuleType, ...] = (queues,)


def routes() -> list[BaseRoute]:
    return [route for page in PAGES for route in page.ROUTES]


def navigation() -> list[tuple[str, str]]:
    return [page.NAV for page in PAGES if page.NAV is not None]
