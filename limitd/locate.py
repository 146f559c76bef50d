"""Which Redis a process uses: the one order that app code, every command and
``limitd start`` follow, so the process that enqueues and the workers that run the job
meet in the same Redis.

1. an explicit URL: ``--redis URL``, ``limitd.configure(url=...)``;
2. the environment: ``LIMITD_REDIS_URL``, then ``REDIS_URL``;
3. the config, when one is named: ``-C`` files, ``limitd start``'s file arguments and
   ``limitd.configure(paths)``, else ``LIMITD_CONFIG`` (paths separated by
   ``os.pathsep``). The files are merged as ``limitd start`` merges them; their
   ``redis.url``, else the embedded Redis that ``limitd start`` runs beside the first
   file. A named config is final: if it names no URL and its embedded Redis is not
   running, nothing is found (looking elsewhere could pick another app's Redis);
4. with no config named, a running embedded Redis found in ``./.limitd/`` or
   ``./conf/.limitd/`` (the quick start runs ``limitd start conf/example.yml`` from the
   repository's root, and the app runs from there too);
5. the default, which depends on the entry point: app code connects to
   ``redis://127.0.0.1:6379/0``, ``limitd start`` starts an embedded Redis, other
   commands exit 69 rather than guess.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Sequence
from dataclasses import dataclass, replace
from pathlib import Path

import redis as redis_py

from limitd.config import Config, RedisSettings, load_config
from limitd.connection import DEFAULT_URL, URL_ENV_VARS, connect
from limitd.connection.embedded import discover_embedded, embedded_dir, running_embedded_url

CONFIG_ENV = "LIMITD_CONFIG"

# How the URL was found (Location.step), in the order above.
EXPLICIT = "explicit"
ENVIRONMENT = "environment"
CONFIGURED = "config"
EMBEDDED = "embedded"
DISCOVERED = "discovered"
DEFAULT = "default"
NOTHING = "nothing"

log = logging.getLogger("limitd.locate")


class RedisNotFound(RuntimeError):
    """No Redis can be chosen safely: the named config's Redis is not running, or two
    embedded Redis servers run here. The message names the places and the fix."""


@dataclass(frozen=True)
class Location:
    """Where Redis was found. ``url`` is None when nothing was (step ``nothing``);
    ``source`` says where it came from, for logs and messages; ``config`` is the named
    config, read once, for its timeouts and ``fair_tenant`` settings."""

    url: str | None
    step: str
    source: str
    config: Config | None = None


def config_files(explicit: Sequence[str | Path] = ()) -> list[str]:
    """The config files a process was given: ``explicit`` ones, else ``LIMITD_CONFIG``."""
    if explicit:
        return [str(path) for path in explicit]
    value = os.environ.get(CONFIG_ENV, "")
    return [part for part in value.split(os.pathsep) if part.strip()]


def named_config(explicit: Sequence[str | Path] = ()) -> Config | None:
    """The config of :func:`config_files`, loaded; None when none is named."""
    files = config_files(explicit)
    return load_config(files) if files else None


def locate(url: str | None = None, config: Config | None = None, cwd: str | Path = ".") -> Location:
    """Steps 1 to 4 of the order (see the module docstring)."""
    if url:
        return Location(url, EXPLICIT, "the URL given", config)
    for var in URL_ENV_VARS:
        if os.environ.get(var):
            return Location(os.environ[var], ENVIRONMENT, var, config)
    if config is not None:
        return _from_config(config)
    return _discovered(cwd)


def _from_config(config: Config) -> Location:
    files = ", ".join(config.files)
    if config.redis.url:
        return Location(config.redis.url, CONFIGURED, f"redis.url of {files}", config)
    source = f"the embedded Redis of {files} in {embedded_dir(config.base_dir)}"
    return Location(running_embedded_url(config.base_dir), EMBEDDED, source, config)


def _discovered(cwd: str | Path) -> Location:
    found = discover_embedded(cwd)
    if len(found) > 1:
        places = " and ".join(str(directory) for directory, _ in found)
        raise RedisNotFound(
            f"no Redis configured, and two embedded limitd Redis servers run here "
            f"({places}): choose one with LIMITD_CONFIG=path/to/its/config.yml "
            "or LIMITD_REDIS_URL"
        )
    if found:
        directory, url = found[0]
        return Location(url, DISCOVERED, f"the embedded Redis running in {directory}")
    return Location(None, NOTHING, "nothing")


def not_running(config: Config) -> RedisNotFound:
    """The error for a named config whose Redis is not there."""
    files = ", ".join(config.files)
    return RedisNotFound(
        f"{files} names no redis.url and its embedded Redis ({embedded_dir(config.base_dir)}) "
        f"is not running: start it with `limitd start {' '.join(config.files)}`, "
        "or set LIMITD_REDIS_URL"
    )


def app_location(url: str | None = None, files: Sequence[str | Path] = ()) -> Location:
    """The order for app code: never None. A named config whose Redis is not running
    raises :class:`RedisNotFound` rather than fall back to the default: jobs pushed
    there would never reach that config's workers. A discovered embedded Redis is used
    with a warning that says how to choose explicitly."""
    where = locate(url, named_config(files), os.getcwd())
    if where.step == DISCOVERED:
        log.warning(
            "limitd: no Redis configured (LIMITD_REDIS_URL, REDIS_URL, LIMITD_CONFIG): using "
            "%s (%s), which `limitd start` runs; set LIMITD_CONFIG to choose explicitly",
            where.source,
            where.url,
        )
    if where.url is not None:
        return where
    if where.config is not None:
        raise not_running(where.config)
    return replace(where, url=DEFAULT_URL, step=DEFAULT, source="the default URL")


def connect_to(where: Location, max_connections: int | None = None) -> redis_py.Redis:
    """A client for ``where.url`` (the default URL when nothing was found) with the
    named config's timeouts."""
    settings = where.config.redis if where.config is not None else RedisSettings()
    return connect(
        where.url or DEFAULT_URL,
        max_connections=max_connections,
        socket_timeout=settings.socket_timeout,
        connect_timeout=settings.connect_timeout,
        wait=settings.replica_wait,
    )
