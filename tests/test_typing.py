"""Type checkers hold enqueue calls to the job's own parameters (docs/typing.md).

mypy runs once over the files in tests/typing/, calls that must pass and calls that must
not, and has to report an error on exactly the lines marked ``# E: <fragment>``, each
error's message containing the fragment, and nothing on any other line. Were the enqueue
methods typed ``*args: Any`` again, the marked lines would pass and this would fail.
"""

from __future__ import annotations

import re
import subprocess
import sys
from collections import defaultdict
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
CALLS = Path(__file__).resolve().parent / "typing"
MARK = re.compile(r"\S  # E: (?P<fragment>.+?)\s*$")  # a comment after code
ERROR = re.compile(r"^(?P<path>[^:]+\.py):(?P<line>\d+): error: (?P<message>.*)$")

# From scratch, writing no cache (nothing left behind); plain one-line messages.
MYPY_FLAGS = ("--no-incremental", "--cache-dir", "/dev/null", "--hide-error-context")
MYPY_FLAGS += ("--no-pretty", "--no-error-summary")

Where = tuple[str, int]  # (file name, line number)


def expected_errors() -> dict[Where, str]:
    """The marked lines of every file in tests/typing/, with their fragments."""
    expected = {}
    for path in sorted(CALLS.glob("*.py")):
        for number, line in enumerate(path.read_text().splitlines(), start=1):
            if match := MARK.search(line):
                expected[(path.name, number)] = match["fragment"]
    return expected


def mypy_errors() -> dict[Where, list[str]]:
    """One mypy run over tests/typing/ with the project's settings (pyproject.toml):
    a few seconds, most of them reading limitd itself."""
    result = subprocess.run(
        [sys.executable, "-m", "mypy", *MYPY_FLAGS, str(CALLS)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=110,
        check=False,
    )
    assert result.returncode in (0, 1), result.stdout + result.stderr  # 2: mypy failed
    found: dict[Where, list[str]] = defaultdict(list)
    for line in result.stdout.splitlines():
        match = ERROR.match(line)
        if match and Path(match["path"]).resolve().parent == CALLS:
            found[(Path(match["path"]).name, int(match["line"]))].append(match["message"])
    return found


def test_mypy_reports_exactly_the_marked_calls() -> None:
    expected = expected_errors()
    found = mypy_errors()
    unexpected = {where: found[where] for where in found.keys() - expected.keys()}
    missed = {where: expected[where] for where in expected.keys() - found.keys()}
    assert unexpected == {}, "errors on lines that should type-check"
    assert missed == {}, "calls mypy should have reported"
    wrong = {
        where: (expected[where], messages)
        for where, messages in found.items()
        if not all(expected[where] in message for message in messages)
    }
    assert wrong == {}, "errors whose message does not contain the line's fragment"


def test_every_file_has_calls_that_pass_and_calls_that_fail() -> None:
    """The check above is only as good as the marks: each file has some, and lines
    without them."""
    marked = {name for name, _ in expected_errors()}
    assert marked == {path.name for path in CALLS.glob("*.py")}
    assert {"function_jobs.py", "class_jobs.py", "async_calls.py"} <= marked
