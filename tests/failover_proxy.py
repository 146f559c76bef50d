"""A tiny TCP proxy that decides, per new connection, which Redis server it reaches.

It models a failover as clients see it: sockets opened before the failover talk to the
old primary (now a read-only replica); sockets opened after it reach the new primary.
"""

from __future__ import annotations

import contextlib
import socket
import threading
from collections.abc import Callable

from limitd.connection.embedded import free_port


class FailoverProxy:
    def __init__(self, route: Callable[[int], int]) -> None:
        """``route(n)`` returns the backend port for the n-th connection (from 0)."""
        self.route = route
        self.port = free_port()
        self.connections = 0
        self._listener = socket.create_server(("127.0.0.1", self.port))
        self._closing = threading.Event()
        self._sockets: list[socket.socket] = []
        threading.Thread(target=self._accept, daemon=True).start()

    def close(self) -> None:
        self._closing.set()
        self._listener.close()
        for sock in self._sockets:
            sock.close()

    def _accept(self) -> None:
        while not self._closing.is_set():
            try:
                client, _ = self._listener.accept()
            except OSError:
                return
            backend = socket.create_connection(("127.0.0.1", self.route(self.connections)))
            self.connections += 1
            self._sockets += [client, backend]
            for src, dst in ((client, backend), (backend, client)):
                threading.Thread(target=_pipe, args=(src, dst), daemon=True).start()


def _pipe(src: socket.socket, dst: socket.socket) -> None:
    try:
        while data := src.recv(65536):
            dst.sendall(data)
    except OSError:
        pass
    finally:
        for sock in (src, dst):
            with contextlib.suppress(OSError):
                sock.shutdown(socket.SHUT_RDWR)
