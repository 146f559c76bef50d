"""Connecting app code to the Redis a configuration names.

``limitd start conf/app.yml`` and the app that enqueues jobs must talk to the same
Redis, including the embedded one that ``limitd start`` runs beside the config when no
Redis is configured. Both resolve it here, in this order: an explicit URL, the
environment (``LIMITD_REDIS_URL``, ``REDIS_URL``), the config's ``redis.url``, then the
embedded Redis recorded in ``.limitd/`` beside the config.
"""

from __future__ import annotations

from pathlib import Path

from limitd.client import Client, set_default_client
from limitd.config import Config
from limitd.config_loader import load_config
from limitd.embedded import embedded_url
from limitd.middleware.defaults import default_client_chain
from limitd.redis import configured_url, connect


def redis_url(config: Config | None, explicit: str | None = None) -> str | None:
    """The URL to use, or None when nothing is configured and no embedded Redis runs."""
    url = configured_url(explicit)
    if url:
        return url
    if config is not None and config.redis.url:
        return config.redis.url
    return embedded_url(config.base_dir if config is not None else ".")


def configure(*paths: str | Path, url: str | None = None) -> Client:
    """Load the config files and make limitd's default client use their Redis (and their
    ``fair_tenant`` settings, under any ``LIMITD_FAIR_TENANT_*`` variables)::

    limitd.configure("conf/example.yml")
    send_report.perform_async(42)
    """
    config = load_config(list(paths)) if paths else None
    found = redis_url(config, url)
    if found is None:
        where = ", ".join(map(str, paths)) or "this directory"
        raise RuntimeError(
            f"no Redis configured for {where} and no embedded Redis running "
            "there: start 'limitd start' first, or set LIMITD_REDIS_URL"
        )
    settings = config.fair_tenant if config is not None else None
    client = Client(connect(found), middleware=default_client_chain(settings))
    set_default_client(client)
    return client
