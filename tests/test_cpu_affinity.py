"""``cpu_affinity`` without pinning the test process's own threads: the kernel calls are
replaced, so what is checked is which CPUs each capsule process is given and what
happens when the kernel says no. Real capsule processes are checked in
test_supervisor_cli.py."""

from __future__ import annotations

import logging
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from limitd.supervisor import cpu_affinity, cpu_claims, cpu_readings, cpu_scheduling, cpu_watch


@pytest.fixture(autouse=True)
def own_claims(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """Claims in a file of the test's own: capsules running on this machine claim theirs
    in the shared one."""
    path = tmp_path / "cpus"
    monkeypatch.setattr(cpu_claims, "claims_path", lambda: str(path))
    return path


@pytest.mark.parametrize(
    ("process_number", "per_process", "allowed", "expected"),
    [
        (0, 1, [0, 1], {0}),
        (1, 1, [0, 1], {1}),
        (2, 1, [0, 1], {0}),  # more capsule processes than CPUs: round again
        (1, 1, [6, 4, 5], {5}),  # the supervisor's own set, in CPU order
        (1, 2, [0, 1, 2, 3], {2, 3}),
        (1, 2, [0, 1, 2], {2, 0}),  # wrapping round inside one process's share
        (0, 8, [2, 3], {2, 3}),  # more CPUs asked than there are: all of them
    ],
)
def test_capsule_processes_are_spread_over_the_supervisor_s_cpus(
    process_number: int, per_process: int, allowed: list[int], expected: set[int]
) -> None:
    assert cpu_affinity.cpus_for(process_number, per_process, allowed) == expected


class FakeKernel:
    """Per-thread CPU sets, as Linux keeps them; ``refuse`` makes every change fail."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch, threads: list[int]) -> None:
        self.cpus = dict.fromkeys([0, *threads], frozenset({0, 1, 2, 3}))
        self.refuse: OSError | None = None
        self.gone: set[int] = set()
        monkeypatch.setattr(cpu_scheduling, "own_threads", lambda: [0, *threads])
        monkeypatch.setattr(os, "sched_getaffinity", lambda thread: set(self.cpus[thread]))
        monkeypatch.setattr(os, "sched_setaffinity", self.set)

    def set(self, thread: int, cpus: set[int]) -> None:
        if self.refuse is not None:
            raise self.refuse
        if thread in self.gone:
            raise ProcessLookupError(thread)
        self.cpus[thread] = frozenset(cpus)


def test_every_thread_of_the_process_is_kept_on_its_cpus(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    kernel = FakeKernel(monkeypatch, [101, 102])
    with caplog.at_level(logging.INFO, logger="limitd.supervisor"):
        cpu_affinity.apply(1, 2)
    assert kernel.cpus == dict.fromkeys([0, 101, 102], frozenset({2}))
    assert "capsule process 2 keeps its threads on CPU 2" in caplog.text


def test_none_leaves_the_threads_where_the_kernel_puts_them(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    kernel = FakeKernel(monkeypatch, [101])
    cpu_affinity.apply(None, 1)
    assert set(kernel.cpus.values()) == {frozenset({0, 1, 2, 3})}


def test_a_thread_that_ended_meanwhile_is_skipped(monkeypatch: pytest.MonkeyPatch) -> None:
    kernel = FakeKernel(monkeypatch, [101, 102])
    kernel.gone = {101}
    cpu_affinity.apply(2, 1)
    assert kernel.cpus[0] == kernel.cpus[102] == frozenset({2, 3})
    assert kernel.cpus[101] == frozenset({0, 1, 2, 3})


def test_a_refusal_is_logged_and_the_capsule_runs_on(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    kernel = FakeKernel(monkeypatch, [101])
    kernel.refuse = PermissionError(1, "Operation not permitted")
    with caplog.at_level(logging.WARNING, logger="limitd.supervisor"):
        cpu_affinity.apply(1, 0)
    assert "cpu_affinity 1: the kernel refused it" in caplog.text
    assert set(kernel.cpus.values()) == {frozenset({0, 1, 2, 3})}


def test_a_platform_without_affinity_runs_as_it_is(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    monkeypatch.delattr(os, "sched_setaffinity")
    with caplog.at_level(logging.DEBUG, logger="limitd.supervisor"):
        cpu_affinity.apply(1, 0)
    assert "not available on this platform" in caplog.text


@pytest.mark.parametrize(
    ("cpus", "expected"),
    [([0], "0"), ([3, 0, 1, 2], "0-3"), ([0, 1, 2, 3, 6], "0-3,6"), ([1, 3, 5], "1,3,5")],
)
def test_cpus_are_listed_as_linux_lists_them(cpus: list[int], expected: str) -> None:
    assert cpu_affinity.listed(cpus) == expected


# cpu_affinity: auto. The kernel's per-CPU counters and the process's own are fed in.

PROC_STAT = """cpu  400 0 200 9000 10 0 5 0 0 0
cpu0 300 0 100 4000 5 0 3 0 0 0
cpu1 100 0 100 5000 5 0 2 7 0 0
intr 12345 0 0
ctxt 999
"""


def test_cpu_times_are_read_per_cpu_from_proc_stat() -> None:
    """Busy: user, nice, system, irq, softirq; total: every tick, steal included."""
    times = cpu_readings.read_cpu_times(PROC_STAT)
    assert times == {
        0: cpu_readings.CpuTimes(busy=403, total=4408),
        1: cpu_readings.CpuTimes(busy=202, total=5214),
    }
    assert cpu_readings.read_own_ticks() >= 0  # this process, from /proc/self/stat


def auto_kernel(monkeypatch: pytest.MonkeyPatch, shares: dict[int, float]) -> FakeKernel:
    kernel = FakeKernel(monkeypatch, [101])
    monkeypatch.setattr(cpu_affinity, "sample_cpu_times", lambda seconds: shares)
    monkeypatch.setattr(cpu_affinity.ForeignLoadWatch, "start", lambda self: None)
    return kernel


def test_auto_keeps_the_process_on_the_quietest_cpu(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """Another supervisor's capsule already busy on CPU 0 (the k-th for both): this one
    takes a quiet CPU instead; a difference under a tenth is noise, and the k-th wins."""
    kernel = auto_kernel(monkeypatch, {0: 0.9, 1: 0.12, 2: 0.05, 3: 0.3})
    with caplog.at_level(logging.INFO, logger="limitd.supervisor"):
        cpu_affinity.apply("auto", 0, 1)
    assert kernel.cpus == dict.fromkeys([0, 101], frozenset({1}))
    assert "keeps its threads on CPU 1 while no other process needs it" in caplog.text


@pytest.mark.parametrize(
    ("process_number", "shares", "expected"),
    [
        (0, {}, 0),  # an idle machine: the k-th CPU, as cpu_affinity: 1
        (1, {}, 1),
        (3, {0: 0.0, 1: 0.0, 2: 0.0, 3: 0.0}, 3),
        (1, {0: 0.0, 1: 0.5}, 0),
    ],
)
def test_auto_spreads_a_supervisor_s_children_over_idle_cpus(
    monkeypatch: pytest.MonkeyPatch, process_number: int, shares: dict[int, float], expected: int
) -> None:
    kernel = auto_kernel(monkeypatch, shares)
    cpu_affinity.apply("auto", process_number, 4)
    assert kernel.cpus[0] == frozenset({expected})


@pytest.mark.parametrize(
    ("allowed", "process_count"),
    [({0, 1, 2, 3}, 5), ({2}, 1)],  # more children than CPUs; nothing to choose from
)
def test_auto_leaves_the_threads_alone_when_no_cpu_can_be_a_process_s_own(
    monkeypatch: pytest.MonkeyPatch, allowed: set[int], process_count: int
) -> None:
    kernel = auto_kernel(monkeypatch, {})
    kernel.cpus = dict.fromkeys(kernel.cpus, frozenset(allowed))
    cpu_affinity.apply("auto", 0, process_count)
    assert set(kernel.cpus.values()) == {frozenset(allowed)}


def test_auto_leaves_a_python_without_a_gil_alone(monkeypatch: pytest.MonkeyPatch) -> None:
    """Free-threaded CPython runs the threads in parallel: one CPU would be a cap."""
    kernel = auto_kernel(monkeypatch, {})
    monkeypatch.setattr(sys, "_is_gil_enabled", lambda: False, raising=False)
    cpu_affinity.apply("auto", 0, 1)
    assert set(kernel.cpus.values()) == {frozenset({0, 1, 2, 3})}


class Counters:
    """/proc/stat and /proc/self/stat as the watch reads them, advanced by hand: each
    step is 100 ticks of every CPU, of which ``busy[cpu]`` ran something, ``own`` of
    them this process."""

    def __init__(self) -> None:
        self.cpus = {cpu: cpu_readings.CpuTimes(0, 0) for cpu in range(3)}
        self.own = 0
        self.pins: list[set[int]] = []

    def step(self, busy: dict[int, int], own: int) -> None:
        for cpu, times in self.cpus.items():
            self.cpus[cpu] = cpu_readings.CpuTimes(times.busy + busy.get(cpu, 0), times.total + 100)
        self.own += own

    def watch(self, cpu: int) -> cpu_watch.ForeignLoadWatch:
        def pin_to(cpus: set[int]) -> bool:
            self.pins.append(cpus)
            return True

        self.watched = cpu_watch.ForeignLoadWatch(
            cpu, self.cpus, pin_to, read_cpus=lambda: dict(self.cpus), read_own=lambda: self.own
        )
        return self.watched

    def readings(self, busy: dict[int, int], own: int, times: int = 2) -> None:
        """``times`` steps alike, the watch reading after each (two: what it acts on)."""
        for _ in range(times):
            self.step(busy, own)
            self.watched.check()


def test_the_watch_ignores_the_process_s_own_load_and_a_single_busy_reading() -> None:
    counters = Counters()
    watch = counters.watch(0)
    counters.readings({0: 100, 1: 40}, own=95, times=1)  # its own CPU full, of its own work
    counters.readings({0: 90, 1: 10}, own=40, times=1)  # one reading with 50% foreign
    counters.readings({0: 95, 1: 10}, own=90, times=1)
    assert counters.pins == [] and watch.strikes == 0 and not watch.done.is_set()


def test_a_cpu_shared_twice_in_a_row_makes_the_process_move_once_then_let_go(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """Another busy process on its CPU: it moves to the quietest CPU; shared there too,
    it lets the kernel place its threads (and its children's) for good."""
    counters = Counters()
    watch = counters.watch(0)
    with caplog.at_level(logging.INFO, logger="limitd.supervisor"):
        counters.readings({0: 100, 1: 60, 2: 5}, own=50)
        assert counters.pins == [{2}] and watch.cpu == 2
        assert "other processes took 50% of CPU 0; moving to CPU 2" in caplog.text
        counters.readings({0: 5, 1: 60, 2: 100}, own=55)
    assert counters.pins == [{2}, {0, 1, 2}]
    assert watch.done.is_set()
    assert "threads left to the kernel on CPU 0-2 from now on" in caplog.text


def test_with_no_quiet_cpu_but_room_elsewhere_the_process_lets_go_at_once() -> None:
    counters = Counters()
    watch = counters.watch(1)
    counters.readings({0: 30, 1: 100, 2: 25}, own=50)
    assert counters.pins == [{0, 1, 2}]
    assert watch.done.is_set()


def test_where_every_cpu_is_as_busy_the_process_stays_and_keeps_reading() -> None:
    """Two capsules and Redis on two cores: Redis takes part of each capsule's CPU, but
    the kernel has no better place for either, and spread out they would lose the
    switches in place."""
    counters = Counters()
    watch = counters.watch(0)
    counters.readings({0: 100, 1: 95, 2: 90}, own=60, times=4)
    assert counters.pins == []
    assert not watch.done.is_set()


@pytest.mark.skipif(len(os.sched_getaffinity(0)) < 2, reason="one CPU: nothing to share")
def test_a_busy_process_on_the_cpu_reads_as_foreign_load() -> None:
    """The real counters: a process spinning on CPU ``c`` takes well over the limit of
    ``c`` in a reading (on a busy machine too: it is kept on ``c``, and takes at least
    its fair share of it), and the reading leaves this process's own ticks out."""
    cpu = min(os.sched_getaffinity(0))
    watch = cpu_watch.ForeignLoadWatch(cpu, os.sched_getaffinity(0), pin_to=lambda cpus: True)
    spinner = subprocess.Popen(
        [sys.executable, "-c", f"import os\nos.sched_setaffinity(0, {{{cpu}}})\nwhile True: pass"]
    )
    try:
        watch.reading()  # from now on
        time.sleep(1.0)  # the window read: a second of the spinner's ticks
        share, shares = watch.reading()
    finally:
        spinner.kill()
        spinner.wait()
    assert share is not None and share > cpu_watch.FOREIGN_LIMIT, share
    assert shares[cpu] >= share


@pytest.fixture
def other_process() -> Iterator[int]:
    """A live process other than this one, to hold a claim."""
    sleeper = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    yield sleeper.pid
    sleeper.kill()
    sleeper.wait()


def test_a_cpu_another_capsule_process_claims_is_passed_over_for_one_nobody_claims(
    monkeypatch: pytest.MonkeyPatch, own_claims: Path, other_process: int
) -> None:
    """Two supervisors starting together see the same idle CPUs: the one that claims
    second takes another CPU, and the claims file says who keeps to which."""
    own_claims.write_text(f"{other_process} 0\n")
    kernel = auto_kernel(monkeypatch, {})
    cpu_affinity.apply("auto", 0, 1)
    assert kernel.cpus[0] == frozenset({1})
    assert sorted(own_claims.read_text().splitlines()) == sorted(
        [f"{other_process} 0", f"{os.getpid()} 1"]
    )


def test_the_claim_of_a_process_that_ended_counts_for_nothing(
    monkeypatch: pytest.MonkeyPatch, own_claims: Path
) -> None:
    ended = subprocess.Popen([sys.executable, "-c", "pass"])
    ended.wait()
    own_claims.write_text(f"{ended.pid} 0\n")
    kernel = auto_kernel(monkeypatch, {})
    cpu_affinity.apply("auto", 0, 1)
    assert kernel.cpus[0] == frozenset({0})
    assert own_claims.read_text() == f"{os.getpid()} 0\n"


def test_claims_follow_a_move_and_go_when_the_process_lets_go(own_claims: Path) -> None:
    cpu_claims.claim(lambda claimed: 0)
    counters = Counters()
    counters.watch(0)
    counters.readings({0: 100, 1: 60, 2: 5}, own=50)
    assert own_claims.read_text() == f"{os.getpid()} 2\n"
    counters.readings({0: 5, 1: 60, 2: 100}, own=50)
    assert own_claims.read_text() == ""


def test_an_unusable_claims_file_leaves_the_choice_to_the_load(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setattr(cpu_claims, "claims_path", lambda: str(tmp_path / "missing" / "cpus"))
    assert cpu_claims.claim(lambda claimed: 3 if not claimed else 0) == 3
    cpu_claims.release()  # nothing to release, nothing raised


def test_without_cpu_times_to_watch_with_auto_does_not_pin(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """A sandbox without /proc: a pin nobody watches is the trap auto exists to avoid."""
    kernel = auto_kernel(monkeypatch, {})

    def unreadable(seconds: float) -> dict[int, float]:
        raise FileNotFoundError(2, "No such file or directory", "/proc/stat")

    monkeypatch.setattr(cpu_affinity, "sample_cpu_times", unreadable)
    with caplog.at_level(logging.INFO, logger="limitd.supervisor"):
        cpu_affinity.apply("auto", 0, 1)
    assert set(kernel.cpus.values()) == {frozenset({0, 1, 2, 3})}
    assert "cannot read CPU times" in caplog.text


def test_a_quiet_cpu_that_an_idle_capsule_keeps_to_is_no_place_to_move_to(
    own_claims: Path, other_process: int
) -> None:
    """Another capsule process keeps to CPU 2 and is idle: CPU 2 looks quiet, but moving
    there would share it the moment that capsule gets work. The process lets go instead
    (CPU 1 has room)."""
    own_claims.write_text(f"{other_process} 2\n")
    counters = Counters()
    watch = counters.watch(0)
    counters.readings({0: 100, 1: 40, 2: 0}, own=50)
    assert counters.pins == [{0, 1, 2}]
    assert watch.done.is_set()
