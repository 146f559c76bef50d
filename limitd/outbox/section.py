"""The ``outbox:`` config section: the relay that ``limitd start`` runs::

    outbox:
      url: postgresql+psycopg://app@db/app   # SQLAlchemy URL of the app's database
      table: limitd_outbox                   # default
      poll_interval: 1                       # seconds between looks at an empty table
      chunk: 100                             # rows per relay transaction

No section (or no ``url``): no relay runs. With one, the supervisor's first child
process (``process_number`` 0) of each capsule runs a relay thread.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from limitd.config.values import Section, describe
from limitd.outbox.table import DEFAULT_TABLE, name_problem

KEY = "outbox"
OUTBOX_KEYS = frozenset({"url", "table", "poll_interval", "chunk"})
DEFAULT_POLL_INTERVAL = 1.0
DEFAULT_CHUNK = 100
_URL_FORM = "a SQLAlchemy database URL such as postgresql+psycopg://user@host/db"


@dataclass(frozen=True)
class OutboxSettings:
    """Where the relay reads (``url``, None: no relay), and how."""

    url: str | None = None
    table: str = DEFAULT_TABLE
    poll_interval: float = DEFAULT_POLL_INTERVAL
    chunk: int = DEFAULT_CHUNK

    @property
    def enabled(self) -> bool:
        return self.url is not None


def read_outbox(section: Section, env: Mapping[str, str]) -> OutboxSettings:
    """The section, every value checked; each error names the file, the key and what
    was expected (``env`` is unused: ``${VAR}`` in the files covers a password)."""
    del env
    section.check_keys(OUTBOX_KEYS)
    url = _url(section)
    table = section.string("table", DEFAULT_TABLE)
    problem = name_problem(table)
    if problem is not None:
        raise section.error("table", problem)
    settings = OutboxSettings(
        url=url,
        table=table,
        poll_interval=section.number("poll_interval", DEFAULT_POLL_INTERVAL, 0, above=True),
        chunk=section.integer("chunk", DEFAULT_CHUNK, 1),
    )
    if url is None and section.data:
        raise section.error("url", f"expected {_URL_FORM} (the relay needs a database)")
    return settings


def _url(section: Section) -> str | None:
    url = section.optional_string("url")
    if url is None:
        return None
    try:
        from sqlalchemy.engine import make_url
    except ImportError:
        raise section.error(
            "url", "the outbox relay needs SQLAlchemy: pip install 'limitd[sqlalchemy]'"
        ) from None
    try:
        make_url(url)
    except Exception:  # sqlalchemy raises ArgumentError, and ValueError for a bad port
        raise section.error("url", f"expected {_URL_FORM}, got {describe(url)}") from None
    return url


def as_dict(settings: OutboxSettings) -> dict[str, Any]:
    """The section as ``limitd check`` prints it (the URL's password hidden)."""
    if not settings.enabled:
        return {}
    return {
        "url": _masked(str(settings.url)),
        "table": settings.table,
        "poll_interval": settings.poll_interval,
        "chunk": settings.chunk,
    }


def _masked(url: str) -> str:
    from sqlalchemy.engine import make_url

    return make_url(url).render_as_string(hide_password=True)
