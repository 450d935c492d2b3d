"""The shared base of the Redis pool's roles: the client, and how every command runs.

redis-py's ``Redis()`` retries a command after a connection error by default
(3 times in redis-py 6, 10 in redis-py 8). A retried RPUSH whose first attempt landed would put the
same range in the list twice, so the client here is built with retries off:
every command runs at most once, and a caller that gets an error treats the
outcome as unknown (a push is abandoned, a pop is counted as lost).

``RedisCore`` holds the client and the keys, runs every call (``send``: at most
once, waiting for a free connection, errors as StoreNotSent/StoreUnavailable
that say whether it may have run), a script by its SHA (``run_script``), the
start check, and the moved hint a pop sends apart. Each role
(``pool/redis_lists.py``, ``redis_marks.py``, ``redis_stats.py``,
``redis_nodes.py``, ``redis_leadership.py``) builds on it; ``pool/redis_pool.py``
combines them.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import inspect
from typing import Any, NamedTuple

import redis.asyncio as aioredis
from redis.asyncio.cluster import RedisCluster
from redis.asyncio.retry import Retry
from redis.asyncio.sentinel import SentinelConnectionPool
from redis.backoff import NoBackoff
from redis.exceptions import (
    AskError,
    ClusterDownError,
    NoScriptError,
    RedisClusterException,
    RedisError,
    TryAgainError,
)
from redis.exceptions import ConnectionError as RedisConnectionError

from .cluster import Client, cluster_client, verify_cluster
from .errors import ConfigError, StoreBusy, StoreNotSent, StoreUnavailable
from .keys import Keys, Legacy
from .sentinel import sentinel_client
from .settings import Settings

# The most ranges one pop may take (a batch of IDPOOL_MAX_COUNT IDs at step 1).
# At most this many commands in flight per client, so redis-py's pool (sized to
# match; per shard on a cluster) is never found full: a full pool raises at once,
# and a command that was never sent must not be taken for a Redis fault or an
# ambiguous write.
MAX_CONNECTIONS = 32


class Lua(NamedTuple):
    """A script, sent by its SHA1 and by its text only when the server lacks it."""

    text: str
    sha: str

    @classmethod
    def of(cls, text: str) -> Lua:
        return cls(text, hashlib.sha1(text.encode()).hexdigest())


# RedisClusterException is not a RedisError: a cluster client that cannot find a
# node for the command (no seed reachable, a slot uncovered) raises it before
# anything is sent. AttributeError: redis-py's cluster client closes every
# connection on CLUSTERDOWN, also those other commands are using, which then
# fail inside redis-py ("'NoneType' object has no attribute ..."): outcome unknown.
# The same close, hitting a connection that is being opened, makes asyncio refuse
# the write with a RuntimeError ("... the handler is closed"): outcome unknown too.
_ERRORS = (
    RedisError, OSError, TimeoutError, RedisClusterException, AttributeError, RuntimeError
)  # fmt: skip


def make_client(settings: Settings) -> Client:
    options: dict[str, Any] = dict(
        socket_timeout=settings.store_timeout,
        socket_connect_timeout=settings.store_timeout,
        # At most once: see the module docstring.
        retry=Retry(NoBackoff(), 0),
        retry_on_error=[],
        retry_on_timeout=False,
        decode_responses=True,
        max_connections=MAX_CONNECTIONS,
    )
    cluster = settings.cluster_params()
    if cluster is not None:  # redis+cluster://: the seeds of a Redis Cluster (pool/cluster.py)
        return cluster_client(cluster, **options)
    sentinel = settings.sentinel_params()
    if sentinel is not None:  # redis+sentinel://: follow the master (pool/sentinel.py)
        return sentinel_client(sentinel, **options)
    try:
        client = aioredis.Redis.from_url(settings.redis_url, **options)
        # an option redis-py does not know (?x=1) raises only when a connection is
        # made (a traceback at the first command): make one now, unconnected
        pool = client.connection_pool
        pool.connection_class(**pool.connection_kwargs)
    except (TypeError, ValueError) as e:
        raise ConfigError(f"IDPOOL_REDIS_URL: {e}; options go in IDPOOL_* settings") from None
    return client


class RedisCore:
    """The client, the keys and the call runner every role of the pool shares."""

    def __init__(
        self, client: Client, keys: Keys, slot_wait: float = 2.0, mark_replicas: int = 0
    ) -> None:
        self.client = client
        self.keys = keys
        self.clustered = isinstance(client, RedisCluster)
        # The old layout's keys are read on a single Redis only (an upgrade in place).
        self.legacy = None if self.clustered else Legacy(keys.prefix)
        self._closed = False
        # Checked once: a cluster's coverage and state, or that a plain redis:// URL
        # does not name a node of a Redis Cluster
        self._verified = False
        self._slots = asyncio.Semaphore(MAX_CONNECTIONS)
        # replicas that must have a raised high-water mark before it counts (WAIT)
        self._mark_replicas = mark_replicas
        self._slot_wait = slot_wait  # how long a command waits for a free connection
        self._moved_pending: set[str] = set()
        self._moved_task: asyncio.Task[None] | None = None

    async def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        if self._moved_task is not None:
            with contextlib.suppress(Exception):
                await self._moved_task
        await self.client.aclose()

    async def check(self) -> None:
        """Raise StoreUnavailable (naming IDPOOL_REDIS_URL) unless Redis answers.

        Under Sentinel, ask the Sentinels for the master first: when it moved,
        redis-py drops the idle connections to the old one. Without this a node
        whose connections all stayed open to an old primary that came back as
        a master during a failover kept using it until Sentinel demoted it (8-15
        s): two masters serving at once, which a strict tag's order cannot take.
        The first check of a cluster also asks every primary for its state: a
        cluster with a slot uncovered or a shard down is refused at start. The
        first check of a plain URL raises ConfigError when it names a Cluster node."""
        pool = getattr(self.client, "connection_pool", None)  # a cluster client has none
        try:
            if isinstance(pool, SentinelConnectionPool) and pool.is_master:
                await self._plain(pool.get_master_address())  # type: ignore[no-untyped-call]
            if not self._verified and isinstance(self.client, RedisCluster):
                await self._plain(verify_cluster(self.client))
            elif not self._verified:
                await self._refuse_cluster_node()
            self._verified = True
            await self._plain(self.client.ping())
        except StoreBusy:
            raise  # it answers; this process is busy
        except StoreUnavailable as e:
            raise StoreUnavailable(
                "redis", f"no answer from Redis (check IDPOOL_REDIS_URL): {e.detail}"
            ) from e

    async def _refuse_cluster_node(self) -> None:
        """A plain client on a node of a Redis Cluster reaches one shard: every key
        in another slot answers MOVED, so the node would start ready and answer
        503 to nearly every request. Raises ConfigError naming the URL to use."""
        info = await self._plain(self.client.info("cluster"))
        if str(info.get("cluster_enabled", "0")) == "1":
            raise ConfigError(
                "IDPOOL_REDIS_URL names a node of a Redis Cluster (cluster_enabled:1) with "
                "redis://: use redis+cluster://host:port[,host:port...] so each key goes "
                "to the node of its slot"
            )

    def _mark_moved(self, tag: str) -> None:
        """Add the tag to the moved set soon: one SADD for all pops meanwhile, never
        in the pop's way (a lost mark costs a tick, the next report sends it again)."""
        if self._closed:
            return
        self._moved_pending.add(tag)
        if self._moved_task is None or self._moved_task.done():
            self._moved_task = asyncio.ensure_future(self._send_moved())

    async def _send_moved(self) -> None:
        while self._moved_pending:
            tags, self._moved_pending = self._moved_pending, set()
            with contextlib.suppress(StoreUnavailable):
                await self._plain(self.client.sadd(self.keys.moved, *tags))

    async def _scan(self, match: str, server: Any = None) -> set[str]:
        """Every key matching ``match`` (on one server of a cluster, or on all)."""
        options: dict[str, Any] = {} if server is None else {"target_nodes": server}
        return {key async for key in self.client.scan_iter(match=match, count=1000, **options)}

    async def _call(self, script: Lua, keys: list[str], args: list[str]) -> Any:
        return await self._plain(run_script(self.client, script, keys, args))

    async def _plain(self, awaitable: Any) -> Any:
        try:
            async with asyncio.timeout(self._slot_wait):
                await self._slots.acquire()
        except TimeoutError:
            if inspect.iscoroutine(awaitable):
                awaitable.close()  # never started: nothing was sent
            raise StoreBusy(
                "redis",
                f"all {MAX_CONNECTIONS} connections stayed busy for {self._slot_wait}s; "
                "command not sent",
            ) from None
        try:
            return await awaitable
        except _ERRORS as e:
            if isinstance(e, RuntimeError) and "handler is closed" not in str(e):
                raise  # a bug of ours or redis-py's, not a store error
            if isinstance(e, RedisConnectionError) and isinstance(self.client, aioredis.Redis):
                # The others in the pool likely lead to the same gone server (a
                # restart, a failover): drop them now rather than fail once each.
                # (A cluster client does this itself, per shard.)
                with contextlib.suppress(*_ERRORS):
                    await self.client.connection_pool.disconnect(inuse_connections=False)
            if _never_sent(e):
                raise StoreNotSent("redis", _error_text(e)) from e
            raise StoreUnavailable("redis", _error_text(e)) from e
        finally:
            self._slots.release()

    async def send(self, awaitable: Any) -> Any:
        """Run one Redis call as every call here runs: at most once, waiting for a
        free connection, errors as StoreUnavailable (for the lease store)."""
        return await self._plain(awaitable)


async def run_script(client: Client, script: Lua, keys: list[str], args: list[str]) -> Any:
    """EVALSHA, then EVAL only after NOSCRIPT (which means it did not run): never a
    second run. On a cluster both go to the shard of the keys' slot."""
    try:
        return await client.evalsha(script.sha, len(keys), *keys, *args)
    except NoScriptError:
        return await client.eval(script.text, len(keys), *keys, *args)


def _never_sent(e: BaseException) -> bool:
    """The command was never run: redis-py failed to open the connection (its
    connect errors read "Error N connecting to ..." or "Timeout connecting to"), a
    cluster client found no node for it, or the shard refused it unread
    (CLUSTERDOWN, and MOVED/ASK/TRYAGAIN left after redis-py followed 16 of them)."""
    if isinstance(e, RedisConnectionError) and "connecting to" in str(e):
        return True
    return isinstance(e, RedisClusterException | ClusterDownError | AskError | TryAgainError)


def _error_text(e: BaseException) -> str:
    return f"{type(e).__name__}: {e}" if str(e) else type(e).__name__
