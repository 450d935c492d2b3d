"""A Redis Cluster of our own on loopback: 3 primaries and 3 replicas by default.

Six ``redis-server --cluster-enabled yes`` processes on free ports whose bus
ports (port + 10000) are free too, joined by ``redis-cli --cluster create
--cluster-replicas 1``. Nodes are killed, failed over and restarted by PID;
``stop()`` stops every one and removes the directory. Shared by the tests and
the fault-injection suite.

The node timeout is 1 s (``cluster-node-timeout``), so a replica is promoted a
couple of seconds after its primary dies.
"""

from __future__ import annotations

import contextlib
import shutil
import socket
import subprocess
import time
from collections.abc import Callable
from pathlib import Path

import redis
from redis.crc import key_slot

from .processes import free_port
from .servers import RedisServer

NODE_TIMEOUT_MS = 1000


def free_cluster_port() -> int:
    """A free port whose cluster bus port (port + 10000) is free too."""
    for _ in range(200):
        port = free_port()
        if port + 10000 > 65535:
            continue
        with socket.socket() as s:
            try:
                s.bind(("127.0.0.1", port + 10000))
            except OSError:
                continue
        return port
    raise RuntimeError("no free port pair (port, port + 10000) for a cluster node")


class ClusterNodeServer(RedisServer):
    """One cluster node; its nodes.conf survives a restart (it rejoins as itself)."""

    def __init__(self, directory: Path, *args: str) -> None:
        super().__init__(directory, *args)
        self.port = free_cluster_port()

    def client(self) -> redis.Redis:
        return redis.Redis(port=self.port, decode_responses=True, socket_timeout=5)

    def start(self) -> ClusterNodeServer:
        super().start()
        return self

    def role(self) -> str:
        with self.client() as c:
            return str(c.info("replication")["role"])

    def node_id(self) -> str:
        with self.client() as c:
            return str(c.execute_command("CLUSTER", "MYID"))


class LocalCluster:
    def __init__(self, directory: Path, primaries: int = 3, replicas: int = 1) -> None:
        self.dir = directory
        self.primaries = primaries
        self.replicas = replicas
        args = (
            "--cluster-enabled", "yes",
            "--cluster-config-file", "nodes.conf",
            "--cluster-node-timeout", str(NODE_TIMEOUT_MS),
            "--cluster-replica-validity-factor", "0",  # any replica may take over
            # the other shards serve while one has no primary (docs/design/failovers.md)
            "--cluster-require-full-coverage", "no",
            "--appendonly", "no",
            "--save", "",
        )  # fmt: skip
        count = primaries * (1 + replicas)
        self.nodes = [ClusterNodeServer(directory / f"node{i}", *args) for i in range(count)]

    @property
    def url(self) -> str:
        return "redis+cluster://" + ",".join(f"127.0.0.1:{n.port}" for n in self.nodes)

    def start(self, timeout: float = 60.0) -> LocalCluster:
        for node in self.nodes:
            node.start()
        subprocess.run(
            [
                "redis-cli", "--cluster", "create",
                *(f"127.0.0.1:{n.port}" for n in self.nodes),
                "--cluster-replicas", str(self.replicas),
                "--cluster-yes",
            ],
            check=True,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            timeout=timeout,
        )  # fmt: skip
        self.wait_ok(timeout)
        return self

    def stop(self) -> None:
        for node in self.nodes:
            with contextlib.suppress(Exception):
                node.resume()
            with contextlib.suppress(Exception):
                node.stop()
            with contextlib.suppress(Exception):
                node.kill9()
        shutil.rmtree(self.dir, ignore_errors=True)

    def running(self) -> list[ClusterNodeServer]:
        return [n for n in self.nodes if n.proc is not None]

    def state_ok(self) -> bool:
        """Every running node says cluster_state:ok and knows one live primary per
        shard, and every running replica is in sync with its primary (and online
        as its primary sees it)."""
        for node in self.running():
            try:
                with node.client() as c:
                    info = c.execute_command("CLUSTER", "INFO")
                    if "cluster_state:ok" not in info:
                        return False
                    slots = c.execute_command("CLUSTER", "SLOTS")
                    repl = c.info("replication")
                    if repl["role"] == "slave" and repl.get("master_link_status") != "up":
                        return False  # a replica still syncing
                    replicas = [v for k, v in repl.items() if isinstance(v, dict)]  # slaveN
                    if any(r.get("state") != "online" for r in replicas):
                        # the primary's side: only an online replica acknowledges a
                        # WAIT (IDPOOL_REDIS_MARK_REPLICAS), a moment after its link is up
                        return False
            except redis.RedisError:
                return False
            if len(slots) < self.primaries:
                return False
            # every slot range's primary is a live node
            live = {n.port for n in self.running()}
            if any(int(s[2][1]) not in live for s in slots):
                return False
        return True

    def wait_ok(self, timeout: float = 30.0) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.state_ok():
                return
            time.sleep(0.1)
        raise TimeoutError(f"Redis Cluster not ok after {timeout}s")

    def primary_of(self, key: str) -> ClusterNodeServer:
        """The node serving ``key``'s slot now (asked of a running node)."""
        slot = key_slot(key.encode())
        for node in self.running():
            with contextlib.suppress(redis.RedisError), node.client() as c:
                for first, last, primary, *_ in c.execute_command("CLUSTER", "SLOTS"):
                    if int(first) <= slot <= int(last):
                        return self.by_port(int(primary[1]))
        raise RuntimeError(f"no running node serves the slot of {key!r}")

    def replicas_of(self, primary: ClusterNodeServer) -> list[ClusterNodeServer]:
        found = []
        for node in self.running():
            if node is primary:
                continue
            with contextlib.suppress(redis.RedisError), node.client() as c:
                info = c.info("replication")
                if info.get("role") == "slave" and int(info.get("master_port", 0)) == primary.port:
                    found.append(node)
        return found

    def by_port(self, port: int) -> ClusterNodeServer:
        return next(n for n in self.nodes if n.port == port)

    def shard_primaries(self) -> list[ClusterNodeServer]:
        return [n for n in self.running() if n.role() == "master"]

    def failover(self, replica: ClusterNodeServer, timeout: float = 30.0) -> None:
        """``CLUSTER FAILOVER`` on a replica (a manual, lossless switch); waits for it."""
        with replica.client() as c:
            c.execute_command("CLUSTER", "FAILOVER")
        self.wait_for(lambda: replica.role() == "master", timeout)
        self.wait_ok(timeout)

    def wait_promoted(self, replica: ClusterNodeServer, timeout: float = 30.0) -> float:
        """Wait until ``replica`` is a primary and the cluster is ok; the time it took."""
        start = time.monotonic()
        self.wait_for(lambda: replica.role() == "master", timeout)
        self.wait_ok(timeout)
        return time.monotonic() - start

    def restart(self, node: ClusterNodeServer) -> None:
        """Start a stopped node again: it rejoins with its nodes.conf, with no data."""
        node.start()

    @staticmethod
    def wait_for(check: Callable[[], bool], timeout: float) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            with contextlib.suppress(redis.RedisError):
                if check():
                    return
            time.sleep(0.05)
        raise TimeoutError(f"condition not met after {timeout}s")
