"""Where app code declares what it adds to limitd: error and death handlers, its own
server and client middleware, and hooks on a capsule's lifecycle.

The app writes a function that receives a config object and decorates it, in a module
the config ``require``s (or any module the app imports)::

    @limitd.configure_server
    def reporting(config: limitd.ServerConfig) -> None:
        config.error_handlers.append(report_failure)
        config.server_middleware.add(Timing())
        config.on("shutdown", flush_reports)

    @limitd.configure_client
    def request_ids(config: limitd.ClientConfig) -> None:
        config.client_middleware.add(add_request_id)

This is Sidekiq's ``configure_server`` / ``configure_client`` with one difference that
saves writing a middleware twice: ``configure_client`` applies to every client of every
process, the capsules' included (jobs that enqueue jobs), so client middleware are
declared there only.

Declaring only records the function. limitd runs each one once per process, when it
first needs the declarations: the server functions when a capsule (or the testing
runner) builds its server chain, so only where jobs run; the client functions when the
first client builds its chain. Under ``limitd start`` the supervisor imports the app
before forking, so the recorded functions are in each child (a process of a rolling
restart imports the app itself), and each capsule process runs them for itself.

A function is known by its source file and qualified name: importing its module again
(under another name, or by a reload) replaces it rather than adding it twice. A
declaration made after the declarations were used is taken into account by what is
built later (the next capsule, the next client); chains built before keep what they
had.

This module sits with the middleware: it builds chains and knows the retry handlers'
types, and the chains' defaults (``limitd.middleware.defaults``), the capsule and the
package's ``__init__`` read it.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Sequence
from typing import Generic, Literal, TypeVar, get_args

from limitd.middleware.chain import ServerChain
from limitd.middleware.client_chain import ClientChain
from limitd.retry import DeathHandler, ErrorHandler

log = logging.getLogger("limitd.app_hooks")

Event = Literal["startup", "quiet", "shutdown"]
EVENTS: tuple[str, ...] = get_args(Event)
LifecycleHook = Callable[[], object]


class ServerConfig:
    """What a process that runs jobs adds, filled by the ``configure_server`` functions:

    - ``error_handlers``: each ``handler(exc, failure)`` is called for every failed
      attempt of every job (sync or async, retried or not), once its fate is recorded,
      with a ``limitd.retry.Failure``;
    - ``death_handlers``: each ``handler(payload, exc)`` is called when a job dies
      (after its own ``retries_exhausted``), whether it is kept in the dead set or not;
    - ``server_middleware``: a ``ServerChain`` (``add``, ``prepend``,
      ``insert_before``, ``insert_after``, ``remove``) of typed
      ``limitd.middleware.base.ServerMiddleware`` or plain callables; they run before
      (around) the features' middleware, in this chain's order;
    - :meth:`on`: hooks on each capsule's ``startup``, ``quiet`` and ``shutdown``.

    A handler or hook that raises is logged and the others still run."""

    def __init__(self) -> None:
        self.error_handlers: list[ErrorHandler] = []
        self.death_handlers: list[DeathHandler] = []
        self.server_middleware = ServerChain()
        self.hooks: dict[str, list[LifecycleHook]] = {event: [] for event in EVENTS}

    def on(self, event: Event, hook: LifecycleHook) -> LifecycleHook:
        """Call ``hook()`` at ``event`` in each capsule: ``startup`` before it takes its
        first job, ``quiet`` when it stops taking jobs (TSTP, a quiet asked from the
        dashboard, or the start of a stop; once), ``shutdown`` after its last job, before
        the process exits. Startup hooks run in the order declared, quiet and shutdown
        hooks in reverse (the last one set up is the first torn down). Returns
        ``hook``."""
        if event not in self.hooks:
            raise ValueError(
                f"limitd.ServerConfig.on: unknown event {event!r}, expected one of "
                f"{', '.join(EVENTS)}"
            )
        self.hooks[event].append(hook)
        return hook

    def fire(self, event: Event) -> None:
        """Run the hooks of ``event`` (see :meth:`on`); one that raises is logged."""
        hooks = self.hooks[event]
        for hook in hooks if event == "startup" else reversed(hooks):
            try:
                hook()
            except Exception:
                log.exception("%s hook %s failed", event, _name(hook))


class ClientConfig:
    """What every client adds, filled by the ``configure_client`` functions:
    ``client_middleware``, a ``ClientChain`` of typed
    ``limitd.middleware.base.ClientMiddleware`` or plain callables, run before (around)
    the features' middleware, in this chain's order."""

    def __init__(self) -> None:
        self.client_middleware = ClientChain()


C = TypeVar("C", ServerConfig, ClientConfig)
Declaring = Callable[[C], None]


class Declarations(Generic[C]):
    """The functions declared for one side, by origin, and the config they built (once
    per process, again after a declaration changed)."""

    def __init__(self, make: Callable[[], C], kind: str) -> None:
        self._make: Callable[[], C] = make
        self._kind = kind
        self._functions: dict[tuple[str, str], Declaring[C]] = {}
        self._built: C | None = None
        self._lock = threading.RLock()

    def declare(self, function: Declaring[C]) -> Declaring[C]:
        if not callable(function):
            raise TypeError(f"limitd.{self._kind} decorates a function, got {function!r}")
        with self._lock:
            self._functions[_origin(function)] = function
            self._built = None
        return function

    def config(self) -> C:
        """The config the declared functions fill, built on first use. A function that
        raises is not swallowed: the error names it, and nothing is built."""
        with self._lock:
            if self._built is None:
                built = self._make()
                for function in self._functions.values():
                    try:
                        function(built)
                    except Exception as exc:
                        raise RuntimeError(
                            f"limitd.{self._kind} function {_name(function)} raised: {exc}"
                        ) from exc
                self._built = built
            return self._built

    def clear(self) -> None:
        with self._lock:
            self._functions.clear()
            self._built = None

    def functions(self) -> Sequence[Declaring[C]]:
        with self._lock:
            return tuple(self._functions.values())


_server: Declarations[ServerConfig] = Declarations(ServerConfig, "configure_server")
_client: Declarations[ClientConfig] = Declarations(ClientConfig, "configure_client")


def configure_server(function: Declaring[ServerConfig]) -> Declaring[ServerConfig]:
    """Decorator: ``function(config)`` fills a :class:`ServerConfig` in every process
    that runs jobs (see the module docstring for when). Returns ``function``."""
    return _server.declare(function)


def configure_client(function: Declaring[ClientConfig]) -> Declaring[ClientConfig]:
    """Decorator: ``function(config)`` fills the :class:`ClientConfig` every client of
    every process uses. Returns ``function``."""
    return _client.declare(function)


def server_config() -> ServerConfig:
    """This process's server declarations (the declared functions run on first use)."""
    return _server.config()


def client_config() -> ClientConfig:
    """This process's client declarations (the declared functions run on first use)."""
    return _client.config()


def clear() -> None:
    """Forget every declaration (for tests: declarations are per process)."""
    _server.clear()
    _client.clear()


def _origin(function: Callable[..., object]) -> tuple[str, str]:
    """Where a function was written: the same source under two module names (or
    reloaded) is the same declaration."""
    code = getattr(function, "__code__", None)
    where = code.co_filename if code is not None else getattr(function, "__module__", "?")
    return (str(where), getattr(function, "__qualname__", repr(function)))


def _name(function: object) -> str:
    module = getattr(function, "__module__", None)
    name = getattr(function, "__qualname__", None) or repr(function)
    return f"{module}.{name}" if module else name
