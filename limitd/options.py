"""Declared job options.

Every option a job may carry is declared once by the code that understands it (the core
declares ``queue`` and the retry options; each middleware declares its own). Defining a
job with an option nobody declared is an error at definition time, so a misspelled
``retyr=3`` fails at import instead of being silently ignored for months.

Features also declare their job *hooks*: callables a job definition may give (a keyword
of ``@limitd.job`` or a method of a ``limitd.Job`` class) that are not payload options,
such as tenant fairness's ``tenant``. The spec keeps them in ``JobSpec.hooks`` under the
keyword, so the core carries them without knowing any feature.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

Normalizer = Callable[[Any], Any]


class InvalidJobOption(ValueError):
    """A job was defined or configured with an unknown or ill-typed option."""


@dataclass(frozen=True)
class OptionSpec:
    """One declared option: who owns it and how to check and normalise its value.

    ``normalize`` returns the value to put in the payload, or raises ValueError whose
    message says what was expected."""

    name: str
    owner: str
    normalize: Normalizer


_DECLARED: dict[str, OptionSpec] = {}


def declare(name: str, normalize: Normalizer, owner: str) -> None:
    """Declare an option. Declaring the same name from two owners is a programming error."""
    _check_owner("job option", _DECLARED.get(name), name, owner)
    _DECLARED[name] = OptionSpec(name, owner, normalize)


def _check_owner(what: str, existing: OptionSpec | HookSpec | None, name: str, owner: str) -> None:
    """Options and hooks alike: one owner per name (the same owner may declare again)."""
    if existing is not None and existing.owner != owner:
        raise InvalidJobOption(
            f"{what} {name!r} is already declared by {existing.owner}, not {owner}"
        )


def declared() -> dict[str, OptionSpec]:
    """A copy of the declared options, by name."""
    return dict(_DECLARED)


def validate(job_name: str, options: dict[str, Any]) -> dict[str, Any]:
    """Check and normalise ``options`` for ``job_name``; errors name the job and option."""
    normalized: dict[str, Any] = {}
    for name, value in options.items():
        spec = _DECLARED.get(name)
        if spec is None:
            known = ", ".join(sorted(_DECLARED))
            raise InvalidJobOption(
                f"job {job_name}: unknown option {name!r} (known options: {known})"
            )
        try:
            normalized[name] = spec.normalize(value)
        except (TypeError, ValueError) as exc:
            raise InvalidJobOption(
                f"job {job_name}: option {name!r}={value!r} is invalid: {exc}"
            ) from exc
    return normalized


@dataclass(frozen=True)
class HookSpec:
    """One declared job hook: the ``@limitd.job`` keyword (also its key in
    ``JobSpec.hooks``) and the ``limitd.Job`` method that gives it in class jobs."""

    keyword: str
    method: str
    owner: str


_HOOKS: dict[str, HookSpec] = {}


def declare_hook(keyword: str, method: str, owner: str) -> None:
    """Declare a job hook. The same keyword from two owners is a programming error."""
    _check_owner("job hook", _HOOKS.get(keyword), keyword, owner)
    _HOOKS[keyword] = HookSpec(keyword, method, owner)


def declared_hooks() -> tuple[HookSpec, ...]:
    """The declared hooks, in declaration order."""
    return tuple(_HOOKS.values())


def split_hooks(
    job_options: dict[str, Any],
) -> tuple[dict[str, Callable[..., Any]], dict[str, Any]]:
    """``@limitd.job`` keywords split into the declared hooks given (None: not given)
    and the options, which :func:`validate` then checks."""
    hooks = {k: v for k, v in job_options.items() if k in _HOOKS and v is not None}
    rest = {k: v for k, v in job_options.items() if k not in _HOOKS}
    return hooks, rest


# Normalisers shared by several options.


def non_empty_str(value: Any) -> str:
    if not isinstance(value, str) or not value:
        raise ValueError("expected a non-empty string")
    return value


MAX_TENANT_BYTES = 1024  # a tenant id's length at most, encoded (fair queues' lines)


def tenant_id(value: Any) -> str:
    """A tenant id (``fair_tenant``): a non-empty string of at most 1 KB."""
    value = non_empty_str(value)
    if len(value.encode()) > MAX_TENANT_BYTES:
        raise ValueError(
            f"expected at most {MAX_TENANT_BYTES} bytes, got {len(value.encode())}"
        )
    return value


def boolean(value: Any) -> bool:
    if not isinstance(value, bool):
        raise ValueError("expected true or false")
    return value


def seconds(value: Any) -> float:
    """A positive duration given as seconds or a ``timedelta``; stored as float seconds."""
    if isinstance(value, dt.timedelta):
        value = value.total_seconds()
    if isinstance(value, bool) or not isinstance(value, (int, float)) or value <= 0:
        raise ValueError("expected a positive number of seconds or a timedelta")
    return float(value)
