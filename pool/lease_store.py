"""Client leases in Redis: which ranges a client holds, and their one-time return.

A node leases whole ranges to client libraries (``POST /lease/{tag}``). Each lease
is recorded under ``idpool:{R}:leased:{run_id}:{replid}:{lease_id}`` (see
``pool/keys.py``; ``R`` is a short string in the tag's slot, which the lease id
ends with, so a return naming only the lease reaches the tag's shard) with a TTL,
so that a return (``POST /lease/return``) is taken only for a range idpool
really leased, and only once:

- a record is ``"L tag first last end hash"`` while the lease is out, and becomes
  the tombstone ``"R tag first last end hash from"`` in the same script that
  pushes the returned tail ``from-last`` to the head of the tag's pool list; a
  second return finds the tombstone and is refused (``already_returned``),
  changing nothing;
- ``hash`` is the SHA-256 of the lease's *secret*, which only the lease answer
  carries (never a log, a record or a page): a return must show it, so knowing a
  lease id (the key's name, say) is not enough to return someone's lease. The
  script compares the hashes in constant time. Logs name a lease by its
  ``fingerprint`` (a hash of its id), never by its id or secret;
- the key names the Redis *incarnation*, computed in the script exactly as the
  pool scripts' ``PRELUDE`` does. A Redis restored from an old snapshot (or a
  promoted replica) is a new incarnation: it cannot see the records of the old
  one, so a lease returned before the data loss cannot be returned again (its
  record in the snapshot still says "L"), and its tail cannot reach the list twice.

Numbers stay decimal strings inside Lua (doubles lose 64-bit precision): ``end``
(``last + 1``) is computed in Python and stored beside ``last``.
"""

from __future__ import annotations

import hashlib
import secrets
from collections.abc import Awaitable, Callable, Sequence
from typing import Any, NamedTuple

from redis.exceptions import RedisError

from .cluster import Client
from .errors import LeaseClash, LeaseRefused, StoreUnavailable
from .keys import Keys, Legacy, lease_route, route_of
from .ranges import IdRange, TaggedRange, tagged_ranges

# The incarnation check of the pool scripts, shared so both compute it the same way.
from .redis_base import Lua, run_script
from .redis_incarnation import PRELUDE

# A secret's hash against the one recorded, in every script that checks one (the
# client leases' here, the worker leases' in pool/worker_store.py).
SAME_LUA = """
local function same(a, b)  -- constant time: how long it takes says nothing of where they differ
  if #a ~= #b then return false end
  local diff = 0
  for i = 1, #a do diff = bit.bor(diff, bit.bxor(string.byte(a, i), string.byte(b, i))) end
  return diff == 0
end
"""

# KEYS[1] = the tag's clean marker, KEYS[2] = its pool list, KEYS[3] = the lease
# route key (never written: it takes the script to the tag's shard), KEYS[4] = the
# old layout's list (single Redis); ARGV[1] = tag, ARGV[2] = old clean prefix (the
# prelude's), ARGV[3] = leased-record prefix, ARGV[4] = TTL seconds, ARGV[5] = k,
# ARGV[6..5+k] = the rest ('first-last', in serving order), ARGV[6+k..] = lease_id,
# first, last, end, secret hash, lease_id, ... Returns {dropped, n recorded}.
_RECORD = (
    PRELUDE
    + """
local dropped = ensure_clean(KEYS[1], KEYS[2], ARGV[1], KEYS[4], ARGV[2])
local base = ARGV[3] .. incarnation() .. ':'
local k = tonumber(ARGV[5])
local leases = 6 + k
-- SET NX: a record is written once; a (vanishingly unlikely) id clash fails the
-- whole lease instead of overwriting another client's record.
for i = leases, #ARGV, 5 do
  if redis.call('EXISTS', base .. ARGV[i]) == 1 then return {dropped, -1} end
end
-- The rest of the ranges cut for this lease goes back to the head of the list in
-- the script that records the lease: it is in the list (once) exactly when the
-- lease is recorded, and after ensure_clean, so a new incarnation cannot hold it twice.
for i = 5 + k, 6, -1 do redis.call('LPUSH', KEYS[2], ARGV[i]) end
local n = 0
for i = leases, #ARGV, 5 do
  local value = 'L ' .. ARGV[1] .. ' ' .. ARGV[i + 1] .. ' ' .. ARGV[i + 2] .. ' ' .. ARGV[i + 3]
    .. ' ' .. ARGV[i + 4]
  redis.call('SET', base .. ARGV[i], value, 'EX', ARGV[4])
  n = n + 1
end
return {dropped, n}
"""
)

# KEYS[1] = the lease route key (the record's slot, which is its tag's slot);
# ARGV[1] = key prefix (the tag's keys are ARGV[1] .. '{tag}:...', built here from
# the record, in the same slot), ARGV[2] = leased-record prefix, ARGV[3] = TTL
# seconds, ARGV[4] = tag the caller names ('' for any), ARGV[5] = lease_id,
# ARGV[6] = from (first unused ID, decimal), ARGV[7] = the old layout's key prefix
# ('' on a cluster: its lists and clean markers are taken in by ensure_clean),
# ARGV[8] = the secret's hash. Returns {dropped, verdict, tag, pushed 'from-last' or ''}.
_RETURN = (
    PRELUDE
    + SAME_LUA
    + """
local function le(a, b)  -- a <= b for decimal strings without leading zeros
  return #a < #b or (#a == #b and a <= b)
end
local key = ARGV[2] .. incarnation() .. ':' .. ARGV[5]
local record = redis.call('GET', key)
if not record then return {{}, 'unknown_lease', '', ''} end
local state, tag, first, last, stop, hash =
  string.match(record, '^(%a) (%S+) (%d+) (%d+) (%d+) (%x+)')
-- The secret first: a caller without it learns nothing more (not even the tag).
-- A record without a hash (made before secrets) cannot be returned: waste, never a hole.
if not hash or not same(hash, ARGV[8]) then return {{}, 'wrong_secret', '', ''} end
local old_list, old_clean = nil, ''
if ARGV[7] ~= '' then old_list, old_clean = ARGV[7] .. 'pool:' .. tag, ARGV[7] .. 'clean:' end
local list = ARGV[1] .. '{' .. tag .. '}:pool'
local dropped = ensure_clean(ARGV[1] .. '{' .. tag .. '}:clean', list, tag, old_list, old_clean)
if ARGV[4] ~= '' and ARGV[4] ~= tag then return {dropped, 'wrong_tag', tag, ''} end
if state == 'R' then return {dropped, 'already_returned', tag, ''} end
local from = ARGV[6]
if not (le(first, from) and le(from, stop)) then return {dropped, 'outside_lease', tag, ''} end
-- Tombstone, not DEL: a retried return (its first answer lost) must read
-- "already returned", not "unknown". Same script as the push, so a tail can
-- reach the list at most once.
redis.call('SET', key,
  'R ' .. tag .. ' ' .. first .. ' ' .. last .. ' ' .. stop .. ' ' .. hash .. ' ' .. from,
  'EX', ARGV[3])
if from == stop then return {dropped, 'ok', tag, ''} end
local tail = from .. '-' .. last
redis.call('LPUSH', list, tail)
return {dropped, 'ok', tag, tail}
"""
)


def new_lease(tag: str) -> tuple[str, str]:
    """(lease id, secret), 128 random bits each; the id ends with the route to the
    tag's slot (``<token>-<R>``). Only the secret's hash is stored."""
    return f"{secrets.token_urlsafe(16)}-{route_of(tag)}", new_secret()


def new_secret() -> str:
    """128 random bits, URL-safe: what only a holder is given (a client lease's, a
    worker lease's); stores keep ``hash_secret`` of it, logs its ``fingerprint``."""
    return secrets.token_urlsafe(16)


def hash_secret(secret: str) -> str:
    return hashlib.sha256(secret.encode()).hexdigest()


def fingerprint(lease_id: str) -> str:
    """What logs and messages name a lease by: 48 bits of its id's hash, enough
    to match a client's report with a node's log, useless for a return."""
    return hashlib.sha256(lease_id.encode()).hexdigest()[:12]


class Returned(NamedTuple):
    tag: str
    tail: IdRange | None  # pushed to the head of the tag's list; None: nothing left
    dropped: list[TaggedRange]  # abandoned because Redis is a new incarnation


class Recorded(NamedTuple):
    dropped: list[TaggedRange]


class LeaseStore:
    def __init__(
        self,
        client: Client,
        keys: Keys,
        ttl_seconds: int,
        send: Callable[[Any], Awaitable[Any]] | None = None,
        legacy: Legacy | None = None,
    ) -> None:
        self._send = send
        self.client = client
        self.keys = keys
        self.ttl_seconds = ttl_seconds
        self.legacy = legacy  # the old layout's records and lists (a single Redis)
        self._record = Lua.of(_RECORD)
        self._return = Lua.of(_RETURN)

    @staticmethod
    def new_lease_id(tag: str) -> str:
        """A fresh lease id: 128 random bits, then the route to the tag's slot."""
        return new_lease(tag)[0]

    async def record(
        self,
        tag: str,
        leases: Sequence[tuple[str, str, IdRange]],
        rest: Sequence[IdRange] = (),
    ) -> Recorded:
        """Record every (lease_id, secret, range) of one answer, in one script call
        (the secret only as its hash), and push ``rest`` (what was taken for the
        lease beyond what it hands out) back to the head of the tag's list, in
        serving order, in the same call. The ids must come from ``new_lease(tag)``.

        Raises StoreUnavailable (outcome unknown: the caller must not hand the
        ranges out, nor count on ``rest`` being in the list) or LeaseClash
        (nothing written).
        """
        route = route_of(tag)
        keys = [self.keys.clean(tag), self.keys.pool(tag), self.keys.lease_route(route)]
        args = [tag, "", self.keys.leased_prefix(route), str(self.ttl_seconds)]
        if self.legacy is not None:
            keys.append(self.legacy.pool(tag))
            args[1] = self.legacy.clean_prefix
        args += [str(len(rest)), *(r.to_text() for r in rest)]
        for lease_id, secret, r in leases:
            if lease_route(lease_id) != route:
                raise ValueError(f"lease id {fingerprint(lease_id)} does not route to tag {tag!r}")
            args += [lease_id, str(r.start), str(r.end - 1), str(r.end), hash_secret(secret)]
        dropped, n = await self._call(self._record, keys, args)
        if int(n) < 0:
            raise LeaseClash("a lease id is already recorded")
        return Recorded(tagged_ranges(dropped))

    async def give_back(self, lease_id: str, secret: str, start: int, tag: str = "") -> Returned:
        """Close the lease and push [start, end of lease) to the head of its tag's list,
        if ``secret`` is the lease's.

        Raises LeaseRefused (nothing changed) or StoreUnavailable (outcome
        unknown: the client may retry, and a retry after a success is refused
        as ``already_returned``).
        """
        route = lease_route(lease_id)
        old = "" if self.legacy is None else self.legacy.prefix + ":"
        if route is not None:
            key, prefix = self.keys.lease_route(route), self.keys.leased_prefix(route)
        elif self.legacy is not None:  # leased by a node of the old layout
            key, prefix = self.legacy.leased_prefix, self.legacy.leased_prefix
        else:  # no such lease on a cluster
            message = _MESSAGES["unknown_lease"].format(lease=fingerprint(lease_id), tag="")
            raise LeaseRefused("unknown_lease", message)
        args = [self.keys.tag_prefix, prefix, str(self.ttl_seconds), tag, lease_id, str(start), old]
        args.append(hash_secret(secret))
        dropped, verdict, found_tag, tail = await self._call(self._return, [key], args)
        if verdict != "ok":
            message = _MESSAGES[verdict].format(lease=fingerprint(lease_id), tag=found_tag)
            raise LeaseRefused(verdict, message)
        pushed = IdRange.from_text(tail) if tail else None
        return Returned(found_tag, pushed, tagged_ranges(dropped))

    async def _call(self, script: Lua, keys: list[str], args: list[str]) -> Any:
        # Run once, never retried here (the client is built with retries off),
        # through the pool's connection slots when it has them.
        if self._send is not None:
            return await self._send(run_script(self.client, script, keys, args))
        try:
            return await run_script(self.client, script, keys, args)
        except (RedisError, OSError, TimeoutError) as e:
            detail = f"{type(e).__name__}: {e}" if str(e) else type(e).__name__
            raise StoreUnavailable("redis", detail) from e


_MESSAGES = {  # {lease}: the fingerprint, never the id
    "unknown_lease": (
        "lease {lease} is not known: it was never issued, it expired, or Redis restarted "
        "since it was issued; keep nothing, there is nothing to return"
    ),
    "wrong_secret": (
        "secret does not match lease {lease}: send the secret its lease answer gave "
        "(a lease made by a node older than secrets cannot be returned)"
    ),
    "already_returned": "lease {lease} was already returned; nothing more to do",
    "wrong_tag": "lease {lease} belongs to tag {tag!r}, not the tag given",
    "outside_lease": (
        "from must lie in the lease, between its first ID and its last ID + 1 (nothing left)"
    ),
}
