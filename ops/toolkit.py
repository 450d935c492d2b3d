"""The public toolkit of ops/: what tests, the benchmark, the fault suite, the
scale bench and the rolling restart use to run servers, nodes and load. Import
from here, not from the modules behind it:

- stores of our own on free ports: ``RedisServer``, ``MariaServer``, a Redis
  under Sentinel (``RedisSentinelGroup``), a MariaDB primary and replica
  (``MariaPair``), a Galera cluster (``GaleraCluster``), a Redis Cluster of
  3 primaries and 3 replicas (``LocalCluster``), and ``TcpProxy``
  to cut a store off from a node;
- idpool processes: ``NodeProcess`` (``idpool serve``), ``PreloaderProcess``,
  ``env_with`` (their environment), ports (``free_port``, ``wait_for_port``,
  ``wait_port_closed``), ``wait_ready`` (``/readyz``), ``node_stopped`` (the
  figures of a node's ``event=node_stopped`` line);
- load: ``NodeConnections.get_ids`` (one attempt at a node for IDs, kept alive).
"""

from __future__ import annotations

from .galera import GaleraCluster
from .idclient import Answer, NodeConnections
from .processes import (
    NodeProcess,
    PreloaderProcess,
    env_with,
    free_port,
    node_stopped,
    wait_for_port,
    wait_port_closed,
    wait_ready,
)
from .redis_cluster import LocalCluster
from .replication import MariaPair, RedisSentinelGroup
from .servers import MariaServer, RedisServer, TcpProxy

__all__ = [
    "Answer",
    "GaleraCluster",
    "LocalCluster",
    "MariaPair",
    "MariaServer",
    "NodeConnections",
    "NodeProcess",
    "PreloaderProcess",
    "RedisSentinelGroup",
    "RedisServer",
    "TcpProxy",
    "env_with",
    "free_port",
    "node_stopped",
    "wait_for_port",
    "wait_port_closed",
    "wait_ready",
]
