"""Enqueue N jobs of one system and print ``{"seconds": ...}``; run by run.py in the
interpreter that has that system installed (the peers' venv, or the project's for
limitd), with BENCH_REDIS_URL set and apps/ on PYTHONPATH.

    python bench/peers/enqueue.py SYSTEM N

The app module is imported before the clock starts, so the figure is the enqueue calls
alone (connecting included), as an application that already runs would see them.
"""

from __future__ import annotations

import importlib
import json
import sys
import time

from systems import by_name


def main() -> None:
    name, jobs = sys.argv[1], int(sys.argv[2])
    system = by_name(name)
    if system.enqueue is None or system.app is None:
        raise SystemExit(f"{name} has no Python enqueue")
    importlib.import_module(system.app)
    started = time.perf_counter()
    system.enqueue(jobs)
    print(json.dumps({"seconds": time.perf_counter() - started}))


if __name__ == "__main__":
    main()
