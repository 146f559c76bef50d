"""Bar chart of the steady drain (10% to 90% of the jobs), jobs/s per system (median,
min-max error bars); run by run.py in the peers' venv, where matplotlib is installed.

    python bench/peers/chart.py DATA.json OUT.png

DATA.json: {"title": str, "systems": [{"name", "median", "min", "max"}, ...]}, and
optionally "xlabel" (what the bars measure, if not the steady drain).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt


def _color(name: str) -> str:
    """limitd stands out; the floor worker (not a job system) is greyed."""
    if name.startswith("limitd"):
        return "tab:orange"
    return "tab:gray" if name.startswith("floor") else "tab:blue"


def main() -> None:
    data = json.loads(Path(sys.argv[1]).read_text())
    rows = data["systems"]
    names = [row["name"] for row in rows]
    medians = [row["median"] for row in rows]
    errors = [
        [row["median"] - row["min"] for row in rows],
        [row["max"] - row["median"] for row in rows],
    ]
    colors = [_color(name) for name in names]
    fig, ax = plt.subplots(figsize=(9, 0.45 * len(rows) + 1.5))
    ax.barh(names, medians, xerr=errors, color=colors, capsize=3)
    for y, row in enumerate(rows):
        ax.text(row["max"], y, f"  {row['median']:,.0f}", va="center", fontsize=8)
    ax.invert_yaxis()
    ax.set_xlabel(
        data.get(
            "xlabel", "steady drain (10%-90% of the jobs), jobs/s (median of runs; bars: min-max)"
        )
    )
    ax.set_title(data["title"], fontsize=9)
    ax.margins(x=0.15)
    fig.tight_layout()
    fig.savefig(sys.argv[2], dpi=120)


if __name__ == "__main__":
    main()
