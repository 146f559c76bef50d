"""Configuration: YAML files to one checked, typed :class:`Config`.

The one public entry for everything configuration. Its modules, in the order a load
runs through them:

- ``files``: read the YAML files, merge them (later files win) and interpolate
  ``${VAR}``, keeping which file each value came from;
- ``values``: typed readers that name the file, key and expected value in every error;
- ``schema``: which keys exist where (top level, capsules, the sections features
  register) and how they become settings;
- ``settings``: the typed settings themselves (``Config``, ``CapsuleConfig``, ...);
- ``app_checks``: the checks that need the app's jobs imported as well.
"""

from limitd.config.app_checks import app_modules, check_app
from limitd.config.schema import accepted_keys, config_as_dict, load_config
from limitd.config.settings import (
    CapsuleConfig,
    CapsuleSpec,
    Config,
    ConfigError,
    LoggingSettings,
    RedisSettings,
)

__all__ = [
    "CapsuleConfig",
    "CapsuleSpec",
    "Config",
    "ConfigError",
    "LoggingSettings",
    "RedisSettings",
    "accepted_keys",
    "app_modules",
    "check_app",
    "config_as_dict",
    "load_config",
]
