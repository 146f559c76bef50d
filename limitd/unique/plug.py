"""Unique jobs as a feature: a client middleware that takes the lock, a server
middleware that releases it. No config section, commands or admin calls: the whole
feature is light enough to load with ``import limitd``."""

from limitd.plugins import Feature
from limitd.unique.middleware import UniqueJobs, UniqueRelease

UNIQUE = Feature(
    name="unique",
    client_middleware=lambda _settings: UniqueJobs(),
    server_middleware=UniqueRelease,
)
