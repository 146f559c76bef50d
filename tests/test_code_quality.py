"""The house rules CI enforces: ruff clean, mypy clean (configured in pyproject.toml)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
# The project's own code: a user's own files in the checkout are not ours to lint.
OWN_PATHS = ("limitd", "tests", "bench", "examples")


def run(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", *args], cwd=ROOT, capture_output=True, text=True, check=False
    )


def test_ruff_is_clean() -> None:
    result = run("ruff", "check", *OWN_PATHS)
    assert result.returncode == 0, result.stdout + result.stderr


def test_mypy_is_clean() -> None:
    result = run("mypy")
    assert result.returncode == 0, result.stdout + result.stderr
