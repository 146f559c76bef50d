"""What users install is what the suite tests: the wheel carries every file the package
reads at run time, and the suite gives the same results whatever the developer's shell
exports."""

from __future__ import annotations

import fnmatch
import importlib
import os
import shutil
import subprocess
import sys
import tarfile
from pathlib import Path
from typing import Any

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
        [sys.executable, "-m", "pytest", "-q", "-n", "0", "-p", "no:cacheprovider", test],
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


def pyproject() -> dict[str, Any]:
    with (ROOT / "pyproject.toml").open("rb") as f:
        return tomllib.load(f)


def package_files() -> set[str]:
    """Every file of the package in the checkout, as a path from the repository's root."""
    return {
        path.relative_to(ROOT).as_posix()
        for path in PACKAGE.rglob("*")
        if path.is_file() and "__pycache__" not in path.parts and path.suffix != ".pyc"
    }


def build_sdist(source: Path, out: Path) -> Path:
    """setuptools' PEP 517 sdist hook run in ``source`` (no isolation: the dev venv's
    setuptools); the path of the archive it made."""
    code = f"from setuptools import build_meta; print(build_meta.build_sdist({str(out)!r}))"
    done = subprocess.run(
        [sys.executable, "-c", code],
        check=False,
        cwd=source,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    return out / done.stdout.strip().splitlines()[-1]


def test_the_sdist_carries_every_package_file(tmp_path: Path) -> None:
    """The sdist is what pip builds a wheel from when none fits, and what distributions
    package: it carries every file under limitd/, the Lua scripts, the dashboard's
    templates and static files and py.typed among them. (.ci/package builds the wheel
    from the sdist and runs it.) Built from a copy of the checkout, so the checkout's
    limitd.egg-info is left alone."""
    source = tmp_path / "source"
    source.mkdir()
    for name in ("pyproject.toml", "README.md", "MANIFEST.in", "setup.cfg", "setup.py"):
        if (ROOT / name).exists():
            shutil.copy(ROOT / name, source / name)
    shutil.copytree(PACKAGE, source / "limitd", ignore=shutil.ignore_patterns("__pycache__"))
    wanted = package_files()
    kinds = ("limitd/py.typed", ".lua", "limitd/web/templates/", "limitd/web/static/")
    assert all(any(kind in name for name in wanted) for kind in kinds)

    sdist = build_sdist(source, tmp_path)
    top = sdist.name.removesuffix(".tar.gz")
    with tarfile.open(sdist) as archive:
        in_sdist = {name.removeprefix(top + "/") for name in archive.getnames()}
    assert sorted(wanted - in_sdist) == [], f"missing from {sdist.name}"


def entry_points() -> list[tuple[str, str, str]]:
    """``(group, name, "module:attribute")`` for the scripts and every entry-point group
    pyproject.toml declares (pytest11, the testing modes' plugin, among them)."""
    project = pyproject()["project"]
    groups = {
        "console_scripts": project.get("scripts", {}),
        "gui_scripts": project.get("gui-scripts", {}),
        **project.get("entry-points", {}),
    }
    return [
        (group, name, value) for group, points in groups.items() for name, value in points.items()
    ]


def test_every_entry_point_names_a_module_the_package_ships() -> None:
    """An entry point naming a module that is not in the wheel breaks more than itself: a
    pytest11 plugin that does not import stops every pytest run of every app that
    installed limitd."""
    points = entry_points()
    assert ("pytest11", "limitd", "limitd.testing.pytest_plugin") in points
    for group, name, value in points:
        module_name, _, attribute = value.partition(":")
        module = importlib.import_module(module_name.strip())
        where = Path(module.__file__ or "").resolve()
        assert PACKAGE in where.parents, f"{group} {name}: {where} is not under limitd/"
        if attribute:
            assert callable(getattr(module, attribute.strip())), f"{group} {name}: {value}"
