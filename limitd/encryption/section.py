"""The ``encryption:`` config section, and the ``LIMITD_ENCRYPTION_*`` variables.

::

    encryption:
      keys:                      # version: 32 random bytes, base64
        v1: ${LIMITD_KEY_1}
        v2: ${LIMITD_KEY_2}
      current: 2                 # seals new jobs; default: the highest version

or, without a config file (a web process that only enqueues), the environment:
``LIMITD_ENCRYPTION_KEYS="1:<base64>,2:<base64>"`` and ``LIMITD_ENCRYPTION_CURRENT=2``.
The variables win over the file. Errors name the file or variable, the key and what was
expected, never a key's value.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import Any

from limitd.config.files import Layers
from limitd.config.settings import ConfigError
from limitd.config.values import ENVIRONMENT, Section, describe
from limitd.encryption import SECTION_KEYS
from limitd.encryption.cipher import KEY_BYTES, Keyring, decode_key

KEY = "encryption"
KEYS_VARIABLE = "LIMITD_ENCRYPTION_KEYS"
CURRENT_VARIABLE = "LIMITD_ENCRYPTION_CURRENT"
HIDDEN = "<hidden>"  # what ``limitd check`` prints in place of a key
EXPECTED_KEY = f"expected {KEY_BYTES} random bytes in base64 (openssl rand -base64 32)"


def read_encryption(section: Section, env: Mapping[str, str]) -> Keyring:
    """The section's keyring, the variables' keys and current version over it."""
    section.check_keys(SECTION_KEYS)
    keys = _file_keys(section)
    current = _file_current(section)
    if env.get(KEYS_VARIABLE):
        keys = _variable_keys(env[KEYS_VARIABLE])
    if env.get(CURRENT_VARIABLE):
        current = _variable_current(env[CURRENT_VARIABLE])
    if not keys:
        if current is not None:
            raise section.error("keys", "no keys: current names a version of none")
        return Keyring()
    current = max(keys) if current is None else current
    if current not in keys:
        message = f"expected one of the key versions {sorted(keys)}, got {current}"
        if env.get(CURRENT_VARIABLE):
            raise ConfigError(ENVIRONMENT, CURRENT_VARIABLE, message)
        raise section.error("current", message)
    return Keyring(keys, current)


def keyring_from_environment(env: Mapping[str, str] | None = None) -> Keyring:
    """The keyring of a process that loaded no config: the variables alone."""
    empty = Section({}, (KEY,), Layers(files=[ENVIRONMENT]))
    return read_encryption(empty, os.environ if env is None else env)


def as_dict(keyring: Keyring) -> dict[str, Any]:
    """What ``limitd check`` prints: the section's own shape (so a config without keys
    reads back as printed), with each key's value hidden."""
    hidden = {f"v{version}": HIDDEN for version in sorted(keyring.keys)}
    return {"keys": hidden, "current": keyring.current}


def _file_keys(section: Section) -> dict[int, bytes]:
    values = section.section("keys")
    keys: dict[int, bytes] = {}
    for name, raw in values.data.items():
        version = _version(name)
        if version is None:
            raise values.error(str(name), "expected a key version: v1, v2 ... (or \"1\", \"2\")")
        key = decode_key(raw) if isinstance(raw, str) else None
        if key is None:
            raise values.error(str(name), f"{EXPECTED_KEY}, got {_shape(raw)}")
        keys[version] = key
    return keys


def _file_current(section: Section) -> int | None:
    raw = section.data.get("current")
    if raw is None:
        return None
    version = _version(raw)
    if version is None:
        raise section.error("current", f"expected a key version (2 or v2), got {describe(raw)}")
    return version


def _variable_keys(text: str) -> dict[int, bytes]:
    keys: dict[int, bytes] = {}
    for index, item in enumerate(text.split(",")):
        name, colon, encoded = item.strip().partition(":")
        version = _version(name)
        if not colon or version is None:
            raise ConfigError(
                ENVIRONMENT,
                KEYS_VARIABLE,
                f"entry {index + 1}: expected VERSION:BASE64KEY, comma-separated "
                "(e.g. 1:<key>,2:<key>) with versions integers >= 1",
            )
        key = decode_key(encoded)
        if key is None:
            raise ConfigError(
                ENVIRONMENT, KEYS_VARIABLE, f"key version {version}: {EXPECTED_KEY}"
            )
        keys[version] = key
    return keys


def _variable_current(text: str) -> int:
    version = _version(text.strip())
    if version is None:
        raise ConfigError(ENVIRONMENT, CURRENT_VARIABLE, "expected a key version >= 1")
    return version


def _version(name: Any) -> int | None:
    """A key version: ``v2`` (as YAML keys must be strings) or ``2``."""
    if isinstance(name, bool):
        return None
    if isinstance(name, str):
        name = name.removeprefix("v")
    try:
        version = int(name)
    except (TypeError, ValueError):
        return None
    return version if version >= 1 else None


def _shape(raw: Any) -> str:
    """What was found instead of a key, without printing a secret."""
    if isinstance(raw, str):
        return f"a string of {len(raw)} characters"
    return describe(raw)
