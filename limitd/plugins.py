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

``import limitd`` imports every shipped ``plug`` module, so a plug imports at its top
only what enqueueing needs (its middleware, config section and checks). The pieces for
the command line, ``limitd metrics`` and ``limitd start`` (argparse, prometheus-client,
the admin API, the web front end) are functions in the plug that import their module
when they are called: app code never pays for them, and mypy still checks each call
(``tests/test_import_cost.py`` keeps it so).
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

from limitd.spec import JobSpec

log = logging.getLogger("limitd.plugins")


@dataclass(frozen=True)
class ConfigSection:
    """A top-level config section the feature owns (``fair_tenant:``).

    ``read(section, env)`` turns the section (a ``limitd.config.values.Section``, empty
    when the files do not have it; its data may be a list with ``list_form``) into the
    feature's settings, raising ``ConfigError`` naming the file, key and expected value;
    ``as_dict(settings)`` is what ``limitd check`` prints."""

    key: str
    read: Callable[[Any, Mapping[str, str]], Any]
    as_dict: Callable[[Any], dict[str, Any]]
    list_form: bool = False  # the section may be a list: ``read`` gets it as the data


class Service(Protocol):
    """Something a feature runs beside the jobs in each capsule process (a periodic
    scheduler, a metrics endpoint): started before the first job, stopped after the
    last. ``stop`` must return within a second or two and never raise for a service
    that failed to start."""

    def start(self) -> None: ...

    def stop(self) -> None: ...


@dataclass
class ProcessContext:
    """What a feature's services are given in a capsule process started by ``limitd
    start``.

    - ``redis``: the process's client;
    - ``sections``: the loaded config's feature settings, by section key;
    - ``capsule``: the capsule's ``CapsuleConfig`` (``process_number`` says which of
      the supervisor's children this is, stable across restarts);
    - ``chain``: the capsule's server chain, before any job runs: a service may add its
      middleware to it (the per-process job metrics do)."""

    redis: Any
    sections: Mapping[str, Any]
    capsule: Any
    chain: Any
    services: list[Service] = field(default_factory=list)

    def section(self, key: str) -> Any:
        return self.sections.get(key)


@dataclass(frozen=True)
class Feature:
    """The pieces of one feature, each optional.

    - ``section``: its config section;
    - ``client_middleware(settings)``: its client middleware, given the section's
      settings (None when no config was loaded: the feature falls back on its defaults);
    - ``server_middleware(redis)``: its server middleware, on the capsule's Redis;
    - ``add_commands(subparsers, resolve_redis)``: its ``limitd`` subcommands;
    - ``check_app(config, jobs)``: checks of the app's jobs against the loaded config,
      run by ``limitd check`` and ``limitd start`` (raise ``ConfigError``);
    - ``process_services(context)``: the services it runs in each capsule process
      (:class:`ProcessContext`), started in order before the capsule and stopped in
      reverse order after it;
    - ``metrics(redis)``: its part of ``limitd metrics``: prometheus-client metric
      families read from Redis at each scrape, in a bounded number of round trips
      whatever the amount of state.

    The hooks a capsule or the command line calls (``add_commands``, ``metrics``,
    ``process_services``) import their heavy modules inside the function, when called.

    Admin API calls are re-exported by ``limitd.api`` from the feature's ``admin``
    module, so that users import them from one place and mypy can follow them."""

    name: str
    section: ConfigSection | None = None
    client_middleware: Callable[[Any], Any] | None = None
    server_middleware: Callable[[Any], Any] | None = None
    add_commands: Callable[[Any, Any], None] | None = None
    check_app: Callable[[Any, Sequence[JobSpec]], None] | None = None
    process_services: Callable[[ProcessContext], Sequence[Service]] | None = None
    metrics: Callable[[Any], Iterable[Any]] | None = None


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


def start_process_services(context: ProcessContext) -> None:
    """Start every feature's services for this process, in registration order; they are
    kept in ``context.services`` for :func:`stop_process_services`. One that fails to
    start stops those already started, and the error goes up: a capsule must not run
    without a service its config asked for."""
    for feature in registered():
        if feature.process_services is None:
            continue
        for service in feature.process_services(context):
            try:
                service.start()
            except BaseException:
                stop_process_services(context)
                raise
            context.services.append(service)


def stop_process_services(context: ProcessContext) -> None:
    """Stop the started services, last started first. A failing stop is logged and the
    others still stop."""
    while context.services:
        service = context.services.pop()
        try:
            service.stop()
        except Exception:
            log.exception("could not stop %s", type(service).__name__)
