"""The ``metrics:`` config section: where each capsule process serves its job metrics.

::

    metrics:
      port: 9200        # process 0 serves on 9200, process 1 on 9201, ...
      bind: 0.0.0.0     # default 127.0.0.1

No section (or no ``port``): capsule processes serve nothing. The port of a process is
``port`` plus its ``process_number`` (its place among the supervisor's children, kept
across restarts), so every process of every capsule has a fixed scrape target.
:func:`check_ports` checks, once the capsules are known, that the last of those ports
still exists.
"""

from __future__ import annotations

import ipaddress
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from limitd.config.settings import Config, ConfigError
from limitd.config.values import Section
from limitd.spec import JobSpec

KEY = "metrics"
METRICS_KEYS = frozenset({"port", "bind"})
DEFAULT_BIND = "127.0.0.1"
HIGHEST_PORT = 65_535
_HOSTNAME = re.compile(
    r"[A-Za-z0-9]([A-Za-z0-9-]*[A-Za-z0-9])?(\.[A-Za-z0-9]([A-Za-z0-9-]*[A-Za-z0-9])?)*"
)


@dataclass(frozen=True)
class MetricsSettings:
    """``port``: the first process's port, None when processes serve no metrics;
    ``bind``: the address they listen on; ``source``: the file that set ``port``, for
    errors found after loading (not part of the settings' value)."""

    port: int | None = None
    bind: str = DEFAULT_BIND
    source: str = field(default="", compare=False)

    @property
    def enabled(self) -> bool:
        return self.port is not None

    def port_of(self, process_number: int) -> int:
        """The port the supervisor's child number ``process_number`` serves on."""
        if self.port is None:
            raise ValueError("metrics are not enabled: no metrics.port")
        return self.port + process_number


def read_metrics(section: Section, env: Mapping[str, str]) -> MetricsSettings:
    """The ``metrics`` section, every value checked (``env`` is unused: the files'
    ``${VAR}`` interpolation covers the port of a deployment)."""
    del env
    section.check_keys(METRICS_KEYS)
    port = section.optional_integer("port", 1)
    if port is not None and port > HIGHEST_PORT:
        raise section.error("port", f"expected a TCP port from 1 to {HIGHEST_PORT}, got {port}")
    bind = _address(section)
    if port is None and section.given("bind"):
        raise section.error("port", "expected a TCP port (bind is set, but no port to serve on)")
    source = section.layers.origin((*section.path, "port")) if port is not None else ""
    return MetricsSettings(port=port, bind=bind, source=source)


def _address(section: Section) -> str:
    bind = section.string("bind", DEFAULT_BIND)
    try:
        ipaddress.ip_address(bind)
    except ValueError:
        if not _HOSTNAME.fullmatch(bind):
            raise section.error(
                "bind",
                f"expected an IP address (127.0.0.1, 0.0.0.0, ::) or a host name, got {bind!r}",
            ) from None
    return bind


def as_dict(settings: MetricsSettings) -> dict[str, Any]:
    """The section as ``limitd check`` prints it (and reads it back): without a port,
    ``bind`` is null too, as a bind alone is refused."""
    return {"port": settings.port, "bind": settings.bind if settings.enabled else None}


def check_ports(config: Config, jobs: Iterable[JobSpec]) -> None:
    """Every process gets ``port + process_number``: the last one must be a port."""
    del jobs
    settings = config.section(KEY)
    if not isinstance(settings, MetricsSettings) or settings.port is None:
        return
    processes = sum(spec.processes for spec in config.capsules)
    last = settings.port_of(processes - 1)
    if last > HIGHEST_PORT:
        raise ConfigError(
            settings.source or ", ".join(config.files),
            f"{KEY}.port",
            f"expected a port <= {HIGHEST_PORT - processes + 1}: its {processes} processes "
            f"serve on port to port + {processes - 1}, and {last} is not a TCP port",
        )
