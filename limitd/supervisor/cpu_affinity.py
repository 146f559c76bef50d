"""Which CPUs a capsule process runs on (``cpu_affinity``).

A capsule runs Python on one thread at a time (the GIL), and its threads hand the GIL
and their jobs to one another several times per job. When the kernel spreads those
threads over several CPUs, each hand-off wakes a thread on another CPU: an
inter-processor interrupt, which on a virtual machine is a trip through the hypervisor.
On one CPU the same hand-off is a switch on the spot. On a 2-core virtual machine, a
1 x 10 drain of no-op jobs ran 1.67x faster with its capsule kept on one CPU (Redis on
the other), at 0.55x the worker CPU per job (docs/benchmarks.md).

``cpu_affinity: N`` keeps each capsule process on N CPUs of the set the supervisor may
run on (``taskset``, a container's cpuset): the supervisor's k-th child on the N CPUs
from position k x N on, wrapping round, so that its capsules spread over the set. It is
off by default, because pinning is only right when the CPUs are the capsules' to share
out: with as many capsules as CPUs and Redis on the same machine, a pinned capsule
cannot make way for Redis (2 x 10 on 2 cores: 0.89x), and supervisors sharing a machine
each count from the start of their own set, so each needs a set of its own. The
affinity is set on every thread the capsule process has when it starts; the threads
started after inherit it. The supervisor itself is left alone.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Iterable

from limitd.supervisor import cpu_scheduling

log = logging.getLogger("limitd.supervisor")


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


def apply(per_process: int | None, process_number: int) -> None:
    """Keep this process's threads (and those they start from now on) on the CPUs
    :func:`cpus_for` gives it; nothing when ``per_process`` is None. Where the platform
    cannot (macOS, Windows) or the kernel refuses, the capsule runs where the kernel
    puts it, and says so at DEBUG or WARNING."""
    if per_process is None:
        return
    if not hasattr(os, "sched_setaffinity"):
        log.debug("cpu_affinity %d: not available on this platform, left as it is", per_process)
        return
    cpus = cpus_for(process_number, per_process, os.sched_getaffinity(0))
    for thread in cpu_scheduling.own_threads():
        try:
            os.sched_setaffinity(thread, cpus)
        except ProcessLookupError:
            continue  # a thread that ended meanwhile
        except OSError as exc:
            log.warning(
                "cpu_affinity %d: the kernel refused it (%s); left as it is", per_process, exc
            )
            return
    log.info("capsule process %d keeps its threads on CPU %s", process_number, listed(cpus))


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
