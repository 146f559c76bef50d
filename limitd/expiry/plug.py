"""Expiring jobs as a feature: the ``expires_in`` job option, a client middleware that
stamps each job's deadline (``expires_at``) and a server middleware that drops a job
found past it. No config section, commands or admin calls.

``import limitd`` loads only this module (the option must be known when a job is
defined); the middleware module is imported when a chain is first built.
"""

from __future__ import annotations

from typing import Any

from limitd import options
from limitd.plugins import Feature

options.declare("expires_in", options.seconds, owner="limitd.expiry")


def client_middleware(_settings: Any) -> Any:
    from limitd.expiry.middleware import ExpiryStamp

    return ExpiryStamp()


def server_middleware(_redis: Any) -> Any:
    from limitd.expiry.middleware import ExpiryCheck

    return ExpiryCheck()  # no Redis work: the payload says all


EXPIRY = Feature(
    name="expiry",
    client_middleware=client_middleware,
    server_middleware=server_middleware,
)
