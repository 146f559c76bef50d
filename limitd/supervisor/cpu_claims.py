"""Which CPU each capsule process on this machine keeps to (``cpu_affinity: auto``).

Capsule processes that start together (two supervisors, a container's restart) read the
CPUs' load at the same moment, see the same quiet CPU and both take it: then each gets
half a CPU while another sits idle (a 100,000-job burst from two supervisors: the last
job 9.7 s late on one CPU against 5.2 s on two). Load alone cannot tell them apart, so
each process claims its CPU in a small file shared by the processes of one user on one
machine (``/dev/shm``, else the temporary directory; ``$LIMITD_CPU_CLAIMS`` names
another), under an exclusive ``flock``: the
choice reads the claims of the processes still alive and takes a CPU with the fewest.
Processes that do not share the file (containers with their own ``/dev/shm``) are left to
the load watch (``cpu_watch.py``).
"""

from __future__ import annotations

import fcntl
import logging
import os
import tempfile
from collections import Counter
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import IO

log = logging.getLogger("limitd.supervisor")


CLAIMS_ENV = "LIMITD_CPU_CLAIMS"


def claims_path() -> str:
    """The file: ``$LIMITD_CPU_CLAIMS`` if set (containers that share a host can share
    one through a mounted directory), else one per user per machine (mount namespace)."""
    if os.environ.get(CLAIMS_ENV):
        return os.environ[CLAIMS_ENV]
    folder = "/dev/shm" if os.path.isdir("/dev/shm") else tempfile.gettempdir()
    return os.path.join(folder, f"limitd-cpus-{os.getuid()}")


def claim(choose: Callable[[Counter[int]], int], path: str | None = None) -> int:
    """Under the lock: ``choose`` is given how many live processes claim each CPU and
    returns the CPU this process takes, which is recorded as its claim. Where the file
    cannot be used, the choice is made without the others' claims (and said at DEBUG)."""
    try:
        with _locked(path or claims_path()) as file:
            claims, _ = _others_claims(file)
            cpu = choose(Counter(claims.values()))
            _write(file, {**claims, os.getpid(): cpu})
            return cpu
    except OSError as exc:
        log.debug("cpu_affinity auto: no shared claims (%s): chosen by load alone", exc)
        return choose(Counter())


def others(path: str | None = None) -> Counter[int]:
    """How many other live processes claim each CPU (empty where the file cannot be
    read): a CPU another capsule keeps to is no place to move to, even while that
    capsule is idle."""
    try:
        with _locked(path or claims_path()) as file:
            claims, _ = _others_claims(file)
    except OSError as exc:
        log.debug("cpu_affinity auto: no shared claims (%s)", exc)
        return Counter()
    return Counter(claims.values())


def release(path: str | None = None) -> None:
    """This process no longer keeps to a CPU (it let go, or moved: it claims again)."""
    try:
        with _locked(path or claims_path()) as file:
            claims, mine = _others_claims(file)
            if mine is not None:
                _write(file, claims)
    except OSError as exc:
        log.debug("cpu_affinity auto: claim not released (%s)", exc)


@contextmanager
def _locked(path: str) -> Iterator[IO[str]]:
    descriptor = os.open(path, os.O_RDWR | os.O_CREAT, 0o600)
    with open(descriptor, "r+", encoding="ascii") as file:
        fcntl.flock(file, fcntl.LOCK_EX)
        yield file  # the lock goes with the file's closing


def _read(file: IO[str]) -> dict[int, int]:
    file.seek(0)
    claims = {}
    for line in file.read().splitlines():
        pid, _, cpu = line.partition(" ")
        if pid.isdigit() and cpu.isdigit():
            claims[int(pid)] = int(cpu)
    return claims


def _others_claims(file: IO[str]) -> tuple[dict[int, int], int | None]:
    """The claims of the other processes still running (a killed process leaves its
    line), and this process's own CPU if it claims one."""
    claims = {pid: cpu for pid, cpu in _read(file).items() if _running(pid)}
    return claims, claims.pop(os.getpid(), None)


def _running(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True  # someone else's process reusing the number: keep the line
    return True


def _write(file: IO[str], claims: dict[int, int]) -> None:
    file.seek(0)
    file.truncate()
    file.write("".join(f"{pid} {cpu}\n" for pid, cpu in sorted(claims.items())))
    file.flush()
