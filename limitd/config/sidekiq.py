"""A Sidekiq config file (``sidekiq.yml``) read as a limitd one.

Sidekiq makes every key of its YAML a symbol, so to it ``:concurrency: 5`` and
``concurrency: 5`` are one key; limitd reads both too, at every depth. Then, before the
schema sees the file:

- a key Sidekiq spells differently is renamed when it means the same thing
  (:data:`RENAMED`: ``dead_max_jobs`` is ``dead.max_jobs``, ``verbose: true`` is
  ``logging.level: DEBUG``, ...);
- a key with no meaning in limitd is refused with what to do instead
  (:data:`NO_EQUIVALENT`), never ignored; so is an environment section
  (``production:``) and an ERB tag (``<%= ... %>``), which Sidekiq evaluates and limitd
  would otherwise report as a bad value;
- everything else is limitd's spelling already: ``queues`` (names, ``[name, weight]``
  pairs), ``concurrency``, ``timeout``, ``tag``, ``capsules`` (Sidekiq 7's, each with
  ``queues`` and ``concurrency``), and sidekiq-limit_fetch's ``limits``,
  ``process_limits``, ``blocking`` and ``dynamic``. The schema checks them as usual.

This runs on each file before the files are merged, so an error names the file that
holds the key.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from limitd.config.settings import ConfigError

DAY = 86_400

RENAMED: dict[str, str] = {
    "verbose": "logging.level",
    "logfile": "logging.file",
    "dead_max_jobs": "dead.max_jobs",
    "dead_timeout_in_seconds": "dead.timeout_days",
}

_IN_CODE = "is set in code: limitd.configure_server(...) (see the page on extending limitd)"
NO_EQUIVALENT: dict[str, str] = {
    "pidfile": "limitd writes no pid file: run it under systemd, a container or another "
    "process manager, which knows the pid (and sends the signals)",
    "daemon": "limitd does not daemonize: run it under systemd or in a container",
    "environment": "limitd has no environments: put an environment's settings in a file "
    "of their own and name it after the base one (limitd start base.yml production.yml)",
    "strict": "Sidekiq ignores it too: the queue order is strict when no queue has a "
    "weight and weighted otherwise; remove the key",
    "labels": "limitd shows one label per process: set tag",
    "max_retries": "limitd sets retries per job: @limitd.job(retry=N) (the default is 25, "
    "as in Sidekiq)",
    "average_scheduled_poll_interval": "limitd's poller sleeps until the next scheduled "
    "job is due rather than polling at an interval: nothing to tune; remove the key",
    "poll_interval_average": "limitd's poller sleeps until the next scheduled job is due "
    "rather than polling at an interval: nothing to tune; remove the key",
    "on_complex_arguments": "limitd always refuses job arguments JSON cannot carry as they "
    "are; remove the key",
    "error_handlers": _IN_CODE,
    "death_handlers": _IN_CODE,
    "lifecycle_events": _IN_CODE,
    "logged_job_attributes": "limitd's job log lines carry the class, jid and queue (and "
    "bid); remove the key",
    "redis_idle_timeout": "limitd keeps its pool's connections; set redis.socket_timeout "
    "for reads, or remove the key",
}
ENVIRONMENTS = ("production", "staging", "development", "test")


def from_sidekiq(data: dict[str, Any], file: str) -> dict[str, Any]:
    """``data`` (one file's top-level mapping) in limitd's spelling; raises a
    ``ConfigError`` naming ``file`` and the key for what limitd cannot take."""
    data = _symbols_as_names(data, file, "")
    _refuse_erb(data, file, "")
    for key in data:
        if key in NO_EQUIVALENT:
            raise ConfigError(file, key, NO_EQUIVALENT[key])
        if key in ENVIRONMENTS and isinstance(data[key], dict):
            raise ConfigError(
                file,
                key,
                "limitd has no environment sections: put these settings in a file of their "
                f"own and name it after the base one (limitd start base.yml {key}.yml)",
            )
    for old, new in RENAMED.items():
        if old in data:
            _move(data, old, new, file)
    if isinstance(data.get("require"), str):
        data["require"] = [_module(data["require"], file)]
    return data


def _symbols_as_names(value: Any, file: str, path: str) -> Any:
    """Every mapping key ``:name`` as ``name``, as Sidekiq's symbolized keys are."""
    if isinstance(value, list):
        return [_symbols_as_names(item, file, path) for item in value]
    if not isinstance(value, dict):
        return value
    named: dict[str, Any] = {}
    for key, item in value.items():
        name = key[1:] if key.startswith(":") and len(key) > 1 else key
        where = f"{path}.{name}" if path else name
        if name in named:
            raise ConfigError(file, where, f"given twice, as {name!r} and {':' + name!r}")
        named[name] = _symbols_as_names(item, file, where)
    return named


def _refuse_erb(value: Any, file: str, path: str) -> None:
    if isinstance(value, dict):
        for key, item in value.items():
            _refuse_erb(item, file, f"{path}.{key}" if path else key)
    elif isinstance(value, list):
        for index, item in enumerate(value):
            _refuse_erb(item, file, f"{path}[{index}]")
    elif isinstance(value, str) and "<%" in value:
        raise ConfigError(
            file,
            path,
            f"{value!r}: ERB tags are Sidekiq's; limitd reads the environment with "
            "${VAR} or ${VAR:-default}",
        )


def _move(data: dict[str, Any], old: str, new: str, file: str) -> None:
    """``data[old]`` to the dotted path ``new``, converted; the new key given as well
    would make the file say two things, and is an error."""
    value = data.pop(old)
    section, key = new.split(".")
    target = data.setdefault(section, {})
    if not isinstance(target, dict):
        return  # the schema reports the section that is not a mapping
    if target.get(key) is not None:
        raise ConfigError(file, old, f"is Sidekiq's spelling of {new}, which is set too: keep one")
    converted = _CONVERSIONS[old](value, file, old)
    if converted is not None:
        target[key] = converted
    if not target:
        del data[section]


def _verbose(value: Any, file: str, key: str) -> str | None:
    if not isinstance(value, bool):
        raise ConfigError(file, key, f"expected true or false, got {value!r}")
    return "DEBUG" if value else None  # false: the default level, as in Sidekiq


def _as_is(value: Any, file: str, key: str) -> Any:
    return value


def _days(value: Any, file: str, key: str) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or value <= 0:
        raise ConfigError(
            file, key, f"expected a number of seconds > 0 (or set dead.timeout_days), got {value!r}"
        )
    return value / DAY


_CONVERSIONS: dict[str, Callable[[Any, str, str], Any]] = {
    "verbose": _verbose,
    "logfile": _as_is,
    "dead_max_jobs": _as_is,
    "dead_timeout_in_seconds": _days,
}


def _module(value: str, file: str) -> str:
    """Sidekiq's ``require`` is a Ruby file or a Rails directory; limitd's names Python
    modules. One module name is taken as a list of one."""
    if "/" in value or value.endswith(".rb") or value.startswith("."):
        raise ConfigError(
            file,
            "require",
            f"{value!r} is a path; limitd imports Python modules by name: require: "
            "[myapp.jobs] (run limitd from the directory that holds the package)",
        )
    return value
