"""The shared pool: one Redis list of ready ranges per tag.

Every read-modify-write is a Lua script over the keys of one tag (one slot, so
one shard of a Redis Cluster), so it is atomic on the server. Every script that
touches a pool list first checks that the tag's keys belong to the server's
current *incarnation* (see ``PRELUDE``), so a Redis that restarted from an old
snapshot, or a replica promoted with missing writes, can never hand out a range
that was already popped. The same code runs on a single Redis, behind Sentinel,
and on a Redis Cluster (``pool/cluster.py``).

redis-py's ``Redis()`` retries a command after a connection error by default
(3 times in redis-py 6, 10 in redis-py 8). A retried RPUSH whose first attempt landed would put the
same range in the list twice, so the client here is built with retries off:
every command runs at most once, and a caller that gets an error treats the
outcome as unknown (a push is abandoned, a pop is counted as lost).
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import inspect
import time
from collections.abc import Mapping, Sequence
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

from .cluster import Client, cluster_client, on_one_connection, verify_cluster
from .errors import ConfigError, StoreBusy, StoreNotSent, StoreUnavailable, TooFewReplicas
from .keys import Keys, Legacy
from .ranges import IdRange, tagged_ranges
from .sentinel import sentinel_client
from .settings import Settings
from .tag_rules import WORKER_KEYS_KIND, format_record
from .values import MAX_POP_RANGES, Moved, PoolSummary, PopResult, PushResult, summary

# The Redis incarnation, computed on the server inside the script that relies on
# it: `run_id` changes on every start, `master_replid` on every promotion.
INCARNATION_LUA = """
local function incarnation()
  local server = redis.call('INFO', 'server')
  local repl = redis.call('INFO', 'replication')
  return string.match(server, 'run_id:(%w+)') .. ':' .. string.match(repl, 'master_replid:(%w+)')
end
"""

# Shared head of the pool scripts: the incarnation check, per tag.
PRELUDE = (
    INCARNATION_LUA
    + """
-- The tag's list may hold only ranges pushed on this incarnation. The first
-- script of the tag here (restart, failover, restore) drops what an older one
-- left, unread: those ranges may have been popped before the data was lost.
-- On a single Redis it also takes in the old layout's list (an upgrade):
-- whole when the old layout cleaned this incarnation too, else dropped.
local function ensure_clean(marker, list, tag, old_list, old_clean)
  local here = incarnation()
  local dropped = {}
  if redis.call('GET', marker) ~= here then
    for _, r in ipairs(redis.call('LRANGE', list, 0, -1)) do
      dropped[#dropped + 1] = tag .. '=' .. r
    end
    redis.call('DEL', list)
    redis.call('SET', marker, here)
  end
  if old_list and redis.call('EXISTS', old_list) == 1 then
    local ranges = redis.call('LRANGE', old_list, 0, -1)
    redis.call('DEL', old_list)
    if redis.call('EXISTS', old_clean .. here) == 1 then
      for i = #ranges, 1, -1 do redis.call('LPUSH', list, ranges[i]) end
    else
      for _, r in ipairs(ranges) do dropped[#dropped + 1] = tag .. '=' .. r end
    end
  end
  return dropped
end
"""
)

# KEYS[1] = the tag's clean marker, KEYS[2] = pool list, KEYS[3] = stats hash,
# KEYS[4] = the old layout's list (single Redis only); ARGV[1] = tag, ARGV[2] =
# the old layout's clean-marker prefix, ARGV[3] = IDs wanted, ARGV[4] = most
# ranges to take. Takes head ranges until they hold the IDs wanted (at least one
# range): a batch larger than a range is one call, not one per range.
# Returns {dropped, ranges taken, depth after the pop, target depth or false}.
_POP = (
    PRELUDE
    + """
local dropped = ensure_clean(KEYS[1], KEYS[2], ARGV[1], KEYS[4], ARGV[2])
local want, most, got, taken = tonumber(ARGV[3]), tonumber(ARGV[4]), 0, {}
repeat
  local range = redis.call('LPOP', KEYS[2])
  if not range then break end
  taken[#taken + 1] = range
  -- doubles: exact below 2^53, and only decides when to stop, never what is served
  local first, last = string.match(range, '(%d+)-(%d+)')
  got = got + tonumber(last) - tonumber(first) + 1
until got >= want or #taken >= most
return {dropped, taken, redis.call('LLEN', KEYS[2]), redis.call('HGET', KEYS[3], 'target_depth')}
"""
)

# The most ranges one pop may take (a batch of IDPOOL_MAX_COUNT IDs at step 1).
# At most this many commands in flight per client, so redis-py's pool (sized to
# match; per shard on a cluster) is never found full: a full pool raises at once,
# and a command that was never sent must not be taken for a Redis fault or an
# ambiguous write.
MAX_CONNECTIONS = 32

# KEYS[1] = clean marker, KEYS[2] = pool list, KEYS[3] = the preloader leadership and
# KEYS[4] = the old list (single Redis only); ARGV[1] = tag, ARGV[2] = old clean
# prefix, ARGV[3] = 'head' or 'tail', ARGV[4] = the pushing preloader's id to check
# here ('' for a node, and on a cluster, where the lease is in another slot: checked
# just before, see push()), ARGV[5..] = ranges in the order they should be served.
# Returns {dropped, new length, or -1: lease not held}.
_PUSH = (
    PRELUDE
    + """
local dropped = ensure_clean(KEYS[1], KEYS[2], ARGV[1], KEYS[4], ARGV[2])
-- A preloader frozen past its lease (SIGSTOP, swap) must not push what it claimed
-- while the new holder fills the same list: its push counts only while it holds it.
if ARGV[4] ~= '' and redis.call('GET', KEYS[3]) ~= ARGV[4] then return {dropped, -1} end
local n = 0
if ARGV[3] == 'head' then
  for i = #ARGV, 5, -1 do n = redis.call('LPUSH', KEYS[2], ARGV[i]) end
else
  for i = 5, #ARGV do n = redis.call('RPUSH', KEYS[2], ARGV[i]) end
end
return {dropped, n}
"""
)

# KEYS[1] = hwm, KEYS[2] = the old layout's hwm (single Redis: raised too, so
# nodes of the old version stay fenced while both run); ARGV[1] = candidate.
# Decimal strings without leading zeros compare by length then text (Lua numbers
# are doubles and lose 64-bit precision). Returns {mark, replicas online}.
_RAISE_HWM = """
local function above(a, b) return #a > #b or (#a == #b and a > b) end
local online = 0
for lag in string.gmatch(redis.call('INFO', 'replication'), 'state=online,offset=%d+,lag=(%d+)') do
  if tonumber(lag) <= 2 then online = online + 1 end  -- _ACK_LAG_SECONDS
end
local new = ARGV[1]
for i = 1, #KEYS do
  local cur = redis.call('GET', KEYS[i])
  if cur and above(cur, new) then new = cur end
end
-- SET even when the mark is already there: WAIT counts only this connection's
-- writes, so a raise that found a higher mark (another process's, maybe not on
-- a replica yet) must write after it, or its WAIT answers for an older offset.
for i = 1, #KEYS do redis.call('SET', KEYS[i], new) end
return {new, online}
"""

# KEYS = hwm (and the old layout's). The marks ('' where none) after the replicas
# online, read in one step: a claim is not made while a raise could not count.
_READ_HWM = """
local online = 0
for lag in string.gmatch(redis.call('INFO', 'replication'), 'state=online,offset=%d+,lag=(%d+)') do
  if tonumber(lag) <= 2 then online = online + 1 end  -- _ACK_LAG_SECONDS
end
local found = {online}
for i = 1, #KEYS do found[#found + 1] = redis.call('GET', KEYS[i]) or '' end
return found
"""

# KEYS[1] = the tag's format fingerprint, KEYS[2] = its hwm, KEYS[3] and KEYS[4] =
# its worker hash and worker_lease (one slot: a name whose record predates its
# kind's records, but whose worker keys exist, was a tag of ARGV[3]'s kind,
# tag_rules.WORKER_KEYS_KIND); ARGV[1] = the
# record a tag of that name is being made or served with (its format's
# fingerprint, PLAIN_RECORD for none, or its kind's prefix and a hash:
# tag_rules.name_fingerprint), ARGV[2] = '1' when a node is about to
# serve the (live) tag: then a missing record is written whatever the mark (the
# row is the tag's truth; a Redis that lost the key gets it back). A plain name's
# record is written as any other: a format added to its row by hand, or removed
# from a formatted one, is then refused by a node serving it fresh. One script:
# no claim can raise the mark between the look and the SET. Returns
# {'same' | 'set' (first use of the name recorded) | 'other' (another format was
# used) | 'unformatted' (a format asked for a name used plain: recorded so, or
# numbers claimed with nothing recorded) | a kind's name (the record is that kind's,
# "NAME:hash": tag_rules.record_kind; of another layout if that kind is asked),
# replicas online}.
# A record found is SET again, as the raise does: a WAIT then covers it.
_FENCE_FORMAT = """
local online = 0
for lag in string.gmatch(redis.call('INFO', 'replication'), 'state=online,offset=%d+,lag=(%d+)') do
  if tonumber(lag) <= 2 then online = online + 1 end  -- _ACK_LAG_SECONDS
end
local cur = redis.call('GET', KEYS[1])
if cur then
  if cur == ARGV[1] then
    redis.call('SET', KEYS[1], cur)
    return {'same', online}
  end
  if cur == 'plain' then return {'unformatted', online} end  -- PLAIN_RECORD
  local colon = string.find(cur, ':', 1, true)  -- a kind's record: answer its name
  if colon then return {string.sub(cur, 1, colon - 1), online} end
  return {'other', online}
end
-- No record: a name of ARGV[3]'s kind from before its records has its worker keys
if string.sub(ARGV[1], 1, #ARGV[3] + 1) ~= ARGV[3] .. ':'
    and (redis.call('EXISTS', KEYS[3]) == 1 or redis.call('EXISTS', KEYS[4]) == 1) then
  return {ARGV[3], online}
end
local mark = redis.call('GET', KEYS[2])
if ARGV[1] ~= 'plain' and ARGV[2] ~= '1' and mark and mark ~= '0' then
  return {'unformatted', online}
end
redis.call('SET', KEYS[1], ARGV[1])
return {'set', online}
"""

# KEYS[1] = format fingerprint; ARGV[1] = ours. Undo our 'set' (a creation that lost).
_UNFENCE_FORMAT = """
if redis.call('GET', KEYS[1]) == ARGV[1] then return redis.call('DEL', KEYS[1]) end
return 0
"""

# KEYS[1] = a strict tag's state (pool/strict.py), ARGV[1] = the floor (decimal
# text). A strict tag made (again) under a name: the state an earlier life of the
# name left (its IDs below the new start, or below IDs a later segment life
# issued) is dropped, and `floor` (never lowered) refuses a refill whose claim
# starts below it: one an earlier life's node claimed before the removal and
# lands only now. One script: a take or extension runs wholly before or after.
# Returns the floor kept.
_FENCE_STATE = """
local function lt(a, b)
  if #a ~= #b then return #a < #b end
  return a < b
end
local floor = redis.call('HGET', KEYS[1], 'floor')
if not floor or lt(floor, ARGV[1]) then floor = ARGV[1] end
redis.call('DEL', KEYS[1])
redis.call('HSET', KEYS[1], 'floor', floor)
return floor
"""

# KEYS[1] = preloader leadership; ARGV[1] = owner, ARGV[2] = ms. Take it, or renew our own.
_LEAD = """
local holder = redis.call('GET', KEYS[1])
if holder == ARGV[1] then redis.call('PEXPIRE', KEYS[1], ARGV[2]) return 1 end
if holder then return 0 end
redis.call('SET', KEYS[1], ARGV[1], 'PX', ARGV[2])
return 1
"""

# KEYS[1] = preloader leadership; ARGV[1] = owner. Delete only our own leadership.
_RESIGN = """
if redis.call('GET', KEYS[1]) == ARGV[1] then return redis.call('DEL', KEYS[1]) end
return 0
"""

# KEYS[1] = moved set. Read and empty it in one step: a tag added meanwhile is
# either read now or left for the next tick, never lost.
_TAKE_MOVED = """
local tags = redis.call('SMEMBERS', KEYS[1])
redis.call('DEL', KEYS[1])
return tags
"""

# KEYS = the tag's list (and the old layout's). Read and delete in one step: a
# pop or push between the read and the delete would otherwise be lost from the
# answer (a pushed range deleted unread) or counted twice.
_TAKE_ALL = """
local taken = {}
for i = 1, #KEYS do
  for _, r in ipairs(redis.call('LRANGE', KEYS[i], 0, -1)) do taken[#taken + 1] = r end
  redis.call('DEL', KEYS[i])
end
return taken
"""

# KEYS as the push's; ARGV[1] = tag, ARGV[2] = old clean prefix. Only the
# incarnation check: a tag's list cleaned without popping or pushing.
_TOUCH = (
    PRELUDE
    + """
return ensure_clean(KEYS[1], KEYS[2], ARGV[1], KEYS[3], ARGV[2])
"""
)

# The server's incarnation, as the prelude computes it.
_INCARNATION = PRELUDE + "\nreturn incarnation()\n"

# KEYS[1] = stats hash. Read and clear the last lifetime: one observation, one decision.
_TAKE_LIFETIME = """
local seen = redis.call('HMGET', KEYS[1], 'lifetime_ids', 'lifetime_s')
redis.call('HDEL', KEYS[1], 'lifetime_ids', 'lifetime_s')
return seen
"""


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


class RedisPool:
    name = "redis"  # in /status, /metrics and 503 messages

    def __init__(
        self, client: Client, keys: Keys, slot_wait: float = 2.0, mark_replicas: int = 0
    ) -> None:
        self.client = client
        self.keys = keys
        self.clustered = isinstance(client, RedisCluster)
        # The old layout's keys are read on a single Redis only (an upgrade in place).
        self.legacy = None if self.clustered else Legacy(keys.prefix)
        self._pop = Lua.of(_POP)
        self._push = Lua.of(_PUSH)
        self._raise_hwm = Lua.of(_RAISE_HWM)
        self._read_hwm = Lua.of(_READ_HWM)
        self._fence_format = Lua.of(_FENCE_FORMAT)
        self._unfence_format = Lua.of(_UNFENCE_FORMAT)
        self._fence_state = Lua.of(_FENCE_STATE)
        self._lead = Lua.of(_LEAD)
        self._resign = Lua.of(_RESIGN)
        self._take_moved = Lua.of(_TAKE_MOVED)
        self._take_all = Lua.of(_TAKE_ALL)
        self._take_lifetime = Lua.of(_TAKE_LIFETIME)
        self._touch = Lua.of(_TOUCH)
        self._incarnation = Lua.of(_INCARNATION)
        self._seen: dict[str, str] = {}  # server -> incarnation whose lists this process cleaned
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

    async def mark_replicas(self) -> tuple[int, int] | None:
        """(fewest replicas online on a primary, replicas a raise waits for), or
        None when IDPOOL_REDIS_MARK_REPLICAS is 0. Fewer online than wanted:
        every raise is refused, so no claim can be made (for the health probe)."""
        if not self._mark_replicas:
            return None
        if isinstance(self.client, RedisCluster):
            infos = []
            for node in self.client.get_primaries():
                info = await self._plain(self.client.info("replication", target_nodes=node))
                if "role" not in info and len(info) == 1:
                    info = next(iter(info.values()))  # {node name: info}
                infos.append(info)
        else:
            infos = [await self._plain(self.client.info("replication"))]
        return min(map(_replicas_online, infos), default=0), self._mark_replicas

    def _tag_args(self, tag: str) -> tuple[list[str], list[str], list[str]]:
        """The prelude's keys: clean marker, list; the old list (single Redis); and
        the old clean-marker prefix ('' on a cluster)."""
        keys = [self.keys.clean(tag), self.keys.pool(tag)]
        if self.legacy is None:
            return keys, [], [tag, ""]
        return keys, [self.legacy.pool(tag)], [tag, self.legacy.clean_prefix]

    async def pop(self, tag: str, ids: int = 1) -> PopResult:
        """Take head ranges holding at least ``ids`` IDs (at least one range), or
        none when the list is empty.

        On an error the pop may have happened: whatever it took is lost, never
        handed out; the caller just fetches elsewhere.
        """
        keys, old, args = self._tag_args(tag)
        keys += [self.keys.stats(tag), *old]
        args += [str(ids), str(MAX_POP_RANGES)]
        dropped, texts, depth, target = await self._call(self._pop, keys, args)
        # The active preloader looks at the tag on its next tick (a hint, sent apart:
        # the moved set is on another shard of a cluster).
        self._mark_moved(tag)
        taken = [IdRange.from_text(t) for t in texts]
        return PopResult(taken, tagged_ranges(dropped), int(depth), int(target or 0))

    async def push(
        self, tag: str, ranges: Sequence[IdRange], *, head: bool, leader: str = ""
    ) -> PushResult:
        """Append fresh ranges (tail) or return remainders (head), in serving order.
        With ``leader`` (a preloader's id), only while it holds the preloader leadership:
        otherwise nothing is pushed and the result says ``lease_lost``.

        Called once per batch; never retried (an error means "maybe pushed").
        """
        keys, old, args = self._tag_args(tag)
        if self.clustered:
            # The lease key is in another slot than the tag's keys: a script cannot
            # read both on a cluster. Read right before the push instead: a preloader
            # frozen between the two still pushes, ranges it claimed with the mark
            # (waste, never a duplicate; docs/design/failovers.md, "Redis Cluster").
            if leader and await self._plain(self.client.get(self.keys.preloader)) != leader:
                return PushResult(0, [], lease_lost=True)
            leader = ""
        else:
            keys.append(self.keys.preloader)
        args += ["head" if head else "tail", leader, *(r.to_text() for r in ranges)]
        dropped, depth = await self._call(self._push, keys + old, args)
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
        """Tags that have a list (a SCAN: for inspection, never on a hot path)."""
        head, tail = len(self.keys.tag_prefix) + 1, len("}:pool")
        found = {key[head:-tail] for key in await self._plain(self._scan(self.keys.pool("*")))}
        if self.legacy is not None:
            found.update(await self._plain(self.client.smembers(self.legacy.pools)))
        return sorted(found)

    async def take_all(self, tag: str) -> list[IdRange]:
        """Remove every ready range of ``tag`` and return them (a disabled tag's
        list). On an error they may or may not be gone: the caller calls again."""
        keys = [self.keys.pool(tag)] + ([] if self.legacy is None else [self.legacy.pool(tag)])
        texts = await self._call(self._take_all, keys, [])
        return [IdRange.from_text(t) for t in texts]

    async def forget_periods(self, tags: Sequence[str]) -> None:
        """Delete the ``:stats`` and ``:clean`` keys of period rows that ended (their
        lists were emptied by take_all); their ``:hwm`` stays, with the ledger row."""
        if not tags:
            return
        async with self.client.pipeline(transaction=False) as pipe:
            for tag in tags:
                pipe.delete(self.keys.stats(tag))
                pipe.delete(self.keys.clean(tag))
            await self._plain(pipe.execute())

    async def high_water(self, tag: str) -> int:
        if self.legacy is None:
            values = [await self._plain(self.client.get(self.keys.hwm(tag)))]
        else:  # the old layout's mark counts until every node raises both
            keys = [self.keys.hwm(tag), self.legacy.hwm(tag)]
            values = await self._plain(self.client.mget(keys))
        return max((int(v) for v in values if v), default=0)

    async def high_water_to_claim(self, tag: str) -> int:
        """The mark, as high_water(); with IDPOOL_REDIS_MARK_REPLICAS set, read in
        one script with the replicas online on the tag's primary, and TooFewReplicas
        when fewer are online than a raise needs: the claim is not made, so no range
        is wasted on a raise that would be refused."""
        if not self._mark_replicas:
            return await self.high_water(tag)
        keys = [self.keys.hwm(tag)] + ([] if self.legacy is None else [self.legacy.hwm(tag)])
        online, *values = await self._call(self._read_hwm, keys, [])
        if int(online) < self._mark_replicas:
            raise _short_of_replicas(int(online), self._mark_replicas)
        return max((int(v) for v in values if v), default=0)

    async def fence_format(self, tag: str, fingerprint: str, *, serving: bool = False) -> str:
        """Record (or check) the format a tag of this name renders with, beside its
        high-water mark: 'same', 'set', 'other', 'unformatted' or a kind's name (see
        _FENCE_FORMAT; tag_rules.fence_refused, used_as)."""
        keys = [self.keys.format(tag), self.keys.hwm(tag)]
        keys += [self.keys.workers(tag), self.keys.worker_lease(tag)]
        args = [format_record(fingerprint), "1" if serving else "0", WORKER_KEYS_KIND]
        if not self._mark_replicas or not fingerprint or serving:
            # Serving checks a live row against the record (the row is the truth: a
            # record a failover lost is written back at the next check), so it need
            # not wait for replicas: too few of them stop claims, not serving. A
            # plain name's record is not waited for either: a plain tag is made with
            # Redis short of replicas (or down), as before records.
            found, _ = await self._call(self._fence_format, keys, args)
            return str(found)
        # As a raise of the mark: the fingerprint counts only once the replicas
        # IDPOOL_REDIS_MARK_REPLICAS asks for have it (WAIT on the script's connection),
        # or a Sentinel failover could lose it while the tag is served.
        if isinstance(self.client, RedisCluster):
            found, online, acked = await self._plain(
                on_one_connection(
                    self.client,
                    keys[0],
                    self._fence_format,
                    keys,
                    args,
                    self._mark_replicas,
                    self._wait_ms(),
                )
            )
        else:
            found, online, acked = await self._plain(
                self._run_and_wait(self._fence_format, keys, args)
            )
        if found in ("same", "set"):  # written: it counts only as a raise would
            _check_acknowledged(
                online, acked, self._mark_replicas, self._wait_ms(), "format fingerprint"
            )
        return str(found)

    async def unfence_format(self, tag: str, fingerprint: str) -> None:
        """Take back a fingerprint this process set for a tag it then did not make."""
        record = format_record(fingerprint)
        await self._call(self._unfence_format, [self.keys.format(tag)], [record])

    async def fence_state(self, tag: str, floor: int) -> int:
        """Before the row of a tag whose kind's rules say ``fences_state`` (strict) is
        made: drop the state (the counter, pool/strict.py) an earlier tag of the name
        left, and refuse any later refill whose claim starts below ``floor`` (the new
        start, the mark). Returns the floor kept (never lowered)."""
        return int(await self._call(self._fence_state, [self.keys.strict(tag)], [str(floor)]))

    async def raise_high_water(self, tag: str, value: int) -> int:
        """Raise the tag's mark to ``value`` (never lower it). With replicas to wait
        for (IDPOOL_REDIS_MARK_REPLICAS), it counts only once that many replicas have
        it, whether the primary sees them online or not: a failover to a replica
        without it would leave ranges already served above the shared mark. Raises
        TooFewReplicas when fewer acknowledged (the mark is on the primary only)."""
        if isinstance(self.client, RedisCluster):
            return await self._raise_on_shard(self.client, tag, value)
        keys = [self.keys.hwm(tag)] + ([] if self.legacy is None else [self.legacy.hwm(tag)])
        if not self._mark_replicas:
            mark, _ = await self._call(self._raise_hwm, keys, [str(value)])
            return int(mark)
        return int(await self._plain(self._raise_and_wait(keys, value)))

    def replica_wait_ms(self) -> int:
        """How long a WAIT for replicas may block (half the store timeout)."""
        return self._wait_ms()

    def _wait_ms(self) -> int:
        return max(1, int(self._slot_wait * 500))  # half the store timeout: WAIT answers first

    async def _run_and_wait(
        self, script: Lua, keys: list[str], args: list[str]
    ) -> tuple[str, int, int | None]:
        """A script answering {value, replicas online}, then WAIT (see _wait_on), on
        one held connection (see _raise_and_wait). Returns (value, online, acknowledged)."""
        assert isinstance(self.client, aioredis.Redis)
        one = aioredis.Redis(
            connection_pool=self.client.connection_pool, single_connection_client=True
        )
        try:
            value, online = await run_script(one, script, keys, args)
            return str(value), int(online), await self._wait_on(one, int(online))
        finally:
            await one.aclose()

    async def _raise_and_wait(self, keys: list[str], value: int) -> str:
        # WAIT counts only the writes of its own connection: a WAIT sent on another
        # pooled connection would answer for that one's writes, not the raise. So
        # both run on one connection, held from the pool (one slot, see _plain).
        # A plain Redis: its aclose gives the connection back and closes nothing else.
        mark, online, acked = await self._run_and_wait(self._raise_hwm, keys, [str(value)])
        _check_acknowledged(online, acked, self._mark_replicas, self._wait_ms())
        return mark

    async def _wait_on(self, one: aioredis.Redis, online: int) -> int | None:
        """WAIT for every replica the setting wants, whether online or not: a
        replica cut off from the primary (which then forgets it) may still be
        promoted, so "none online, none to wait for" would let a raise count on
        no replica. With fewer online than wanted nothing could acknowledge in
        time: None, not waited for (the raise is refused at once)."""
        if online < self._mark_replicas:
            return None
        return int(await one.wait(self._mark_replicas, self._wait_ms()))

    async def _raise_on_shard(self, client: RedisCluster, tag: str, value: int) -> int:
        """The raise, then its WAIT, on one connection to the primary of the tag's
        shard: WAIT counts the replicas of that shard that have this connection's
        writes, and the shard must have as many as the setting wants."""
        key = self.keys.hwm(tag)
        mark, online, acked = await self._plain(
            on_one_connection(
                client,
                key,
                self._raise_hwm,
                [key],
                [str(value)],
                self._mark_replicas,
                self._wait_ms(),
            )
        )
        if self._mark_replicas:
            _check_acknowledged(online, acked, self._mark_replicas, self._wait_ms())
        return int(mark)

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

    async def take_moved(self) -> Moved:
        """The tags that moved since the last call (read and emptied at once)."""
        if self._moved_task is not None and not self._moved_task.done():
            # this process's own marks first (they are sent apart from the pops)
            with contextlib.suppress(Exception):
                await asyncio.wait_for(asyncio.shield(self._moved_task), self._slot_wait)
        tags = await self._call(self._take_moved, [self.keys.moved], [])
        return Moved(sorted(tags), tagged_ranges(await self._clean_new_incarnations()))

    async def _clean_new_incarnations(self) -> list[str]:
        """Clean every list of a server that is a new incarnation since the last
        look (a restart, a failover; any server at the first look): nodes may live
        on their reserve for a while, and a list not cleaned yet would read as full.

        One small script per primary each tick; a SCAN of the server's lists and
        a GET of each one's marker only when its incarnation changed."""
        dropped: list[str] = []
        servers: list[Any] = (
            self.client.get_primaries() if isinstance(self.client, RedisCluster) else [None]
        )
        for server in servers:
            name = "" if server is None else server.name
            here = str(await self._plain(self._incarnation_of(server)))
            if self._seen.get(name) == here:
                continue
            dropped += await self._clean_server(server, here)
            self._seen[name] = here
        return dropped

    async def _scan(self, match: str, server: Any = None) -> set[str]:
        """Every key matching ``match`` (on one server of a cluster, or on all)."""
        options: dict[str, Any] = {} if server is None else {"target_nodes": server}
        return {key async for key in self.client.scan_iter(match=match, count=1000, **options)}

    async def _incarnation_of(self, server: Any) -> Any:
        """The incarnation script on one server (by SHA; its text only after NOSCRIPT)."""
        options: dict[str, Any] = {} if server is None else {"target_nodes": server}
        script = self._incarnation
        try:
            return await self.client.execute_command("EVALSHA", script.sha, 0, **options)
        except NoScriptError:
            return await self.client.execute_command("EVAL", script.text, 0, **options)

    async def _clean_server(self, server: Any, here: str) -> list[str]:
        head, tail = len(self.keys.tag_prefix) + 1, len("}:pool")
        lists = await self._plain(self._scan(self.keys.pool("*"), server))
        tags = {key[head : len(key) - tail] for key in lists}
        old_tags: set[str] = set()
        if self.legacy is not None:  # the old layout's lists move in when touched
            start = len(self.legacy.pool(""))
            old_tags = {key[start:] for key in await self._plain(self._scan(self.legacy.pool("*")))}
        dropped: list[str] = []
        ordered = sorted(tags | old_tags)
        for first in range(0, len(ordered), 500):
            chunk = ordered[first : first + 500]
            async with self.client.pipeline(transaction=False) as pipe:
                for tag in chunk:
                    pipe.get(self.keys.clean(tag))
                markers = await self._plain(pipe.execute())
            for tag, marker in zip(chunk, markers, strict=True):
                if marker != here or tag in old_tags:
                    keys, old, args = self._tag_args(tag)
                    dropped += await self._call(self._touch, keys + old, args)
        return dropped

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
        ids, seconds = await self._call(self._take_lifetime, [self.keys.stats(tag)], [])
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


# A replica acknowledges its offset every second; one whose last acknowledgement is
# older (frozen, stalled) is not counted, as if it were not online: a raise then is
# refused at once (no claim made, no WAIT held on the request path) and the probe
# reports claims stopped. The scripts above count the same way (the "2" in them).
_ACK_LAG_SECONDS = 2


def _replicas_online(info: Mapping[str, Any]) -> int:
    """Replicas in ``state=online`` that acknowledged within _ACK_LAG_SECONDS, in a
    parsed INFO replication (as the raise script counts them)."""
    return sum(
        1
        for name, replica in info.items()
        if name.startswith("slave")
        and isinstance(replica, dict)
        and replica.get("state") == "online"
        and int(replica.get("lag", 0)) <= _ACK_LAG_SECONDS
    )


def _short_of_replicas(online: int, wanted: int) -> TooFewReplicas:
    return TooFewReplicas(
        0,
        wanted,
        online,
        f"only {online} of {wanted} replicas online as the primary sees them "
        "(IDPOOL_REDIS_MARK_REPLICAS): no high-water raise can count, so no claim is "
        "made until enough replicas are back",
    )


def _check_acknowledged(
    online: int, acked: int | None, wanted: int, ms: int, what: str = "high-water mark"
) -> None:
    """Raise TooFewReplicas unless ``wanted`` replicas acknowledged the write
    (``acked`` None: fewer were online than wanted, not waited for)."""
    if acked is None:
        raise _short_of_replicas(online, wanted)
    if acked < wanted:
        raise TooFewReplicas(
            acked,
            wanted,
            online,
            f"{what} reached {acked} of {wanted} replicas in {ms} ms (IDPOOL_REDIS_MARK_REPLICAS)",
        )


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
