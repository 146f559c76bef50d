"""Plain aligned text tables for the admin commands' human output.

No dependency and no colour: the output is read in terminals, CI logs and ``grep``.
Columns are separated by two spaces; a column whose values are all numbers is aligned
right so magnitudes line up, every other column left. None shows as ``-``.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from limitd.commands.common import print_json

GAP = "  "
ELLIPSIS = "..."


def print_listing(
    as_json: bool,
    documents: Sequence[Any],
    headers: Sequence[str],
    rows: Sequence[Sequence[object]],
    empty: str,
) -> None:
    """What every listing command prints: ``documents`` as JSON for scripts, else the
    table of ``rows``, or the ``empty`` line when there is nothing to list."""
    if as_json:
        print_json(list(documents))
    elif rows:
        print(render(headers, rows))
    else:
        print(empty)


def render(headers: Sequence[str], rows: Sequence[Sequence[object]]) -> str:
    """The table as one string: a header line, then one line per row."""
    cells = [[cell(value) for value in row] for row in rows]
    widths = [
        max([len(header), *(len(row[index]) for row in cells)])
        for index, header in enumerate(headers)
    ]
    numeric = [all(_is_number(row[index]) for row in rows) for index in range(len(headers))]
    lines = [_line(headers, widths, [False] * len(headers))]
    lines += [_line(row, widths, numeric) for row in cells]
    return "\n".join(lines)


def cell(value: object) -> str:
    """How one value reads in a table. Floats get one decimal (seconds, mostly);
    line breaks would split a row, so they become spaces."""
    if value is None:
        return "-"
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, float):
        return f"{value:.1f}"
    return " ".join(str(value).splitlines())


def truncate(text: str, width: int) -> str:
    """``text`` cut to ``width`` characters, the cut marked with "..."."""
    return text if len(text) <= width else text[: width - len(ELLIPSIS)] + ELLIPSIS


def _is_number(value: object) -> bool:
    return value is None or (isinstance(value, (int, float)) and not isinstance(value, bool))


def _line(values: Sequence[str], widths: Sequence[int], right: Sequence[bool]) -> str:
    padded = [
        value.rjust(width) if align_right else value.ljust(width)
        for value, width, align_right in zip(values, widths, right, strict=True)
    ]
    return GAP.join(padded).rstrip()
