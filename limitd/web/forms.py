"""Reading the dashboard's forms and query strings: a bad value is a 400 naming the
field and what was expected, never a crash and never a partial change."""

from __future__ import annotations

from starlette.datastructures import FormData
from starlette.exceptions import HTTPException
from starlette.requests import Request

MAX_PAGE = 1_000_000


def require(form: FormData, field: str) -> str:
    value = form.get(field)
    if not isinstance(value, str) or not value:
        raise HTTPException(400, f"{field}: required")
    return value


def optional_count(form: FormData, field: str) -> int | None:
    """A whole number >= 0, or None for an empty field."""
    value = form.get(field)
    if value is None or (isinstance(value, str) and not value.strip()):
        return None
    if not isinstance(value, str) or not value.strip().isdigit():
        raise HTTPException(400, f"{field}: expected a whole number >= 0 or nothing, got {value!r}")
    return int(value)


def page_number(request: Request) -> int:
    raw = request.query_params.get("page", "1")
    if not raw.isdigit() or not 1 <= int(raw) <= MAX_PAGE:
        raise HTTPException(400, f"page: expected a number from 1 to {MAX_PAGE}, got {raw!r}")
    return int(raw)
