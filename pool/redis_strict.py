"""A strict tag's Redis hash, ``idpool:{tag}:strict``, and its three scripts.

The hash holds ``[next, limit)`` (IDs claimed from the ledger, ready), ``inc``
(the Redis incarnation it was set under), ``floor`` (its fence), the refill
grant and where the consumption rate is measured from. Take, extend and
release are each one script on that one key (the tag's slot), run at most once
(``RedisStrict``); the rules they keep, and the refill that calls them, are in
``pool/strict.py`` (``StrictCounter``).

Numbers cross into Lua as decimal strings and are added and compared digit by
digit there: Lua numbers are doubles, exact only below 2^53.
"""

from __future__ import annotations

import uuid
from typing import Any, NamedTuple

from redis.asyncio import Redis
from redis.asyncio.cluster import RedisCluster

from .cluster import run_then_wait
from .ranges import IdRange
from .redis_base import Lua, run_script
from .redis_incarnation import INCARNATION_LUA
from .redis_pool import RedisPool
from .sentinel import named_master_by_majority

# Decimal strings without leading zeros: compare by length, then by text; add
# digit by digit.
_DECIMAL_LUA = """
local function lt(a, b)
  if #a ~= #b then return #a < #b end
  return a < b
end
local function add(a, b)
  local out, carry, i, j = {}, 0, #a, #b
  while i > 0 or j > 0 or carry > 0 do
    local d = carry
    if i > 0 then d = d + string.byte(a, i) - 48; i = i - 1 end
    if j > 0 then d = d + string.byte(b, j) - 48; j = j - 1 end
    carry = 0
    if d >= 10 then d, carry = d - 10, 1 end
    out[#out + 1] = d
  end
  local s = {}
  for k = #out, 1, -1 do s[#s + 1] = out[k] end
  return table.concat(s)
end
local function now_ms()
  local t = redis.call('TIME')
  return tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
end
-- KEYS[1] = the strict hash. Take `want` IDs from a state of incarnation `inc`:
-- {first taken or false, next, limit} (next and limit false: no state of `inc`).
-- On a cluster: the replicas this server's own cluster config lists for it (a
-- take here is confirmed by WAIT for all of them). Those it flagged `fail` too:
-- its view is frozen while it is paused, and a replica it flagged may since have
-- come back and been promoted (a review: a paused replica, then a paused primary,
-- answered 17-24 after the promoted replica answered 1001).
local function replicas_known()
  return #redis.call('CLUSTER', 'REPLICAS', redis.call('CLUSTER', 'MYID'))
end
local function take(inc, want)
  local s = redis.call('HMGET', KEYS[1], 'next', 'limit', 'inc')
  if s[3] ~= inc then return {false, false, false} end
  if want == '0' then return {false, s[1], s[2]} end
  local after = add(s[1], want)
  if lt(s[2], after) then return {false, s[1], s[2]} end
  redis.call('HSET', KEYS[1], 'next', after)
  return {s[1], after, s[2]}
end
"""

# ARGV[1] = IDs wanted, ARGV[2] = the low-water mark (IDs), ARGV[3] = how long a
# refill grant lasts (ms), ARGV[4] = who asks (a process's random id), ARGV[5] =
# '1' on a Redis Cluster (count the replicas a take must be confirmed by). The
# incarnation check and the take are one script: no take can reach a state set
# under an older incarnation (one a restored snapshot or a promoted replica
# brought back). When the state did not hold the batch, or holds less than the
# low-water mark after it, the caller is granted the refill unless another
# caller holds an unexpired grant: one refill at a time for the cluster, so
# nodes do not claim and race each other (the grant is a hint against waste
# only; the extend script's rules keep the order whatever it says). The holder
# of a grant is granted again (its refill failed: it tries again at once).
# Returns {inc, first, next, limit, granted, now ms, since ms, since next,
# replicas to confirm by (0 unless IDs were taken on a cluster)}.
_TAKE = (
    INCARNATION_LUA
    + _DECIMAL_LUA
    + """
local inc = incarnation()
local t = take(inc, ARGV[1])
local now = now_ms()
local granted = 0
if t[1] == false or lt(t[3], add(t[2], ARGV[2])) then
  local g = redis.call('HMGET', KEYS[1], 'refill_until', 'refill_by')
  if tonumber(g[1] or '0') < now or g[2] == ARGV[4] then
    redis.call('HSET', KEYS[1], 'refill_until', tostring(now + tonumber(ARGV[3])),
      'refill_by', ARGV[4])
    granted = 1
  end
end
local since = redis.call('HMGET', KEYS[1], 'since_ms', 'since_next')
local confirm = 0
if t[1] and ARGV[5] == '1' then confirm = replicas_known() end
return {inc, t[1], t[2], t[3], granted, tostring(now), since[1], since[2], confirm}
"""
)

# ARGV[1] = the incarnation seen before the claim, ARGV[2] = the claim's first
# ID, ARGV[3] = its end (exclusive), ARGV[4] = IDs to take after ('0': none),
# ARGV[5] = '1' on a Redis Cluster (as for a take).
# The check of the incarnation seen, the extension and the take are one script:
# a claim made before a restart or failover can never enter the new state.
# Returns {inc, first, next, limit, how, lost next, lost limit, replicas to confirm by}.
_EXTEND = (
    INCARNATION_LUA
    + _DECIMAL_LUA
    + """
local inc = incarnation()
local how, lost_next, lost_limit = 'moved', false, false
if inc == ARGV[1] then
  local s = redis.call('HMGET', KEYS[1], 'next', 'limit', 'inc', 'floor')
  if s[3] ~= inc and s[4] and lt(ARGV[2], s[4]) then
    -- below the floor the tag's (re-)creation set (RedisPool.fence_state): claimed
    -- for an earlier tag of the name, before its removal
    how = 'fenced'
  elseif s[3] ~= inc then
    how = 'replaced'
    if s[1] and s[2] then lost_next, lost_limit = s[1], s[2] end
    redis.call('HSET', KEYS[1], 'next', ARGV[2], 'limit', ARGV[3], 'inc', inc)
  elseif lt(ARGV[2], s[2]) then
    how = 'refused'
  elseif ARGV[2] == s[2] then
    how = 'extended'
    redis.call('HSET', KEYS[1], 'limit', ARGV[3])
  else
    how = 'jumped'
    lost_next, lost_limit = s[1], s[2]
    redis.call('HSET', KEYS[1], 'next', ARGV[2], 'limit', ARGV[3])
  end
  if how ~= 'refused' and how ~= 'fenced' then
    -- where the consumption rate is measured from, for the next refill's size:
    -- a window of a second at least (a new one after a replace or a jump, whose
    -- next moved by more than what was handed out)
    local t = now_ms()
    local since = tonumber(redis.call('HGET', KEYS[1], 'since_ms') or '0')
    if how ~= 'extended' or t - since >= 1000 then
      redis.call('HSET', KEYS[1], 'since_ms', tostring(t),
        'since_next', redis.call('HGET', KEYS[1], 'next'))
    end
  end
  redis.call('HDEL', KEYS[1], 'refill_until', 'refill_by')
end
local t = take(inc, ARGV[4])
local confirm = 0
if t[1] and ARGV[5] == '1' then confirm = replicas_known() end
return {inc, t[1], t[2], t[3], how, lost_next, lost_limit, confirm}
"""
)

# ARGV[1] = who gives its grant back. Only the holder's own grant: one another
# caller holds since (this one's expired) is left alone.
_RELEASE = """
if redis.call('HGET', KEYS[1], 'refill_by') == ARGV[1] then
  return redis.call('HDEL', KEYS[1], 'refill_until', 'refill_by')
end
return 0
"""

_RATE_MIN_SECONDS = 1.0


class StrictAnswer(NamedTuple):
    """What a take (or an extension) found on the server."""

    incarnation: str
    first: int | None  # first of the IDs taken; None: the state did not hold them
    next: int | None  # the state after the call; None: no state of this incarnation
    limit: int | None
    granted: bool = False  # this caller is to refill the state now
    rate: float | None = None  # IDs/s taken from the state since its last refill
    # False: taken on a cluster primary not every replica it knows acknowledged the
    # take for (WAIT); maybe a deposed one, so never answered (RedisStrict.take)
    confirmed: bool = True

    @property
    def left(self) -> int:
        """IDs ready in the state after the call."""
        return 0 if self.next is None or self.limit is None else self.limit - self.next


class Extension(NamedTuple):
    answer: StrictAnswer
    how: str  # replaced, extended, jumped, refused, fenced or moved
    lost: IdRange | None  # the rest of a state given up (jumped, or replaced)


def _int(value: str | None) -> int | None:
    return None if value is None else int(value)


def _answer(raw: list[str | None]) -> StrictAnswer:
    inc, first, nxt, limit = raw[:4]
    assert inc is not None
    return StrictAnswer(inc, _int(first), _int(nxt), _int(limit))


class RedisStrict:
    """The two strict scripts, run as every pool command runs (at most once)."""

    name = "redis"

    def __init__(self, pool: RedisPool) -> None:
        self.pool = pool
        self.keys = pool.keys
        self._take = Lua.of(_TAKE)
        self._extend = Lua.of(_EXTEND)
        self._release = Lua.of(_RELEASE)

    async def _run(self, script: Lua, tag: str, args: list[str]) -> tuple[list[Any], bool]:
        """The script's reply, and whether the IDs it took (if any) are confirmed.

        On a Redis Cluster a primary paused past its failover (SIGSTOP, a VM
        freeze, a healed partition) runs the commands queued on its sockets
        before the cluster bus tells it that its replica was promoted: a node
        whose slot map is stale would answer IDs from the old state, below IDs
        the promoted replica already answered. So a take there counts only once
        every replica the primary itself knows of (its own cluster config, failed
        ones too) acknowledged it: ``WAIT`` on the script's connection. A
        promoted replica no longer replicates from the old primary, so its takes
        are never confirmed. No Sentinel majority plays this role on a cluster;
        the replicas are the cluster's own witnesses of who is primary."""
        key = self.keys.strict(tag)
        client = self.pool.client
        if not isinstance(client, RedisCluster):
            return await self.pool.send(run_script(client, script, [key], args)), True
        ms = self.pool.replica_wait_ms()
        raw, acked = await self.pool.send(
            run_then_wait(client, key, script, [key], [*args, "1"], lambda r: int(r[-1]), ms)
        )
        return raw, acked is None or acked >= int(raw[-1])

    async def take(
        self, tag: str, n: int, low: int = 0, grant_ms: int = 4000, asker: str = ""
    ) -> StrictAnswer:
        """Take ``n`` IDs if the state of this incarnation holds them; ask for the
        refill (as ``asker``) when it did not, or holds under ``low`` after.
        Raises StoreUnavailable (the take may have happened: its IDs are lost)."""
        args = [str(n), str(low), str(grant_ms), asker or uuid.uuid4().hex]
        raw, confirmed = await self._run(self._take, tag, args)
        answer = _answer(raw)._replace(confirmed=confirmed)
        rate = None
        if raw[6] is not None and raw[7] is not None and answer.next is not None:
            # over a second at least: a grant a few ms after a refill must not read
            # a burst of one batch as the tag's rate (and claim minutes of it)
            elapsed = max(_RATE_MIN_SECONDS, (int(raw[5]) - int(raw[6])) / 1000)
            rate = (answer.next - int(raw[7])) / elapsed
        return answer._replace(granted=raw[4] == 1, rate=rate)

    async def extend(self, tag: str, seen: str, claimed: IdRange, n: int) -> Extension:
        """Add ``claimed`` (claimed after seeing incarnation ``seen``) to the state,
        then take ``n`` IDs if it holds them."""
        args = [seen, str(claimed.start), str(claimed.end), str(n)]
        raw, confirmed = await self._run(self._extend, tag, args)
        lost = None
        if raw[5] is not None and raw[6] is not None and int(raw[5]) < int(raw[6]):
            lost = IdRange(int(raw[5]), int(raw[6]))
        return Extension(_answer(raw)._replace(confirmed=confirmed), str(raw[4]), lost)

    async def release(self, tag: str, asker: str) -> None:
        """Give back ``asker``'s refill grant (its refill failed): another node may
        refill at once instead of waiting for the grant to expire."""
        key = self.keys.strict(tag)
        await self.pool.send(run_script(self.pool.client, self._release, [key], [asker]))

    async def from_master(self, incarnation: str) -> bool:
        """Whether the server a call ran on (its incarnation) is the master most
        Sentinels name, asked after the call; always True without Sentinel (on a
        cluster the shard's replicas confirm each take instead: see _run)."""
        client = self.pool.client
        if not isinstance(client, Redis):
            return True
        named = await named_master_by_majority(client, incarnation.split(":")[0])
        return named is not False

    async def state(self, tag: str) -> dict[str, str]:
        """The hash as it is (next, limit, inc, ...); empty when there is none."""
        found = await self.pool.send(self.pool.client.hgetall(self.keys.strict(tag)))
        return dict(found)
