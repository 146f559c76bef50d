"""CPU numbers and counters as Linux shows them: ``/proc/stat`` per CPU, this process's
own ticks, and CPU lists written as ``0-3,6``. Used by ``cpu_affinity: auto`` to choose a
CPU and to see whether other processes need it."""

from __future__ import annotations

import time
from collections.abc import Iterable, Mapping
from dataclasses import dataclass


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


def read_own_ticks() -> int:
    """This process's CPU ticks, every thread's, user and system (``/proc/self/stat``)."""
    with open("/proc/self/stat", encoding="ascii") as stat:
        fields = stat.read().rsplit(")", 1)[1].split()
    return int(fields[11]) + int(fields[12])  # utime, stime: the 14th and 15th fields


def listed(cpus: Iterable[int]) -> str:
    """CPU numbers as ranges, as Linux lists them: ``0-3,6``."""
    ranges: list[list[int]] = []
    for cpu in sorted(cpus):
        if ranges and cpu == ranges[-1][1] + 1:
            ranges[-1][1] = cpu
        else:
            ranges.append([cpu, cpu])
    return ",".join(str(low) if low == high else f"{low}-{high}" for low, high in ranges)
