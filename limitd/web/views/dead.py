"""Dead: the dead set a page at a time, filtered by job name or payload text, one
entry in full, and the actions on one, several or all of them (see
``limitd.web.sorted_set_pages``, shared with the other set pages)."""

from __future__ import annotations

from limitd.web.sorted_set_pages import DEAD, routes

ORDER = 60
NAV = (DEAD.path, DEAD.title)
ROUTES = routes(DEAD)
