"""The README and the documentation site stay consistent with each other and with CI.

The README is the page people copy commands from, so its quick start and test commands
must be the ones CI runs (`.ci/run`), word for word, and it must stay a README (short,
pointing to the docs) rather than grow back into the manual. The site's navigation is
written by hand in mkdocs.yml: a page missing from it is unreachable, and an entry whose
page was renamed is a broken link. `mkdocs build --strict` catches the rest (links,
anchors, docstrings); it is not run here because it takes seconds and needs the `docs`
extra.
"""

from __future__ import annotations

import re
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parent.parent
DOCS = ROOT / "docs"
README_MAX_LINES = 300

QUICK_START = (
    "python3 -m venv .venv && .venv/bin/pip install -e '.[embedded]' && "
    ".venv/bin/limitd start conf/example.yml"
)


def ci_test_command() -> str:
    """The command `.ci/run` runs under its "# The README's test command:" comment."""
    lines = (ROOT / ".ci" / "run").read_text().splitlines()
    marker = lines.index("# The README's test command:")
    command = lines[marker + 1].strip()
    assert command.startswith("python3 -m venv"), f".ci/run: unexpected test command {command!r}"
    return command


def nav_pages(entries: object) -> list[str]:
    """Every page path in a mkdocs nav (nested lists of titles -> path or section)."""
    if isinstance(entries, str):
        return [entries]
    if isinstance(entries, list):
        return [page for entry in entries for page in nav_pages(entry)]
    if isinstance(entries, dict):
        return [page for value in entries.values() for page in nav_pages(value)]
    raise AssertionError(f"mkdocs.yml: nav: unexpected entry {entries!r}")


def mkdocs_nav() -> list[str]:
    config = yaml.safe_load((ROOT / "mkdocs.yml").read_text())
    return [page for page in nav_pages(config["nav"]) if not page.startswith("http")]


def test_readme_is_short() -> None:
    lines = (ROOT / "README.md").read_text().splitlines()
    assert len(lines) < README_MAX_LINES, (
        f"README.md has {len(lines)} lines; keep it under {README_MAX_LINES} and move "
        "detail into docs/"
    )


def test_readme_and_quick_start_page_carry_the_commands_ci_runs() -> None:
    test_command = ci_test_command()
    for page in (ROOT / "README.md", DOCS / "getting-started.md"):
        lines = [line.strip() for line in page.read_text().splitlines()]
        assert QUICK_START in lines, f"{page.name}: the quick start command changed or is gone"
        assert test_command in lines, (
            f"{page.name}: the test command differs from .ci/run's: {test_command!r}"
        )


def test_readme_links_point_to_files_that_exist() -> None:
    text = (ROOT / "README.md").read_text()
    targets = re.findall(r"\]\(([^)\s]+)\)", text)
    local = [t.split("#")[0] for t in targets if not re.match(r"[a-z]+:", t)]
    assert local, "README.md links to no docs page"
    missing = sorted({t for t in local if t and not (ROOT / t).exists()})
    assert not missing, f"README.md links to missing files: {missing}"


def test_every_docs_page_is_in_the_nav_and_every_nav_entry_exists() -> None:
    nav = mkdocs_nav()
    pages = {p.relative_to(DOCS).as_posix() for p in DOCS.rglob("*.md")}
    duplicates = sorted({p for p in nav if nav.count(p) > 1})
    assert not duplicates, f"mkdocs.yml: pages listed twice in nav: {duplicates}"
    missing = sorted(set(nav) - pages)
    assert not missing, f"mkdocs.yml: nav lists pages that do not exist in docs/: {missing}"
    orphans = sorted(pages - set(nav))
    assert not orphans, f"docs/: pages that mkdocs.yml's nav does not list: {orphans}"


def test_nav_walk_sees_nested_sections() -> None:
    """The walk itself: a page inside a section inside a section is found."""
    nav = [{"Home": "index.md"}, {"A": [{"B": [{"C": "a/b/c.md"}]}, "d.md"]}]
    assert nav_pages(nav) == ["index.md", "a/b/c.md", "d.md"]
