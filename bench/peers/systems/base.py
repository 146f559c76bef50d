"""What the driver needs to know about one benchmarked system: how to enqueue N jobs (in
the interpreter that has the system installed) and which worker processes to start.

Only the standard library is imported here and at the top of each driver module: the
driver modules are read by run.py in the project's venv, where the peers are not
installed, and their ``enqueue`` functions run in the peers' venv (see enqueue.py).
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

PEERS_DIR = Path(__file__).resolve().parent.parent
REPO_DIR = PEERS_DIR.parent.parent
APPS_DIR = PEERS_DIR / "apps"
PEERS_VENV = PEERS_DIR / ".venv"
PEERS_BIN = PEERS_VENV / "bin"
PROJECT_BIN = REPO_DIR / ".venv" / "bin"
QUEUE = "bench"


def project_python() -> Path:
    """The project venv's interpreter (it has limitd), else the one running now."""
    candidate = PROJECT_BIN / "python"
    return candidate if candidate.exists() else Path(sys.executable)


@dataclass(frozen=True)
class Context:
    """Where one run of one system happens."""

    url: str  # Redis URL including the system's own db number
    tmp: Path  # scratch directory for configuration files


def _nothing_missing() -> str | None:
    return None


@dataclass(frozen=True)
class System:
    """One benchmarked configuration, e.g. ``celery-prefork``.

    ``enqueue(n)`` runs in ``python`` after ``app`` was imported, so import time stays
    out of the enqueue figure. A system that is not Python gives ``enqueue_command``
    instead: a command that pushes N jobs and prints ``{"seconds": ...}``.
    """

    name: str
    settings: str  # printed next to the figures
    enqueue_api: str  # which enqueue call the figure measures
    workers: Callable[[Context], list[list[str]]]  # one command per worker process
    app: str | None = None
    enqueue: Callable[[int], None] | None = None
    python: Path = PEERS_BIN / "python"
    enqueue_command: Callable[[Context, int], list[str]] | None = None
    missing: Callable[[], str | None] = _nothing_missing  # why it cannot run here
    max_jobs: int | None = None  # fewer jobs per run for very slow systems (time budget)
    # Directories put first on PYTHONPATH for the enqueue and every worker process: set
    # on run.py's --compare twins, whose limitd is imported from another checkout.
    pythonpath: tuple[Path, ...] = ()

    def jobs_per_run(self, jobs: int) -> int:
        return min(jobs, self.max_jobs) if self.max_jobs else jobs

    def enqueue_argv(self, ctx: Context, jobs: int) -> list[str]:
        """The command that enqueues ``jobs`` jobs and prints the seconds it took."""
        if self.enqueue_command is not None:
            return self.enqueue_command(ctx, jobs)
        return [str(self.python), str(PEERS_DIR / "enqueue.py"), self.name, str(jobs)]
