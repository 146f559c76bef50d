"""Which CPUs a capsule process runs on (``cpu_affinity``).

A capsule runs Python on one thread at a time (the GIL), and its threads hand the GIL
and their jobs to one another several times per job. When the kernel spreads those
threads over several CPUs, each hand-off wakes a thread on another CPU: an
inter-processor interrupt, which on a virtual machine is a trip through the hypervisor.
On one CPU the same hand-off is a switch on the spot. On 2-core virtual machines, a
1 x 10 drain of no-op jobs ran 1.67-1.77x faster with its capsule kept on one CPU (Redis
on the other), at about half the worker CPU per job (docs/benchmarks.md).

``cpu_affinity: N`` keeps each capsule process on N CPUs of the set the supervisor may
run on (``taskset``, a container's cpuset): the supervisor's k-th child on the N CPUs
from position k x N on, wrapping round, so that its capsules spread over the set. The
affinity is set on every thread the capsule process has when it starts; the threads
started after inherit it. The supervisor itself is left alone.

``auto`` (the default) keeps each process on one CPU *while that CPU is its own*.
Pinning is a loss when something else needs the same CPU: another supervisor's capsule
pinned to it (each supervisor counts from the start of its set, and containers that
share a host see the same CPU numbers), or a busy Redis that cannot move away. So
``auto`` pins only where every child of the supervisor gets a CPU of its own (no more
children than CPUs), chooses the quietest CPU (ties: the k-th, as ``1`` would), and
then watches: a :class:`ForeignLoadWatch` thread reads, every few seconds, how much of
its CPU went to other processes. Over :data:`FOREIGN_LIMIT` in two readings in a row,
the process moves once to the quietest CPU if one is quiet, and else (or the second
time) lets the kernel place its threads again, as ``none`` does, for good, provided
another CPU has clearly more room than it is left: where every CPU is as busy (two
capsules and Redis on two cores), it stays. A free-
threaded Python (no GIL) is never pinned by ``auto``: its threads do run in parallel.
"""

from __future__ import annotations

import logging
import os
import sys
import threading
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass

from limitd.supervisor import cpu_scheduling

log = logging.getLogger("limitd.supervisor")

AUTO = "auto"
# Under ``auto``: the share of the process's CPU that other processes may take, in two
# readings in a row, before the process stops keeping to it. A pinned capsule that gets
# only (1 - share) of its CPU still beats the same capsule spread over the CPUs (about
# 0.6x the jobs per CPU second) below roughly a third; two busy capsules on one CPU
# show about a half.
FOREIGN_LIMIT = 0.35
# ... and how much more idle another CPU must be than what is left of the process's own
# for letting go to be worth it.
ROOM_MARGIN = 0.15
WATCH_PERIOD = 2.0  # seconds between readings
STRIKES = 2  # readings over the limit in a row before acting on them
START_SAMPLE = 0.1  # seconds of /proc/stat read to choose the quietest CPU


def cpus_for(process_number: int, per_process: int, allowed: Iterable[int]) -> set[int]:
    """The CPUs of the supervisor's child number ``process_number``: ``per_process`` of
    ``allowed`` (all of them when there are fewer), starting at position
    ``process_number * per_process`` in CPU order and wrapping round."""
    ordered = sorted(allowed)
    if not ordered:
        raise ValueError("no CPU to run on")
    count = min(per_process, len(ordered))
    first = process_number * count
    return {ordered[(first + offset) % len(ordered)] for offset in range(count)}


def apply(setting: int | str | None, process_number: int, process_count: int = 1) -> None:
    """Keep this process's threads (and those they start from now on) on the CPUs the
    setting gives it: ``N`` as :func:`cpus_for` says, ``auto`` as the module says,
    nothing for None. ``process_count``: how many children the supervisor runs. Where
    the platform cannot (macOS, Windows) or the kernel refuses, the capsule runs where
    the kernel puts it, and says so at DEBUG or WARNING."""
    if setting is None:
        return
    if not hasattr(os, "sched_setaffinity"):
        log.debug("cpu_affinity %s: not available on this platform, left as it is", setting)
        return
    allowed = os.sched_getaffinity(0)
    if setting == AUTO:
        _apply_auto(allowed, process_number, process_count)
        return
    assert isinstance(setting, int), setting
    cpus = cpus_for(process_number, setting, allowed)
    if pin(cpus, setting):
        log.info("capsule process %d keeps its threads on CPU %s", process_number, listed(cpus))


def _apply_auto(allowed: set[int], process_number: int, process_count: int) -> None:
    if len(allowed) < 2 or process_count > len(allowed) or not _gil_enabled():
        log.debug(
            "cpu_affinity auto: %d children on CPU %s%s: left where the kernel puts them",
            process_count,
            listed(allowed),
            "" if _gil_enabled() else " without a GIL",
        )
        return
    cpu = quietest(allowed, min(cpus_for(process_number, 1, allowed)), sample_cpu_times)
    if not pin({cpu}, AUTO):
        return
    log.info(
        "capsule process %d keeps its threads on CPU %d while no other process needs it "
        "(cpu_affinity: auto)",
        process_number,
        cpu,
    )
    ForeignLoadWatch(cpu, allowed).start()


def _gil_enabled() -> bool:
    check: Callable[[], bool] | None = getattr(sys, "_is_gil_enabled", None)
    return True if check is None else check()


def pin(cpus: set[int], setting: int | str) -> bool:
    """Every thread of this process on ``cpus``; False (logged) if the kernel refuses."""
    for thread in cpu_scheduling.own_threads():
        try:
            os.sched_setaffinity(thread, cpus)
        except ProcessLookupError:
            continue  # a thread that ended meanwhile
        except OSError as exc:
            log.warning("cpu_affinity %s: the kernel refused it (%s); left as it is", setting, exc)
            return False
    return True


@dataclass(frozen=True)
class CpuTimes:
    """One CPU's clock ticks since boot, from ``/proc/stat``."""

    busy: int  # running anything: user, nice, system, irq, softirq
    total: int  # every tick, idle, iowait and steal included


def read_cpu_times(text: str | None = None) -> dict[int, CpuTimes]:
    """Every CPU's :class:`CpuTimes` (``text``: the file's content, read when None)."""
    if text is None:
        with open("/proc/stat", encoding="ascii") as stat:
            text = stat.read()
    times: dict[int, CpuTimes] = {}
    for line in text.splitlines():
        name, *fields = line.split()
        if not name.startswith("cpu") or name == "cpu":
            continue
        ticks = [int(field) for field in fields[:8]]  # guest time is inside user time
        user, nice, system, _idle, _iowait, irq, softirq = ticks[:7]
        times[int(name[3:])] = CpuTimes(user + nice + system + irq + softirq, sum(ticks))
    return times


def sample_cpu_times(seconds: float) -> dict[int, float]:
    """Each CPU's busy share over the next ``seconds``."""
    before = read_cpu_times()
    time.sleep(seconds)  # the sample being taken
    return busy_shares(before, read_cpu_times())


def busy_shares(before: Mapping[int, CpuTimes], after: Mapping[int, CpuTimes]) -> dict[int, float]:
    """Each CPU's busy share between two readings (0 where no tick passed)."""
    shares = {}
    for cpu, now in after.items():
        then = before.get(cpu, now)
        ticks = now.total - then.total
        shares[cpu] = (now.busy - then.busy) / ticks if ticks > 0 else 0.0
    return shares


def quietest(
    allowed: Iterable[int], preferred: int, sample: Callable[[float], Mapping[int, float]]
) -> int:
    """The allowed CPU that was least busy over a short sample, in steps of a tenth so
    that noise does not undo the spread; ties go to ``preferred``, then CPU order."""
    shares = sample(START_SAMPLE)
    return min(sorted(allowed), key=lambda cpu: (round(shares.get(cpu, 0.0), 1), cpu != preferred))


def read_own_ticks() -> int:
    """This process's CPU ticks, every thread's, user and system (``/proc/self/stat``)."""
    with open("/proc/self/stat", encoding="ascii") as stat:
        fields = stat.read().rsplit(")", 1)[1].split()
    return int(fields[11]) + int(fields[12])  # utime, stime: the 14th and 15th fields


class ForeignLoadWatch:
    """Under ``auto``, reads every :data:`WATCH_PERIOD` how much of the process's CPU
    other processes took, and stops keeping to a CPU that is not its own (see the
    module). It also covers what the process starts: a job's subprocess inherits the
    CPU, shows as foreign load, and is let go with the process's threads."""

    def __init__(
        self,
        cpu: int,
        allowed: Iterable[int],
        read_cpus: Callable[[], Mapping[int, CpuTimes]] = read_cpu_times,
        read_own: Callable[[], int] = read_own_ticks,
        pin_to: Callable[[set[int]], bool] = lambda cpus: pin(cpus, AUTO),
    ) -> None:
        self.cpu = cpu
        self.allowed = set(allowed)
        self._read_cpus, self._read_own, self._pin = read_cpus, read_own, pin_to
        self._cpus, self._own = read_cpus(), read_own()
        self.strikes = 0
        self.moved = False
        self.done = threading.Event()

    def start(self) -> None:
        threading.Thread(target=self._run, name="limitd-cpu-watch", daemon=True).start()

    def _run(self) -> None:
        while not self.done.wait(WATCH_PERIOD):
            try:
                self.check()
            except (OSError, ValueError) as exc:  # /proc unreadable: stop judging, say so
                log.warning("cpu_affinity auto: cannot read CPU times (%s); stays as it is", exc)
                return

    def check(self) -> None:
        """One reading, and what it calls for."""
        share, shares = self.reading()
        if share is None:
            return
        self.strikes = self.strikes + 1 if share > FOREIGN_LIMIT else 0
        if self.strikes >= STRIKES:
            self._act(share, shares)

    def reading(self) -> tuple[float | None, dict[int, float]]:
        """Since the last reading: the share of this process's CPU that other processes
        took (None if no tick passed), and every CPU's busy share."""
        cpus, own = self._read_cpus(), self._read_own()
        mine_before, mine = self._cpus[self.cpu], cpus[self.cpu]
        ticks = mine.total - mine_before.total
        foreign = (mine.busy - mine_before.busy) - (own - self._own)
        shares = busy_shares(self._cpus, cpus)
        self._cpus, self._own = cpus, own
        return (foreign / ticks if ticks > 0 else None), shares

    def _act(self, share: float, shares: Mapping[int, float]) -> None:
        """Two readings in a row over the limit. A quiet CPU: go there (once). Else let
        go, but only where another CPU has clearly more room than this process is left
        on its own: when every CPU is as busy (two capsules and Redis on two cores),
        the kernel would find it no better place, and the process would lose what
        keeping its threads together gains."""
        self.strikes = 0
        others = {cpu: shares.get(cpu, 0.0) for cpu in self.allowed - {self.cpu}}
        quiet = sorted((busy, cpu) for cpu, busy in others.items() if busy <= FOREIGN_LIMIT / 2)
        if quiet and not self.moved and self._pin({quiet[0][1]}):
            log.info(
                "cpu_affinity auto: other processes took %.0f%% of CPU %d; moving to CPU %d",
                100 * share,
                self.cpu,
                quiet[0][1],
            )
            self.cpu, self.moved = quiet[0][1], True
            return
        most_room = 1.0 - min(others.values(), default=1.0)
        if most_room < (1.0 - share) + ROOM_MARGIN:
            return  # no better place: stay, and keep reading
        self.done.set()
        if self._pin(self.allowed):
            release_children(self.allowed)
            log.info(
                "cpu_affinity auto: other processes took %.0f%% of CPU %d; "
                "threads left to the kernel on CPU %s from now on",
                100 * share,
                self.cpu,
                listed(self.allowed),
            )


def release_children(allowed: set[int]) -> None:
    """Give this process's child processes (a job's subprocess, which inherited the
    pinned CPU) back ``allowed``, every thread of theirs."""
    for child in _child_pids():
        try:
            threads = os.listdir(f"/proc/{child}/task")
        except OSError:
            continue  # ended meanwhile
        for thread in threads:
            try:
                os.sched_setaffinity(int(thread), allowed)
            except OSError as exc:  # ended, or not ours to change (setuid)
                log.debug(
                    "cpu_affinity auto: child %d thread %s left as it is (%s)", child, thread, exc
                )


def _child_pids() -> list[int]:
    """This process's children, whichever of its threads started them."""
    pids: list[int] = []
    for thread in os.listdir("/proc/self/task"):
        try:
            with open(f"/proc/self/task/{thread}/children", encoding="ascii") as file:
                pids.extend(int(pid) for pid in file.read().split())
        except OSError:
            continue  # a thread that ended meanwhile, or a kernel without the file
    return pids


def current() -> str | None:
    """The CPUs this process may run on, as :func:`listed` writes them (None where the
    platform cannot tell): what its process record shows (``limitd status``)."""
    if not hasattr(os, "sched_getaffinity"):
        return None
    return listed(os.sched_getaffinity(0))


def listed(cpus: Iterable[int]) -> str:
    """CPU numbers as ranges, as Linux lists them: ``0-3,6``."""
    ranges: list[list[int]] = []
    for cpu in sorted(cpus):
        if ranges and cpu == ranges[-1][1] + 1:
            ranges[-1][1] = cpu
        else:
            ranges.append([cpu, cpu])
    return ",".join(str(low) if low == high else f"{low}-{high}" for low, high in ranges)
