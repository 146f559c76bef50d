"""Server-side SVG charts for the dashboard: processed and failed jobs over time.

Drawn here as markup rather than by a JavaScript library so that the chart is part of
the page's live block: every refresh brings a fresh chart with the figures, and the page
needs no script beyond the one that refreshes it. Every bit of text is escaped, so a
label can never inject markup; the result is :class:`markupsafe.Markup` only because it
is markup built here.

Each slot (a minute, a day) has two bars side by side, processed and failed, scaled to
a rounded-up maximum so the y axis reads in round numbers. Screen readers get the
chart's ``<title>`` and a ``<desc>`` with the totals; every slot has its own
``<title>`` so hovering a bar shows its figures.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

from markupsafe import Markup, escape

Point = tuple[str, int, int]  # (slot label, processed, failed)


@dataclass(frozen=True)
class Frame:
    """Where the plot sits inside the SVG (pixels), leaving room for the axes' labels."""

    width: int = 760
    height: int = 220
    left: int = 52
    right: int = 12
    top: int = 14
    bottom: int = 40

    @property
    def plot_width(self) -> float:
        return float(self.width - self.left - self.right)

    @property
    def plot_height(self) -> float:
        return float(self.height - self.top - self.bottom)

    @property
    def baseline(self) -> float:
        return float(self.height - self.bottom)


def nice_ceiling(value: int) -> int:
    """The smallest of 1, 2, 5 times a power of ten that is at least ``value`` (at least 1),
    so the top of the y axis is a round number."""
    if value <= 1:
        return 1
    power = 10 ** math.floor(math.log10(value))
    for step in (1, 2, 5, 10):
        if step * power >= value:
            return step * power
    return 10 * power  # not reached: 10 * power >= value always


def history_chart(
    points: Sequence[Point],
    *,
    title: str,
    chart_id: str,
    label_every: int = 1,
    frame: Frame | None = None,
) -> Markup:
    """An SVG bar chart of ``points`` (oldest first). ``label_every``: write the x label
    of every n-th slot only (60 minute labels would overlap); the last slot is always
    labelled. ``chart_id`` names the ``<title>`` and ``<desc>`` elements for
    ``aria-labelledby``, so it must be unique on the page."""
    frame = frame or Frame()
    top = nice_ceiling(max((max(done, bad) for _, done, bad in points), default=0))
    parts = [
        f'<svg class="chart" id="{escape(chart_id)}" xmlns="http://www.w3.org/2000/svg" '
        f'viewBox="0 0 {frame.width} {frame.height}" role="img" '
        f'aria-labelledby="{escape(chart_id)}-title {escape(chart_id)}-desc">',
        f'<title id="{escape(chart_id)}-title">{escape(title)}</title>',
        f'<desc id="{escape(chart_id)}-desc">{escape(_summary(points))}</desc>',
        *_y_axis(top, frame),
        *_bars(points, top, frame, label_every),
        *_legend(frame),
        "</svg>",
    ]
    # Every text interpolated above went through escape(): the markup is ours alone.
    return Markup("\n".join(parts))


def _summary(points: Sequence[Point]) -> str:
    processed = sum(done for _, done, _ in points)
    failed = sum(bad for _, _, bad in points)
    if not points:
        return "No data."
    return f"{processed:,} processed and {failed:,} failed from {points[0][0]} to {points[-1][0]}."


def _y_axis(top: int, frame: Frame) -> list[str]:
    """Grid lines and labels at 0, half and the top."""
    lines = []
    for value in (0, top / 2, top):
        y = frame.baseline - frame.plot_height * value / top
        text = f"{value:,.0f}" if float(value).is_integer() else f"{value:,.1f}"
        lines.append(
            f'<line class="grid" x1="{frame.left}" x2="{frame.width - frame.right}" '
            f'y1="{y:.1f}" y2="{y:.1f}" stroke="#e3e6ee"/>'
        )
        lines.append(
            f'<text class="y-label" x="{frame.left - 6}" y="{y + 4:.1f}" text-anchor="end" '
            f'font-size="11" fill="#6b7385">{escape(text)}</text>'
        )
    return lines


def _bars(points: Sequence[Point], top: int, frame: Frame, label_every: int) -> list[str]:
    if not points:
        return []
    slot = frame.plot_width / len(points)
    bar = max(1.0, slot * 0.4)
    every = max(1, label_every)
    out = []
    for index, (label, done, bad) in enumerate(points):
        x = frame.left + index * slot + (slot - 2 * bar) / 2
        out.append(f'<g class="slot" data-label="{escape(label)}">')
        out.append(f"<title>{escape(label)}: {done:,} processed, {bad:,} failed</title>")
        out.append(_bar("processed", x, bar, value=done, top=top, frame=frame, fill="#1e8e5a"))
        out.append(_bar("failed", x + bar, bar, value=bad, top=top, frame=frame, fill="#c0392b"))
        out.append("</g>")
        if index % every == 0 or index == len(points) - 1:
            out.append(
                f'<text class="x-label" x="{x + bar:.1f}" y="{frame.baseline + 16:.1f}" '
                f'text-anchor="middle" font-size="11" fill="#6b7385">{escape(label)}</text>'
            )
    return out


def _bar(css: str, x: float, width: float, *, value: int, top: int, frame: Frame, fill: str) -> str:
    height = frame.plot_height * value / top
    return (
        f'<rect class="{css}" x="{x:.1f}" y="{frame.baseline - height:.1f}" '
        f'width="{width:.1f}" height="{height:.1f}" fill="{fill}" data-value="{value}"/>'
    )


def _legend(frame: Frame) -> list[str]:
    y = frame.height - 4
    x = frame.width - frame.right - 170
    return [
        f'<rect x="{x}" y="{y - 9}" width="10" height="10" fill="#1e8e5a"/>',
        f'<text x="{x + 14}" y="{y}" font-size="11" fill="#1d2433">processed</text>',
        f'<rect x="{x + 90}" y="{y - 9}" width="10" height="10" fill="#c0392b"/>',
        f'<text x="{x + 104}" y="{y}" font-size="11" fill="#1d2433">failed</text>',
    ]
