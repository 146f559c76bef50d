"""The kernel scheduling policy of a capsule process (``cpu_scheduling``).

A capsule's threads hand jobs to each other: the thread that makes a fetch call wakes
each processor it fetched a job for, one lock release each. Under Linux's default
policy a thread that wakes up may preempt the one that woke it, on the spot. In
CPython the waker still holds the GIL at that moment, so the woken thread cannot run
Python either: both wait until the scheduler comes back to the waker. A busy capsule
loses a sixth to a third of its GIL time this way (py-spy ``--gil``: the time sits in
the releases).

``SCHED_BATCH`` is the same fair-share policy, at the same nice value, without that
wake-up preemption: the woken thread runs once the waker blocks (its next socket call,
which releases the GIL) or its time slice ends, or at once on an idle core. On a
2-core machine it made a 1 x 10 drain of no-op jobs 1.17-1.23x faster (92 -> 76 us of
worker CPU per job) and a 2 x 10 one 1.10-1.28x (see docs/benchmarks.md). ``normal``
keeps the kernel's default. The policy is set on every thread the capsule process has
when it starts (its main thread, the parent watchdog), and the threads started after
inherit it; the supervisor and in-process capsules (tests, an app that runs one) are
left alone.
"""

from __future__ import annotations

import logging
import os
import threading

from limitd.config.settings import CPU_SCHEDULINGS

log = logging.getLogger("limitd.supervisor")


def apply(policy: str) -> None:
    """Give this process's threads (and those they start from now on) ``policy``.
    Where the platform has no such policy (macOS, Windows) or refuses it (a sandbox
    that filters the call), the capsule runs under the default one, and says so at
    DEBUG or WARNING."""
    if policy not in CPU_SCHEDULINGS:
        raise ValueError(f"cpu_scheduling must be one of {CPU_SCHEDULINGS}, got {policy!r}")
    number = _policy_number(policy)
    if number is None:
        log.debug("cpu_scheduling %s: not available on this platform, left as it is", policy)
        return
    for thread in own_threads():
        try:
            if os.sched_getscheduler(thread) != number:
                os.sched_setscheduler(thread, number, os.sched_param(0))
        except ProcessLookupError:
            continue  # a thread that ended meanwhile
        except OSError as exc:
            log.warning("cpu_scheduling %s: the kernel refused it (%s); left as it is", policy, exc)
            return


def own_threads() -> list[int]:
    """This process's threads (Linux: each has its own policy and CPU set), the calling
    one first."""
    try:
        others = [int(tid) for tid in os.listdir("/proc/self/task")]
    except OSError:
        return [0]
    return [0, *(tid for tid in others if tid != threading.get_native_id())]


def _policy_number(policy: str) -> int | None:
    name = "SCHED_BATCH" if policy == "batch" else "SCHED_OTHER"
    number = getattr(os, name, None)
    if number is None or not hasattr(os, "sched_setscheduler"):
        return None
    return int(number)
