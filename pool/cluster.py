"""A Redis Cluster client with idpool's at-most-once settings.

``IDPOOL_REDIS_URL=redis+cluster://[[user]:password@]host:port[,host:port...]``
(``rediss+cluster://`` for TLS) names seed nodes; redis-py's asyncio
``RedisCluster`` asks one of them for the slot map and sends each command to
the primary of its key's slot. Every script idpool runs touches the keys of one
tag, which share the hash tag ``{tag}`` (``pool/keys.py``), so one slot.

What redis-py 8's ``RedisCluster`` retries, and what idpool lets it (read in
``redis/asyncio/cluster.py``; docs/design/failovers.md, "Redis Cluster"):

- ``MOVED`` and ``ASK`` are followed (up to 16 redirects a command). Both are
  answers from a node that did not run the command: the slot is elsewhere.
  ``TRYAGAIN`` (a multi-key command during a slot migration) is retried the
  same way; it did not run either.
- A connection error or timeout would be retried ``retry.get_retries()`` times
  after re-reading the slot map. idpool passes ``Retry(NoBackoff(), 0)``: the
  error is raised at once (the slot map is re-read before the next command).
  Each node's connections are built with no retry of their own either.
- ``CLUSTERDOWN`` and an uncovered slot are raised the same way (after redis-py
  closes its connections and sleeps 0.25 s); neither ran anything.
- A node's pool that is full raises ``MaxConnectionsError`` at once; idpool's
  semaphore keeps in flight at most as many commands as one node's pool holds.

So every command runs at most once, as with a single Redis.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import redis.asyncio as aioredis
from redis.asyncio.cluster import ClusterNode, RedisCluster
from redis.exceptions import MovedError, NoScriptError, RedisClusterException

from .errors import StoreUnavailable
from .settings import ClusterParams

Client = aioredis.Redis | RedisCluster


def cluster_client(params: ClusterParams, **options: Any) -> RedisCluster:
    """The client of the cluster ``params`` seeds; ``options`` as for ``Redis()``."""
    # RedisCluster takes no retry_on_timeout (timeouts are not retried with retries=0)
    options = {k: v for k, v in options.items() if k != "retry_on_timeout"}
    return RedisCluster(
        startup_nodes=[ClusterNode(host, port) for host, port in params.nodes],
        require_full_coverage=True,
        username=params.username,
        password=params.password,
        ssl=params.tls,
        **options,
    )


async def verify_cluster(client: RedisCluster) -> None:
    """Raise unless the slot map covers every slot and each primary reports
    ``cluster_state:ok`` (a shard down, or slots uncovered, say fail)."""
    await client.initialize()  # RedisClusterException: no seed answers, slots uncovered
    for node in client.get_primaries():
        info = await client.execute_command("CLUSTER INFO", target_nodes=node)
        if "cluster_state" not in info and len(info) == 1:
            info = next(iter(info.values()))  # {node name: info}
        state = info.get("cluster_state")
        if state != "ok":
            raise StoreUnavailable(
                "redis",
                f"the Redis Cluster IDPOOL_REDIS_URL names is not serving: {node.name} reports "
                f"cluster_state:{state} (a shard without a primary, or slots not covered)",
            )


async def on_one_connection(
    client: RedisCluster,
    key: str,
    script: Any,
    keys: list[str],
    args: list[str],
    replicas: int,
    ms: int,
) -> tuple[str, int, int | None]:
    """Run a script that answers ``{value, replicas online}`` on one connection to
    the primary of ``key``'s slot, then ``WAIT`` on that same connection for
    ``replicas`` replicas (WAIT counts only its own connection's writes). Returns
    (value, online, acknowledged); acknowledged is None when nothing was waited
    for: ``replicas`` is 0, or fewer are online than it wants (only an online
    replica can acknowledge: the raise cannot count, and the caller refuses it
    without holding the connection for the WAIT's timeout)."""

    def wanted(reply: Any) -> int:
        return replicas if replicas and int(reply[1]) >= replicas else 0

    (value, online), acked = await run_then_wait(client, key, script, keys, args, wanted, ms)
    return str(value), int(online), acked


_REDIRECTS = 5  # MOVED answers followed before giving up (each one ran nothing)


async def run_then_wait(
    client: RedisCluster,
    key: str,
    script: Any,
    keys: list[str],
    args: list[str],
    wanted: Callable[[Any], int],
    ms: int,
) -> tuple[Any, int | None]:
    """Run a script on one connection to the primary of ``key``'s slot, then, when
    ``wanted(reply)`` is above 0, ``WAIT`` that many replicas on that same
    connection (WAIT counts only its own connection's writes). Returns (reply,
    acknowledged), acknowledged None when nothing was waited for.

    Nothing that may have run is sent again: an error after the script was sent
    is raised as it comes. A MOVED (the script did not run: the slot is elsewhere
    now) updates the slot map and the script is sent to the new primary.
    """
    await client.initialize()
    for _ in range(_REDIRECTS):
        node = client.get_node_from_key(key)
        if node is None:  # not in the slot map: nothing sent
            raise RedisClusterException(f"no node serves the slot of {key!r}")
        try:
            return await _run_then_wait_on(node, script, keys, args, wanted, ms)
        except MovedError as e:
            await client.nodes_manager.move_slot(e)
    raise RedisClusterException(f"the slot of {key!r} moved {_REDIRECTS} times in a row")


async def _run_then_wait_on(
    node: ClusterNode,
    script: Any,
    keys: list[str],
    args: list[str],
    wanted: Callable[[Any], int],
    ms: int,
) -> tuple[Any, int | None]:
    conn = node.acquire_connection()
    try:
        await node.disconnect_if_needed(conn)
        try:
            await conn.send_command("EVALSHA", script.sha, len(keys), *keys, *args)
            reply = await conn.read_response()
        except NoScriptError:  # not run: send the text this once
            await conn.send_command("EVAL", script.text, len(keys), *keys, *args)
            reply = await conn.read_response()
        acked = None
        replicas = wanted(reply)
        if replicas > 0:
            await conn.send_command("WAIT", replicas, ms)
            acked = int(await conn.read_response())
        return reply, acked
    except BaseException:
        await conn.disconnect()  # a reply may be left unread on it
        raise
    finally:
        node.release(conn)
