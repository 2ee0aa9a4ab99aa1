"""Redis servers a test starts and stops itself: a cluster, a primary with a replica.

Every server listens on a free loopback port, keeps nothing on disk but its log
and cluster config (in a temporary directory), and is stopped by the pid this
module started, never by name.
"""

from __future__ import annotations

import contextlib
import random
import shutil
import signal
import socket
import subprocess
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import redis
from redis.cluster import ClusterNode, RedisCluster

HOST = "127.0.0.1"
START_TIMEOUT = 30.0


def _port_is_free(port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        try:
            sock.bind((HOST, port))
        except OSError:
            return False
    return True


def free_port(*, with_bus: bool = False) -> int:
    """A free loopback port; ``with_bus``: port + 10000 (the cluster bus) is free too."""
    for _ in range(500):
        port = random.randrange(20000, 29999)
        if _port_is_free(port) and (not with_bus or _port_is_free(port + 10000)):
            return port
    raise RuntimeError("no free port pair on 127.0.0.1")


def wait_until(predicate: Callable[[], Any], what: str, timeout: float = START_TIMEOUT) -> Any:
    """Poll ``predicate`` until it returns something true; fail after ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            value = predicate()
        except (redis.RedisError, OSError):
            value = None
        if value:
            return value
        if time.monotonic() > deadline:
            raise TimeoutError(f"gave up waiting for {what} after {timeout:.0f}s")
        time.sleep(0.05)


class Server:
    """One ``redis-server`` process on a free port."""

    def __init__(self, directory: Path, *args: str, cluster: bool = False) -> None:
        self.args = args
        self.cluster = cluster
        self.port = 0
        self.directory = directory
        self.process: subprocess.Popen[bytes] | None = None
        self._client: redis.Redis | None = None

    def start(self) -> Server:
        for _ in range(5):  # another process may take the port between the probe and the bind
            self.port = free_port(with_bus=self.cluster)
            directory = self.directory / str(self.port)
            directory.mkdir(parents=True, exist_ok=True)
            command = [
                "redis-server",
                *self._head(directory),
                "--port",
                str(self.port),
                "--bind",
                HOST,
                "--save",
                "",
                "--appendonly",
                "no",
                "--dir",
                str(directory),
                "--logfile",
                "redis.log",
                "--repl-diskless-sync-delay",
                "0",
                "--repl-ping-replica-period",
                "1",
            ]
            if self.cluster:
                command += [
                    "--cluster-enabled",
                    "yes",
                    "--cluster-config-file",
                    "nodes.conf",
                    "--cluster-node-timeout",
                    "1500",
                ]
            self.process = subprocess.Popen([*command, *self.args], stdout=subprocess.DEVNULL)
            try:
                wait_until(lambda: self.process.poll() is not None or self.client().ping(), "redis-server")
            except TimeoutError:
                self.kill()
                raise
            if self.process.poll() is None:
                return self
        raise RuntimeError(f"redis-server would not start; see {self.directory}")

    def _head(self, directory: Path) -> list[str]:
        """What goes between ``redis-server`` and its options: nothing, for a plain server."""
        return []

    @property
    def address(self) -> str:
        return f"{HOST}:{self.port}"

    def client(self) -> redis.Redis:
        """A client of this server (one per server, made on first use)."""
        if self._client is None or self._client.connection_pool.connection_kwargs["port"] != self.port:
            self._client = redis.Redis(host=HOST, port=self.port, socket_timeout=5, socket_connect_timeout=2)
        return self._client

    def kill(self) -> None:
        """SIGKILL: the process dies with whatever it had not sent yet."""
        if self.process is not None and self.process.poll() is None:
            self.process.send_signal(signal.SIGKILL)
            self.process.wait(10)

    def stop(self) -> None:
        stop_all([self])


def stop_all(servers: list[Server]) -> None:
    """SIGTERM every server, then wait; SIGKILL what is still running after 10 seconds."""
    running = [s for s in servers if s.process is not None and s.process.poll() is None]
    for server in running:
        server.process.terminate()  # type: ignore[union-attr]
    for server in running:
        try:
            server.process.wait(10)  # type: ignore[union-attr]
        except subprocess.TimeoutExpired:
            server.kill()


@contextlib.contextmanager
def _scratch() -> Iterator[Path]:
    directory = Path(tempfile.mkdtemp(prefix="effectq-redis-"))
    try:
        yield directory
    finally:
        shutil.rmtree(directory, ignore_errors=True)


class Cluster:
    """Three primaries and three replicas, made with ``redis-cli --cluster create``."""

    def __init__(self, servers: list[Server]) -> None:
        self.servers = servers
        self._ids: dict[int, str] = {}

    @property
    def url(self) -> str:
        """Seed nodes as a ``redis+cluster://`` URL."""
        return "redis+cluster://" + ",".join(s.address for s in self.servers[:3])

    def client(self, **kwargs: Any) -> RedisCluster:
        nodes = [ClusterNode(HOST, s.port) for s in self.servers]
        return RedisCluster(startup_nodes=nodes, socket_timeout=5, socket_connect_timeout=2, **kwargs)

    def node_id(self, server: Server) -> str:
        if server.port not in self._ids:
            self._ids[server.port] = server.client().execute_command("CLUSTER MYID").decode()
        return self._ids[server.port]

    def primaries(self) -> list[Server]:
        return [s for s in self.servers if s.client().info("replication")["role"] == "master"]

    def owner(self, slot: int) -> Server:
        """The primary serving ``slot``."""
        by_port = {s.port: s for s in self.servers}
        for start, end, primary, *_ in self.servers[0].client().execute_command("CLUSTER SLOTS"):
            if start <= slot <= end:
                return by_port[int(primary[1])]
        raise LookupError(f"no primary serves slot {slot}")

    def replica_of(self, slot: int) -> Server:
        """The replica of the primary serving ``slot``."""
        by_port = {s.port: s for s in self.servers}
        for start, end, _primary, replica, *_ in self.servers[0].client().execute_command("CLUSTER SLOTS"):
            if start <= slot <= end:
                return by_port[int(replica[1])]
        raise LookupError(f"no replica serves slot {slot}")

    def move_slot(self, slot: int, target: Server) -> int:
        """Migrate ``slot`` to ``target`` one key at a time, as ``redis-cli --cluster reshard`` does.

        Returns how many keys moved. While keys move, clients get ASK and TRYAGAIN
        replies for the slot; once it moved, MOVED.
        """
        source = self.owner(slot)
        if source is target:
            return 0
        src, dst = source.client(), target.client()
        src_id, dst_id = self.node_id(source), self.node_id(target)
        dst.execute_command("CLUSTER SETSLOT", slot, "IMPORTING", src_id)
        src.execute_command("CLUSTER SETSLOT", slot, "MIGRATING", dst_id)
        moved = 0
        while True:
            keys = src.execute_command("CLUSTER GETKEYSINSLOT", slot, 1)
            if not keys:
                break
            src.execute_command("MIGRATE", HOST, target.port, "", 0, 5000, "KEYS", *keys)
            moved += len(keys)
        for server in self.primaries():
            server.client().execute_command("CLUSTER SETSLOT", slot, "NODE", dst_id)
        return moved

    def errorstats(self) -> dict[str, int]:
        """Error replies sent by every node, by prefix (MOVED, ASK, TRYAGAIN, ...), summed."""
        totals: dict[str, int] = {}
        for server in self.servers:
            for name, value in server.client().info("errorstats").items():
                prefix = name.removeprefix("errorstat_")
                totals[prefix] = totals.get(prefix, 0) + int(value["count"])
        return totals

    def check(self) -> bool:
        """Every node says the cluster is ok and knows every other node; every replica is in sync."""
        for server in self.servers:
            client = server.client()
            info = client.execute_command("CLUSTER INFO")
            if info["cluster_state"] != "ok" or int(info["cluster_known_nodes"]) != len(self.servers):
                return False
            replication = client.info("replication")
            if replication["role"] == "master" and replication["connected_slaves"] < 1:
                return False
            if replication["role"] == "slave" and replication["master_link_status"] != "up":
                return False
        ranges = self.servers[0].client().execute_command("CLUSTER SLOTS")
        return all(len(entry) >= 4 for entry in ranges)  # start, end, primary, replica


@contextlib.contextmanager
def cluster() -> Iterator[Cluster]:
    """A running cluster of three primaries and three replicas, stopped afterwards."""
    with _scratch() as directory:
        servers = [Server(directory, cluster=True) for _ in range(6)]
        try:
            for server in servers:
                server.start()
            subprocess.run(
                [
                    "redis-cli",
                    "--cluster",
                    "create",
                    *(s.address for s in servers),
                    "--cluster-replicas",
                    "1",
                    "--cluster-yes",
                ],
                check=True,
                stdout=subprocess.DEVNULL,
                timeout=60,
            )
            made = Cluster(servers)
            wait_until(made.check, "cluster_state:ok on every node")
            yield made
        finally:
            stop_all(servers)


class Link:
    """A TCP relay between a replica and its primary whose primary-to-replica half can be held.

    Once :meth:`hold` is called, every byte the primary sends afterwards stays in the
    relay and never reaches the replica: the replica falls behind exactly at that
    point, as over a partitioned or congested network.
    """

    def __init__(self, upstream_port: int) -> None:
        self.upstream_port = upstream_port
        self.port = free_port()
        self._held = threading.Event()
        self._sockets: list[socket.socket] = []
        self._listener = socket.create_server((HOST, self.port))
        threading.Thread(target=self._accept, daemon=True).start()

    def hold(self) -> None:
        self._held.set()

    def close(self) -> None:
        for sock in [self._listener, *self._sockets]:
            with contextlib.suppress(OSError):
                sock.shutdown(socket.SHUT_RDWR)
            sock.close()

    def _accept(self) -> None:
        while True:
            try:
                downstream, _ = self._listener.accept()
            except OSError:
                return
            upstream = socket.create_connection((HOST, self.upstream_port))
            self._sockets += [downstream, upstream]
            threading.Thread(target=self._pump, args=(upstream, downstream, True), daemon=True).start()
            threading.Thread(target=self._pump, args=(downstream, upstream, False), daemon=True).start()

    def _pump(self, source: socket.socket, sink: socket.socket, holdable: bool) -> None:
        while True:
            try:
                data = source.recv(65536)
                if not data:
                    return
                if holdable and self._held.is_set():
                    continue  # received after hold(): never delivered
                sink.sendall(data)
            except OSError:
                return


class Pair:
    """A primary and one replica that replicates through a :class:`Link`."""

    def __init__(self, primary: Server, replica: Server, link: Link | None) -> None:
        self.primary = primary
        self.replica = replica
        self.link = link

    def in_sync(self) -> bool:
        info = self.primary.client().info("replication")
        replica = info.get("slave0")
        return bool(
            info.get("connected_slaves") == 1
            and replica
            and replica["state"] == "online"
            and replica["offset"] == info["master_repl_offset"]
        )

    def hold(self) -> None:
        """From now on the replica receives nothing more (see :meth:`Link.hold`)."""
        if self.link is None:
            raise RuntimeError("this pair replicates directly; start it with relay=True to hold it")
        self.link.hold()

    def fail_over(self) -> None:
        """The primary dies (SIGKILL) and the replica is promoted, as Sentinel would do."""
        self.primary.kill()
        if self.link is not None:
            self.link.close()
        self.replica.client().execute_command("REPLICAOF", "NO", "ONE")
        wait_until(lambda: self.replica.client().info("replication")["role"] == "master", "promotion")


@contextlib.contextmanager
def primary_with_replica(*, relay: bool = True) -> Iterator[Pair]:
    """A primary, and a replica of it reached through a holdable link (``relay=False``: directly)."""
    with _scratch() as directory:
        primary = Server(directory)
        replica = Server(directory)
        link: Link | None = None
        try:
            primary.start()
            link = Link(primary.port) if relay else None
            replica.start()
            replica.client().execute_command("REPLICAOF", HOST, link.port if link else primary.port)
            pair = Pair(primary, replica, link)
            wait_until(pair.in_sync, "the replica to sync")
            yield pair
        finally:
            if link is not None:
                link.close()
            stop_all([replica, primary])


SERVICE = "svc"
"""The name the sentinels of :func:`sentinel_group` monitor the primary by."""


class SentinelServer(Server):
    """A ``redis-server --sentinel`` monitoring one primary, from a ``sentinel.conf`` of its own."""

    def __init__(self, directory: Path, primary_port: int, *, failover_timeout_ms: int) -> None:
        super().__init__(directory)
        self.primary_port = primary_port
        self.failover_timeout_ms = failover_timeout_ms

    def _head(self, directory: Path) -> list[str]:
        conf = directory / "sentinel.conf"  # Sentinel rewrites it: one per sentinel
        conf.write_text(
            f"sentinel monitor {SERVICE} {HOST} {self.primary_port} 2\n"
            f"sentinel down-after-milliseconds {SERVICE} 1000\n"
            f"sentinel failover-timeout {SERVICE} {self.failover_timeout_ms}\n"
        )
        return [str(conf), "--sentinel"]


class SentinelGroup:
    """A primary, one replica of it (through a holdable :class:`Link` if asked) and three
    sentinels with a quorum of two."""

    def __init__(self, pair: Pair, sentinels: list[SentinelServer], directory: Path) -> None:
        self.pair = pair
        self.sentinels = sentinels
        self.directory = directory
        self.extra: list[Server] = []

    @property
    def url(self) -> str:
        """The sentinels as a ``redis+sentinel://`` URL, for the monitored service."""
        return "redis+sentinel://" + ",".join(s.address for s in self.sentinels) + f"/{SERVICE}"

    def primary_ports(self) -> set[int]:
        """The primary's port as every sentinel that answers has it."""
        ports = set()
        for sentinel in self.sentinels:
            with contextlib.suppress(redis.RedisError):
                ports.add(int(sentinel.client().sentinel_get_master_addr_by_name(SERVICE)[1]))
        return ports

    def ready(self) -> bool:
        """Every sentinel knows the other two, a healthy primary and a replica that is in sync."""
        for sentinel in self.sentinels:
            state = sentinel.client().sentinel_master(SERVICE)
            if not state["is_master"] or state["is_sdown"] or state["is_odown"]:
                return False
            if state["num-other-sentinels"] != len(self.sentinels) - 1 or state["num-slaves"] < 1:
                return False
        return self.pair.in_sync()

    def add_replica(self, primary: Server) -> Server:
        """A new server replicating ``primary`` directly, once it is in sync and the sentinels
        count it among the primary's healthy replicas."""
        replica = Server(self.directory)
        self.extra.append(replica)
        replica.start()
        replica.client().execute_command("REPLICAOF", HOST, primary.port)

        def seen() -> bool:
            link = replica.client().info("replication").get("master_link_status") == "up"
            return link and all(
                any(
                    r["port"] == replica.port and not r["is_sdown"]
                    for r in s.client().sentinel_slaves(SERVICE)
                )
                for s in self.sentinels
            )

        wait_until(seen, "the new replica to sync and the sentinels to see it")
        return replica


@contextlib.contextmanager
def sentinel_group(*, relay: bool = False, failover_timeout_ms: int = 5000) -> Iterator[SentinelGroup]:
    """A running :class:`SentinelGroup` on free ports, every process stopped afterwards.

    ``failover_timeout_ms`` is also how long Sentinel lets a replica replicate through
    another address than the primary's (the relay) before it points the replica at the
    primary itself: a test that holds the relay needs it longer than the test.
    """
    with primary_with_replica(relay=relay) as pair:
        group = SentinelGroup(pair, [], pair.primary.directory)
        try:
            for _ in range(3):
                sentinel = SentinelServer(
                    group.directory, pair.primary.port, failover_timeout_ms=failover_timeout_ms
                )
                group.sentinels.append(sentinel)
                sentinel.start()
            wait_until(group.ready, "the sentinels to find each other and the replica", timeout=60)
            yield group
        finally:
            stop_all([*group.sentinels, *group.extra])


__all__ = [
    "SERVICE",
    "Cluster",
    "Link",
    "Pair",
    "SentinelGroup",
    "SentinelServer",
    "Server",
    "cluster",
    "free_port",
    "primary_with_replica",
    "sentinel_group",
    "wait_until",
]
