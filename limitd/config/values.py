"""Typed reads from the merged config: every value checked against what its key expects.

``Section`` is one mapping of the merged configuration (the top level, ``redis``, one
capsule, ...) together with its key path. Its readers return typed values or raise a
``ConfigError`` that names the file which set the value, the full key path and what was
expected, e.g. ``conf/prod.yml: capsules.mail.concurrency: expected an integer >= 1,
got -2``.

Typing: a literal value must already have the right YAML type (``concurrency: "12"`` is
an error). A value built by ``${VAR}`` interpolation is text from the environment, so it
is converted to the type the key expects: integers are digits with an optional sign,
numbers anything ``float()`` reads that is finite, booleans true/false/yes/no/on/off/1/0
in any case. This is why the conversion is driven by the schema rather than by
re-parsing the text as YAML: ``tag: ${TAG}`` with ``TAG=on`` stays the string "on".
A null value (or one that interpolated to empty text) means "not set": the default.
"""

from __future__ import annotations

import difflib
import math
import re
from collections.abc import Collection, Mapping
from typing import Any

from limitd.config.files import Interpolated, KeyPath, Layers
from limitd.config.settings import ConfigError
from limitd.queues.order import QueueOrder, QueueSpec
from limitd.queues.rates import FORMS, Rate, parse_rate

ENVIRONMENT = "environment"  # the "file" named by errors in environment variables
_INTEGER = re.compile(r"[+-]?\d+")
_TRUE = frozenset({"true", "yes", "on", "1"})
_FALSE = frozenset({"false", "no", "off", "0"})
_SHOWN = 60  # characters of a list or mapping shown in an error
_QUEUE_FORMS = "a queue name, 'name,weight' or [name, weight] with an integer weight >= 0"


def describe(value: Any) -> str:
    """A value as the error message shows it, in YAML's words where they differ."""
    if isinstance(value, Interpolated):
        return f"{str(value)!r} (from {value.source!r})"
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, dict):
        text = "{" + ", ".join(f"{key}: {describe(item)}" for key, item in value.items()) + "}"
    elif isinstance(value, list):
        text = "[" + ", ".join(describe(item) for item in value) + "]"
    else:
        return repr(value)
    return text if len(text) <= _SHOWN else text[: _SHOWN - 4] + " ..."


def as_int(value: Any) -> int | None:
    if isinstance(value, Interpolated):
        return int(value) if _INTEGER.fullmatch(value.strip()) else None
    if isinstance(value, int) and not isinstance(value, bool):
        return value
    return None


def as_float(value: Any) -> float | None:
    if isinstance(value, Interpolated):
        try:
            number = float(value)
        except ValueError:
            return None
        return number if math.isfinite(number) else None
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        return float(value) if math.isfinite(value) else None
    return None


def as_bool(value: Any) -> bool | None:
    if isinstance(value, Interpolated):
        text = value.strip().lower()
        return True if text in _TRUE else (False if text in _FALSE else None)
    return value if isinstance(value, bool) else None


class Section:
    """One mapping of the merged config and the key path that leads to it."""

    def __init__(self, data: Mapping[str, Any], path: KeyPath, layers: Layers) -> None:
        self.data = data
        self.path = path
        self.layers = layers

    def error(self, key: str | KeyPath, message: str) -> ConfigError:
        sub = (key,) if isinstance(key, str) else key
        return self.layers.error((*self.path, *sub), message)

    def check_keys(self, allowed: Collection[str]) -> None:
        """Unknown keys are errors: a misspelt setting must not be silently ignored."""
        for key in self.data:
            if key not in allowed:
                close = difflib.get_close_matches(key, allowed, n=1)
                hint = (
                    f"did you mean {close[0]!r}?" if close else f"expected one of {sorted(allowed)}"
                )
                raise self.error(key, f"unknown key; {hint}")

    def given(self, key: str) -> bool:
        return self.data.get(key) is not None

    def section(self, key: str, *, allow_list: bool = False) -> Section:
        """The mapping under ``key`` (empty when absent); with ``allow_list``, a list
        there is kept as the section's data, for readers that take both forms."""
        raw = self.data.get(key)
        if allow_list and isinstance(raw, list):
            return Section(raw, (*self.path, key), self.layers)  # type: ignore[arg-type]
        if raw is not None and not isinstance(raw, dict):
            raise self.error(key, f"expected a mapping, got {describe(raw)}")
        return Section(raw or {}, (*self.path, key), self.layers)

    def integer(self, key: str, default: int, minimum: int) -> int:
        found = self.optional_integer(key, minimum)
        return default if found is None else found

    def optional_integer(self, key: str, minimum: int) -> int | None:
        raw = self.data.get(key)
        if raw is None:
            return None
        found = as_int(raw)
        if found is None or found < minimum:
            raise self.error(key, f"expected an integer >= {minimum}, got {describe(raw)}")
        return found

    def number(
        self,
        key: str,
        default: float,
        minimum: float,
        *,
        above: bool = False,
        unit: str = "seconds",
    ) -> float:
        """A finite number >= minimum (> minimum when ``above``)."""
        raw = self.data.get(key)
        if raw is None:
            return default
        found = as_float(raw)
        if found is None or found < minimum or (above and found == minimum):
            bound = f"{'>' if above else '>='} {minimum:g}"
            raise self.error(key, f"expected a number of {unit} {bound}, got {describe(raw)}")
        return found

    def boolean(self, key: str, default: bool) -> bool:
        raw = self.data.get(key)
        found = default if raw is None else as_bool(raw)
        if found is None:
            raise self.error(key, f"expected true or false, got {describe(raw)}")
        return found

    def string(self, key: str, default: str) -> str:
        found = self.optional_string(key)
        return default if found is None else found

    def optional_string(self, key: str) -> str | None:
        raw = self.data.get(key)
        if raw is None:
            return None
        if not isinstance(raw, str):
            raise self.error(key, f"expected a string, got {describe(raw)}")
        return str(raw)  # a plain str, not an Interpolated

    def choice(self, key: str, choices: Collection[str], default: str) -> str:
        found = self.string(key, default)
        if found not in choices:
            raise self.error(key, f"expected one of {sorted(choices)}, got {found!r}")
        return found

    def names(self, key: str, what: str, pattern: re.Pattern[str] | None = None) -> list[str]:
        """A list of names (``what``: "queue name", "module name"), each a non-empty
        string; [] when not set."""
        raw = self.data.get(key)
        if raw is None:
            return []
        if not isinstance(raw, list):
            raise self.error(key, f"expected a list of {what}s, got {describe(raw)}")
        for index, item in enumerate(raw):
            good = isinstance(item, str) and item and (pattern is None or pattern.fullmatch(item))
            if not good:
                raise self.error((key, index), f"expected a {what}, got {describe(item)}")
        return [str(item) for item in raw]

    def limits(self, key: str) -> dict[str, int]:
        """queue -> integer >= 0; a queue whose limit is null has no limit."""
        values = self.section(key)
        found = {queue: values.optional_integer(queue, 0) for queue in values.data}
        return {queue: value for queue, value in found.items() if value is not None}

    def rate_limits(self, key: str) -> dict[str, Rate]:
        """queue -> rate ("100/minute", "10/30s"); a queue whose rate is null has none.
        An interpolated value is text already, so it reads like a literal one."""
        values = self.section(key)
        rates = {}
        for queue, raw in values.data.items():
            if raw is None:
                continue
            try:
                rates[queue] = parse_rate(str(raw) if isinstance(raw, str) else raw)
            except ValueError:
                raise values.error(queue, f"expected a rate {FORMS}, got {describe(raw)}") from None
        return rates

    def poll_range(self, key: str, default: tuple[float, float]) -> tuple[float, float]:
        raw = self.data.get(key)
        if raw is None:
            return default
        pair = [as_float(item) for item in raw] if isinstance(raw, list) else []
        if len(pair) != 2 or pair[0] is None or pair[1] is None or not 0 < pair[0] <= pair[1]:
            raise self.error(
                key, f"expected [low, high] seconds with 0 < low <= high, got {describe(raw)}"
            )
        return (pair[0], pair[1])

    def queues(self, key: str) -> list[QueueSpec] | None:
        """Queue entries in one normal form: the name when its weight is 0 (the strict
        order), else [name, weight]. None when not set."""
        raw = self.data.get(key)
        if raw is None:
            return None
        if not isinstance(raw, list) or not raw:
            raise self.error(key, f"expected a non-empty list of queues, got {describe(raw)}")
        entries: dict[str, int] = {}
        for index, entry in enumerate(raw):
            name, weight = self._queue_entry((key, index), entry)
            if name in entries:
                raise self.error((key, index), f"queue {name!r} is listed twice")
            entries[name] = weight
        return [name if weight == 0 else [name, weight] for name, weight in entries.items()]

    def _queue_entry(self, path: KeyPath, entry: Any) -> tuple[str, int]:
        spec: QueueSpec | None = None
        if isinstance(entry, str):
            spec = str(entry)
        elif isinstance(entry, list) and len(entry) == 2 and isinstance(entry[0], str):
            weight = as_int(entry[1])
            spec = None if weight is None else [str(entry[0]), weight]
        if spec is not None:
            try:
                return next(iter(QueueOrder([spec]).weights.items()))
            except ValueError:
                pass
        raise self.error(path, f"expected {_QUEUE_FORMS}, got {describe(entry)}")
