"""Enqueue N jobs for one peer of bench/async_io.py, in the peers' venv:

    python enqueue_io.py arq|saq N

BENCH_REDIS_URL names the server; the enqueue is not part of the measured drain."""

from __future__ import annotations

import asyncio
import importlib
import sys

BATCH = 200  # enqueue calls in flight at once


def main() -> None:
    system, jobs = sys.argv[1], int(sys.argv[2])
    app = importlib.import_module(f"{system}_io_app")
    asyncio.run(app.enqueue(jobs, BATCH))


if __name__ == "__main__":
    main()
