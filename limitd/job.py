"""Defining jobs and enqueueing them.

Two styles, one model. The primary style is a decorated function::

    @limitd.job(queue="webhooks", retry=5)
    def send_webhook(tenant_id, url): ...

    send_webhook.perform_async(42, "https://example.com/hook")

Classes suit jobs with hooks or state, and map Ruby Sidekiq class names::

    class HardJob(limitd.Job, name="HardJob", queue="critical"):
        def perform(self, a, b): ...
        def retry_in(self, count, exc, payload): return 10 * (count + 1)

Both produce a :class:`~limitd.spec.JobSpec` (what the server needs to run the job)
registered under its wire name, and both enqueue through an :class:`Enqueuer`. This is the
top of the client side: it builds specs and pushes through :mod:`limitd.client`.

The enqueue methods are typed with the job's own parameters (``Enqueuer[P]``, ``P`` a
``ParamSpec``), so a type checker reports ``send_webhook.perform_async("42")`` when
``tenant_id`` is an ``int``; keyword arguments are placed at their parameter's position
(:mod:`limitd.arguments`), since the wire format is a list. See ``docs/typing.md``.
"""

from __future__ import annotations

import datetime as dt
import functools
import inspect
from collections.abc import Callable, Sequence
from typing import Any, ClassVar, Generic, ParamSpec, Protocol, TypeVar, cast, overload

from limitd import clock, options
from limitd.aio.enqueue import AsyncEnqueuer
from limitd.arguments import Arguments, P, PlaceArguments, positional_only
from limitd.client import Client, default_client
from limitd.payload import Payload
from limitd.registry import registry
from limitd.spec import ExhaustedHook, JobSpec, RetryInHook, current_payload

options.declare("queue", options.non_empty_str, owner="limitd.job")

R = TypeVar("R")
# A job function's own parameters: like P, without its default (a type parameter with
# a default may not come before R, which has none).
FP = ParamSpec("FP")


def define(
    name: str,
    origin: str,
    run: Callable[[Payload], Any],
    job_options: dict[str, Any],
    *,
    retry_in: RetryInHook | None = None,
    retries_exhausted: ExhaustedHook | None = None,
    hooks: dict[str, Callable[..., Any]] | None = None,
    is_async: bool = False,
) -> JobSpec:
    """Validate options, build the spec and register it under its wire name. ``hooks``:
    the features' declared hooks by keyword (see :func:`limitd.options.declare_hook`)."""
    spec = JobSpec(
        name=name,
        origin=origin,
        run=run,
        options=options.validate(name, job_options),
        retry_in=retry_in,
        retries_exhausted=retries_exhausted,
        hooks=hooks or {},
        is_async=is_async,
    )
    registry.register(spec)
    return spec


class Enqueuer(Generic[P]):
    """Pushes one job with a fixed set of options. ``.set()`` returns a copy with more
    options, so ``send.set(queue="low").perform_async(1)`` leaves ``send`` unchanged.
    ``P`` is the job's parameters, which type checkers hold every enqueue call to;
    ``place`` turns a call's arguments into the payload's list (an enqueuer made from a
    bare spec, its job's function unknown, takes positional arguments only)."""

    def __init__(
        self,
        spec: JobSpec,
        overrides: dict[str, Any] | None = None,
        client: Client | None = None,
        *,
        place: PlaceArguments = positional_only,
    ) -> None:
        self._spec = spec
        self._overrides = overrides or {}
        self._client = client
        self._place = place

    def set(self, *, client: Client | None = None, **job_options: Any) -> Enqueuer[P]:
        """A configured enqueuer: the options are checked like definition options."""
        merged = {**self._overrides, **options.validate(self._spec.name, job_options)}
        return Enqueuer(self._spec, merged, client or self._client, place=self._place)

    @property
    def aio(self) -> AsyncEnqueuer[P]:
        """The same enqueuer for async code: ``await send.aio.perform_async(1)`` (see
        :mod:`limitd.aio`), with these options and this client's async twin."""
        return AsyncEnqueuer(self._spec, self._overrides, self._client, place=self._place)

    def perform_async(self, *args: P.args, **kwargs: P.kwargs) -> str | None:
        """Enqueue now. Returns the jid, or None if a client middleware stopped the push."""
        return self._push(self._place(args, kwargs), at=None)

    def perform_in(
        self, interval: float | dt.timedelta, /, *args: P.args, **kwargs: P.kwargs
    ) -> str | None:
        """Run after ``interval`` seconds (or a timedelta)."""
        if isinstance(interval, dt.timedelta):
            interval = interval.total_seconds()
        return self._push(self._place(args, kwargs), at=clock.now() + float(interval))

    def perform_at(
        self, when: float | dt.datetime, /, *args: P.args, **kwargs: P.kwargs
    ) -> str | None:
        """Run at an epoch time in seconds or a datetime (naive means local time)."""
        at = when.timestamp() if isinstance(when, dt.datetime) else float(when)
        return self._push(self._place(args, kwargs), at=at)

    def perform_bulk(
        self, args_list: Sequence[Sequence[Any]], batch_size: int = 1000
    ) -> list[str | None]:
        """Enqueue many jobs of this class, one LPUSH per ``batch_size`` jobs. Each
        inner list is one job's positional arguments, unchecked by type checkers."""
        item = self._item([])
        return self._get_client().push_bulk(
            item,
            [a if type(a) is list else list(a) for a in args_list],
            batch_size=batch_size,
            spec=self._spec,
        )

    def _push(self, args: list[Any], at: float | None) -> str | None:
        item = self._item(args)
        if at is not None and at > clock.now():
            item["at"] = at
        return self._get_client().push(item, spec=self._spec)

    def _item(self, args: list[Any]) -> Payload:
        return {**self._spec.options, **self._overrides, "class": self._spec.name, "args": args}

    def _get_client(self) -> Client:
        return self._client if self._client is not None else default_client()


class JobFunction(Enqueuer[FP], Generic[FP, R]):
    """What ``@limitd.job`` returns: still callable as the plain function (handy in
    tests and for running inline), plus the enqueue methods, all typed with the
    function's parameters (and the call with its return type)."""

    def __init__(self, fn: Callable[FP, R], spec: JobSpec) -> None:
        super().__init__(spec, place=Arguments(spec.name, fn))
        self.fn = fn
        self.spec = spec
        functools.update_wrapper(self, fn)

    def __call__(self, *args: FP.args, **kwargs: FP.kwargs) -> R:
        return self.fn(*args, **kwargs)

    def __repr__(self) -> str:
        return f"<limitd job {self.spec.name}>"


@overload
def job(
    fn: Callable[FP, R],
    *,
    name: str | None = None,
    retry_in: RetryInHook | None = None,
    retries_exhausted: ExhaustedHook | None = None,
    **job_options: Any,
) -> JobFunction[FP, R]: ...


@overload
def job(
    fn: None = None,
    *,
    name: str | None = None,
    retry_in: RetryInHook | None = None,
    retries_exhausted: ExhaustedHook | None = None,
    **job_options: Any,
) -> Callable[[Callable[FP, R]], JobFunction[FP, R]]: ...


def job(
    fn: Callable[..., Any] | None = None,
    *,
    name: str | None = None,
    retry_in: RetryInHook | None = None,
    retries_exhausted: ExhaustedHook | None = None,
    **job_options: Any,
) -> Any:
    """Decorator that turns a function into a job; usable bare or with options. The
    hooks: ``retry_in``, ``retries_exhausted`` (see ``limitd.retry``) and those the
    features declare, such as ``tenant`` (called with the job's arguments, see
    ``limitd.fair_tenant``) and ``limiter_backoff`` (see ``limitd.limiters.middleware``)."""
    hooks, job_options = options.split_hooks(job_options)

    def decorate(target: Callable[FP, R]) -> JobFunction[FP, R]:
        origin = f"{target.__module__}.{target.__qualname__}"
        run: Callable[..., Any] = target  # the payload's list, unchecked: it comes from JSON
        spec = define(
            name or origin,
            origin,
            lambda payload: run(*payload["args"]),
            job_options,
            retry_in=retry_in,
            retries_exhausted=retries_exhausted,
            hooks=hooks,
            is_async=inspect.iscoroutinefunction(target),
        )
        return JobFunction(target, spec)

    return decorate(fn) if fn is not None else decorate


class _Performs(Protocol[P]):
    """A job class as the enqueue class methods see it: ``cls`` typed with this
    protocol lets a type checker take ``P`` from the class's own ``perform``."""

    _enqueuer: ClassVar[Enqueuer[...]]

    def perform(self, *args: P.args, **kwargs: P.kwargs) -> Any: ...


def _typed_enqueuer(cls: type[_Performs[P]]) -> Enqueuer[P]:
    """The class's enqueuer, typed with its ``perform``'s parameters (which its class
    attribute cannot say: a ClassVar takes no type variables)."""
    return cast("Enqueuer[P]", cls._enqueuer)


class _ClassAio:
    """``Job.aio``: the class's enqueue methods for async code (see :mod:`limitd.aio`)."""

    def __get__(self, instance: object, owner: type[_Performs[P]]) -> AsyncEnqueuer[P]:
        return _typed_enqueuer(owner).aio


class Job:
    """Base class for class-style jobs: options go in the class statement, ``perform``
    receives the arguments, and the optional ``retry_in`` / ``retries_exhausted``
    methods are the retry hooks, ``fair_tenant(*args)`` the tenant hook,
    ``limiter_backoff(count, exc, payload)`` the over-limit delay. A fresh
    instance runs each job, with ``jid`` and ``payload`` set before ``perform``."""

    spec: ClassVar[JobSpec]
    _enqueuer: ClassVar[Enqueuer[...]]  # the class's options, no overrides; places by perform
    jid: str
    payload: Payload

    def __init_subclass__(
        cls, name: str | None = None, abstract: bool = False, **job_options: Any
    ) -> None:
        super().__init_subclass__()
        if abstract:
            return
        if not callable(getattr(cls, "perform", None)):
            raise TypeError(f"job class {cls.__qualname__} must define perform(self, ...)")
        origin = f"{cls.__module__}.{cls.__qualname__}"
        cls.spec = define(
            name or origin,
            origin,
            functools.partial(_run_instance, cls),
            job_options,
            retry_in=_hook(cls, "retry_in"),
            retries_exhausted=_hook(cls, "retries_exhausted"),
            hooks=_feature_hooks(cls),
            is_async=inspect.iscoroutinefunction(cls.perform),  # type: ignore[attr-defined]
        )
        place = Arguments(cls.spec.name, cls.perform, method=True)  # type: ignore[attr-defined]
        cls._enqueuer = Enqueuer(cls.spec, place=place)

    aio = _ClassAio()  # ``await HardJob.aio.perform_async(...)``

    # ``cls: type[_Performs[P]]``: the arguments are checked against ``perform``'s, less
    # ``self``; a class without ``perform`` (an abstract base) has no enqueue methods.

    @classmethod
    def set(cls: type[_Performs[P]], **job_options: Any) -> Enqueuer[P]:
        return _typed_enqueuer(cls).set(**job_options)

    @classmethod
    def perform_async(cls: type[_Performs[P]], *args: P.args, **kwargs: P.kwargs) -> str | None:
        return _typed_enqueuer(cls).perform_async(*args, **kwargs)

    @classmethod
    def perform_in(
        cls: type[_Performs[P]],
        interval: float | dt.timedelta,
        /,
        *args: P.args,
        **kwargs: P.kwargs,
    ) -> str | None:
        return _typed_enqueuer(cls).perform_in(interval, *args, **kwargs)

    @classmethod
    def perform_at(
        cls: type[_Performs[P]], when: float | dt.datetime, /, *args: P.args, **kwargs: P.kwargs
    ) -> str | None:
        return _typed_enqueuer(cls).perform_at(when, *args, **kwargs)

    @classmethod
    def perform_bulk(
        cls: type[_Performs[P]], args_list: Sequence[Sequence[Any]], batch_size: int = 1000
    ) -> list[str | None]:
        return _typed_enqueuer(cls).perform_bulk(args_list, batch_size=batch_size)


def _run_instance(cls: type[Job], payload: Payload) -> Any:
    instance = cls()
    instance.jid = payload.get("jid", "")
    instance.payload = payload
    return instance.perform(*payload["args"])  # type: ignore[attr-defined]


def _feature_hooks(cls: type[Job]) -> dict[str, Callable[..., Any]]:
    """The declared hooks this class defines as methods, by keyword."""
    found = {h.keyword: _hook(cls, h.method) for h in options.declared_hooks()}
    return {keyword: hook for keyword, hook in found.items() if hook is not None}


def _hook(cls: type[Job], method: str) -> Callable[..., Any] | None:
    """Class hooks are plain methods; each call gets a fresh instance."""
    if not callable(getattr(cls, method, None)):
        return None

    def call_on_fresh_instance(*args: Any) -> Any:
        return getattr(cls(), method)(*args)

    return call_on_fresh_instance


__all__ = ["Enqueuer", "Job", "JobFunction", "JobSpec", "current_payload", "define", "job"]
