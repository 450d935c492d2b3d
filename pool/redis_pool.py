"""The shared pool: one Redis list of ready ranges per tag.

Every read-modify-write is a Lua script, so it is atomic on the server. Every
script that touches a pool list first checks that the Redis it runs on is a
*clean incarnation* (see ``PRELUDE``), so a Redis that restarted from an old
snapshot, or a replica promoted with missing writes, can never hand out a range
that was already popped.

redis-py's ``Redis()`` retries a command after a connection error by default
(3 times in redis-py 6, 10 in redis-py 8). A retried RPUSH whose first attempt landed would put the
same range in the list twice, so the client here is built with retries off:
every command runs at most once, and a caller that gets an error treats the
outcome as unknown (a push is abandoned, a pop is counted as lost).
"""

from __future__ import annotations

import asyncio
import contextlib
import inspect
import time
from collections.abc import Mapping, Sequence
from typing import Any

import redis.asyncio as aioredis
from redis.asyncio.retry import Retry
from redis.backoff import NoBackoff
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import RedisError

from .errors import StoreBusy, StoreNotSent, StoreUnavailable
from .keys import Keys
from .ranges import IdRange, tagged_ranges
from .sentinel import sentinel_client
from .settings import Settings
from .values import MAX_POP_RANGES, Moved, PoolSummary, PopResult, PushResult, summary

# Shared head of the pool scripts. KEYS[1] = pools set, KEYS[2] = incarnation
# key; ARGV[1] = clean-marker prefix, ARGV[2] = pool-list prefix.
PRELUDE = """
local function incarnation()
  local server = redis.call('INFO', 'server')
  local repl = redis.call('INFO', 'replication')
  return string.match(server, 'run_id:(%w+)') .. ':' .. string.match(repl, 'master_replid:(%w+)')
end
local function ensure_clean()
  local marker = ARGV[1] .. incarnation()
  if redis.call('EXISTS', marker) == 1 then return {} end
  -- First script on this incarnation (restart, failover, restore): the lists
  -- may hold ranges popped before the data was lost. Drop them all, unread.
  local dropped = {}
  for _, tag in ipairs(redis.call('SMEMBERS', KEYS[1])) do
    local key = ARGV[2] .. tag
    for _, r in ipairs(redis.call('LRANGE', key, 0, -1)) do
      dropped[#dropped + 1] = tag .. '=' .. r
    end
    redis.call('DEL', key)
  end
  local old = redis.call('GET', KEYS[2])
  if old then redis.call('DEL', old) end
  redis.call('SET', marker, '1')
  redis.call('SET', KEYS[2], marker)
  return dropped
end
"""

# KEYS[3] = pool list, KEYS[4] = stats hash, KEYS[5] = moved set; ARGV[3] = IDs
# wanted, ARGV[4] = most ranges to take, ARGV[5] = tag. Takes head ranges until
# they hold the IDs wanted (at least one range): a batch larger than a range is
# one call, not one per range. The tag goes into the moved set, so the active
# preloader looks at it on its next tick.
# Returns {dropped, ranges taken, depth after the pop, target depth or false}.
_POP = (
    PRELUDE
    + """
local dropped = ensure_clean()
local want, most, got, taken = tonumber(ARGV[3]), tonumber(ARGV[4]), 0, {}
repeat
  local range = redis.call('LPOP', KEYS[3])
  if not range then break end
  taken[#taken + 1] = range
  -- doubles: exact below 2^53, and only decides when to stop, never what is served
  local first, last = string.match(range, '(%d+)-(%d+)')
  got = got + tonumber(last) - tonumber(first) + 1
until got >= want or #taken >= most
redis.call('SADD', KEYS[5], ARGV[5])
return {dropped, taken, redis.call('LLEN', KEYS[3]), redis.call('HGET', KEYS[4], 'target_depth')}
"""
)

# The most ranges one pop may take (a batch of IDPOOL_MAX_COUNT IDs at step 1).
# At most this many commands in flight per client, so redis-py's pool (sized to
# match) is never found full: a full pool raises at once, and a command that was
# never sent must not be taken for a Redis fault or an ambiguous write.
MAX_CONNECTIONS = 32

# KEYS[3] = pool list, KEYS[4] = preloader lease; ARGV[3] = tag, ARGV[4] = 'head' or
# 'tail', ARGV[5] = the pushing preloader's id ('' for a node), ARGV[6..] = ranges in
# the order they should be served. Returns {dropped, new length, or -1: lease not held}.
_PUSH = (
    PRELUDE
    + """
local dropped = ensure_clean()
-- A preloader frozen past its lease (SIGSTOP, swap) must not push what it claimed
-- while the new holder fills the same list: its push counts only while it holds it.
if ARGV[5] ~= '' and redis.call('GET', KEYS[4]) ~= ARGV[5] then return {dropped, -1} end
redis.call('SADD', KEYS[1], ARGV[3])
local n = 0
if ARGV[4] == 'head' then
  for i = #ARGV, 6, -1 do n = redis.call('LPUSH', KEYS[3], ARGV[i]) end
else
  for i = 6, #ARGV do n = redis.call('RPUSH', KEYS[3], ARGV[i]) end
end
return {dropped, n}
"""
)

# KEYS[1] = hwm; ARGV[1] = candidate. Decimal strings without leading zeros
# compare by length then text (Lua numbers are doubles and lose 64-bit precision).
_RAISE_HWM = """
local online = 0
for _ in string.gmatch(redis.call('INFO', 'replication'), 'state=online') do online = online + 1 end
local cur = redis.call('GET', KEYS[1])
local new = ARGV[1]
if cur and (#cur > #new or (#cur == #new and cur >= new)) then return {cur, online} end
redis.call('SET', KEYS[1], new)
return {new, online}
"""

# KEYS[1] = preloader lease; ARGV[1] = owner, ARGV[2] = ms. Take it, or renew our own.
_LEAD = """
local holder = redis.call('GET', KEYS[1])
if holder == ARGV[1] then redis.call('PEXPIRE', KEYS[1], ARGV[2]) return 1 end
if holder then return 0 end
redis.call('SET', KEYS[1], ARGV[1], 'PX', ARGV[2])
return 1
"""

# KEYS[1] = preloader lease; ARGV[1] = owner. Delete only our own lease.
_RESIGN = """
if redis.call('GET', KEYS[1]) == ARGV[1] then return redis.call('DEL', KEYS[1]) end
return 0
"""

# KEYS[3] = moved set. Read and empty it in one step: a tag added meanwhile is
# either read now or left for the next tick, never lost. A pool script too: the
# active preloader's tick cleans a new Redis incarnation within a second, even
# when no node pops (nodes may live on their reserve for a while).
_TAKE_MOVED = (
    PRELUDE
    + """
local dropped = ensure_clean()
local tags = redis.call('SMEMBERS', KEYS[3])
redis.call('DEL', KEYS[3])
return {dropped, tags}
"""
)

_ERRORS = (RedisError, OSError, TimeoutError)


def make_client(settings: Settings) -> aioredis.Redis:
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
    sentinel = settings.sentinel_params()
    if sentinel is not None:  # redis+sentinel://: follow the master (pool/sentinel.py)
        return sentinel_client(sentinel, **options)
    return aioredis.Redis.from_url(settings.redis_url, **options)


class RedisPool:
    name = "redis"  # in /status, /metrics and 503 messages

    def __init__(
        self, client: aioredis.Redis, keys: Keys, slot_wait: float = 2.0, mark_replicas: int = 0
    ) -> None:
        self.client = client
        self.keys = keys
        self._pop = client.register_script(_POP)
        self._push = client.register_script(_PUSH)
        self._raise_hwm = client.register_script(_RAISE_HWM)
        self._lead = client.register_script(_LEAD)
        self._resign = client.register_script(_RESIGN)
        self._take_moved = client.register_script(_TAKE_MOVED)
        self._closed = False
        self._slots = asyncio.Semaphore(MAX_CONNECTIONS)
        # replicas that must have a raised high-water mark before it counts (WAIT)
        self._mark_replicas = mark_replicas
        self._slot_wait = slot_wait  # how long a command waits for a free connection

    @classmethod
    def from_settings(cls, settings: Settings) -> RedisPool:
        return cls(
            make_client(settings),
            Keys(settings.redis_prefix),
            settings.store_timeout,
            settings.redis_mark_replicas,
        )

    async def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        await self.client.aclose()

    async def check(self) -> None:
        """Raise StoreUnavailable (naming IDPOOL_REDIS_URL) unless Redis answers."""
        try:
            await self._plain(self.client.ping())
        except StoreBusy:
            raise  # it answers; this process is busy
        except StoreUnavailable as e:
            raise StoreUnavailable(
                "redis", f"no answer from Redis (check IDPOOL_REDIS_URL): {e.detail}"
            ) from e

    def _pool_args(self, tag: str) -> tuple[list[str], list[str]]:
        keys = [self.keys.pools, self.keys.incarnation, self.keys.pool(tag)]
        return keys, [self.keys.clean_prefix, self.keys.pool("")]

    async def pop(self, tag: str, ids: int = 1) -> PopResult:
        """Take head ranges holding at least ``ids`` IDs (at least one range), or
        none when the list is empty.

        On an error the pop may have happened: whatever it took is lost, never
        handed out; the caller just fetches elsewhere.
        """
        keys, args = self._pool_args(tag)
        keys += [self.keys.stats(tag), self.keys.moved]
        args += [str(ids), str(MAX_POP_RANGES), tag]
        dropped, texts, depth, target = await self._call(self._pop, keys, args)
        taken = [IdRange.from_text(t) for t in texts]
        return PopResult(taken, tagged_ranges(dropped), int(depth), int(target or 0))

    async def push(
        self, tag: str, ranges: Sequence[IdRange], *, head: bool, leader: str = ""
    ) -> PushResult:
        """Append fresh ranges (tail) or return remainders (head), in serving order.
        With ``leader`` (a preloader's id), only while it holds the preloader lease:
        otherwise nothing is pushed and the result says ``lease_lost``.

        Called once per batch; never retried (an error means "maybe pushed").
        """
        keys, args = self._pool_args(tag)
        keys.append(self.keys.preloader)
        args += [tag, "head" if head else "tail", leader, *(r.to_text() for r in ranges)]
        dropped, depth = await self._call(self._push, keys, args)
        if int(depth) < 0:
            return PushResult(0, tagged_ranges(dropped), lease_lost=True)
        return PushResult(int(depth), tagged_ranges(dropped))

    async def depth(self, tag: str) -> int:
        return int(await self._plain(self.client.llen(self.keys.pool(tag))))

    async def ranges(self, tag: str) -> list[IdRange]:
        texts = await self._plain(self.client.lrange(self.keys.pool(tag), 0, -1))
        return [IdRange.from_text(t) for t in texts]

    async def summaries(self, tags: Sequence[str]) -> dict[str, PoolSummary]:
        """Depth, head range and stats of each tag's list: three O(1) reads per
        tag, in one round trip (never the whole list, however deep)."""
        if not tags:
            return {}
        async with self.client.pipeline(transaction=False) as pipe:
            for tag in tags:
                pipe.llen(self.keys.pool(tag))
                pipe.lindex(self.keys.pool(tag), 0)
                pipe.hgetall(self.keys.stats(tag))
            replies = await self._plain(pipe.execute())
        found = {}
        for i, tag in enumerate(tags):
            depth, head_text, stats = replies[3 * i : 3 * i + 3]
            found[tag] = summary(int(depth), head_text, dict(stats))
        return found

    async def tags(self) -> list[str]:
        return sorted(await self._plain(self.client.smembers(self.keys.pools)))

    async def take_all(self, tag: str) -> list[IdRange]:
        """Remove every ready range of ``tag`` and return them (a disabled tag's
        list). On an error they may or may not be gone: the caller calls again."""
        # MULTI: a pop or push between the read and the delete would otherwise be
        # lost from the answer (a pushed range deleted unread) or counted twice.
        async with self.client.pipeline(transaction=True) as pipe:
            pipe.lrange(self.keys.pool(tag), 0, -1)
            pipe.delete(self.keys.pool(tag))
            texts, _ = await self._plain(pipe.execute())
        return [IdRange.from_text(t) for t in texts]

    async def high_water(self, tag: str) -> int:
        value = await self._plain(self.client.get(self.keys.hwm(tag)))
        return int(value) if value else 0

    async def raise_high_water(self, tag: str, value: int) -> int:
        """Raise the tag's mark to ``value`` (never lower it). With replicas to wait
        for, it counts only once that many replicas have it: a failover to a replica
        without it would leave ranges already served above the shared mark."""
        if not self._mark_replicas:
            mark, _ = await self._call(self._raise_hwm, [self.keys.hwm(tag)], [str(value)])
            return int(mark)
        return int(await self._plain(self._raise_and_wait(tag, value)))

    async def _raise_and_wait(self, tag: str, value: int) -> str:
        # WAIT counts only the writes of its own connection: a WAIT sent on another
        # pooled connection would answer for that one's writes, not the raise. So
        # both run on one connection, held from the pool (one slot, see _plain).
        # A plain Redis: its aclose gives the connection back and closes nothing else.
        one = aioredis.Redis(
            connection_pool=self.client.connection_pool, single_connection_client=True
        )
        try:
            mark, online = await self._raise_hwm(
                keys=[self.keys.hwm(tag)], args=[str(value)], client=one
            )
            # Only replicas that are online count: with none (the replica was just
            # promoted, or is down) there is nothing a failover could promote, and
            # waiting for one would stop every claim until a new replica has synced.
            wanted = min(self._mark_replicas, int(online))
            if wanted:
                # half the store timeout: WAIT answers first
                ms = max(1, int(self._slot_wait * 500))
                acked = int(await one.wait(wanted, ms))
                if acked < wanted:
                    raise StoreUnavailable(
                        "redis",
                        f"high-water mark reached {acked} of {wanted} replicas in {ms} ms "
                        "(IDPOOL_REDIS_MARK_REPLICAS)",
                    )
        finally:
            await one.aclose()
        return str(mark)

    async def report_issued(self, counts: Mapping[str, int]) -> None:
        """Add IDs a node handed out to each tag's ``issued`` count (the consumption
        signal), and mark the tags moved: one round trip for all of them."""
        if not counts:
            return
        async with self.client.pipeline(transaction=False) as pipe:
            for tag, ids in counts.items():
                pipe.hincrby(self.keys.stats(tag), "issued", ids)
            pipe.sadd(self.keys.moved, *counts)
            await self._plain(pipe.execute())

    async def take_moved(self) -> Moved:
        """The tags that moved since the last call (read and emptied at once)."""
        keys, args = self._pool_args("")
        keys[2] = self.keys.moved
        dropped, tags = await self._call(self._take_moved, keys, args)
        return Moved(sorted(tags), tagged_ranges(dropped))

    async def depths(self, tags: Sequence[str]) -> dict[str, int]:
        """Each list's depth: one LLEN per tag, in one round trip."""
        if not tags:
            return {}
        async with self.client.pipeline(transaction=False) as pipe:
            for tag in tags:
                pipe.llen(self.keys.pool(tag))
            replies = await self._plain(pipe.execute())
        return {tag: int(n) for tag, n in zip(tags, replies, strict=True)}

    async def report_lifetime(self, tag: str, ids: int, seconds: float) -> None:
        """A node finished a range of ``ids`` IDs that it served for ``seconds``."""
        mapping: dict[Any, Any] = {"lifetime_ids": ids, "lifetime_s": f"{seconds:.3f}"}
        await self._plain(self.client.hset(self.keys.stats(tag), mapping=mapping))

    async def read_stats(self, tag: str) -> dict[str, str]:
        return dict(await self._plain(self.client.hgetall(self.keys.stats(tag))))

    async def write_stats(self, tag: str, fields: dict[str, str]) -> None:
        await self.write_stats_many({tag: fields})

    async def write_stats_many(self, figures: Mapping[str, dict[str, str]]) -> None:
        """HSET each tag's figures, all in one round trip."""
        if not figures:
            return
        async with self.client.pipeline(transaction=False) as pipe:
            for tag, fields in figures.items():
                mapping: dict[Any, Any] = dict(fields)
                pipe.hset(self.keys.stats(tag), mapping=mapping)
            await self._plain(pipe.execute())

    async def add_stats(self, increments: Mapping[str, Mapping[str, int]]) -> None:
        """HINCRBY each tag's running totals (``returned``, ``wasted:{reason}``):
        one round trip. Never retried by callers: a lost one only undercounts."""
        if not increments:
            return
        async with self.client.pipeline(transaction=False) as pipe:
            for tag, fields in increments.items():
                for name, n in fields.items():
                    pipe.hincrby(self.keys.stats(tag), name, n)
            await self._plain(pipe.execute())

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

    async def take_lifetime(self, tag: str) -> tuple[int, float] | None:
        """Read and clear the last reported range lifetime: one observation, one decision."""
        async with self.client.pipeline(transaction=True) as pipe:
            pipe.hmget(self.keys.stats(tag), ["lifetime_ids", "lifetime_s"])
            pipe.hdel(self.keys.stats(tag), "lifetime_ids", "lifetime_s")
            (ids, seconds), _ = await self._plain(pipe.execute())
        if ids is None or seconds is None:
            return None
        return int(ids), float(seconds)

    async def lead(self, owner: str, seconds: float) -> bool:
        """Become (or stay) the one active preloader for ``seconds``; False when
        another holds the lease."""
        ms = str(max(1, int(seconds * 1000)))
        return bool(await self._call(self._lead, [self.keys.preloader], [owner, ms]))

    async def resign(self, owner: str) -> None:
        await self._call(self._resign, [self.keys.preloader], [owner])

    async def _call(self, script: Any, keys: list[str], args: list[str]) -> Any:
        return await self._plain(script(keys=keys, args=args))

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
            if isinstance(e, RedisConnectionError):
                # The others in the pool likely lead to the same gone server (a
                # restart, a failover): drop them now rather than fail once each.
                with contextlib.suppress(*_ERRORS):
                    await self.client.connection_pool.disconnect(inuse_connections=False)
            if _never_sent(e):
                raise StoreNotSent("redis", _describe(e)) from e
            raise StoreUnavailable("redis", _describe(e)) from e
        finally:
            self._slots.release()

    async def send(self, awaitable: Any) -> Any:
        """Run one Redis call as every call here runs: at most once, waiting for a
        free connection, errors as StoreUnavailable (for the lease store)."""
        return await self._plain(awaitable)


def _never_sent(e: BaseException) -> bool:
    """redis-py failed to open the connection, so the command was never written:
    its connect errors read "Error N connecting to ..." or "Timeout connecting to"."""
    return isinstance(e, RedisConnectionError) and "connecting to" in str(e)


def _describe(e: BaseException) -> str:
    return f"{type(e).__name__}: {e}" if str(e) else type(e).__name__
