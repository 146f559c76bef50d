"""The reference pages of the docs site stay complete as the code grows.

Each test reads what the code accepts or serves (the config schema's keys, the command
line's parser, the metric families the exporter and a capsule process serve) and checks
that the page names every item, so a new key, flag or metric without documentation fails
here rather than surprising an operator.
"""

from __future__ import annotations

import argparse
import importlib
import re
from collections.abc import Iterator
from pathlib import Path

import redis as redis_py
import yaml
from prometheus_client.core import Metric

from limitd.cli import build_parser
from limitd.config import CapsuleConfig, accepted_keys
from limitd.metrics.exporter import ClusterCollector
from limitd.metrics.process import ProcessMetrics
from limitd.metrics.section import MetricsSettings
from limitd.plugins import ProcessContext, sections

DOCS = Path(__file__).resolve().parent.parent / "docs"
CONFIGURATION = DOCS / "reference" / "configuration.md"
CLI = DOCS / "reference" / "cli.md"
METRICS = DOCS / "reference" / "metrics.md"
ALERTS = DOCS / "operations" / "metrics-and-alerts.md"


def chapters(page: Path) -> dict[str, str]:
    """The page's text by level-2 heading (``## `redis```), subsections included."""
    found: dict[str, str] = {}
    heading = ""
    for line in page.read_text(encoding="utf-8").splitlines():
        if line.startswith("## "):
            heading = line[3:].strip()
        found[heading] = found.get(heading, "") + line + "\n"
    return found


def chapter_for(path: str) -> str:
    """The heading that documents the mapping at ``path`` (as ``accepted_keys`` names it)."""
    if path == "":
        return "Top level"
    return f"`{path.split('.', maxsplit=1)[0]}`"


def feature_keys() -> dict[str, frozenset[str]]:
    """The keys inside each feature's section: the ``*_KEYS`` sets its reader's module
    declares (every shipped section names them so; a section without one fails)."""
    found = {}
    for section in sections():
        module = importlib.import_module(section.read.__module__)
        declared = [
            value
            for name, value in vars(module).items()
            if name.endswith("_KEYS") and isinstance(value, frozenset)
        ]
        assert declared, f"{module.__name__} declares no *_KEYS set for section {section.key}"
        found[section.key] = frozenset().union(*declared)
    return found


def test_every_config_key_is_in_its_chapter() -> None:
    text = chapters(CONFIGURATION)
    expected = {**accepted_keys(), **feature_keys()}
    missing = []
    for path, allowed in expected.items():
        chapter = text.get(chapter_for(path))
        if chapter is None:
            missing.append(f"chapter {chapter_for(path)}")
            continue
        missing += [f"{path or '<top>'}: {key}" for key in allowed if f"`{key}`" not in chapter]
    assert not missing, f"{CONFIGURATION.name} lacks: {sorted(missing)}"


def commands(parser: argparse.ArgumentParser, path: str = "limitd") -> Iterator[tuple[str, str]]:
    """(command path, long option) for every option of every (sub)command, with the
    option "" for the command itself."""
    yield path, ""
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, sub in action.choices.items():
                yield from commands(sub, f"{path} {name}")
            continue
        for option in action.option_strings:
            if option.startswith("--") and option != "--help":
                yield path, option


def test_every_command_and_long_option_is_documented() -> None:
    """Options every command takes (``--config``, before or after the command's name) are
    documented once, in the `limitd` chapter; the others in their command's chapter."""
    text = chapters(CLI)
    found = list(commands(build_parser()))
    paths = {path for path, _ in found}
    common = {
        option
        for option in {option for _, option in found if option}
        if all((path, option) in found for path in paths)
    }
    missing = []
    for path, option in found:
        heading = "`limitd`" if option in common else f"`{path}`"
        chapter = text.get(heading)
        if chapter is None:
            missing.append(f"chapter {heading}")
        elif option and f"`{option}" not in chapter:
            missing.append(f"{path} {option}")
    assert not missing, f"{CLI.name} lacks: {sorted(set(missing))}"


def exposed_names(families: list[Metric]) -> set[str]:
    """The names a scrape shows: counters carry ``_total``."""
    return {
        f"{family.name}_total" if family.type == "counter" else family.name for family in families
    }


def documented_metrics() -> set[str]:
    return set(re.findall(r"`([a-z_]+)`", METRICS.read_text(encoding="utf-8")))


def cluster_metric_names(redis: redis_py.Redis) -> set[str]:
    return exposed_names(list(ClusterCollector(redis).collect()))


def process_metric_names() -> set[str]:
    context = ProcessContext(redis=None, sections={}, capsule=CapsuleConfig(), chain=None)
    served = ProcessMetrics(context, MetricsSettings(port=9200))  # not started: no port taken
    return exposed_names(list(served.registry.collect()))


def test_every_cluster_metric_is_documented(redis: redis_py.Redis) -> None:
    names = cluster_metric_names(redis)
    assert "limitd_queue_size" in names  # the collector really ran
    missing = names - documented_metrics()
    assert not missing, f"{METRICS.name} lacks: {sorted(missing)}"


def test_every_process_metric_is_documented() -> None:
    names = process_metric_names()
    assert "limitd_jobs_total" in names
    missing = names - documented_metrics()
    assert not missing, f"{METRICS.name} lacks: {sorted(missing)}"


def test_alert_rules_use_metrics_that_exist(redis: redis_py.Redis) -> None:
    """The recommended rules parse, and every limitd (or process) metric their
    expressions name is one the code serves (a histogram's series by their suffixes)."""
    blocks = re.findall(r"```yaml\n(.*?)```", ALERTS.read_text(encoding="utf-8"), re.DOTALL)
    rules = [
        rule
        for block in blocks
        for group in (yaml.safe_load(block) or {}).get("groups", [])
        for rule in group["rules"]
    ]
    assert len(rules) >= 5
    served = cluster_metric_names(redis) | process_metric_names()
    histograms = {f"{name}{suffix}" for name in served for suffix in ("_bucket", "_sum", "_count")}
    used = {
        name
        for rule in rules
        for name in re.findall(r"\b((?:limitd|process)_[a-z_]+)", rule["expr"])
    }
    assert used, "the rules name no limitd metric"
    unknown = used - served - histograms
    assert not unknown, f"{ALERTS.name} alerts on metrics nobody serves: {sorted(unknown)}"
