"""What an enqueue call's arguments become: the job's list of positional arguments.

Sidekiq's wire format carries a job's arguments as a JSON list, so a job has positions,
never names. The enqueue methods are typed with the job's own parameters (a
``ParamSpec``, see ``docs/typing.md``), which lets a type checker accept
``send_webhook.perform_async(42, url="https://...")``; :class:`Arguments` makes that call
mean at run time what the checker says it means, by placing each keyword argument at its
parameter's position. A keyword-only parameter has no position, so passing one is a
``TypeError`` at the enqueue, not a job that fails later on every worker.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    # A default (PEP 696) keeps ``Enqueuer(spec)`` meaning "any arguments" for type
    # checkers instead of asking for an annotation; typing has it from Python 3.13 only,
    # and typing_extensions is not a runtime dependency.
    from typing_extensions import ParamSpec

    P = ParamSpec("P", default=...)
else:
    from typing import ParamSpec

    P = ParamSpec("P")

PlaceArguments = Callable[[tuple[Any, ...], dict[str, Any]], list[Any]]
_POSITIONAL = (inspect.Parameter.POSITIONAL_ONLY, inspect.Parameter.POSITIONAL_OR_KEYWORD)


def positional_only(args: tuple[Any, ...], kwargs: dict[str, Any]) -> list[Any]:
    """For an enqueuer made from a bare spec, whose function is unknown: keyword
    arguments cannot be placed, so they are refused."""
    if kwargs:
        raise TypeError(
            f"keyword arguments {sorted(kwargs)} need the job's function to find their "
            "positions: enqueue through the job (or pass them positionally)"
        )
    return list(args)


class Arguments:
    """Places an enqueue call's arguments for one job: positional arguments pass as they
    are (no signature is read, so the common call costs nothing), keyword arguments go to
    their parameter's position, with the defaults of skipped parameters before them."""

    def __init__(self, job_name: str, target: Callable[..., Any], *, method: bool = False):
        self._job_name = job_name
        self._target = target
        self._method = method  # ``perform(self, ...)``: its first parameter is not an argument
        self._signature: inspect.Signature | None = None

    def __call__(self, args: tuple[Any, ...], kwargs: dict[str, Any]) -> list[Any]:
        if not kwargs:
            return list(args)
        signature = self._signature or self._read_signature()
        try:
            bound = signature.bind(*args, **kwargs)
        except TypeError as exc:
            raise TypeError(f"{self._job_name}: {exc}") from None
        return self._place(signature, bound.arguments)

    def _place(self, signature: inspect.Signature, given: dict[str, Any]) -> list[Any]:
        placed: list[Any] = []
        given_up_to = 0
        for param in signature.parameters.values():
            if param.kind in _POSITIONAL:
                placed.append(given.get(param.name, param.default))
                if param.name in given:
                    given_up_to = len(placed)
            elif param.kind is inspect.Parameter.VAR_POSITIONAL:
                if param.name in given:
                    placed.extend(given[param.name])
                    given_up_to = len(placed)
            elif param.name in given:
                raise TypeError(
                    f"{self._job_name}: {param.name!r} has no position: a job's arguments "
                    "travel as a list (Sidekiq's format), so each needs a positional parameter"
                )
        # Defaults after the last argument given stay out: the worker applies its own.
        return placed[:given_up_to]

    def _read_signature(self) -> inspect.Signature:
        signature = inspect.signature(self._target)
        if self._method:
            params = list(signature.parameters.values())[1:]
            signature = signature.replace(parameters=params)
        self._signature = signature
        return signature
