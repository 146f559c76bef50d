"""The example app of the testing mode (examples/testing_app) passes its own suite with
no Redis reachable: run as an app developer would, in a pytest of its own, with
``LIMITD_REDIS_URL`` pointing at a closed port."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
from pathlib import Path

APP = Path(__file__).resolve().parent.parent / "examples" / "testing_app"


def test_example_app_suite_passes_without_redis() -> None:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    env = {**os.environ, "LIMITD_REDIS_URL": f"redis://127.0.0.1:{port}/0"}
    env.pop("LIMITD_CONFIG", None)
    result = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "tests"],
        cwd=APP,
        env=env,
        capture_output=True,
        text=True,
        timeout=110,
        check=False,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    assert "4 passed" in result.stdout
