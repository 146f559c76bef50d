"""What users install is what the suite tests: the wheel carries every file the package
reads at run time, and the suite gives the same results whatever the developer's shell
exports."""

from __future__ import annotations

import fnmatch
import os
import subprocess
import sys
from pathlib import Path

import tomllib

ROOT = Path(__file__).resolve().parent.parent
PACKAGE = ROOT / "limitd"


def package_data() -> dict[str, list[str]]:
    with (ROOT / "pyproject.toml").open("rb") as f:
        return tomllib.load(f)["tool"]["setuptools"]["package-data"]


def owning_package(path: Path) -> Path:
    """The nearest folder above ``path`` that is a package (has ``__init__.py``)."""
    folder = path.parent
    while not (folder / "__init__.py").exists():
        folder = folder.parent
    return folder


def test_every_run_time_file_is_package_data() -> None:
    """Lua scripts, templates and static files are read from the installed package; a
    file no package-data pattern names is missing from the wheel (``limitd web`` once
    crashed on a wheel without its templates)."""
    patterns = package_data()
    missing = []
    for path in sorted(PACKAGE.rglob("*")):
        if path.is_dir() or path.suffix in (".py", ".pyc") or "__pycache__" in path.parts:
            continue
        package = owning_package(path)
        name = ".".join(package.relative_to(ROOT).parts)
        relative = path.relative_to(package).as_posix()
        wanted = patterns.get("*", []) + patterns.get(name, [])
        if not any(fnmatch.fnmatch(relative, pattern) for pattern in wanted):
            missing.append(f"{path.relative_to(ROOT)} (package {name})")
    assert missing == [], "not in [tool.setuptools.package-data] of pyproject.toml"


def test_the_suite_ignores_the_redis_url_a_shell_exports() -> None:
    """A test that reads a config's Redis URL, run with LIMITD_REDIS_URL and REDIS_URL
    set as many developers have them, passes (conftest.py removes what limitd reads)."""
    env = {
        **os.environ,
        "LIMITD_REDIS_URL": "redis://127.0.0.1:1/0",
        "REDIS_URL": "redis://127.0.0.1:1/0",
    }
    test = "tests/test_cluster.py::test_the_url_and_the_config_name_the_nodes"
    done = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", test],
        check=False,
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stdout[-2000:]


def test_the_version_is_written_once() -> None:
    """pyproject.toml reads the version from limitd/version.py, so a release bumps one
    line, and the installed metadata says what ``limitd.__version__`` says."""
    import importlib.metadata

    import limitd

    with (ROOT / "pyproject.toml").open("rb") as f:
        project = tomllib.load(f)
    assert "version" not in project["project"]
    assert project["tool"]["setuptools"]["dynamic"]["version"] == {
        "attr": "limitd.version.__version__"
    }
    assert importlib.metadata.version("limitd") == limitd.__version__


def test_the_changelog_has_an_entry_for_this_version() -> None:
    import limitd

    assert f"## [{limitd.__version__}]" in (ROOT / "CHANGELOG.md").read_text()
