"""The dashboard's pages, one module each, found here by name.

A page module defines ``ORDER`` (its place in the navigation bar, and the order routes
are tried), ``NAV`` (its entry in the bar: ``(path, title)``, or None for a page reached
only by links) and ``ROUTES`` (its Starlette routes: a GET that renders through
``limitd.web.rendering.render``, and a POST per change, each answering with a redirect
back). GET views are plain functions: Starlette runs them in its thread pool, so their
blocking Redis calls never hold up the server's event loop. Adding a page is adding a
module: nothing else lists them.
"""

from __future__ import annotations

import importlib
import pkgutil
from types import ModuleType

from starlette.routing import BaseRoute


def pages() -> list[ModuleType]:
    found = [
        importlib.import_module(f"{__name__}.{info.name}")
        for info in pkgutil.iter_modules(__path__)
        if not info.name.startswith("_")
    ]
    return sorted(found, key=lambda page: (page.ORDER, page.__name__))


def routes() -> list[BaseRoute]:
    return [route for page in pages() for route in page.ROUTES]


def navigation() -> list[tuple[str, str]]:
    return [page.NAV for page in pages() if page.NAV is not None]
