"""The middleware every client and every capsule starts with: the app's own, declared
with ``limitd.configure_client`` / ``limitd.configure_server`` (``limitd.app_hooks``),
then each registered feature's (see ``limitd.plugins``), in registration order. Each
feature's is a no-op for jobs that do not use it, so the chains are the same for
everyone.

The app's come first, so they wrap the features': a client middleware's changes to the
payload (its queue, a field) are what the features see and the write makes, and a
server middleware sees the job as the processor runs it, the features' work included.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from limitd.app_hooks import client_config, server_config
from limitd.middleware.base import ServerMiddleware
from limitd.middleware.callables import OnThread
from limitd.middleware.chain import ServerChain
from limitd.middleware.client_chain import ClientChain
from limitd.middleware.work import RedisClient
from limitd.plugins import registered


def default_client_chain(settings: Mapping[str, Any] | None = None) -> ClientChain:
    """The app's client middleware, then one per feature that has one, each given its
    config section's settings from ``settings`` (a loaded config's ``sections``;
    without it, features use their defaults and their environment variables)."""
    chain = ClientChain(list(client_config().client_middleware))
    for feature in registered():
        if feature.client_middleware is None:
            continue
        key = feature.section.key if feature.section is not None else None
        chain.add(feature.client_middleware((settings or {}).get(key) if key else None))
    return chain


def default_server_chain(redis: RedisClient) -> ServerChain:
    """The app's server middleware, then one per feature that has one, reporting on the
    capsule's Redis. The app's plain sync callables run async jobs on a worker thread, as documented
    (``OnThread``), without the warning a capsule gives other middleware lacking
    ``acall``."""
    chain = ServerChain([_as_declared(m) for m in server_config().server_middleware])
    for feature in registered():
        if feature.server_middleware is not None:
            chain.add(feature.server_middleware(redis))
    return chain


def _as_declared(middleware: Any) -> Any:
    """An app's server middleware as the capsule's chain holds it (a callable one with
    an ``acall`` keeps using it)."""
    return middleware if isinstance(middleware, ServerMiddleware) else OnThread(middleware)
