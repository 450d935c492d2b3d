"""A Redis client that follows Sentinel to the current master.

``IDPOOL_REDIS_URL=redis+sentinel://host1:26379,host2:26379/mymaster/0`` builds
the client with redis-py's ``Sentinel(...).master_for(...)``. Its connection
pool asks the Sentinels for the master's address whenever it opens a
connection; after a failover the broken connections fail once (the command is
not retried: see ``pool/redis_pool.py``), the next connection is opened to the
promoted replica, and a connection that meets a demoted master (``READONLY``)
is dropped the same way. Nodes and preloaders follow a failover without restart.

The Sentinels are asked with the same timeouts and no retries either: a
Sentinel that hangs costs one ``IDPOOL_STORE_TIMEOUT``, and the next one is
asked. A master that a Sentinel sees as down (``+sdown``), or that none of them
knows, is an error at once (``MasterNotFoundError``), never a guess.
"""

from __future__ import annotations

import asyncio
from typing import Any

import redis.asyncio as aioredis
from redis.asyncio.sentinel import Sentinel, SentinelConnectionPool
from redis.exceptions import RedisError

from .settings import SentinelParams


class SentinelMaster(aioredis.Redis):
    """The master's client; closing it also closes the connections to the Sentinels."""

    async def aclose(self, close_connection_pool: bool | None = None) -> None:
        await super().aclose(close_connection_pool)
        pool = self.connection_pool
        if isinstance(pool, SentinelConnectionPool):
            await pool.sentinel_manager.aclose()


def sentinel_client(params: SentinelParams, **options: Any) -> aioredis.Redis:
    """The client of ``params.service``'s master; ``options`` as for ``Redis()``."""
    # retry_on_timeout is deprecated in Redis() (and False anyway): leave it out
    asking = {k: options[k] for k in ("socket_timeout", "socket_connect_timeout", "retry")}
    asking["retry_on_error"] = []
    sentinel = Sentinel(  # type: ignore[no-untyped-call]
        list(params.sentinels),
        sentinel_kwargs={**asking, "password": params.sentinel_password},
    )
    master: aioredis.Redis = sentinel.master_for(
        params.service,
        redis_class=SentinelMaster,
        db=params.db,
        username=params.username,
        password=params.password,
        **options,
    )
    return master


async def named_master_by_majority(client: aioredis.Redis, run_id: str) -> bool | None:
    """Whether most Sentinels name, as the master, the server whose ``run_id`` is
    given (``SENTINEL MASTER``, all Sentinels asked at once). None when the client
    does not follow Sentinel (nothing to ask).

    A strict tag's take asks after it ran: two masters can be up at once during a
    failover (an old primary restarted as a master while the Sentinels promote a
    replica), and Sentinels never go back to a master they left, so a take that
    most of them still name the master of cannot be answered after a take on the
    one they switched to (two majorities share a Sentinel).
    """
    pool = client.connection_pool
    if not isinstance(pool, SentinelConnectionPool):
        return None
    sentinels = list(pool.sentinel_manager.sentinels)

    async def names(sentinel: aioredis.Redis) -> bool:
        try:
            state = await sentinel.execute_command(  # type: ignore[no-untyped-call]
                "SENTINEL MASTER", pool.service_name
            )
        except (RedisError, OSError):
            return False  # no answer: not a vote for it
        return bool(state.get("runid") == run_id and not state.get("is_odown"))

    votes = await asyncio.gather(*(names(s) for s in sentinels))
    return sum(votes) > len(sentinels) // 2
