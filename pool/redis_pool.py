"""The shared pool: one Redis list of ready ranges per tag.

Every read-modify-write is a Lua script, so it is atomic on the server. Every
script that touches a pool list first checks that the Redis it runs on is a
*clean incarnation* (see ``_PRELUDE``), so a Redis that restarted from an old
snapshot, or a replica promoted with missing writes, can never hand out a range
that was already popped.

redis-py's ``Redis()`` retries a command after a connection error by default
(3 times in redis-py 6, 10 in redis-py 8). A retried RPUSH whose first attempt landed would put the
same range in the list twice, so the client here is built with retries off:
every command runs at most once, and a caller that gets an error treats the
outcome as unknown (a push is abandoned, a pop is counted as lost).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, NamedTuple

import redis.asyncio as aioredis
from redis.asyncio.retry import Retry
from redis.backoff import NoBackoff
from redis.exceptions import RedisError

from .errors import StoreUnavailable
from .keys import Keys
from .ranges import IdRange
from .sentinel import sentinel_client
from .settings import Settings

# Shared head of the pool scripts. KEYS[1] = pools set, KEYS[2] = incarnation
# key; ARGV[1] = clean-marker prefix, ARGV[2] = pool-list prefix.
_PRELUDE = """
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

# KEYS[3] = pool list, KEYS[4] = stats hash.
# Returns {dropped, range or false, depth after the pop, target depth or false}.
_POP = (
    _PRELUDE
    + """
local dropped = ensure_clean()
local range = redis.call('LPOP', KEYS[3])
return {dropped, range, redis.call('LLEN', KEYS[3]), redis.call('HGET', KEYS[4], 'target_depth')}
"""
)

# KEYS[3] = pool list; ARGV[3] = tag, ARGV[4] = 'head' or 'tail', ARGV[5..] = ranges
# in the order they should be served. Returns {dropped, new length}.
_PUSH = (
    _PRELUDE
    + """
local dropped = ensure_clean()
redis.call('SADD', KEYS[1], ARGV[3])
local n = 0
if ARGV[4] == 'head' then
  for i = #ARGV, 5, -1 do n = redis.call('LPUSH', KEYS[3], ARGV[i]) end
else
  for i = 5, #ARGV do n = redis.call('RPUSH', KEYS[3], ARGV[i]) end
end
return {dropped, n}
"""
)

# KEYS[1] = hwm; ARGV[1] = candidate. Decimal strings without leading zeros
# compare by length then text (Lua numbers are doubles and lose 64-bit precision).
_RAISE_HWM = """
local cur = redis.call('GET', KEYS[1])
local new = ARGV[1]
if cur and (#cur > #new or (#cur == #new and cur >= new)) then return cur end
redis.call('SET', KEYS[1], new)
return new
"""

# KEYS[1] = lease; ARGV[1] = owner. Delete only our own lease.
_RELEASE = """
if redis.call('GET', KEYS[1]) == ARGV[1] then return redis.call('DEL', KEYS[1]) end
return 0
"""

_ERRORS = (RedisError, OSError, TimeoutError)


class PopResult(NamedTuple):
    range: IdRange | None
    dropped: list[str]  # "tag=first-last" abandoned because Redis is a new incarnation
    depth: int = 0  # ranges left in the list after the pop
    target_depth: int = 0  # what the preloader fills the list to (0: not known yet)


class PushResult(NamedTuple):
    depth: int
    dropped: list[str]


def make_client(settings: Settings) -> aioredis.Redis:
    options: dict[str, Any] = dict(
        socket_timeout=settings.store_timeout,
        socket_connect_timeout=settings.store_timeout,
        # At most once: see the module docstring.
        retry=Retry(NoBackoff(), 0),
        retry_on_error=[],
        retry_on_timeout=False,
        decode_responses=True,
        max_connections=32,
    )
    sentinel = settings.sentinel_params()
    if sentinel is not None:  # redis+sentinel://: follow the master (pool/sentinel.py)
        return sentinel_client(sentinel, **options)
    return aioredis.Redis.from_url(settings.redis_url, **options)


class RedisPool:
    name = "redis"  # in /status, /metrics and 503 messages

    def __init__(self, client: aioredis.Redis, keys: Keys) -> None:
        self.client = client
        self.keys = keys
        self._pop = client.register_script(_POP)
        self._push = client.register_script(_PUSH)
        self._raise_hwm = client.register_script(_RAISE_HWM)
        self._release = client.register_script(_RELEASE)
        self._closed = False

    @classmethod
    def from_settings(cls, settings: Settings) -> RedisPool:
        return cls(make_client(settings), Keys(settings.redis_prefix))

    async def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        await self.client.aclose()

    async def check(self) -> None:
        """Raise StoreUnavailable (naming IDPOOL_REDIS_URL) unless Redis answers."""
        try:
            await self.client.ping()
        except _ERRORS as e:
            raise StoreUnavailable(
                "redis", f"no answer from Redis (check IDPOOL_REDIS_URL): {_describe(e)}"
            ) from e

    def _pool_args(self, tag: str) -> tuple[list[str], list[str]]:
        keys = [self.keys.pools, self.keys.incarnation, self.keys.pool(tag)]
        return keys, [self.keys.clean_prefix, self.keys.pool("")]

    async def pop(self, tag: str) -> PopResult:
        """Take the head range of the tag's list, or None when the list is empty.

        On an error the pop may have happened: whatever it took is lost, never
        handed out; the caller just fetches elsewhere.
        """
        keys, args = self._pool_args(tag)
        keys.append(self.keys.stats(tag))
        dropped, text, depth, target = await self._call(self._pop, keys, args)
        taken = None if text is None else IdRange.from_text(text)
        return PopResult(taken, list(dropped), int(depth), int(target or 0))

    async def push(self, tag: str, ranges: Sequence[IdRange], *, head: bool) -> PushResult:
        """Append fresh ranges (tail) or return remainders (head), in serving order.

        Called once per batch; never retried (an error means "maybe pushed").
        """
        keys, args = self._pool_args(tag)
        args += [tag, "head" if head else "tail", *(r.to_text() for r in ranges)]
        dropped, depth = await self._call(self._push, keys, args)
        return PushResult(int(depth), list(dropped))

    async def depth(self, tag: str) -> int:
        return int(await self._plain(self.client.llen(self.keys.pool(tag))))

    async def ranges(self, tag: str) -> list[IdRange]:
        texts = await self._plain(self.client.lrange(self.keys.pool(tag), 0, -1))
        return [IdRange.from_text(t) for t in texts]

    async def tags(self) -> list[str]:
        return sorted(await self._plain(self.client.smembers(self.keys.pools)))

    async def high_water(self, tag: str) -> int:
        value = await self._plain(self.client.get(self.keys.hwm(tag)))
        return int(value) if value else 0

    async def raise_high_water(self, tag: str, value: int) -> int:
        return int(await self._call(self._raise_hwm, [self.keys.hwm(tag)], [str(value)]))

    async def count_taken(self, tag: str, ids: int) -> None:
        """Add to the tag's count of IDs taken by nodes (the consumption signal)."""
        await self._plain(self.client.hincrby(self.keys.stats(tag), "taken", ids))

    async def report_lifetime(self, tag: str, ids: int, seconds: float) -> None:
        """A node finished a range of ``ids`` IDs that it served for ``seconds``."""
        mapping: dict[Any, Any] = {"lifetime_ids": ids, "lifetime_s": f"{seconds:.3f}"}
        await self._plain(self.client.hset(self.keys.stats(tag), mapping=mapping))

    async def read_stats(self, tag: str) -> dict[str, str]:
        return dict(await self._plain(self.client.hgetall(self.keys.stats(tag))))

    async def write_stats(self, tag: str, fields: dict[str, str]) -> None:
        mapping: dict[Any, Any] = dict(fields)
        await self._plain(self.client.hset(self.keys.stats(tag), mapping=mapping))

    async def take_lifetime(self, tag: str) -> tuple[int, float] | None:
        """Read and clear the last reported range lifetime: one observation, one decision."""
        async with self.client.pipeline(transaction=True) as pipe:
            pipe.hmget(self.keys.stats(tag), ["lifetime_ids", "lifetime_s"])
            pipe.hdel(self.keys.stats(tag), "lifetime_ids", "lifetime_s")
            (ids, seconds), _ = await self._plain(pipe.execute())
        if ids is None or seconds is None:
            return None
        return int(ids), float(seconds)

    async def acquire_lease(self, tag: str, owner: str, seconds: float) -> bool:
        ms = max(1, int(seconds * 1000))
        return bool(await self._plain(self.client.set(self.keys.lease(tag), owner, nx=True, px=ms)))

    async def release_lease(self, tag: str, owner: str) -> None:
        await self._call(self._release, [self.keys.lease(tag)], [owner])

    async def _call(self, script: Any, keys: list[str], args: list[str]) -> Any:
        return await self._plain(script(keys=keys, args=args))

    async def _plain(self, awaitable: Any) -> Any:
        try:
            return await awaitable
        except _ERRORS as e:
            raise StoreUnavailable("redis", _describe(e)) from e


def _describe(e: BaseException) -> str:
    return f"{type(e).__name__}: {e}" if str(e) else type(e).__name__
