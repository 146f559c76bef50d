"""Who may use the dashboard, and proof that a change came from its own pages.

- **Auth** (optional; required by ``limitd web`` when it listens beyond loopback): HTTP
  Basic with one user and password. The browser asks once and resends it with every
  request, so no session store is needed.
- **CSRF**: a random token in a cookie (``SameSite=Strict``, not readable by scripts)
  and the same token in every form the pages render. A POST whose form field (or
  ``X-CSRF-Token`` header) does not match the cookie is refused with 403 before any
  handler runs; GET, HEAD and OPTIONS never change anything, so they need no token.
"""

from __future__ import annotations

import secrets

from starlette.datastructures import MutableHeaders
from starlette.requests import Request
from starlette.responses import PlainTextResponse, Response
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from limitd.web.credentials import Credentials

CSRF_COOKIE = "limitd_csrf"
CSRF_FIELD = "csrf"
CSRF_HEADER = "x-csrf-token"
SAFE_METHODS = frozenset({"GET", "HEAD", "OPTIONS"})


def csrf_token(request: Request) -> str:
    """The token the page's forms carry (set as a cookie by :class:`Guard`)."""
    return str(request.scope["limitd.csrf"])


class Guard:
    """ASGI middleware: Basic auth when configured, then the CSRF check on changes."""

    def __init__(self, app: ASGIApp, credentials: Credentials | None = None) -> None:
        self.app = app
        self.credentials = credentials

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        request = Request(scope, receive)
        if self.credentials is not None and not self.credentials.admits(
            request.headers.get("authorization")
        ):
            await _unauthorized()(scope, receive, send)
            return
        cookie = request.cookies.get(CSRF_COOKIE)
        token = cookie if cookie and len(cookie) == 64 else secrets.token_hex(32)
        scope["limitd.csrf"] = token
        if request.method not in SAFE_METHODS:
            body = await request.body()  # read once, kept for the form and the handler
            offered = request.headers.get(CSRF_HEADER) or await _form_token(request)
            if not cookie or not offered or not secrets.compare_digest(offered, cookie):
                await PlainTextResponse("missing or wrong CSRF token", 403)(scope, receive, send)
                return
            receive = _replay(body)
        await self.app(scope, receive, _setting_cookie(send, token, fresh=token != cookie))


async def _form_token(request: Request) -> str | None:
    if not request.headers.get("content-type", "").startswith(
        ("application/x-www-form-urlencoded", "multipart/form-data")
    ):
        return None
    form = await request.form()
    value = form.get(CSRF_FIELD)
    return value if isinstance(value, str) else None


def _replay(body: bytes) -> Receive:
    """A receive callable that hands the already-read body to the handler."""
    sent = False

    async def receive() -> Message:
        nonlocal sent
        if sent:
            return {"type": "http.disconnect"}
        sent = True
        return {"type": "http.request", "body": body, "more_body": False}

    return receive


def _setting_cookie(send: Send, token: str, *, fresh: bool) -> Send:
    if not fresh:
        return send

    async def wrapped(message: Message) -> None:
        if message["type"] == "http.response.start":
            headers = MutableHeaders(scope=message)
            headers.append(
                "set-cookie",
                f"{CSRF_COOKIE}={token}; Path=/; HttpOnly; SameSite=Strict",
            )
        await send(message)

    return wrapped


def _unauthorized() -> Response:
    return PlainTextResponse(
        "authentication required", 401, headers={"WWW-Authenticate": 'Basic realm="limitd"'}
    )
