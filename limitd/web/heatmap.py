"""A server-side SVG heat map of job durations: one column per minute, one row per
duration bucket (fastest at the bottom), each cell shaded by how many jobs of that
minute fell in that bucket.

Drawn as markup for the same reason as ``limitd.web.charts``: it is part of the page's
live block and needs no script. Only the rows from the fastest to the slowest bucket
seen are drawn, so a class of quick jobs gets a readable map. Every text is escaped.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from markupsafe import Markup, escape

from limitd.web.charts import Frame


@dataclass(frozen=True)
class Column:
    """One minute: its label and its count per bucket."""

    label: str
    buckets: Sequence[int]


def heat_map(
    columns: Sequence[Column],
    bucket_labels: Sequence[str],
    *,
    title: str,
    chart_id: str,
    label_every: int = 10,
) -> Markup:
    """The SVG heat map of ``columns`` (oldest first); ``bucket_labels`` names the rows."""
    rows = _rows_seen(columns)
    frame = Frame(height=max(80, 18 * len(rows) + 54), left=84)
    parts = [
        f'<svg class="chart heat" id="{escape(chart_id)}" xmlns="http://www.w3.org/2000/svg" '
        f'viewBox="0 0 {frame.width} {frame.height}" role="img" '
        f'aria-labelledby="{escape(chart_id)}-title">',
        f'<title id="{escape(chart_id)}-title">{escape(title)}</title>',
    ]
    if rows:
        parts.extend(_cells(columns, rows, bucket_labels, frame, label_every))
    else:
        parts.append(
            f'<text x="{frame.width / 2:.0f}" y="{frame.height / 2:.0f}" text-anchor="middle" '
            'font-size="12" fill="#6b7385">No timed jobs.</text>'
        )
    parts.append("</svg>")
    # Every text interpolated above went through escape(): the markup is ours alone.
    return Markup("\n".join(parts))


def _rows_seen(columns: Sequence[Column]) -> list[int]:
    seen = [b for column in columns for b, count in enumerate(column.buckets) if count]
    return list(range(min(seen), max(seen) + 1)) if seen else []


def _cells(
    columns: Sequence[Column],
    rows: list[int],
    labels: Sequence[str],
    frame: Frame,
    label_every: int,
) -> list[str]:
    top = max(count for column in columns for count in column.buckets)
    width = frame.plot_width / len(columns)
    height = frame.plot_height / len(rows)
    out = []
    for place, bucket in enumerate(rows):
        y = frame.baseline - (place + 1) * height
        out.append(
            f'<text class="y-label" x="{frame.left - 6}" y="{y + height / 2 + 4:.1f}" '
            f'text-anchor="end" font-size="11" fill="#6b7385">{escape(labels[bucket])}</text>'
        )
        for index, column in enumerate(columns):
            count = column.buckets[bucket]
            if not count:
                continue
            shade = 0.15 + 0.85 * count / top
            out.append(
                f'<rect class="cell" x="{frame.left + index * width:.1f}" y="{y:.1f}" '
                f'width="{width:.1f}" height="{height:.1f}" fill="#2b6cb0" '
                f'fill-opacity="{shade:.2f}" data-bucket="{bucket}" data-value="{count}">'
                f"<title>{escape(column.label)}, {escape(labels[bucket])}: {count:,} jobs</title>"
                "</rect>"
            )
    for index, column in enumerate(columns):
        if index % max(1, label_every) == 0 or index == len(columns) - 1:
            out.append(
                f'<text class="x-label" x="{frame.left + (index + 0.5) * width:.1f}" '
                f'y="{frame.baseline + 16:.1f}" text-anchor="middle" font-size="11" '
                f'fill="#6b7385">{escape(column.label)}</text>'
            )
    return out
