"""Time limits in one process, on real threads and a real Redis: the watchdog's
exception in a sync job's thread (and never after the job), the cancellation of an
async job, the stuck job's mark, the ``time_limits:`` section and the job option. What
``limitd start`` does with them is in ``test_time_limits_processes.py``."""

from __future__ import annotations

import asyncio
import contextlib
import datetime as dt
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import redis as redis_py

import limitd
from limitd.config import ConfigError, load_config
from limitd.config.app_checks import check_app
from limitd.registry import JobRegistry
from limitd.spec import JobSpec
from limitd.time_limits import TimeLimitExceeded
from limitd.time_limits.middleware import TimeLimits, exceeded_key
from limitd.time_limits.section import TimeLimitSettings
from limitd.time_limits.watchdog import Running, Watchdog


def spec(name: str = "tl.Job", **options: Any) -> JobSpec:
    return JobSpec(name, "tests", lambda payload: None, options=options)


def payload(jid: str = "j1", **fields: Any) -> dict[str, Any]:
    return {"class": "tl.Job", "jid": jid, "args": [], "queue": "default", **fields}


class Recycles:
    """Stands for the process's own SIGTERM: counts the calls."""

    def __init__(self) -> None:
        self.calls = 0
        self.called = threading.Event()

    def __call__(self) -> None:
        self.calls += 1
        self.called.set()


@pytest.fixture
def limits(redis: redis_py.Redis) -> Any:
    made: list[TimeLimits] = []

    def make(default: float | None = None, grace: float = 5.0) -> tuple[TimeLimits, Recycles]:
        recycles = Recycles()
        middleware = TimeLimits(redis, default, grace, JobRegistry())
        middleware.watchdog.recycle = recycles
        made.append(middleware)
        return middleware, recycles

    yield make
    for middleware in made:
        middleware.stop()


def spin(seconds: float) -> Callable[[], str]:
    """A job running Python code (interruptible) for ``seconds``."""

    def run() -> str:
        until = time.monotonic() + seconds
        while time.monotonic() < until:
            pass
        return "done"

    return run


def test_a_job_looping_past_its_limit_fails_with_time_limit_exceeded(limits) -> None:
    middleware, recycles = limits()
    started = time.monotonic()
    with pytest.raises(TimeLimitExceeded, match=r"ran past its time limit of 0\.2s"):
        middleware(spec(), payload(time_limit=0.2), "default", spin(30))
    assert time.monotonic() - started < 10
    assert recycles.calls == 0


def test_a_job_under_its_limit_is_untouched_and_nothing_reaches_its_thread_later(
    limits,
) -> None:
    middleware, _ = limits()
    assert middleware(spec(), payload(time_limit=1.0), "default", spin(0.05)) == "done"
    spin(1.3)()  # past the deadline it had: no exception arrives


def test_the_job_option_and_the_default_give_the_limit(limits) -> None:
    middleware, _ = limits(default=0.2)
    with pytest.raises(TimeLimitExceeded, match=r"0\.2s"):
        middleware(spec(), payload(), "default", spin(30))  # the capsule's default
    with pytest.raises(TimeLimitExceeded, match=r"0\.3s"):
        middleware(spec(time_limit=0.3), payload(), "default", spin(30))  # the job's own
    with pytest.raises(TimeLimitExceeded, match=r"0\.25s"):  # set at the push: wins
        middleware(spec(time_limit=0.3), payload(time_limit=0.25), "default", spin(30))


def test_jobs_without_a_limit_are_not_concerned(limits) -> None:
    middleware, _ = limits()
    assert not middleware.concerns(payload())
    assert middleware.concerns(payload(time_limit=5))
    middleware.jobs.register(spec("tl.Limited", time_limit=5))
    assert middleware.concerns({**payload(), "class": "tl.Limited"})
    with_default, _ = limits(default=60)
    assert with_default.concerns(payload())


def test_a_job_ending_at_its_deadline_never_lets_the_exception_out_after_it(limits) -> None:
    """Jobs that end about when their limit fires: each either returns or raises
    ``TimeLimitExceeded`` from the middleware's call; none raises afterwards (the
    pending exception is cleared as the job unregisters)."""
    middleware, _ = limits()
    outcomes = {"done": 0, "exceeded": 0}
    for n in range(150):
        try:
            middleware(spec(), payload(f"j{n}", time_limit=0.004), "default", spin(0.004))
            outcomes["done"] += 1
        except TimeLimitExceeded:
            outcomes["exceeded"] += 1
        spin(0.01)()  # a late exception would surface here and fail the test
    assert sum(outcomes.values()) == 150


def test_a_job_stuck_in_c_is_warned_about_then_its_process_recycled(
    limits, redis: redis_py.Redis, caplog: pytest.LogCaptureFixture
) -> None:
    """``time.sleep`` is one C call: the exception waits for it. Past the grace the job
    is marked and the process recycled; the job that then ends here removes its mark
    (its failure is recorded here), while one that comes back marked fails unrun."""
    middleware, recycles = limits(grace=0.6)
    outcome: list[BaseException] = []

    def stuck() -> None:
        try:
            middleware(spec(), payload("stuck", time_limit=0.2), "default", lambda: time.sleep(3))
        except BaseException as exc:
            outcome.append(exc)

    thread = threading.Thread(target=stuck)
    thread.start()
    assert recycles.called.wait(10), "the process was not recycled"
    assert redis.exists(exceeded_key(redis, "stuck"))
    thread.join(10)
    [error] = outcome
    assert isinstance(error, TimeLimitExceeded)
    assert not redis.exists(exceeded_key(redis, "stuck")), "it ended here: no mark left"
    assert recycles.calls == 1
    assert "still runs past its time limit of 0.2s: blocked in C code" in caplog.text

    redis.set(exceeded_key(redis, "back"), 0.2)
    ran = []
    with pytest.raises(TimeLimitExceeded, match="stuck in C code"):
        middleware(spec(), payload("back", time_limit=0.2), "default", lambda: ran.append(1))
    assert ran == [] and not redis.exists(exceeded_key(redis, "back"))


def test_the_watchdog_starts_its_thread_only_for_a_limited_job() -> None:
    watchdog = Watchdog(TimeLimitExceeded, 1.0, lambda running: None)
    assert watchdog._thread is None
    running = Watchdog.running(5, "j", "tl.Job")
    watchdog.register(running)
    assert isinstance(running, Running) and watchdog._thread is not None
    watchdog.unregister(running)
    watchdog.stop()
    assert not watchdog._thread.is_alive()


def test_an_async_job_is_cancelled_at_its_limit(limits) -> None:
    middleware, _ = limits()

    async def forever() -> None:
        await asyncio.sleep(30)

    async def own_timeout() -> None:
        raise TimeoutError("the job's own")

    async def quick() -> str:
        await asyncio.sleep(0.01)
        return "done"

    async def main() -> None:
        with pytest.raises(TimeLimitExceeded, match=r"0\.2s"):
            await middleware.acall(spec(), payload(time_limit=0.2), "default", forever)
        with pytest.raises(TimeoutError, match="the job's own"):
            await middleware.acall(spec(), payload(time_limit=5), "default", own_timeout)
        assert await middleware.acall(spec(), payload(time_limit=5), "default", quick) == "done"

    asyncio.run(main())


def test_time_limit_is_a_job_option_in_seconds_or_a_timedelta() -> None:
    @limitd.job(name="tl.Declared", time_limit=dt.timedelta(minutes=2))
    def declared() -> None: ...

    assert limitd.registry.resolve("tl.Declared").options["time_limit"] == 120.0
    with pytest.raises(limitd.InvalidJobOption, match="time_limit"):
        limitd.job(name="tl.Bad", time_limit=0)(lambda: None)
    assert issubclass(limitd.TimeLimitExceeded, Exception)


def write(tmp_path: Path, text: str) -> str:
    path = tmp_path / "a.yml"
    path.write_text(text)
    return str(path)


def test_the_section_gives_the_default_per_capsule(tmp_path: Path) -> None:
    text = "time_limits:\n  default: 30\n  grace: 2\n  capsules:\n    reports: 600\n"
    settings = load_config([write(tmp_path, text)]).section("time_limits")
    assert settings == TimeLimitSettings(30.0, 2.0, {"reports": 600.0})
    assert settings.default_for("reports") == 600.0
    assert settings.default_for("default") == 30.0
    assert load_config([]).section("time_limits") == TimeLimitSettings()


@pytest.mark.parametrize(
    ("text", "key", "expected"),
    [
        ("time_limits:\n  default: 0\n", "time_limits.default", "expected a number of seconds > 0"),
        ("time_limits:\n  grace: soon\n", "time_limits.grace", "expected a number of seconds"),
        ("time_limits:\n  capsules:\n    r: -1\n", "time_limits.capsules.r", "> 0"),
        ("time_limits:\n  defualt: 3\n", "time_limits.defualt", "did you mean 'default'?"),
    ],
)
def test_a_mistake_names_the_file_the_key_and_what_was_expected(
    tmp_path: Path, text: str, key: str, expected: str
) -> None:
    with pytest.raises(ConfigError) as caught:
        load_config([write(tmp_path, text)])
    assert caught.value.file == str(tmp_path / "a.yml")
    assert caught.value.key == key
    assert expected in caught.value.message


def test_a_capsule_default_must_name_a_capsule(tmp_path: Path) -> None:
    text = "capsules:\n  reports: {queues: [reports]}\ntime_limits:\n  capsules:\n    reprots: 60\n"
    with pytest.raises(ConfigError) as caught:
        check_app(load_config([write(tmp_path, text)]), [])
    assert caught.value.key == "time_limits.capsules.reprots"
    assert "no capsule is named 'reprots'; expected one of ['reports']" in caught.value.message
    fixed = text.replace("reprots", "reports")
    check_app(load_config([write(tmp_path, fixed)]), [])


def test_a_job_that_swallows_the_error_is_recycled_like_a_stuck_one(
    limits, redis: redis_py.Redis
) -> None:
    middleware, recycles = limits(grace=0.5)
    caught = []

    def stubborn() -> str:
        until = time.monotonic() + 30
        while time.monotonic() < until and not recycles.called.is_set():
            try:
                spin(0.05)()
            except TimeLimitExceeded as exc:
                caught.append(exc)
        return "went on"

    with pytest.raises(TimeLimitExceeded, match=r"ran past its time limit of 0\.2s"):
        middleware(spec(), payload("stubborn", time_limit=0.2), "default", stubborn)
    assert len(caught) == 1 and recycles.calls == 1
    assert not redis.exists(exceeded_key(redis, "stubborn")), "it ended here: no mark left"


class CapsuleShutdown(BaseException):
    """Stands for the capsule's Shutdown: raised in a thread whose job it requeued."""


def test_a_stuck_job_abandoned_at_the_stop_keeps_its_mark(limits, redis: redis_py.Redis) -> None:
    """The capsule requeued the stuck job and abandons its thread: the job did not end
    here, so its next run must find the mark and fail unrun (else it would get stuck,
    and its process recycled, again and again)."""
    middleware, recycles = limits(grace=0.3)

    def stuck_until_abandoned() -> str:
        while not recycles.called.is_set():
            with contextlib.suppress(TimeLimitExceeded):
                spin(0.05)()
        raise CapsuleShutdown

    with pytest.raises(CapsuleShutdown):
        middleware(spec(), payload("abandoned", time_limit=0.2), "default", stuck_until_abandoned)
    assert redis.exists(exceeded_key(redis, "abandoned")), "the mark stays for its next run"
    with pytest.raises(TimeLimitExceeded, match="stuck in C code"):
        middleware(spec(), payload("abandoned", time_limit=0.2), "default", spin(0))


def test_an_async_job_that_swallows_its_cancel_fails_when_it_returns(
    limits, redis: redis_py.Redis
) -> None:
    middleware, _ = limits()

    async def swallows() -> str:
        with contextlib.suppress(asyncio.CancelledError):
            await asyncio.sleep(5)
        return "went on"

    async def run() -> None:
        await middleware.acall(spec(), payload("async", time_limit=0.05), "default", swallows)

    with pytest.raises(TimeLimitExceeded, match=r"ran past its time limit of 0\.05s"):
        asyncio.run(run())


def test_unregistering_clears_an_exception_set_but_not_yet_delivered() -> None:
    """The job's thread is in a C call when its limit fires, and the job is over by the
    time it unregisters (here from another thread, so the order is certain): the
    exception set in the thread must never arrive."""
    watchdog = Watchdog(TimeLimitExceeded, 30.0, lambda running: None)
    ready, fired = threading.Event(), threading.Event()
    arrived: list[BaseException] = []
    holder: list[Running] = []

    def job_thread() -> None:
        try:
            running = Watchdog.running(0.05, "j", "tl.Job")
            holder.append(running)
            watchdog.register(running)
            ready.set()
            fired.wait(10)  # one C call: the exception waits for it to return
            spin(0.05)()  # Python again: a pending exception would arrive here
        except TimeLimitExceeded as exc:
            arrived.append(exc)

    thread = threading.Thread(target=job_thread)
    thread.start()
    assert ready.wait(10)
    running = holder[0]
    deadline = time.monotonic() + 10
    while not running.fired and time.monotonic() < deadline:
        time.sleep(0.01)
    assert running.fired
    watchdog.unregister(running)
    fired.set()
    thread.join(10)
    watchdog.stop()
    assert arrived == []


def test_jobs_stopped_at_their_limit_are_counted_for_limitd_metrics(
    limits, redis: redis_py.Redis
) -> None:
    from limitd.time_limits.metrics import time_limit_metrics

    middleware, recycles = limits(grace=0.4)
    with pytest.raises(TimeLimitExceeded):
        middleware(spec(), payload(time_limit=0.1), "default", spin(30))

    async def forever() -> None:
        await asyncio.sleep(30)

    async def cancelled() -> None:
        with pytest.raises(TimeLimitExceeded):
            await middleware.acall(spec(), payload(time_limit=0.1), "default", forever)

    asyncio.run(cancelled())
    with pytest.raises(TimeLimitExceeded):  # stuck in C, recycled; ends here after all
        middleware(spec(), payload("s", time_limit=0.1), "default", lambda: time.sleep(3))
    assert recycles.calls == 1
    [family] = time_limit_metrics(redis)
    samples = {(s.labels["job_class"], s.labels["how"]): s.value for s in family.samples}
    assert samples == {
        ("tl.Job", "interrupted"): 1,
        ("tl.Job", "cancelled"): 1,
        ("tl.Job", "recycled"): 1,
    }
    assert family.name == "limitd_time_limit_exceeded"
