"""The ``fair_tenant:`` config section, and its ``LIMITD_FAIR_TENANT_<KEY>`` variables.

Read by ``limitd.config`` through the feature's registration (``plug``): the section is
checked like every other (file, key, expected value in each error), then the variables
are checked the same way and win.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from limitd import keys
from limitd.config.files import Interpolated, Layers
from limitd.config.settings import ConfigError
from limitd.config.values import ENVIRONMENT, Section
from limitd.fair_tenant.middleware import ENV_PREFIX, FairTenantSettings

KEY = "fair_tenant"
FAIR_TENANT_KEYS = frozenset({"max_throttling_window", "enqueues_key", "logger"})


def read_fair_tenant(section: Section, env: Mapping[str, str]) -> FairTenantSettings:
    """The ``fair_tenant`` section, then the ``LIMITD_FAIR_TENANT_<KEY>`` variables over
    it: the environment wins. Variables are checked like the file's values, then applied
    by ``FairTenantSettings.from_env``, the one place that reads them."""
    section.check_keys(FAIR_TENANT_KEYS)
    base = _fair_tenant_settings(section, FairTenantSettings())
    variables = _fair_tenant_environment(env)
    try:
        _fair_tenant_settings(variables, base)
    except ConfigError as exc:  # name the variable, not a key of no file
        raise ConfigError(ENVIRONMENT, ENV_PREFIX + exc.key.upper(), exc.message) from None
    return FairTenantSettings.from_env(base, env)


def _fair_tenant_settings(section: Section, base: FairTenantSettings) -> FairTenantSettings:
    enqueues_key = section.string("enqueues_key", base.enqueues_key)
    problem = keys.fair_tenant_template_problem(enqueues_key)
    if problem is not None:
        raise section.error("enqueues_key", problem)
    logger = section.string("logger", base.logger)
    if not logger.strip():
        raise section.error("logger", f"expected a logger name, got {logger!r}")
    return FairTenantSettings(
        max_throttling_window=section.number(
            "max_throttling_window", base.max_throttling_window, 0, above=True
        ),
        enqueues_key=enqueues_key,
        logger=logger,
    )


def _fair_tenant_environment(env: Mapping[str, str]) -> Section:
    """The ``LIMITD_FAIR_TENANT_*`` variables as a section of text values (as if
    interpolated), so the same readers convert and check them. Empty ones are unset, as
    ``from_env`` treats them."""
    names = {ENV_PREFIX + key.upper(): key for key in FAIR_TENANT_KEYS}
    found: dict[str, str] = {}
    for name, value in env.items():
        if not name.startswith(ENV_PREFIX) or not value:
            continue
        if name not in names:
            raise ConfigError(
                ENVIRONMENT, name, f"unknown variable; expected one of {sorted(names)}"
            )
        found[names[name]] = Interpolated(value, "$" + name)
    return Section(found, (), Layers(files=[ENVIRONMENT]))


def as_dict(settings: FairTenantSettings) -> dict[str, Any]:
    """The section as ``limitd check`` prints it (and reads it back)."""
    return {
        "max_throttling_window": settings.max_throttling_window,
        "enqueues_key": settings.enqueues_key,
        "logger": settings.logger,
    }
