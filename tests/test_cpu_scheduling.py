"""``cpu_scheduling`` without touching the test process's own threads: the kernel calls
are replaced, so what is checked is which threads are asked for which policy, and what
happens when the kernel says no. The real policy of real capsule processes is checked
in test_supervisor_cli.py."""

from __future__ import annotations

import logging
import os
import threading

import pytest

from limitd.supervisor import cpu_scheduling


class FakeKernel:
    """Per-thread policies, as Linux keeps them; ``refuse`` makes every change fail."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch, threads: list[int]) -> None:
        self.policies = dict.fromkeys([0, *threads], os.SCHED_OTHER)
        self.refuse: OSError | None = None
        self.gone: set[int] = set()
        monkeypatch.setattr(cpu_scheduling, "own_threads", lambda: [0, *threads])
        monkeypatch.setattr(os, "sched_getscheduler", self.get)
        monkeypatch.setattr(os, "sched_setscheduler", self.set)

    def get(self, thread: int) -> int:
        if thread in self.gone:
            raise ProcessLookupError(thread)
        return self.policies[thread]

    def set(self, thread: int, policy: int, param: object) -> None:
        if self.refuse is not None:
            raise self.refuse
        self.policies[thread] = policy


def test_every_thread_gets_the_policy_and_normal_gives_the_default_back(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    kernel = FakeKernel(monkeypatch, [101, 102])
    cpu_scheduling.apply("batch")
    assert set(kernel.policies.values()) == {os.SCHED_BATCH}
    cpu_scheduling.apply("normal")
    assert set(kernel.policies.values()) == {os.SCHED_OTHER}


def test_a_thread_that_ended_meanwhile_is_skipped(monkeypatch: pytest.MonkeyPatch) -> None:
    kernel = FakeKernel(monkeypatch, [101, 102])
    kernel.gone = {101}
    cpu_scheduling.apply("batch")
    assert kernel.policies == {0: os.SCHED_BATCH, 101: os.SCHED_OTHER, 102: os.SCHED_BATCH}


def test_a_refusal_is_logged_and_the_capsule_runs_on(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    kernel = FakeKernel(monkeypatch, [101])
    kernel.refuse = PermissionError(1, "Operation not permitted")
    with caplog.at_level(logging.WARNING, logger="limitd.supervisor"):
        cpu_scheduling.apply("batch")
    assert set(kernel.policies.values()) == {os.SCHED_OTHER}
    assert "cpu_scheduling batch: the kernel refused it" in caplog.text


def test_a_platform_without_the_policy_is_left_as_it_is(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delattr(os, "SCHED_BATCH")
    monkeypatch.setattr(os, "sched_setscheduler", None)  # would fail if called
    cpu_scheduling.apply("batch")


def test_an_unknown_policy_is_refused() -> None:
    with pytest.raises(ValueError, match=r"cpu_scheduling must be one of \('batch', 'normal'\)"):
        cpu_scheduling.apply("fast")


def test_the_threads_asked_are_this_process_s_own() -> None:
    started, stop = threading.Event(), threading.Event()
    native: list[int] = []

    def other() -> None:
        native.append(threading.get_native_id())
        started.set()
        stop.wait(10)

    thread = threading.Thread(target=other)
    thread.start()
    try:
        assert started.wait(10)
        threads = cpu_scheduling.own_threads()
        assert threads[0] == 0  # the calling thread, by the kernel's shorthand
        assert native[0] in threads
        assert threading.get_native_id() not in threads  # not twice
    finally:
        stop.set()
        thread.join()
