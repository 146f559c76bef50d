"""Encrypted arguments as a feature: the ``encrypt`` job option, the ``encryption:``
config section, the client middleware that seals and the server middleware that opens.

Only the option is declared with ``import limitd``; the middleware, the section reader
and ``cryptography`` load when a chain is built or a config is read, so app code that
never encrypts pays one small module for the feature."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

from limitd import options
from limitd.encryption import SECTION_KEYS
from limitd.plugins import ConfigSection, Feature, ProcessContext, Service

if TYPE_CHECKING:
    from limitd.encryption.cipher import Keyring
    from limitd.encryption.middleware import OpenArgs, SealArgs

KEY = "encryption"  # the section's key (limitd.encryption.section.KEY)
__all__ = ["ENCRYPTION", "SECTION_KEYS"]

options.declare("encrypt", options.boolean, owner="limitd.encryption")


def read_section(section: Any, env: Mapping[str, str]) -> Keyring:
    from limitd.encryption.section import read_encryption

    return read_encryption(section, env)


def section_as_dict(keyring: Keyring) -> dict[str, Any]:
    from limitd.encryption.section import as_dict

    return as_dict(keyring)


def client_middleware(keyring: Keyring | None) -> SealArgs:
    """Sealing with the loaded config's keys, or (no config loaded) the environment's,
    read at the first push that encrypts."""
    from limitd.encryption.middleware import KeySource, SealArgs
    from limitd.encryption.section import keyring_from_environment

    keys = KeySource(keyring_from_environment)
    if keyring is not None:
        keys.use(keyring)
    return SealArgs(keys)


def server_middleware(redis: Any) -> OpenArgs:
    """Opening with the environment's keys unless the capsule's config gives its own
    (``process_services``)."""
    from limitd.encryption.middleware import KeySource, OpenArgs
    from limitd.encryption.section import keyring_from_environment

    return OpenArgs(redis, KeySource(keyring_from_environment))


def process_services(context: ProcessContext) -> Sequence[Service]:
    """No service: the capsule's opening middleware is given the config's keyring."""
    from limitd.encryption.middleware import OpenArgs

    keyring = context.section(KEY)
    if keyring is not None:
        for middleware in context.chain:
            if isinstance(middleware, OpenArgs):
                middleware.keys.use(keyring)
    return ()


ENCRYPTION = Feature(
    name="encryption",
    section=ConfigSection(KEY, read_section, section_as_dict),
    client_middleware=client_middleware,
    server_middleware=server_middleware,
    process_services=process_services,
)
