"""The Redis pool's fences: per tag, the high-water mark, the name's record, the strict state.

The high-water mark is the highest range end ever claimed (``HighWaterMarks``):
raised before a claim counts, never lowered. With IDPOOL_REDIS_MARK_REPLICAS a
raise (and a format's record) counts only once that many replicas have it
(WAIT on the script's own connection), so a failover cannot lose it.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import redis.asyncio as aioredis
from redis.asyncio.cluster import RedisCluster

from .cluster import on_one_connection
from .errors import TooFewReplicas
from .redis_base import Lua, RedisCore, run_script
from .tag_rules import WORKER_KEYS_KIND, format_record

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


class RedisMarks(RedisCore):
    """Raise and read the mark, record a name's format, fence a strict tag's state."""

    _raise_hwm = Lua.of(_RAISE_HWM)
    _read_hwm = Lua.of(_READ_HWM)
    _fence_format = Lua.of(_FENCE_FORMAT)
    _unfence_format = Lua.of(_UNFENCE_FORMAT)
    _fence_state = Lua.of(_FENCE_STATE)

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
