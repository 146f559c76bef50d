"""The watch of ``cpu_affinity: auto``: a process keeps its threads on one CPU only while
that CPU is its own (see ``cpu_affinity.py`` for why, and the choice of the CPU).

A thread reads every :data:`WATCH_PERIOD` seconds how much of the process's CPU went to
other processes (the CPU's busy ticks less the process's own). Over
:data:`FOREIGN_LIMIT` in two readings in a row, the process moves once to a quiet CPU if
there is one, and else (or the second time) gives its threads, and its children, back to
the kernel for good, provided another CPU has clearly more room than it is left: where
every CPU is as busy (two capsules and Redis on two cores), it stays and keeps reading.
"""

from __future__ import annotations

import logging
import os
import threading
from collections.abc import Callable, Iterable, Mapping

from limitd.supervisor import cpu_claims
from limitd.supervisor.cpu_readings import (
    CpuTimes,
    busy_shares,
    listed,
    read_cpu_times,
    read_own_ticks,
)

log = logging.getLogger("limitd.supervisor")

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


class ForeignLoadWatch:
    """Under ``auto``, reads every :data:`WATCH_PERIOD` how much of the process's CPU
    other processes took, and stops keeping to a CPU that is not its own (see the
    module). It also covers what the process starts: a job's subprocess inherits the
    CPU, shows as foreign load, and is let go with the process's threads."""

    def __init__(
        self,
        cpu: int,
        allowed: Iterable[int],
        pin_to: Callable[[set[int]], bool],
        *,
        read_cpus: Callable[[], Mapping[int, CpuTimes]] = read_cpu_times,
        read_own: Callable[[], int] = read_own_ticks,
        claimed: Callable[[], Mapping[int, int]] = cpu_claims.others,
    ) -> None:
        self.cpu = cpu
        self.allowed = set(allowed)
        self._read_cpus, self._read_own, self._pin = read_cpus, read_own, pin_to
        self._claimed = claimed
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
            except (OSError, ValueError, KeyError) as exc:  # /proc unreadable, or the CPU
                # went offline: stop judging, and say so
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
        """Two readings in a row over the limit. A quiet CPU that no other capsule process
        keeps to: go there (once). Else let go, but only where another CPU has clearly
        more room than this process is left on its own: when every CPU is as busy (two
        capsules and Redis on two cores), the kernel would find it no better place, and
        the process would lose what keeping its threads together gains."""
        self.strikes = 0
        others = {cpu: shares.get(cpu, 0.0) for cpu in self.allowed - {self.cpu}}
        claimed = self._claimed() if not self.moved else {}
        quiet = sorted(
            (busy, cpu)
            for cpu, busy in others.items()
            if busy <= FOREIGN_LIMIT / 2 and not claimed.get(cpu)  # an idle capsule's: no
        )
        if quiet and not self.moved and self._pin({quiet[0][1]}):
            log.info(
                "cpu_affinity auto: other processes took %.0f%% of CPU %d; moving to CPU %d",
                100 * share,
                self.cpu,
                quiet[0][1],
            )
            self.cpu, self.moved = quiet[0][1], True
            cpu_claims.claim(lambda claimed: self.cpu)
            return
        most_room = 1.0 - min(others.values(), default=1.0)
        if most_room < (1.0 - share) + ROOM_MARGIN:
            return  # no better place: stay, and keep reading
        self.done.set()
        if self._pin(self.allowed):
            cpu_claims.release()
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
