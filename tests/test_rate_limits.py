"""Rate limits in the limit fetch: the config key, the command, the admin API, the Lua
script at chosen times (its exact guarantee), and capsules that run jobs under one."""

from __future__ import annotations

import json
import random
import subprocess
import sys
import threading
import time
from collections.abc import Iterator, Sequence
from pathlib import Path

import pytest
import redis as redis_py

import limitd
from limitd import keys
from limitd.api import Queue, queue_overview
from limitd.config import ConfigError, config_as_dict, load_config
from limitd.fetch.factory import limit_fetch
from limitd.fetch.limit import LimitFetch
from limitd.queues.order import QueueOrder
from limitd.queues.rates import Rate, parse_rate
from limitd.supervisor import Capsule, CapsuleConfig
from tests.helpers import wait_for
from tests.test_cli_admin import Cli, make_cli

SECOND = 1_000_000  # microseconds
T0 = 1_800_000_000 * SECOND  # an arbitrary "now" for the script


# Parsing


@pytest.mark.parametrize(
    ("text", "rate"),
    [
        ("100/minute", Rate(100, 60)),
        ("5/second", Rate(5, 1)),
        (" 7 / hour ", Rate(7, 3600)),
        ("1/day", Rate(1, 86400)),
        ("10/30s", Rate(10, 30)),
        ("3/0.5s", Rate(3, 0.5)),
    ],
)
def test_rate_forms(text: str, rate: Rate) -> None:
    assert parse_rate(text) == rate
    assert parse_rate(str(rate)) == rate, "printed as it is read"


@pytest.mark.parametrize(
    "bad", ["100", "100/minutes", "100/fortnight", "0/second", "-1/second", "1.5/second",
            "10/0s", "/minute", "ten/minute", "", 100]
)  # fmt: skip
def test_malformed_rates(bad: object) -> None:
    with pytest.raises(ValueError, match="expected a rate 'N/second'"):
        parse_rate(bad)


# Configuration


def load(tmp_path: Path, text: str) -> CapsuleConfig:
    path = tmp_path / "app.yml"
    path.write_text(text)
    return load_config([path], env={}).capsules[0].config


def test_config_rate_limits_like_limits(tmp_path: Path) -> None:
    config = load(
        tmp_path,
        "queues: [webhooks, reports, other]\n"
        "rate_limits: {webhooks: 100/minute, reports: 5/second, other: null}\n",
    )
    assert config.limit_settings.rate_limits == {"webhooks": Rate(100, 60), "reports": Rate(5, 1)}
    path = tmp_path / "app.yml"
    printed = config_as_dict(load_config([path], env={}))["capsules"]["default"]
    assert printed["rate_limits"] == {"webhooks": "100/minute", "reports": "5/second"}


def test_named_capsule_has_its_own_rate_limits(tmp_path: Path) -> None:
    path = tmp_path / "app.yml"
    path.write_text(
        "rate_limits: {mail: 1/second}\nqueues: [mail]\n"
        "capsules: {bulk: {queues: [mail], rate_limits: {mail: 10/30s}}}\n"
    )
    default, bulk = (spec.config for spec in load_config([path], env={}).capsules)
    assert default.limit_settings.rate_limits == {"mail": Rate(1, 1)}
    assert bulk.limit_settings.rate_limits == {"mail": Rate(10, 30)}


@pytest.mark.parametrize(
    ("text", "key", "words"),
    [
        ("rate_limits: {q: 100/fortnight}\n", "rate_limits.q", "'100/fortnight'"),
        ("rate_limits: {q: 0/second}\n", "rate_limits.q", "N >= 1"),
        ("rate_limits: {q: 100}\n", "rate_limits.q", "got 100"),
        ("rate_limits: {other: 1/second}\n", "rate_limits.other", "not in this capsule's"),
        ("rate_limits: [q]\n", "rate_limits", "expected a mapping"),
    ],
)
def test_bad_rate_limits_name_file_and_key(tmp_path: Path, text: str, key: str, words: str) -> None:
    with pytest.raises(ConfigError) as caught:
        load(tmp_path, "queues: [q]\n" + text)
    assert caught.value.file == str(tmp_path / "app.yml")
    assert caught.value.key == key
    assert words in caught.value.message


def test_dynamic_capsule_may_rate_limit_queues_it_does_not_list(tmp_path: Path) -> None:
    config = load(tmp_path, "queues: [q]\ndynamic: true\nrate_limits: {found: 1/hour}\n")
    assert config.limit_settings.rate_limits == {"found": Rate(1, 3600)}


def test_capsule_config_checks_rates_too() -> None:
    with pytest.raises(ValueError, match=r"rate_limits\.q: expected a rate"):
        CapsuleConfig(queues=["q"], rate_limits={"q": "fast"})
    with pytest.raises(ValueError, match=r"rate_limits\.x: queue 'x' is not in"):
        CapsuleConfig(queues=["q"], rate_limits={"x": "1/second"})


def test_limitd_check_exits_78_on_a_bad_rate(tmp_path: Path) -> None:
    path = tmp_path / "app.yml"
    path.write_text("queues: [q]\nrate_limits: {q: 5/week}\n")
    done = subprocess.run(
        [sys.executable, "-m", "limitd.cli", "check", str(path)],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 78, done.stderr
    assert f"{path}: rate_limits.q: expected a rate" in done.stderr


# Stored values: configuration vs run-time changes, as for the concurrency limits


def test_configured_rate_is_a_default_that_run_time_changes_override(
    redis: redis_py.Redis,
) -> None:
    settings = CapsuleConfig(queues=["q"], rate_limits={"q": "5/second"}).limit_settings
    queue = Queue("q", redis)
    settings.apply_defaults(redis)
    assert queue.rate_limit == Rate(5, 1)
    queue.rate_limit = "2/minute"
    settings.apply_defaults(redis)  # a heartbeat, a restart
    assert queue.rate_limit == Rate(2, 60), "the run-time value survives"
    queue.rate_limit = None
    settings.apply_defaults(redis)
    assert queue.rate_limit is None, "cleared stays cleared"
    assert redis.hget(keys.of(redis).RATE_LIMITS, "q") == b"none"
    queue.reset_rate_limit()
    assert queue.rate_limit is None
    settings.apply_defaults(redis)
    assert queue.rate_limit == Rate(5, 1), "reset: the configured value comes back"


def test_admin_api_rejects_a_bad_rate(redis: redis_py.Redis) -> None:
    with pytest.raises(ValueError, match="expected a rate"):
        Queue("q", redis).rate_limit = "lots"
    assert Queue("q", redis).rate_limit is None


def test_queue_overview_shows_rate_limits(redis: redis_py.Redis) -> None:
    Queue("webhooks", redis).rate_limit = "100/minute"
    Queue("cleared", redis).clear_rate_limit()
    rows = {row.name: row for row in queue_overview(redis)}
    assert rows["webhooks"].rate_limit == "100/minute"
    assert rows["cleared"].rate_limit is None


# The command line


@pytest.fixture
def cli(redis: redis_py.Redis, capsys: pytest.CaptureFixture[str]) -> Cli:
    return make_cli(lambda args: redis, capsys)


def test_limit_rate_set_show_clear_reset(cli: Cli, redis: redis_py.Redis) -> None:
    queue = Queue("webhooks", redis)
    result = cli("limit", "rate", "webhooks", "100/minute")
    assert (result.code, result.out) == (0, "rate limit of queue 'webhooks' set to 100/minute\n")
    assert queue.rate_limit == Rate(100, 60)
    assert cli("limit", "rate", "webhooks").out == "rate limit of queue 'webhooks': 100/minute\n"
    rows = cli("queues", "--json").json()
    assert rows == [
        {"name": "webhooks", "size": 0, "latency": 0.0, "limit": None, "process_limit": None}
        | {"busy": 0, "paused": False, "rate_limit": "100/minute", "fair": False}
        | {"tenants_waiting": None}
    ]
    assert "100/minute" in cli("queues").out.splitlines()[1].split()
    result = cli("limit", "rate", "webhooks", "--clear")
    assert (result.code, result.out) == (0, "rate limit of queue 'webhooks' cleared: none\n")
    assert redis.hget(keys.of(redis).RATE_LIMITS, "webhooks") == b"none"
    assert cli("limit", "rate", "webhooks").out == "rate limit of queue 'webhooks': none\n"
    assert cli("limit", "rate", "webhooks", "--reset").code == 0
    assert redis.hget(keys.of(redis).RATE_LIMITS, "webhooks") is None


@pytest.mark.parametrize(
    "argv",
    [
        ("webhooks", "100/fortnight"),
        ("webhooks", "0/second"),
        ("webhooks", "5/second", "--clear"),
        (" ", "5/second"),
    ],
)
def test_limit_rate_bad_input_exits_64(cli: Cli, redis: redis_py.Redis, argv: tuple) -> None:
    result = cli("limit", "rate", *argv)
    assert result.code == 64
    assert result.err.startswith("limitd limit rate: ")
    assert redis.hgetall(keys.of(redis).RATE_LIMITS) == {}


# The script, at chosen times


class Clock:
    def __init__(self) -> None:
        self.now = T0

    def __call__(self) -> int:
        return self.now


@pytest.fixture
def clock() -> Clock:
    return Clock()


def push(redis: redis_py.Redis, queue: str, count: int) -> list[bytes]:
    jobs = [json.dumps({"class": "X", "args": [i], "queue": queue}).encode() for i in range(count)]
    redis.lpush(keys.of(redis).queue(queue), *jobs)
    return jobs


def fetcher(redis: redis_py.Redis, queues: list, clock: Clock, **options: object) -> LimitFetch:
    return limit_fetch(redis, QueueOrder(queues), "c1", rate_clock=clock, **options)  # type: ignore[arg-type]


def take(fetch: LimitFetch, want: int = 1) -> list[bytes]:
    """Take up to ``want`` jobs in one call, acknowledging them at once (so only the rate
    limit can hold the next ones back)."""
    units = fetch.take(want, [])
    for unit in units:
        unit.fetch.settle([unit])
    return [unit.job for unit in units]


def test_n_jobs_in_the_interval_and_the_next_waits_for_it(
    redis: redis_py.Redis, clock: Clock
) -> None:
    jobs = push(redis, "q", 10)
    Queue("q", redis).rate_limit = "3/60s"  # one job every 20 s
    fetch = fetcher(redis, ["q"], clock)
    taken = take(fetch, want=5)
    assert taken == jobs[:1], "no burst: one job per interval even when five are wanted"
    assert fetch.room_in == 20.0
    clock.now += 20 * SECOND - 1
    assert take(fetch) == []
    assert fetch.room_in == 0.001, "1 us to go rounds up to 1 ms"
    clock.now += 1
    assert take(fetch) == jobs[1:2]
    clock.now += 20 * SECOND
    assert take(fetch) == jobs[2:3]
    # Three jobs at T0, T0 + 20 s, T0 + 40 s: the fourth may not start before T0 + 60 s,
    # so no window of 60 s holds four.
    clock.now = T0 + 60 * SECOND - 1
    assert take(fetch) == []
    clock.now = T0 + 60 * SECOND
    assert take(fetch) == jobs[3:4]


def test_fractional_intervals_round_toward_the_limit(redis: redis_py.Redis, clock: Clock) -> None:
    """1/7 s is not a whole number of microseconds: each step of the schedule is rounded
    up, so a fetcher that comes back at the exact moment each time still fits seven
    jobs, not eight, into a second."""
    push(redis, "q", 10)
    Queue("q", redis).rate_limit = "7/second"
    fetch = fetcher(redis, ["q"], clock)
    for _ in range(7):
        assert len(take(fetch)) == 1
        clock.now = int(redis.get(keys.of(redis).rate_state("q")))  # type: ignore[arg-type]
    assert clock.now >= T0 + SECOND
    clock.now = T0 + SECOND - 1
    assert take(fetch) == []


def test_a_fast_rate_lends_one_percent_as_a_burst(redis: redis_py.Redis, clock: Clock) -> None:
    push(redis, "q", 30)
    Queue("q", redis).rate_limit = "1000/second"  # burst 10, then one every 1/991 s
    fetch = fetcher(redis, ["q"], clock)
    assert len(take(fetch, want=30)) == 10
    assert fetch.room_in == 0.002, "1009.08 us, rounded up to whole milliseconds"
    clock.now += 1010
    assert len(take(fetch, want=30)) == 1


@pytest.mark.parametrize("text", ["7/second", "199/10s", "1000/second", "450/3s"])
def test_no_window_ever_holds_more_than_n(redis: redis_py.Redis, clock: Clock, text: str) -> None:
    """A greedy fetcher at irregular times (often microseconds apart, sometimes two
    intervals), over six intervals: the starts in every window of the interval,
    wherever it begins, stay at most N."""
    rate = parse_rate(text)
    window = int(rate.seconds * SECOND)
    push(redis, "q", 7 * rate.count)
    Queue("q", redis).rate_limit = text
    fetch = fetcher(redis, ["q"], clock)
    rng = random.Random(text)
    times: list[int] = []
    while clock.now < T0 + 6 * window:
        times += [clock.now] * len(fetch.take(25, []))
        # The state's expiry (garbage collection a second after its arrival time) runs
        # on Redis's real clock, while this test's clock moves in its own small steps: on
        # a loaded machine, real time outruns it and the state would vanish mid-window.
        redis.persist(keys.of(redis).rate_state("q"))
        step = rate.interval * SECOND * (2 if rng.random() < 0.3 else 0.01)
        clock.now += rng.randrange(0, int(step) + 2)
    assert most_in_any_window(times, window) <= rate.count
    assert len(times) >= 6 * rate.count / 2, "and the fetcher was not starved"


def test_a_late_fetch_does_not_let_the_next_ones_catch_up(
    redis: redis_py.Redis, clock: Clock
) -> None:
    push(redis, "q", 5)
    Queue("q", redis).rate_limit = "1/second"
    fetch = fetcher(redis, ["q"], clock)
    assert len(take(fetch)) == 1
    clock.now += 10 * SECOND  # nothing fetched for ten intervals
    assert len(take(fetch, want=5)) == 1
    clock.now += SECOND - 1
    assert take(fetch) == []


def test_a_rate_blocked_queue_is_skipped_and_fifo_kept(redis: redis_py.Redis, clock: Clock) -> None:
    slow = push(redis, "slow", 3)
    fast = push(redis, "fast", 3)
    Queue("slow", redis).rate_limit = "1/second"
    fetch = fetcher(redis, ["slow", "fast"], clock)
    assert take(fetch, want=3) == [slow[0], fast[0], fast[1]]
    assert fetch.room_in == 1.0
    clock.now += SECOND
    assert take(fetch, want=3) == [slow[1], fast[2]]
    clock.now += SECOND
    assert take(fetch, want=3) == [slow[2]]
    assert fetch.room_in is None, "nothing waits for the rate: no wake-up to ask for"


def test_every_capsule_shares_the_schedule(redis: redis_py.Redis, clock: Clock) -> None:
    push(redis, "q", 4)
    Queue("q", redis).rate_limit = "1/second"
    one = fetcher(redis, ["q"], clock)
    other = limit_fetch(redis, QueueOrder(["q"]), "c2", rate_clock=clock)
    assert (len(take(one)), len(take(other))) == (1, 0)
    clock.now += SECOND
    assert (len(take(other)), len(take(one))) == (1, 0)


def test_rate_and_concurrency_limits_both_hold(redis: redis_py.Redis, clock: Clock) -> None:
    push(redis, "q", 5)
    Queue("q", redis).rate_limit = "10/second"
    Queue("q", redis).limit = 1
    fetch = fetcher(redis, ["q"], clock)
    held = fetch.take(1, [])
    clock.now += SECOND
    assert fetch.take(1, []) == [], "at its concurrency limit"
    assert fetch.room_in is None
    assert len(fetch.take(1, held)) == 1


def test_a_blocking_queue_waiting_for_its_rate_holds_lower_queues(
    redis: redis_py.Redis, clock: Clock
) -> None:
    push(redis, "first", 2)
    push(redis, "second", 2)
    Queue("first", redis).rate_limit = "1/second"
    fetch = fetcher(redis, ["first", "second"], clock, blocking=["first"])
    assert len(take(fetch, want=3)) == 1
    assert fetch.room_in == 1.0


def test_raising_the_rate_applies_at_once(redis: redis_py.Redis, clock: Clock) -> None:
    push(redis, "q", 3)
    queue = Queue("q", redis)
    queue.rate_limit = "1/hour"
    fetch = fetcher(redis, ["q"], clock)
    assert len(take(fetch)) == 1
    queue.rate_limit = "10/second"
    assert take(fetch) == []
    assert fetch.room_in == 0.1, "the hour's schedule is pulled back to one new interval"
    clock.now += SECOND // 10
    assert len(take(fetch)) == 1


def test_cleared_or_absent_rate_costs_nothing(redis: redis_py.Redis, clock: Clock) -> None:
    push(redis, "q", 3)
    push(redis, "free", 3)
    Queue("q", redis).rate_limit = None
    fetch = fetcher(redis, ["q", "free"], clock)
    assert len(take(fetch, want=6)) == 6
    assert redis.exists(keys.of(redis).rate_state("q"), keys.of(redis).rate_state("free")) == 0


def test_the_schedule_expires_a_second_after_it_has_passed(redis: redis_py.Redis) -> None:
    push(redis, "q", 1)
    Queue("q", redis).rate_limit = "1/second"
    fetch = limit_fetch(redis, QueueOrder(["q"]), "c1")  # Redis's clock
    assert len(take(fetch)) == 1
    assert 1000 < int(redis.pttl(keys.of(redis).rate_state("q"))) <= 2000


# Capsules


class Stamps:
    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.times: list[float] = []

    def add(self) -> None:
        with self.lock:
            self.times.append(time.time())


stamps = Stamps()


@limitd.job(name="rate_limits_test.Stamp", queue="rated")
def stamp(n: int) -> None:
    stamps.add()


@pytest.fixture(autouse=True)
def _stamps() -> Iterator[None]:
    stamps.times.clear()
    yield


def most_in_any_window(times: Sequence[float], window: float) -> int:
    """The most starts inside any half-open window of ``window`` seconds."""
    ordered, most, first = sorted(times), 0, 0
    for last, at in enumerate(ordered):
        while at - ordered[first] >= window:
            first += 1
        most = max(most, last - first + 1)
    return most


def test_a_capsule_keeps_the_rate_over_any_window(redis: redis_py.Redis) -> None:
    config = CapsuleConfig(queues=["rated"], concurrency=10, rate_limits={"rated": "50/second"})
    capsule = Capsule(config, redis=redis)
    stamp.perform_bulk([[i] for i in range(500)])
    started = time.monotonic()
    capsule.start()
    try:
        wait_for(lambda: len(stamps.times) == 500, timeout=20, message="500 jobs at 50/s")
    finally:
        capsule.stop(timeout=5)
    assert time.monotonic() - started < 20, "well under 10x the ideal 10 s"
    assert most_in_any_window(stamps.times, 1.0) <= 50


def test_an_idle_capsule_wakes_when_the_rate_allows_not_at_its_poll(
    redis: redis_py.Redis,
) -> None:
    poll = 8.0
    config = CapsuleConfig(
        queues=["rated"], concurrency=2, poll_range=(poll, poll), rate_limits={"rated": "1/second"}
    )
    capsule = Capsule(config, redis=redis)
    capsule.start()
    try:
        stamp.perform_bulk([[1], [2]])
        wait_for(lambda: len(stamps.times) == 2, timeout=poll - 1, message="the second job")
    finally:
        capsule.stop(timeout=5)
    first, second = stamps.times
    assert 0.9 < second - first < poll - 1
