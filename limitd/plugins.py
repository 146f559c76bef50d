"""What a feature brings, and the list of features in use.

A feature (unique jobs, batches, tenant fairness, and the ones to come: rate limiters,
periodic jobs, metrics ...) is a folder with one module per layer it touches, and a
``plug`` module on top that describes it as one :class:`Feature`. ``limitd.features``
registers the shipped ones. The layers below read this registry when they run (the
client's default chain, the config schema, the command line), so they need not import
the features above them, and a new feature is a folder plus a line in
``limitd.features``.

This module is at the bottom of the job-spec layer: it names the pieces only by the
plain types they are called with.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from limitd.spec import JobSpec


@dataclass(frozen=True)
class ConfigSection:
    """A top-level config section the feature owns (``fair_tenant:``).

    ``read(section, env)`` turns the section (a ``limitd.config.values.Section``, empty
    when the files do not have it) into the feature's settings, raising ``ConfigError``
    naming the file, key and expected value; ``as_dict(settings)`` is what ``limitd
    check`` prints."""

    key: str
    read: Callable[[Any, Mapping[str, str]], Any]
    as_dict: Callable[[Any], dict[str, Any]]


@dataclass(frozen=True)
class Feature:
    """The pieces of one feature, each optional.

    - ``section``: its config section;
    - ``client_middleware(settings)``: its client middleware, given the section's
      settings (None when no config was loaded: the feature falls back on its defaults);
    - ``server_middleware(redis)``: its server middleware, on the capsule's Redis;
    - ``add_commands(subparsers, resolve_redis)``: its ``limitd`` subcommands;
    - ``check_app(config, jobs)``: checks of the app's jobs against the loaded config,
      run by ``limitd check`` and ``limitd start`` (raise ``ConfigError``).

    Admin API calls are re-exported by ``limitd.api`` from the feature's ``admin``
    module, so that users import them from one place and mypy can follow them."""

    name: str
    section: ConfigSection | None = None
    client_middleware: Callable[[Any], Any] | None = None
    server_middleware: Callable[[Any], Any] | None = None
    add_commands: Callable[[Any, Any], None] | None = None
    check_app: Callable[[Any, Sequence[JobSpec]], None] | None = None


_features: list[Feature] = []
_lock = threading.Lock()


def register(feature: Feature) -> None:
    """Add ``feature`` after those registered before it (their order is the order of
    the middleware chains); registering a name again replaces it in place."""
    with _lock:
        for index, known in enumerate(_features):
            if known.name == feature.name:
                _features[index] = feature
                return
        _features.append(feature)


def registered() -> tuple[Feature, ...]:
    """The features in use, in registration order."""
    with _lock:
        return tuple(_features)


def sections() -> list[ConfigSection]:
    """The config sections of the features in use."""
    return [feature.section for feature in registered() if feature.section is not None]
