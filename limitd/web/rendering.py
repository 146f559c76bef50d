"""Pages from Jinja2 templates, whole or only their live part.

Every page template extends ``base.html`` and puts what changes in ``{% block live %}``.
The browser's script (``static/limitd.js``) asks for the page's own URL again every few
seconds with an ``X-Limitd-Live`` header and gets that block alone, so a page refreshes
without a reload and without an API of its own: the figures come from the same view.

Autoescaping is on for every template: job arguments are user data, and a ``<script>``
in one must show as text.
"""

from __future__ import annotations

import datetime as dt
import json
from collections.abc import Mapping
from typing import Any

from jinja2 import Environment, PackageLoader, select_autoescape
from starlette.datastructures import FormData
from starlette.requests import Request
from starlette.responses import HTMLResponse, RedirectResponse, Response

from limitd import clock
from limitd.web.security import csrf_token

LIVE_HEADER = "x-limitd-live"
ARGS_SHOWN = 120  # characters of a job's arguments in lists


def environment() -> Environment:
    env = Environment(
        loader=PackageLoader("limitd.web", "templates"),
        autoescape=select_autoescape(default=True, default_for_string=True),
        trim_blocks=True,
        lstrip_blocks=True,
    )
    env.filters.update(
        ago=ago, when=when, args=short_args, number=number, seconds=seconds, full_json=full_json
    )
    # The shared macros as globals: a page's live block is rendered on its own, without
    # the imports at the top of its template.
    macros = env.get_template("macros.html").module
    env.globals.update(post=macros.post, pager=macros.pager)  # type: ignore[attr-defined]
    return env


def render(
    request: Request, template: str, context: Mapping[str, Any], status: int = 200
) -> Response:
    """The page, or its live block when the page's script asks for it."""
    env: Environment = request.app.state.templates
    page = env.get_template(template)
    values = {
        "request": request,
        "csrf": csrf_token(request),
        "root": root_of(request),
        "refresh": request.app.state.refresh_seconds,
        **context,
    }
    if request.headers.get(LIVE_HEADER):
        block = page.blocks["live"]
        return HTMLResponse("".join(block(page.new_context(values))), status)
    return HTMLResponse(page.render(values), status)


def back(request: Request, fallback: str, form: FormData | None = None) -> Response:
    """After a change: to the page it came from (POST, then redirect, then GET), named
    by the form's ``next`` field (or a ``next`` query parameter), else ``fallback``."""
    given = form.get("next") if form is not None else None
    target = (given if isinstance(given, str) else None) or request.query_params.get("next")
    target = target or fallback
    if not target.startswith("/") or target.startswith("//") or "\\" in target:
        target = fallback  # only paths of this site: "//host" would leave it
    return RedirectResponse(root_of(request) + target, status_code=303)


def root_of(request: Request) -> str:
    """Where the dashboard is mounted ("" at the root of its own server): every link and
    redirect starts with it."""
    return str(request.scope.get("root_path", ""))


def ago(epoch: float | None) -> str:
    """``3 s ago``, ``5 min ago``... for timestamps from Redis."""
    if not epoch:
        return "-"
    return seconds(max(0.0, clock.now() - float(epoch))) + " ago"


def seconds(value: float | None) -> str:
    if value is None:
        return "-"
    value = float(value)
    if value < 1:
        return f"{value * 1000:.0f} ms"
    if value < 120:
        return f"{value:.0f} s"
    if value < 7200:
        return f"{value / 60:.0f} min"
    if value < 172800:
        return f"{value / 3600:.0f} h"
    return f"{value / 86400:.0f} d"


def when(epoch: float | None) -> str:
    if not epoch:
        return "-"
    return dt.datetime.fromtimestamp(float(epoch), dt.timezone.utc).strftime("%Y-%m-%d %H:%M:%S")


def short_args(args: Any, limit: int = ARGS_SHOWN) -> str:
    """A job's arguments as JSON, cut to ``limit`` characters for lists."""
    text = json.dumps(args, ensure_ascii=False, default=str)
    return text if len(text) <= limit else text[: limit - 1] + "…"


def full_json(value: Any) -> str:
    return json.dumps(value, ensure_ascii=False, indent=2, default=str, sort_keys=True)


def number(value: float | int | None) -> str:
    return "-" if value is None else f"{value:,}"
