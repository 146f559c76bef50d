"""Config files to one merged mapping: read YAML, merge the files, interpolate ``${VAR}``.

This is the first half of loading a configuration (``schema`` turns the result
into typed settings). It keeps, for every key path, the file that last set it, so that a
mistake found later, while checking types, is blamed on the file that holds it.

Rules:

- a file must hold a YAML mapping (an empty file is an empty mapping); a key may appear
  only once per mapping, and keys must be strings;
- Sidekiq's spelling (``:concurrency: 5``, ``dead_max_jobs``) is read as limitd's, and
  what has no meaning in limitd is refused with what to do instead (``sidekiq``);
- later files override earlier ones: mappings merge key by key (so capsules merge by
  name), anything else (scalars, lists) is replaced whole;
- after merging, ``${VAR}`` and ``${VAR:-default}`` in string values are replaced from
  the environment (``:-`` also applies when VAR is set but empty, as in the shell);
  ``$${`` is a literal ``${``. Only values are interpolated, never keys. A value that
  used a reference becomes an ``Interpolated`` string, which the typed readers convert
  to the type the key expects; one that comes out empty becomes null (the default).
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from limitd.config.settings import ConfigError
from limitd.config.sidekiq import from_sidekiq

KeyPath = tuple[str | int, ...]

_REFERENCE = re.compile(r"\$\$\{|\$\{(?P<body>[^}]*)\}|\$\{")
_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
_MERGE_TAG = "tag:yaml.org,2002:merge"


class Interpolated(str):
    """A string value built from the environment. Unlike a literal string in the file,
    it may stand for a number or a boolean: the environment only holds text."""

    source: str

    def __new__(cls, value: str, source: str) -> Interpolated:
        text = super().__new__(cls, value)
        text.source = source
        return text


def dotted(path: KeyPath) -> str:
    """``('capsules', 'mail', 'queues', 0)`` -> ``capsules.mail.queues[0]``."""
    text = ""
    for part in path:
        text += f"[{part}]" if isinstance(part, int) else (f".{part}" if text else part)
    return text


@dataclass
class Layers:
    """The files merged into one mapping, and which file last set each key path."""

    files: list[str]
    data: dict[str, Any] = field(default_factory=dict)
    origins: dict[KeyPath, str] = field(default_factory=dict)

    def origin(self, path: KeyPath) -> str:
        """The file to blame for the value at ``path``: the one that set it, else the one
        that last set its nearest parent (a missing key is blamed on its mapping)."""
        keys = list(path)
        while keys and isinstance(keys[-1], int):
            keys.pop()
        while keys:
            found = self.origins.get(tuple(keys))
            if found is not None:
                return found
            keys.pop()
        return self.files[-1] if self.files else "(no file)"

    def error(self, path: KeyPath, message: str) -> ConfigError:
        return ConfigError(self.origin(path), dotted(path), message)


def merge_files(paths: Sequence[str | Path]) -> Layers:
    """Read every file and merge them in order (later files win)."""
    layers = Layers(files=[str(path) for path in paths])
    for name in layers.files:
        _merge_into(layers.data, from_sidekiq(read_yaml(name), name), name, layers.origins, ())
    return layers


def read_yaml(name: str) -> dict[str, Any]:
    """One config file as a mapping; every way it can be unusable is a ConfigError."""
    try:
        text = Path(name).read_text(encoding="utf-8")
    except FileNotFoundError:
        raise ConfigError(name, "", "file not found") from None
    except IsADirectoryError:
        raise ConfigError(name, "", "is a directory, expected a YAML file") from None
    except PermissionError:
        raise ConfigError(name, "", "not readable: permission denied") from None
    except OSError as exc:
        raise ConfigError(name, "", f"not readable: {exc.strerror or exc}") from None
    except UnicodeDecodeError:
        raise ConfigError(name, "", "not UTF-8 text") from None
    try:
        data = yaml.load(text, Loader=_StrictLoader)  # a SafeLoader: builds plain data only
    except yaml.YAMLError as exc:
        raise ConfigError(name, "", f"not valid YAML: {_yaml_problem(exc)}") from None
    if data is None:
        return {}
    if not isinstance(data, dict):
        kind = "a list" if isinstance(data, list) else f"{data!r}"
        raise ConfigError(name, "", f"expected a mapping of settings at the top, got {kind}")
    return data


def _yaml_problem(exc: yaml.YAMLError) -> str:
    """PyYAML's message in one line, with the position where it went wrong."""
    if not isinstance(exc, yaml.MarkedYAMLError):
        return str(exc).replace("\n", " ")
    mark = exc.problem_mark or exc.context_mark
    where = f" (line {mark.line + 1}, column {mark.column + 1})" if mark else ""
    return f"{exc.problem or exc.context}{where}"


# libyaml's parser where PyYAML was built with it (the wheels are): the pure-Python one
# took 2.5 s of a capsule's start on a config listing 10,000 queues with their limits.
_SafeBase: type[yaml.SafeLoader] = getattr(yaml, "CSafeLoader", yaml.SafeLoader)


class _StrictLoader(_SafeBase):
    """Safe YAML that refuses a key twice in one mapping (PyYAML silently keeps the last
    one, hiding a mistake) and keys that are not strings (``on:`` would be ``True``)."""

    def construct_mapping(self, node: yaml.MappingNode, deep: bool = False) -> dict[Any, Any]:
        seen: set[str] = set()
        for key_node, _ in node.value:
            if key_node.tag == _MERGE_TAG:
                continue
            key = self.construct_object(key_node, deep=True)
            if not isinstance(key, str):
                raise yaml.constructor.ConstructorError(
                    None, None, f"keys must be strings, got {key!r}", key_node.start_mark
                )
            if key in seen:
                raise yaml.constructor.ConstructorError(
                    None, None, f"duplicate key {key!r}", key_node.start_mark
                )
            seen.add(key)
        return super().construct_mapping(node, deep=deep)


def _merge_into(
    target: dict[str, Any],
    overlay: Mapping[str, Any],
    name: str,
    origins: dict[KeyPath, str],
    prefix: KeyPath,
) -> None:
    for key, value in overlay.items():
        path = (*prefix, key)
        current = target.get(key)
        if isinstance(value, dict) and isinstance(current, dict):
            origins[path] = name
            _merge_into(current, value, name, origins, path)
            continue
        for stale in [known for known in origins if known[: len(path)] == path]:
            del origins[stale]
        target[key] = _fresh(value, name, origins, path)


def _fresh(value: Any, name: str, origins: dict[KeyPath, str], path: KeyPath) -> Any:
    """A copy of a file's value (later merges must not change what a file said), with
    every mapping key path inside it recorded as set by ``name``."""
    origins[path] = name
    if isinstance(value, dict):
        return {key: _fresh(item, name, origins, (*path, key)) for key, item in value.items()}
    if isinstance(value, list):
        return [_copy(item) for item in value]
    return value


def _copy(value: Any) -> Any:
    if isinstance(value, dict):
        return {key: _copy(item) for key, item in value.items()}
    if isinstance(value, list):
        return [_copy(item) for item in value]
    return value


def interpolate(layers: Layers, env: Mapping[str, str]) -> None:
    """Replace ``${VAR}`` references in every string value of the merged data."""
    layers.data = _interpolate_value(layers.data, (), layers, env)


def _interpolate_value(value: Any, path: KeyPath, layers: Layers, env: Mapping[str, str]) -> Any:
    if isinstance(value, dict):
        return {k: _interpolate_value(v, (*path, k), layers, env) for k, v in value.items()}
    if isinstance(value, list):
        return [_interpolate_value(v, (*path, i), layers, env) for i, v in enumerate(value)]
    if isinstance(value, str) and "${" in value:
        return _interpolate_text(value, path, layers, env)
    return value


def _interpolate_text(
    text: str, path: KeyPath, layers: Layers, env: Mapping[str, str]
) -> str | None:
    used = False

    def replace(match: re.Match[str]) -> str:
        nonlocal used
        if match.group(0) == "$${":
            return "${"
        body = match.group("body")
        if body is None:
            raise layers.error(path, f"unclosed '${{' in {text!r}")
        used = True
        return _lookup(body, text, path, layers, env)

    result = _REFERENCE.sub(replace, text)
    if not used:
        return result
    return Interpolated(result, text) if result else None


def _lookup(body: str, text: str, path: KeyPath, layers: Layers, env: Mapping[str, str]) -> str:
    name, has_default, default = body.partition(":-")
    if not _NAME.fullmatch(name):
        raise layers.error(
            path,
            f"bad reference '${{{body}}}' in {text!r}: expected ${{NAME}} or ${{NAME:-default}}",
        )
    value = env.get(name)
    if has_default:
        return value or default
    if value is None:
        raise layers.error(
            path, f"environment variable {name} is not set (or write ${{{name}:-default}})"
        )
    return value
