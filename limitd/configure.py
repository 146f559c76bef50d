"""Connecting app code to the Redis a configuration names.

``limitd start conf/app.yml`` and the app that enqueues jobs must talk to the same
Redis, including the embedded one that ``limitd start`` runs beside the config when no
Redis is configured. Both find it by the one order in :mod:`limitd.locate`; this is the
app's way to name the config in code rather than with ``LIMITD_CONFIG``.
"""

from __future__ import annotations

from pathlib import Path

from limitd.client import Client, client_for, set_default_client
from limitd.locate import app_location


def configure(*paths: str | Path, url: str | None = None) -> Client:
    """Load the config files and make limitd's default client use their Redis (and their
    ``fair_tenant`` settings, under any ``LIMITD_FAIR_TENANT_*`` variables)::

    limitd.configure("conf/example.yml")
    send_report.perform_async(42)

    ``paths`` take the place of ``LIMITD_CONFIG``; ``url`` (like ``LIMITD_REDIS_URL``)
    wins over the files' Redis. Raises ``limitd.locate.RedisNotFound`` when the files
    name no ``redis.url`` and their embedded Redis is not running: falling back to
    another Redis would push jobs their workers never see.
    """
    client = client_for(app_location(url, paths))
    set_default_client(client)
    return client
