"""Helpers for tests that run threads or processes: wait on a condition with a deadline,
never sleep and hope."""

from __future__ import annotations

import argparse
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any


def wait_for(
    condition: Callable[[], object], timeout: float = 10.0, message: str = "condition"
) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout}s waiting for {message}")
        time.sleep(0.005)


def running(pid: int) -> bool:
    """Whether ``pid`` still runs: exited processes may linger as zombies (state Z or X)
    until whoever adopted them reaps them, and may vanish while we read."""
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return False
    return state not in ("Z", "X")


def limitd_start(
    cwd: Path, *args: str, env: dict[str, str] | None = None
) -> subprocess.Popen[bytes]:
    """``limitd start ARGS`` in its own session (so a test can signal the whole process
    group), output appended to ``cwd/limitd.log``."""
    with (cwd / "limitd.log").open("ab") as log:
        return subprocess.Popen(
            [sys.executable, "-m", "limitd.cli", "start", *args],
            cwd=cwd,
            env=env or dict(os.environ),
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )


class LimitdProcesses:
    """The ``limitd start`` processes of one test, on one Redis; whatever still runs at
    the end is killed with its children."""

    def __init__(self, cwd: Path, redis_url: str) -> None:
        self.cwd = cwd
        self.env = {**os.environ, "LIMITD_REDIS_URL": redis_url}
        self.procs: list[subprocess.Popen[bytes]] = []

    def start(self, *args: str) -> subprocess.Popen[bytes]:
        proc = limitd_start(self.cwd, *args, env=self.env)
        self.procs.append(proc)
        return proc

    def kill_all(self) -> None:
        for proc in self.procs:
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()


def in_progress_total(redis: Any) -> int:
    """Jobs held in every capsule's in-progress lists: 0 once nothing is running or lost."""
    return sum(int(redis.llen(k)) for k in redis.scan_iter("limitd:capsule:*:inprogress:*"))


def children(pid: int) -> list[int]:
    """Pids of the Python processes ``pid`` forked and still has: its capsule processes.
    Other programs it runs are left out: importing limitd imports croniter, which runs
    ``file`` on the interpreter (``platform.architecture``), and a test that took that
    short-lived child for a capsule signalled a supervisor still starting up."""
    out = subprocess.run(["pgrep", "-P", str(pid)], capture_output=True, text=True, check=False)
    return sorted(int(child) for child in out.stdout.split() if _same_program(pid, int(child)))


def _same_program(parent: int, child: int) -> bool:
    try:
        return os.readlink(f"/proc/{child}/exe") == os.readlink(f"/proc/{parent}/exe")
    except OSError:  # exited meanwhile (or a zombie, whose exe cannot be read)
        return False


def command_runner(
    add: Callable[[Any, Any], None], redis: Any, capsys: Any
) -> Callable[..., tuple[int, str]]:
    """A ``limitd`` with only the commands ``add`` registers (a feature's
    ``add_*_command``), run in-process on ``redis``: (exit code, standard output)."""

    def run(*argv: str) -> tuple[int, str]:
        parser = argparse.ArgumentParser(prog="limitd")
        add(parser.add_subparsers(required=True), lambda args: redis)
        args = parser.parse_args(list(argv))
        capsys.readouterr()
        code = args.command(args)
        return code, capsys.readouterr().out

    return run


# What a Lua call arrives as in Redis's command stats: a script by EVALSHA, the limit
# fetch by FCALL where the server has functions (limitd.connection.functions).
LUA_CALLS = ("evalsha", "fcall")


def lua_calls(redis: Any) -> int:
    """Lua calls Redis has served (INFO commandstats), whichever way they came."""
    stats = redis.info("commandstats")
    return sum(int(stats.get(f"cmdstat_{name}", {}).get("calls", 0)) for name in LUA_CALLS)


def lua_folded(counts: Any) -> Any:
    """Command counts with the Lua calls counted together, as "lua"."""
    folded = counts.copy()
    lua = sum(folded.pop(name, 0) for name in LUA_CALLS)
    if lua:
        folded["lua"] = lua
    return folded
