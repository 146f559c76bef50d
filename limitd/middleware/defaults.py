"""The middleware every client and every capsule starts with: each registered feature's
(see ``limitd.plugins``), in registration order. Each is a no-op for jobs that do not
use its feature, so the chains are the same for everyone."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from limitd.middleware.chain import ServerChain
from limitd.middleware.client_chain import ClientChain
from limitd.middleware.work import RedisClient
from limitd.plugins import registered


def default_client_chain(settings: Mapping[str, Any] | None = None) -> ClientChain:
    """One client middleware per feature that has one, each given its config section's
    settings from ``settings`` (a loaded config's ``sections``; without it, features
    use their defaults and their environment variables)."""
    chain = ClientChain()
    for feature in registered():
        if feature.client_middleware is None:
            continue
        key = feature.section.key if feature.section is not None else None
        chain.add(feature.client_middleware((settings or {}).get(key) if key else None))
    return chain


def default_server_chain(redis: RedisClient) -> ServerChain:
    """One server middleware per feature that has one, reporting on the capsule's Redis."""
    chain = ServerChain()
    for feature in registered():
        if feature.server_middleware is not None:
            chain.add(feature.server_middleware(redis))
    return chain
