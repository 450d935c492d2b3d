"""The Redis pool's cluster view (``NodeRegistry``): each live node's heartbeat, with a TTL.

A node's hash expires on its own; its entry in the nodes set (scored by the time
it was seen) is dropped by the next heartbeat past ``ttl``, or at once when it leaves.
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from typing import Any

from .redis_base import RedisCore


class RedisNodes(RedisCore):
    """Heartbeats, leaving, and the live nodes."""

    async def heartbeat(self, node_id: str, fields: Mapping[str, str], ttl: float) -> None:
        """Register a node as live for ``ttl`` seconds: its hash, and its entry
        in the nodes set (entries older than ``ttl`` are dropped here)."""
        now = time.time()
        mapping: dict[Any, Any] = {**fields, "seen_at": f"{now:.3f}"}
        async with self.client.pipeline(transaction=False) as pipe:
            pipe.hset(self.keys.node(node_id), mapping=mapping)
            pipe.pexpire(self.keys.node(node_id), int(ttl * 1000))
            pipe.zadd(self.keys.nodes, {node_id: now})
            pipe.zremrangebyscore(self.keys.nodes, "-inf", now - ttl)
            await self._plain(pipe.execute())

    async def leave(self, node_id: str) -> None:
        """A node that stops takes itself out of the cluster view at once."""
        async with self.client.pipeline(transaction=False) as pipe:
            pipe.delete(self.keys.node(node_id))
            pipe.zrem(self.keys.nodes, node_id)
            await self._plain(pipe.execute())

    async def live_nodes(self, ttl: float) -> list[dict[str, str]]:
        """Every node seen within ``ttl`` seconds, with ``id``: two round trips."""
        ids = await self._plain(
            self.client.zrangebyscore(self.keys.nodes, time.time() - ttl, "+inf")
        )
        if not ids:
            return []
        async with self.client.pipeline(transaction=False) as pipe:
            for node_id in ids:
                pipe.hgetall(self.keys.node(node_id))
            found = await self._plain(pipe.execute())
        return [{**f, "id": i} for i, f in zip(ids, found, strict=True) if f]
