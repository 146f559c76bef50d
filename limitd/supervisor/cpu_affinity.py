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
pinned to it (each supervisor counts from the start of its set), containers that share
a host's CPU numbers, a job's subprocess that inherits the CPU, a busy Redis that cannot
move away. So ``auto`` pins only where every child of the supervisor can have a CPU of
its own (no more children than CPUs); takes a CPU that the fewest other capsule
processes of this machine claim (``cpu_claims.py``), the quietest of those over a short
sample, the k-th on ties, as ``1`` would; and then a watch (``cpu_watch.py``) moves the
process, or gives its threads back to the kernel, when other processes take too much of
that CPU. A free-threaded Python (no GIL) is never pinned by ``auto``: its threads do run
in parallel.
"""

from __future__ import annotations

import logging
import os
import sys
from collections import Counter
from collections.abc import Callable, Iterable, Mapping

from limitd.supervisor import cpu_claims, cpu_scheduling
from limitd.supervisor.cpu_readings import listed, sample_cpu_times
from limitd.supervisor.cpu_watch import ForeignLoadWatch

__all__ = ["AUTO", "apply", "cpus_for", "current", "listed"]

log = logging.getLogger("limitd.supervisor")

AUTO = "auto"
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
    preferred = min(cpus_for(process_number, 1, allowed))
    try:
        shares = sample_cpu_times(START_SAMPLE)
        watch = ForeignLoadWatch(preferred, allowed, pin_to=lambda cpus: pin(cpus, AUTO))
    except (OSError, ValueError) as exc:  # no /proc to watch with: pinning would be blind
        log.info("cpu_affinity auto: cannot read CPU times (%s); threads left to the kernel", exc)
        return
    cpu = cpu_claims.claim(lambda claimed: least_claimed(allowed, claimed, shares, preferred))
    if not pin({cpu}, AUTO):
        cpu_claims.release()
        return
    watch.cpu = cpu
    log.info(
        "capsule process %d keeps its threads on CPU %d while no other process needs it "
        "(cpu_affinity: auto)",
        process_number,
        cpu,
    )
    watch.start()


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


def least_claimed(
    allowed: Iterable[int], claimed: Counter[int], shares: Mapping[int, float], preferred: int
) -> int:
    """The allowed CPU that the fewest other capsule processes claim; among those the
    least busy over the start's sample, in steps of a tenth so that noise does not undo
    the spread; then ``preferred``, then CPU order."""
    return min(
        sorted(allowed),
        key=lambda cpu: (claimed[cpu], round(shares.get(cpu, 0.0), 1), cpu != preferred),
    )


def current() -> str | None:
    """The CPUs this process may run on, as :func:`listed` writes them (None where the
    platform cannot tell): what its process record shows (``limitd status``)."""
    if not hasattr(os, "sched_getaffinity"):
        return None
    return listed(os.sched_getaffinity(0))
