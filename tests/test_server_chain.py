"""The server chain runs typed middleware in one frame (``starting`` outermost first,
then ``ended`` innermost first) and nests calls only around callable middleware: both
ways must give the same hooks, in the same order, with the same errors."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from limitd.middleware.base import Ending, ServerMiddleware
from limitd.middleware.chain import ServerChain
from limitd.spec import JobSpec

PAYLOAD: dict[str, Any] = {"class": "X", "args": [], "queue": "default", "jid": "a" * 24}
SPEC: JobSpec = None  # type: ignore[assignment]  # the hooks below never read it


class Recorder(ServerMiddleware):
    """Records its hooks; ``fail`` names what it does wrong: "starting" raises there,
    "replace" ends a failed job with another error, "ended" raises from its hook."""

    def __init__(self, name: str, events: list[str], fail: str = "") -> None:
        self.name, self.events, self.fail = name, events, fail

    def starting(self, spec: JobSpec, payload: Any, queue: str) -> None:
        self.events.append(f"start {self.name}")
        if self.fail == "starting":
            raise KeyError(self.name)

    def ended(self, spec: JobSpec, payload: Any, queue: str, error: Any) -> Ending | None:
        self.events.append(f"end {self.name} {type(error).__name__}")
        if self.fail == "replace" and error is not None:
            return Ending(error=RuntimeError(f"replaced by {self.name}"))
        if self.fail == "ended":
            raise LookupError(self.name)
        return None


class PassThrough:
    """A callable middleware: between the two typed ones, it splits them into two runs,
    the inner one called from it, as nested calls."""

    def __call__(self, spec: Any, payload: Any, queue: str, call_next: Any) -> Any:
        return call_next()

    async def acall(self, spec: Any, payload: Any, queue: str, call_next: Any) -> Any:
        return await call_next()


SCENARIOS = {
    # name: (outer's fail, inner's fail, job fails)
    "success": ("", "", False),
    "job fails": ("", "", True),
    "inner replaces the error": ("", "replace", True),
    "inner starting raises": ("", "starting", False),
    "outer ended raises": ("ended", "", False),
    "inner ended raises, outer replaces": ("replace", "ended", False),
    "job fails, inner ended raises": ("", "ended", True),
}


def outcome(error: BaseException | None) -> str:
    if error is None:
        return "returned"
    cause = type(error.__cause__).__name__ if error.__cause__ else "-"
    context = type(error.__context__).__name__ if error.__context__ else "-"
    return f"raised {type(error).__name__}({error}) from {cause} during {context}"


def run(scenario: str, *, nested: bool, on_loop: bool) -> tuple[list[str], str]:
    outer_fail, inner_fail, job_fails = SCENARIOS[scenario]
    events: list[str] = []
    entries: list[Any] = [
        Recorder("outer", events, outer_fail),
        Recorder("inner", events, inner_fail),
    ]
    if nested:
        entries.insert(1, PassThrough())
    return drive(ServerChain(entries), events, job_fails, on_loop=on_loop)


def drive(
    chain: ServerChain, events: list[str], job_fails: bool, *, on_loop: bool
) -> tuple[list[str], str]:
    """A job (recording "perform", raising ValueError when it fails) through ``chain``,
    on a processor thread or on a loop: the hooks seen, and how it ended."""

    def perform() -> str:
        events.append("perform")
        if job_fails:
            raise ValueError("job")
        return "result"

    async def aperform() -> str:
        return perform()

    try:
        if on_loop:
            result = asyncio.run(chain.ainvoke(SPEC, PAYLOAD, "default", aperform))
        else:
            result = chain.invoke(SPEC, PAYLOAD, "default", perform)
    except Exception as error:
        return events, outcome(error)
    assert result == "result"
    return events, outcome(None)


@pytest.mark.parametrize("on_loop", [False, True], ids=["thread", "loop"])
@pytest.mark.parametrize("scenario", list(SCENARIOS))
def test_typed_middleware_in_one_frame_as_in_nested_runs(scenario: str, on_loop: bool) -> None:
    assert run(scenario, nested=False, on_loop=on_loop) == run(
        scenario, nested=True, on_loop=on_loop
    )


@pytest.mark.parametrize("on_loop", [False, True], ids=["thread", "loop"])
def test_hooks_wrap_the_job_outermost_first(on_loop: bool) -> None:
    assert run("inner replaces the error", nested=False, on_loop=on_loop) == (
        ["start outer", "start inner", "perform", "end inner ValueError", "end outer RuntimeError"],
        "raised RuntimeError(replaced by inner) from ValueError during ValueError",
    )
    # A middleware whose own starting raised is not ended; the one around it is.
    assert run("inner starting raises", nested=False, on_loop=on_loop) == (
        ["start outer", "start inner", "end outer KeyError"],
        "raised KeyError('inner') from - during -",
    )
    # A hook that raises while the job's error is out is chained to it.
    assert run("job fails, inner ended raises", nested=False, on_loop=on_loop) == (
        ["start outer", "start inner", "perform", "end inner ValueError", "end outer LookupError"],
        "raised LookupError(inner) from - during ValueError",
    )
    assert run("inner ended raises, outer replaces", nested=False, on_loop=on_loop) == (
        ["start outer", "start inner", "perform", "end inner NoneType", "end outer LookupError"],
        "raised RuntimeError(replaced by outer) from LookupError during LookupError",
    )


class OnErrorRecorder(ServerMiddleware):
    """Concerned with every job, acting only on one that raised (as the limiters'
    reschedule): replaces a ValueError with a RuntimeError."""

    ends_only_on_error = True

    def __init__(self, events: list[str]) -> None:
        self.events = events

    def ended(self, spec: JobSpec, payload: Any, queue: str, error: Any) -> Ending | None:
        self.events.append(f"end on error {type(error).__name__}")
        if isinstance(error, ValueError):
            return Ending(error=RuntimeError("replaced"))
        return None


def run_on_error(job_fails: bool, *, on_loop: bool, beside: bool = False) -> tuple[list[str], str]:
    """The job through an ``OnErrorRecorder`` (and a ``Recorder`` around it, ``beside``)."""
    events: list[str] = []
    entries: list[Any] = [OnErrorRecorder(events)]
    if beside:
        entries.insert(0, Recorder("outer", events))
    return drive(ServerChain(entries), events, job_fails, on_loop=on_loop)


@pytest.mark.parametrize("on_loop", [False, True], ids=["thread", "loop"])
def test_a_middleware_that_ends_only_on_error_sees_only_failed_jobs(on_loop: bool) -> None:
    assert run_on_error(False, on_loop=on_loop) == (["perform"], "returned")
    assert run_on_error(True, on_loop=on_loop) == (
        ["perform", "end on error ValueError"],
        "raised RuntimeError(replaced) from ValueError during ValueError",
    )
    # Beside a middleware that ends every job, the chain runs as always: both are ended.
    assert run_on_error(False, on_loop=on_loop, beside=True) == (
        ["start outer", "perform", "end on error NoneType", "end outer NoneType"],
        "returned",
    )
    assert run_on_error(True, on_loop=on_loop, beside=True) == (
        ["start outer", "perform", "end on error ValueError", "end outer RuntimeError"],
        "raised RuntimeError(replaced) from ValueError during ValueError",
    )


class FieldRecorder(ServerMiddleware):
    """Concerned with jobs holding a "tag" field, by its ``concerns_fields``; its own
    ``concerns`` would say yes to any job, so a call to it shows in ``asked``."""

    concerns_fields = frozenset({"tag"})

    def __init__(self) -> None:
        self.asked: list[str] = []

    def concerns(self, payload: Any) -> bool:
        self.asked.append(payload["jid"])
        return True


def test_concerns_fields_spare_the_call_for_jobs_without_them() -> None:
    fielded, plain = FieldRecorder(), OnErrorRecorder([])
    chain = ServerChain([fielded, plain])
    without = {**PAYLOAD, "jid": "without"}
    tagged = {**PAYLOAD, "jid": "tagged", "tag": 0}
    assert [entry.middleware for entry in chain.concerned(without)] == [plain]
    # A job holding the field is asked about as before (its concerns decides).
    assert [entry.middleware for entry in chain.concerned(tagged)] == [fielded, plain]
    assert fielded.asked == ["tagged"]


def through_awaitable(chain: ServerChain, aperform: Any) -> Any:
    """The job as the executor runs it: ``awaitable`` inside its own ``try``, what it
    raises through ``afailed``."""

    async def main() -> Any:
        entries = chain.concerned(PAYLOAD)
        try:
            return await chain.awaitable(SPEC, PAYLOAD, "default", aperform, entries)
        except BaseException as error:
            await chain.afailed(error, SPEC, PAYLOAD, "default", entries)

    return asyncio.run(main())


@pytest.mark.parametrize("beside", [False, True], ids=["alone", "beside another"])
@pytest.mark.parametrize("job_fails", [False, True], ids=["returns", "raises"])
def test_awaitable_and_afailed_give_what_ainvoke_gives(job_fails: bool, beside: bool) -> None:
    def run_with(invoke: Any) -> tuple[list[str], str]:
        events: list[str] = []
        entries: list[Any] = [OnErrorRecorder(events)]
        if beside:
            entries.insert(0, Recorder("outer", events))
        chain = ServerChain(entries)

        async def aperform() -> str:
            events.append("perform")
            if job_fails:
                raise ValueError("job")
            return "result"

        try:
            assert invoke(chain, aperform) == "result"
        except Exception as error:
            return events, outcome(error)
        return events, outcome(None)

    def through_ainvoke(chain: ServerChain, aperform: Any) -> Any:
        return asyncio.run(chain.ainvoke(SPEC, PAYLOAD, "default", aperform))

    assert run_with(through_awaitable) == run_with(through_ainvoke)


def test_a_subclass_overriding_the_hook_is_not_judged_by_its_parents_declaration() -> None:
    class AskedAlways(FieldRecorder):
        def concerns(self, payload: Any) -> bool:  # no concerns_fields of its own
            self.asked.append(payload["jid"])
            return True

    class EndsEveryJob(OnErrorRecorder):
        def ended(self, spec: JobSpec, payload: Any, queue: str, error: Any) -> Ending | None:
            self.events.append(f"ended {type(error).__name__}")
            return None

    asked, events = AskedAlways(), []
    chain = ServerChain([asked, EndsEveryJob(events)])
    without = {**PAYLOAD, "jid": "without"}
    assert len(chain.concerned(without)) == 2
    assert asked.asked == ["without"]
    assert chain.invoke(SPEC, without, "default", lambda: "result") == "result"
    assert events == ["ended NoneType"]  # told of a job that returned, as it asks
