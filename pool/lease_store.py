"""Client leases in Redis: which ranges a client holds, and their one-time return.

A node leases whole ranges to client libraries (``POST /lease/{tag}``). Each lease
is recorded under ``idpool:leased:{run_id}:{replid}:{lease_id}`` (see
``pool/keys.py``) with a TTL, so that a return (``POST /lease/return``) is taken
only for a range idpool really leased, and only once:

- a record is ``"L tag first last end"`` while the lease is out, and becomes the
  tombstone ``"R tag first last end from"`` in the same script that pushes the
  returned tail ``from-last`` to the head of the tag's pool list; a second return
  finds the tombstone and is refused (``already_returned``), changing nothing;
- the key names the Redis *incarnation*, computed in the script exactly as the
  pool scripts' ``_PRELUDE`` does. A Redis restored from an old snapshot (or a
  promoted replica) is a new incarnation: it cannot see the records of the old
  one, so a lease returned before the data loss cannot be returned again (its
  record in the snapshot still says "L"), and its tail cannot reach the list twice.

Numbers stay decimal strings inside Lua (doubles lose 64-bit precision): ``end``
(``last + 1``) is computed in Python and stored beside ``last``.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Sequence
from typing import Any, NamedTuple

import redis.asyncio as aioredis
from redis.exceptions import RedisError

from .errors import LeaseClash, LeaseRefused, StoreUnavailable
from .keys import Keys
from .ranges import IdRange

# The incarnation check of the pool scripts, shared so both compute it the same way.
from .redis_pool import _PRELUDE

# KEYS[1] = pools set, KEYS[2] = incarnation key (the prelude's);
# ARGV[1] = clean-marker prefix, ARGV[2] = pool-list prefix (the prelude's),
# ARGV[3] = leased-record prefix, ARGV[4] = TTL seconds, ARGV[5] = tag,
# ARGV[6..] = lease_id, first, last, end, lease_id, first, ... Returns {dropped, n recorded}.
_RECORD = (
    _PRELUDE
    + """
local dropped = ensure_clean()
local base = ARGV[3] .. incarnation() .. ':'
-- SET NX: a record is written once; a (vanishingly unlikely) id clash fails the
-- whole lease instead of overwriting another client's record.
for i = 6, #ARGV, 4 do
  if redis.call('EXISTS', base .. ARGV[i]) == 1 then return {dropped, -1} end
end
local n = 0
for i = 6, #ARGV, 4 do
  local value = 'L ' .. ARGV[5] .. ' ' .. ARGV[i + 1] .. ' ' .. ARGV[i + 2] .. ' ' .. ARGV[i + 3]
  redis.call('SET', base .. ARGV[i], value, 'EX', ARGV[4])
  n = n + 1
end
return {dropped, n}
"""
)

# Same KEYS and ARGV[1..4]; ARGV[5] = tag the caller names ('' for any),
# ARGV[6] = lease_id, ARGV[7] = from (first unused ID, decimal).
# Returns {dropped, verdict, tag, pushed 'from-last' or ''}.
_RETURN = (
    _PRELUDE
    + """
local function le(a, b)  -- a <= b for decimal strings without leading zeros
  return #a < #b or (#a == #b and a <= b)
end
local dropped = ensure_clean()
local key = ARGV[3] .. incarnation() .. ':' .. ARGV[6]
local record = redis.call('GET', key)
if not record then return {dropped, 'unknown_lease', '', ''} end
local state, tag, first, last, stop = string.match(record, '^(%a) (%S+) (%d+) (%d+) (%d+)')
if ARGV[5] ~= '' and ARGV[5] ~= tag then return {dropped, 'wrong_tag', tag, ''} end
if state == 'R' then return {dropped, 'already_returned', tag, ''} end
local from = ARGV[7]
if not (le(first, from) and le(from, stop)) then return {dropped, 'outside_lease', tag, ''} end
-- Tombstone, not DEL: a retried return (its first answer lost) must read
-- "already returned", not "unknown". Same script as the push, so a tail can
-- reach the list at most once.
redis.call('SET', key, 'R ' .. tag .. ' ' .. first .. ' ' .. last .. ' ' .. stop .. ' ' .. from,
  'EX', ARGV[4])
if from == stop then return {dropped, 'ok', tag, ''} end
local tail = from .. '-' .. last
redis.call('SADD', KEYS[1], tag)
redis.call('LPUSH', ARGV[2] .. tag, tail)
return {dropped, 'ok', tag, tail}
"""
)


class Returned(NamedTuple):
    tag: str
    tail: IdRange | None  # pushed to the head of the tag's list; None: nothing left
    dropped: list[str]  # "tag=first-last" abandoned because Redis is a new incarnation


class Recorded(NamedTuple):
    dropped: list[str]


class LeaseStore:
    def __init__(
        self,
        client: aioredis.Redis,
        keys: Keys,
        ttl_seconds: int,
        send: Callable[[Any], Awaitable[Any]] | None = None,
    ) -> None:
        self._send = send
        self.client = client
        self.keys = keys
        self.ttl_seconds = ttl_seconds
        self._record = client.register_script(_RECORD)
        self._return = client.register_script(_RETURN)

    def _args(self, tag: str) -> tuple[list[str], list[str]]:
        keys = [self.keys.pools, self.keys.incarnation]
        args = [self.keys.clean_prefix, self.keys.pool(""), self.keys.leased_prefix]
        return keys, [*args, str(self.ttl_seconds), tag]

    async def record(self, tag: str, leases: Sequence[tuple[str, IdRange]]) -> Recorded:
        """Record every (lease_id, range) of one answer, in one script call.

        Raises StoreUnavailable (outcome unknown: the caller must not hand the
        ranges out) or LeaseClash.
        """
        keys, args = self._args(tag)
        for lease_id, r in leases:
            args += [lease_id, str(r.start), str(r.end - 1), str(r.end)]
        dropped, n = await self._call(self._record, keys, args)
        if int(n) < 0:
            raise LeaseClash("a lease id is already recorded")
        return Recorded(list(dropped))

    async def give_back(self, lease_id: str, start: int, tag: str = "") -> Returned:
        """Close the lease and push [start, end of lease) to the head of its tag's list.

        Raises LeaseRefused (nothing changed) or StoreUnavailable (outcome
        unknown: the client may retry, and a retry after a success is refused
        as ``already_returned``).
        """
        keys, args = self._args(tag)
        args += [lease_id, str(start)]
        dropped, verdict, found_tag, tail = await self._call(self._return, keys, args)
        if verdict != "ok":
            raise LeaseRefused(verdict, _MESSAGES[verdict].format(lease=lease_id, tag=found_tag))
        pushed = IdRange.from_text(tail) if tail else None
        return Returned(found_tag, pushed, list(dropped))

    async def _call(self, script: Any, keys: list[str], args: list[str]) -> Any:
        # Run once, never retried here (the client is built with retries off),
        # through the pool's connection slots when it has them.
        if self._send is not None:
            return await self._send(script(keys=keys, args=args))
        try:
            return await script(keys=keys, args=args)
        except (RedisError, OSError, TimeoutError) as e:
            detail = f"{type(e).__name__}: {e}" if str(e) else type(e).__name__
            raise StoreUnavailable("redis", detail) from e


_MESSAGES = {
    "unknown_lease": (
        "lease {lease!r} is not known: it was never issued, it expired, or Redis restarted "
        "since it was issued; keep nothing, there is nothing to return"
    ),
    "already_returned": "lease {lease!r} was already returned; nothing more to do",
    "wrong_tag": "lease {lease!r} belongs to tag {tag!r}, not the tag given",
    "outside_lease": (
        "from must lie in the lease, between its first ID and its last ID + 1 (nothing left)"
    ),
}
