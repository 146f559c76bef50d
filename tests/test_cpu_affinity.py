"""``cpu_affinity`` without pinning the test process's own threads: the kernel calls are
replaced, so what is checked is which CPUs each capsule process is given and what
happens when the kernel says no. Real capsule processes are checked in
test_supervisor_cli.py."""

from __future__ import annotations

import logging
import os

import pytest

from limitd.supervisor import cpu_affinity, cpu_scheduling


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
