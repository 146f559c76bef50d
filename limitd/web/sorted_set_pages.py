"""What the Retries, Scheduled and Dead pages share: the three sets hold the same thing
(payloads scored by a time), so one list, one detail view and one set of actions serve
all three, described by a ``SetPage``.

A list is a page of 25 read by offset (one ZRANGE), or, with a filter by job name or
payload text, a bounded scan (``SortedSet.filtered_page``) that says when more may
match. A row names its entry by score and jid (``token``): acting on it removes exactly
the entry the operator saw, never another with the same jid, nor one that moved since.
Entries with no jid (malformed payloads) are named by score and a digest of their
bytes, so they can still be deleted or killed.
"""

from __future__ import annotations

import base64
import binascii
import dataclasses
import hashlib
import json
import zlib
from typing import Any
from urllib.parse import quote, urlencode

from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from limitd import clock
from limitd.api import DeadSet, PendingEntry, PendingSet, RetrySet, ScheduledSet, SortedEntry
from limitd.api.sorted_sets import EntryFilter, SortedSet
from limitd.web.forms import page_number
from limitd.web.rendering import back, render, root_of, seconds

PER_PAGE = 25
MESSAGE_SHOWN = 160  # characters of an error message in lists
FILTER_SHOWN = 200  # longest filter value accepted (a scan pattern, not a query language)
DIGEST = "#"  # a token's name part starting with this is a digest, not a jid


@dataclasses.dataclass(frozen=True)
class SetPage:
    """One set as the dashboard shows it. ``ascending``: soonest first (the schedule);
    else newest first. ``errors``: its entries failed, so rows show the error and the
    retry count. ``when``: the heading of the score's column; ``order``: how the list
    is sorted, in words."""

    path: str
    title: str
    label: str
    set_class: type[SortedSet[Any]]
    ascending: bool
    errors: bool
    when: str
    order: str

    @property
    def can_kill(self) -> bool:
        return issubclass(self.set_class, PendingSet)

    def open(self, request: Request) -> SortedSet[Any]:
        return self.set_class(request.app.state.redis)


RETRIES = SetPage(
    "/retries", "Retries", "retry set", RetrySet, False, True, "next retry", "latest due first"
)
SCHEDULED = SetPage(
    "/scheduled", "Scheduled", "scheduled set", ScheduledSet, True, False, "runs", "soonest first"
)
DEAD = SetPage("/dead", "Dead", "dead set", DeadSet, False, True, "died", "newest first")


@dataclasses.dataclass(frozen=True)
class Row:
    """One entry as a row: what the template shows, nothing it has to compute."""

    token: str
    jid: str | None
    klass: str | None
    args: Any
    queue: str | None
    at: float
    relative: str
    error: str | None
    retry_count: int | None
    malformed: bool
    detail: str | None


def token_of(entry: SortedEntry) -> str:
    """``<score> <jid>``, or ``<score> #<digest>`` for an entry without a jid."""
    name = entry.jid if entry.jid is not None else DIGEST + _digest(entry.raw)
    return f"{entry.score!r} {name}"


def resolve(zset: SortedSet[Any], token: str) -> SortedEntry | None:
    """The entry a token names, if it is still in the set at that score."""
    score_text, _, name = token.partition(" ")
    try:
        score = float(score_text)
    except ValueError:
        raise HTTPException(400, f"entry: not an entry of this page: {token!r}") from None
    if not name.startswith(DIGEST):
        return zset.find_job(name, score)
    digest = name.removeprefix(DIGEST)
    return next((e for e in zset.entries_at(score) if _digest(e.raw) == digest), None)


def row_of(kind: SetPage, entry: SortedEntry, root: str) -> Row:
    error = ": ".join(part for part in (entry.error_class, entry.error_message) if part)
    if len(error) > MESSAGE_SHOWN:
        error = error[: MESSAGE_SHOWN - 1] + "…"
    detail = None
    if entry.jid is not None:
        query = urlencode({"score": repr(entry.score)})
        detail = f"{root}{kind.path}/{quote(entry.jid, safe='')}?{query}"
    return Row(
        token=token_of(entry),
        jid=entry.jid,
        klass=entry.klass,
        args=entry.args if entry.payload is not None else entry.text,
        queue=entry.queue,
        at=entry.score,
        relative=relative(entry.score),
        error=error or None,
        retry_count=entry.retry_count,
        malformed=entry.payload is None,
        detail=detail,
    )


def relative(epoch: float) -> str:
    """``in 5 min`` or ``5 min ago``: the schedule and retries lie ahead, the dead behind."""
    delta = epoch - clock.now()
    return f"in {seconds(delta)}" if delta >= 0 else f"{seconds(-delta)} ago"


def filter_of(values: Any) -> EntryFilter:
    """The ``name`` and ``text`` filter from a query string or a form."""
    name, text = _filter_value(values, "name"), _filter_value(values, "text")
    return EntryFilter(name=name, text=text)


def backtrace_of(entry: SortedEntry) -> list[str] | None:
    """The error backtrace if the payload kept one: a list of lines, or as Sidekiq 6+
    writes it (base64 of zlib-compressed JSON). limitd itself keeps none."""
    kept = entry.get("error_backtrace")
    if isinstance(kept, list):
        return [str(line) for line in kept]
    if not isinstance(kept, str):
        return None
    try:
        lines = json.loads(zlib.decompress(base64.b64decode(kept)))
    except (binascii.Error, zlib.error, ValueError):
        return [kept]
    return [str(line) for line in lines] if isinstance(lines, list) else [kept]


# Views


def list_view(request: Request, kind: SetPage) -> Response:
    zset = kind.open(request)
    where = filter_of(request.query_params)
    number = page_number(request)
    start = (number - 1) * PER_PAGE
    complete = True
    if where.active:
        found = zset.filtered_page(where, start, PER_PAGE, ascending=kind.ascending)
        entries, total, complete = found.entries, found.matched, found.complete
    else:
        entries = zset.page(start, PER_PAGE, ascending=kind.ascending)
        total = zset.size()
    root = root_of(request)
    pages = max(1, -(-total // PER_PAGE))
    query = {key: value for key, value in (("name", where.name), ("text", where.text)) if value}
    return render(
        request,
        "set_page.html",
        {
            "kind": kind,
            "rows": [row_of(kind, entry, root) for entry in entries],
            "total": total,
            "size": zset.size() if where.active else total,
            "complete": complete,
            "where": where,
            "filter_fields": query,
            "page": number,
            "pages": pages,
            "newer": _page_link(root, kind, query, number - 1) if number > 1 else None,
            "older": _page_link(root, kind, query, number + 1) if number < pages else None,
            "here": _here(request),
        },
    )


def detail_view(request: Request, kind: SetPage) -> Response:
    zset = kind.open(request)
    jid = request.path_params["jid"]
    score = _score_param(request)
    entry = zset.find_job(jid, score)
    context: dict[str, Any] = {"kind": kind, "jid": jid, "entry": None}
    if entry is None:
        return render(request, "set_entry.html", context, status=404)
    root = root_of(request)
    context.update(
        entry=entry,
        row=row_of(kind, entry, root),
        backtrace=backtrace_of(entry),
        body=entry.payload if entry.payload is not None else entry.text,
    )
    return render(request, "set_entry.html", context)


async def act(request: Request, kind: SetPage, verb: str) -> Response:
    """retry, delete or kill: the selected entries, or all (matching the filter, if
    one is on). Entries gone meanwhile (a poller, another operator) are skipped."""
    form = await request.form()
    zset = kind.open(request)
    if form.get("scope") == "all":
        _act_on_all(zset, verb, filter_of(form))
    else:
        tokens = [value for value in form.getlist("entry") if isinstance(value, str)]
        if not tokens:
            raise HTTPException(400, "entry: select at least one job")
        for token in dict.fromkeys(tokens):
            entry = resolve(zset, token)
            if entry is not None:
                _act_on(entry, verb)
    return back(request, kind.path, form)


def routes(kind: SetPage) -> list[Route]:
    """The page's routes: the actions first, so ``/dead/retry`` is never read as a
    jid."""

    def listing(request: Request) -> Response:
        return list_view(request, kind)

    def detail(request: Request) -> Response:
        return detail_view(request, kind)

    verbs = ["retry", "delete", "kill"] if kind.can_kill else ["retry", "delete"]
    actions = [
        Route(f"{kind.path}/{verb}", _action(kind, verb), methods=["POST"]) for verb in verbs
    ]
    return [
        *actions,
        Route(kind.path, listing, name=kind.path.strip("/")),
        Route(kind.path + "/{jid}", detail),
    ]


def _action(kind: SetPage, verb: str) -> Any:
    async def handler(request: Request) -> Response:
        return await act(request, kind, verb)

    return handler


def _act_on_all(zset: SortedSet[Any], verb: str, where: EntryFilter) -> int:
    entries = zset.matching(where) if where.active else None
    if verb == "retry":
        return zset.retry_all(entries)
    if verb == "kill" and isinstance(zset, PendingSet):
        return zset.kill_all(entries)
    if verb == "delete":
        return zset.clear() if entries is None else sum(entry.delete() for entry in entries)
    raise HTTPException(400, f"{verb}: not an action of this set")


def _act_on(entry: SortedEntry, verb: str) -> bool:
    if verb == "retry":
        return entry.payload is not None and entry.retry()  # malformed: delete or kill
    if verb == "delete":
        return entry.delete()
    if verb == "kill" and isinstance(entry, PendingEntry):
        return entry.kill()
    raise HTTPException(400, f"{verb}: not an action of this set")


def _filter_value(values: Any, field: str) -> str | None:
    value = values.get(field)
    if value is None or not isinstance(value, str) or not value.strip():
        return None
    if len(value) > FILTER_SHOWN:
        raise HTTPException(400, f"{field}: at most {FILTER_SHOWN} characters")
    return value.strip()


def _score_param(request: Request) -> float | None:
    raw = request.query_params.get("score")
    if not raw:
        return None
    try:
        return float(raw)
    except ValueError:
        raise HTTPException(400, f"score: expected a number, got {raw!r}") from None


def _page_link(root: str, kind: SetPage, query: dict[str, str], number: int) -> str:
    return f"{root}{kind.path}?{urlencode({**query, 'page': number})}"


def _here(request: Request) -> str:
    """This page's path and query without the mount point: where an action returns."""
    root = root_of(request)
    path = request.url.path
    if root and path.startswith(root):
        path = path[len(root) :]
    return path + (f"?{request.url.query}" if request.url.query else "")


def _digest(raw: bytes) -> str:
    return hashlib.sha1(raw).hexdigest()[:16]
