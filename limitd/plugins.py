"""What a feature brings, and the list of features in use.

A feature (unique jobs, batches, tenant fairness, and the ones to come: rate limiters,
periodic jobs, metrics ...) is a folder with one module per layer it touches, and a
``plug`` module on top that describes it as one :class:`Feature`. ``limitd.features``
registers the shipped ones. The layers below read this registry when they run (the
client's default chain, the config schema, the command line), so they need not import
the features above them, and a new feature is a folder plus a line in
``limitd.features``.

This module is at the bottom of the job-spec layer: it names the pieces only by the
plain types they are called with. It is for limitd's own features: app code declares
its error handlers, middleware and lifecycle hooks with ``limitd.configure_server`` and
``limitd.configure_client`` (``limitd.app_hooks``, docs/extending.md).

Two seams let a feature step into the core's own work without the core naming it:

- push gates (:func:`add_push_gate`): every push is offered to them first, as a
  :class:`Push` to run; a gate may take it (to run later, or never). Transactions hold
  pushes until the app's database commits this way.
- housekeeping (:attr:`Feature.housekeeping`): periodic upkeep of the feature's Redis
  state, run by every capsule's scheduled poller between looks (batches prune their
  index this way).

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

from limitd.payload import Payload, check_args
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
      whatever the amount of state;
    - ``housekeeping(redis)``: upkeep of its Redis state, called by the scheduled poller
      of every capsule at each of its upkeeps (together about every
      ``average_scheduled_poll_interval`` seconds); work that must happen less often
      or in one process at a time takes a lock key for it. A ``RedisError`` it raises
      backs the poller off; any other error is logged and the poller goes on.

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
    housekeeping: Callable[[Any], Any] | None = None


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


@dataclass(frozen=True)
class Push:
    """A push as the client offers it to the push gates: ``payloads`` (complete, jids
    set, before any middleware) and ``run``, which sends them through the client
    middleware chain and writes them now (returning what the client's push returns).

    A gate that takes the push but runs it at once (reliable push: it keeps the push
    only when Redis does not answer) puts what ``run`` returned in ``ran``: the client
    returns that (None for a push a middleware halted) rather than the jids it set."""

    payloads: list[Payload]
    run: Callable[[], Any]
    strict_args: str = "raise"
    ran: list[Any] = field(default_factory=list, compare=False)

    def validate(self) -> None:
        """Check the arguments as the write would (``limitd.payload.check_args``): a gate
        that holds the push calls this first, so a bad argument fails at the caller."""
        for payload in self.payloads:
            check_args(payload["class"], payload["args"], self.strict_args)

    def what(self) -> str:
        """The push as logs name it."""
        return describe(self.payloads)


PushGate = Callable[[Push], bool]
"""Given a push, takes it (True: the gate runs it later, or drops it) or lets it go on
(False: the client runs it now)."""

_push_gates: list[PushGate] = []  # replaced, never changed in place: pushes read it unlocked
_last_gates: list[PushGate] = []  # offered after every other gate, whenever added


def add_push_gate(gate: PushGate, *, last: bool = False) -> None:
    """Offer every push to ``gate`` from now on, after the gates added before it; with
    ``last``, after every gate added without it, even those added later (a gate that
    runs pushes at once, as reliable push does, must not pass on a push that a
    transaction would hold). Adding the same gate again changes nothing."""
    global _push_gates
    with _lock:
        if gate in _push_gates:
            return
        if last:
            _last_gates.append(gate)
        ordinary = [known for known in _push_gates if known not in _last_gates]
        _push_gates = ordinary + ([] if last else [gate]) + _last_gates


def remove_push_gate(gate: PushGate) -> None:
    global _push_gates
    with _lock:
        if gate in _last_gates:
            _last_gates.remove(gate)
        _push_gates = [known for known in _push_gates if known != gate]


def has_push_gates() -> bool:
    """Whether any gate is set: the client asks this first, so that a push builds no
    :class:`Push` while no feature gates pushes (the usual case)."""
    return bool(_push_gates)


def gate_push(push: Push) -> bool:
    """Whether a push gate took ``push``; False: the caller runs it now."""
    return any(gate(push) for gate in _push_gates)


def describe(payloads: Sequence[Payload]) -> str:
    """Payloads as a log line or an error names them: the first five jids and the class."""
    jids = ",".join(str(payload.get("jid")) for payload in payloads[:5])
    more = f" (+{len(payloads) - 5} more)" if len(payloads) > 5 else ""
    return f"jid={jids}{more} class={payloads[0].get('class')}"
