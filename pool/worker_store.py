"""Worker IDs of snowflake tags, leased in Redis: one holder per worker ID.

One hash per tag (``idpool:{tag}:workers``, in the tag's slot; see ``keys.py``) and one script for
every change, so grant, renew and release are atomic on the server and timed by
its clock (``TIME``). A grant carries a *generation* claimed from the ledger
first (the tag's ``max_id``, fenced by the high-water mark like any claim): it
names the lease (a renewal must show it). Every hash made here starts with a
quarantine, ``init``'s too; only ``lift``, which ``tag add`` runs after ``init``
once the ledger row shows no generation claimed, clears it, so a new tag serves at
once. The argument (why no worker ID has two holders, even across a Redis that
restarts empty or fails over) is in docs/design/snowflake.md, "Why no worker ID has two holders".

Fields of the hash:

* ``inc``: the Redis incarnation (``run_id:master_replid``) its holders belong to.
* ``q``: server unix ms before which nothing is granted (the quarantine after a
  new incarnation was first seen); ``f``: the time floor of a worker ID with no
  field of its own (set with ``q``).
* ``w:{n}``: ``"gen expires_ms last_ms holder hash ttl_ms"`` for worker ID n: the
  lease's generation (0: free), when it expires unless renewed (also the *ceiling*:
  the grant and each renewal answer it, and the holder makes no ID with a later
  time, so a new grant's floor, at or above it, is above every unit the holder may
  have used whatever its clock did; it never moves earlier), the last time it
  may have used (renewals raise it; a new grant starts above it), who holds it,
  the SHA-256 of the lease's *secret* (none once free), and the lease's TTL:
  every renewal, through whichever node, extends by it (never by the caller's).

``idpool:{tag}:worker_lease`` keeps the largest TTL ever granted for the tag; a
quarantine lasts at least that, and at least the caller's ``quarantine_ms`` (the
tag's lease from the ledger row, which survives a Redis that lost both keys).

The secret is made here at each grant (``new_secret``, as a client lease's in
``lease_store.py``) and given only to the holder (the grant's answer); Redis keeps
its hash. A renewal or a release must show it: the generation alone is the tag's
ledger ``max_id``, which anyone can guess, and a release by someone else would let
the worker ID be granted again while its holder still makes IDs (duplicates).
The script checks the secret before it changes anything.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, NamedTuple

from .errors import StoreUnavailable
from .keys import Keys
from .lease_store import SAME_LUA, hash_secret, new_secret

# KEYS[1] = workers hash, KEYS[2] = the tag's lease key (largest TTL ever granted).
# ARGV[1] = op (init, lift, grant, renew, release), ARGV[2] = lease TTL ms (a grant's; a
# renewal extends by the TTL recorded in the field, whatever the caller's), ARGV[3] =
# quarantine ms (at least the longest lease any node may grant for the tag), ARGV[4] =
# generation; grant, room: ARGV[5] = worker IDs, ARGV[6] = holder, ARGV[7] = the most
# live client leases of the tag (0: a node's grant, no cap; was the "first generation"
# flag, always "0"), ARGV[8] = the secret's hash, ARGV[9] = the most live leases of
# this holder (0: none); renew, release: ARGV[5] =
# worker ID, ARGV[6] = last unix ms used, ARGV[7] = the hash of the secret shown; lift:
# ARGV[5] = the incarnation init saw, ARGV[6] = the quarantine's end init set.
_WORKERS = SAME_LUA + """
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local server = redis.call('INFO', 'server')
local repl = redis.call('INFO', 'replication')
local inc = string.match(server, 'run_id:(%w+)') .. ':' .. string.match(repl, 'master_replid:(%w+)')
local seen = redis.call('HGET', KEYS[1], 'inc')
if ARGV[1] == 'lift' then
  -- Race: a tag-add stalled after its row while a grant claimed a generation, was
  -- granted, and Redis lost the hash; its late init made this one. Lifted only if
  -- it is still the hash init made (same incarnation, same quarantine) and nothing
  -- was granted in it: the caller checked, after init, that the ledger shows no
  -- generation claimed, so every grant still to come claimed after init.
  if seen ~= inc or inc ~= ARGV[5] or redis.call('HGET', KEYS[1], 'q') ~= ARGV[6] then
    return {'kept'}
  end
  for _, name in ipairs(redis.call('HKEYS', KEYS[1])) do
    if name ~= 'inc' and name ~= 'q' and name ~= 'f' then return {'kept'} end
  end
  redis.call('HDEL', KEYS[1], 'q', 'f')
  return {'ok'}
end
-- A client's grant (ARGV[7] > 0): at most ARGV[7] live client leases on the tag (the
-- rest stay for nodes) and ARGV[9] for this holder. Counted in the script that
-- grants: two grants racing count one after the other, never both under the cap.
local function capped()
  local cap, mine = tonumber(ARGV[7]) or 0, tonumber(ARGV[9] or '0') or 0
  if cap <= 0 then return nil end
  local clients, held = 0, 0
  local all = redis.call('HGETALL', KEYS[1])
  for i = 1, #all, 2 do
    if string.sub(all[i], 1, 2) == 'w:' then
      local g, exp, last, who = string.match(all[i + 1], '^(%d+) (%d+) (%d+) (%S+)')
      -- Held, or released with a last time not yet past (the worker ID is kept from
      -- everyone until then, and a release keeps its holder's name): a grant-and-
      -- release loop with a late last time blocked every worker ID of a tag.
      local blocked = (g ~= '0' and tonumber(exp) > now) or (g == '0' and tonumber(last) >= now)
      if blocked and string.sub(who, 1, 7) == 'client:' then
        clients = clients + 1
        if who == ARGV[6] then held = held + 1 end
      end
    end
  end
  if mine > 0 and held >= mine then return {'capped', 'holder', tostring(mine)} end
  if clients >= cap then return {'capped', 'clients', tostring(cap)} end
  return nil
end
-- The read-only check before a client's grant claims its generation. Nothing is
-- written: run before the incarnation block, a quarantine of 0 (its argument)
-- was written as the hash's after a restart, and the grant after it found none.
if ARGV[1] == 'room' then
  if seen ~= inc then return {'ok'} end  -- no holder known here; the grant decides
  return capped() or {'ok'}
end
if seen ~= inc then
  -- A new Redis incarnation (restart, failover, restore from a snapshot), or a
  -- hash never made. Holders granted elsewhere may still be issuing, and none is
  -- known here: keep every floor, drop every holder, and grant nothing for a
  -- quarantine (every old holder fails to renew here and stops before it ends).
  local fields = redis.call('HGETALL', KEYS[1])
  for i = 1, #fields, 2 do
    if string.sub(fields[i], 1, 2) == 'w:' then
      local _, exp, last = string.match(fields[i + 1], '(%d+) (%d+) (%d+)')
      local floor = math.max(tonumber(exp), tonumber(last))
      redis.call('HSET', KEYS[1], fields[i], '0 0 ' .. floor .. ' -')
    end
  end
  -- Every hash made here waits a quarantine, init's too (a tag just made):
  -- whether a grant ran before is not in Redis (the hash was lost), and a
  -- generation's value says nothing of the order grants ran in. `tag add` lifts
  -- init's quarantine (below) only once the ledger shows no generation claimed.
  -- As long as the longest lease any node may have granted: the caller's (the
  -- tag's lease, from the ledger row, or its own setting) or the largest this
  -- Redis saw granted (a hash deleted alone keeps KEYS[2]).
  local longest = math.max(tonumber(ARGV[3]), tonumber(redis.call('GET', KEYS[2]) or '0'))
  local q = now + longest
  local f = math.max(q, tonumber(redis.call('HGET', KEYS[1], 'f') or '0'))
  redis.call('HSET', KEYS[1], 'q', q, 'f', f)
  redis.call('HSET', KEYS[1], 'inc', inc)
  -- init made the hash from nothing: say what it saw, for lift
  if ARGV[1] == 'init' and seen == false and #fields == 0 then
    return {'made', inc, tostring(q)}
  end
end
if ARGV[1] == 'init' then return {'ok'} end
if ARGV[1] == 'grant' then
  local ttl = tonumber(ARGV[2])
  local q = tonumber(redis.call('HGET', KEYS[1], 'q') or '0')
  if now < q then return {'quarantine', tostring(q), tostring(now)} end
  local over = capped()
  if over then return over end
  local base = tonumber(redis.call('HGET', KEYS[1], 'f') or '0')
  for w = 0, tonumber(ARGV[5]) - 1 do
    local v = redis.call('HGET', KEYS[1], 'w:' .. w)
    local floor = nil
    if not v then
      floor = base
    else
      local _, exp, last = string.match(v, '(%d+) (%d+) (%d+)')
      exp, last = tonumber(exp), tonumber(last)
      -- reused only once its lease expired and its last time is past; never below
      -- the last quarantine's end (a field from an older snapshot or a lagging
      -- replica misses the renewals its holder made before the incarnation changed)
      if exp <= now and last < now then floor = math.max(exp, last, base) end
    end
    if floor then
      -- The TTL is the lease's own (the field's last word): every renewal, through
      -- any node, extends by it; and the tag's largest, which a later quarantine covers.
      local v2 = ARGV[4] .. ' ' .. (now + ttl) .. ' ' .. floor .. ' ' .. ARGV[6] .. ' ' ..
        ARGV[8] .. ' ' .. ttl
      redis.call('HSET', KEYS[1], 'w:' .. w, v2)
      if ttl > tonumber(redis.call('GET', KEYS[2]) or '0') then redis.call('SET', KEYS[2], ttl) end
      return {'ok', tostring(w), tostring(floor), tostring(now), tostring(now + ttl), tostring(ttl)}
    end
  end
  return {'full', tostring(now)}
end
local key = 'w:' .. ARGV[5]
local v = redis.call('HGET', KEYS[1], key)
if not v then return {'lost', 'no lease of this worker ID in this Redis'} end
local gen, exp, last, holder, hash, lttl =
  string.match(v, '^(%d+) (%d+) (%d+) (%S+) ?(%x*) ?(%d*)$')
if gen == '0' and exp ~= '0' then
  return {'released', 'the lease was released (by its holder, with its secret): the worker ID ' ..
    'is free; ask for a new one'}
end
if gen ~= ARGV[4] then
  return {'lost', 'the lease is gone (a new Redis incarnation, or expired and granted again)'}
end
-- The secret before any write (a caller without it must not even raise the floor).
-- A lease written before secrets has no hash: nobody can show its secret, so it is
-- never renewed or released here; its holder stops, and the worker ID comes back
-- only once the lease expired and its last time is past (never two holders).
if hash == '' then
  return {'lost', 'the lease was granted before worker secrets (or by an older node): ' ..
    'it cannot be renewed; ask for a new worker ID'}
end
if not same(hash, ARGV[7]) then return {'wrong_secret', 'not the secret of this lease'} end
-- A lease written before TTLs were recorded renews by the caller's TTL (as before).
local ttl = tonumber(lttl ~= '' and lttl or ARGV[2])
-- A last time far past this server's clock would keep the worker ID from everyone
-- until then (10^14 ms: the year 5138). No holder reaches it: it makes no ID past the
-- expiry this script answered it (its ceiling, <= now + ttl), its last unit ends at
-- most a unit (1 s) on; whatever its clock does (a leap stops it at the ceiling).
local bound = now + ttl + 1000
if tonumber(ARGV[6]) > bound then
  return {'bad_last', tostring(bound)}
end
local reported = tonumber(ARGV[6])
if tonumber(exp) <= now then
  -- Expired: its holder made no ID past the expiry (its ceiling), the last unit
  -- ending at most a unit (1 s) on. Taken as said, a late renewal's last time kept
  -- the worker ID from everyone, counted against no cap (one call a TTL per ID
  -- starved a tag: an adversarial run).
  reported = math.min(reported, tonumber(exp) + 1000)
end
last = math.max(tonumber(last), reported)
local tail = ' ' .. last .. ' ' .. holder .. ' ' .. hash .. (lttl ~= '' and (' ' .. lttl) or '')
if tonumber(exp) <= now then
  redis.call('HSET', KEYS[1], key, gen .. ' ' .. exp .. tail)
  return {'lost', 'the lease expired before this renewal'}
end
if ARGV[1] == 'renew' then
  -- Never earlier than it was (a lease written before TTLs were recorded, renewed
  -- through a node with a shorter one); the holder's next deadline counts from ttl.
  local expires = math.max(tonumber(exp), now + ttl)
  redis.call('HSET', KEYS[1], key, gen .. ' ' .. expires .. tail)
  return {'ok', tostring(expires), tostring(now), tostring(ttl)}
end
-- The holder's name stays: until its last time is past the worker ID is kept from
-- everyone, and counts against that holder's caps (capped).
redis.call('HSET', KEYS[1], key, '0 ' .. now .. ' ' .. last .. ' ' .. holder)
return {'ok', tostring(now), tostring(now), tostring(ttl)}
"""


# The script's numbers print exactly below 10^14 (Lua's %.14g; unix ms of the year
# 5138): a larger last time would be kept as 9.2e+18, which the fields' pattern
# reads back as 9 (the worker ID granted again below what its holder claimed).
MAX_LAST_MS = 10**14 - 1


@dataclass(frozen=True)
class Grant:
    worker: int
    generation: int
    floor_ms: int  # no ID may use this time or earlier (the previous holder's last)
    server_ms: int
    expires_ms: int  # server time; the holder stops earlier by its own clock
    # shown by the holder to renew or release; only its hash is in Redis. Never in
    # a repr, a log (which name it by ``fingerprint``), /status or the metrics.
    secret: str = field(default="", repr=False)
    ttl_ms: int = 0  # the lease's TTL as Redis recorded it: every renewal extends by it


class Made(NamedTuple):
    """A hash ``init`` made from nothing: its incarnation and quarantine's end
    (server unix ms), as the script wrote them; ``lift`` checks both."""

    incarnation: str
    quarantine: str


class Renewed(NamedTuple):
    """A renewal's (or release's) answer, in the Redis server's ms."""

    expires_ms: int
    server_ms: int
    ttl_ms: int  # the lease's recorded TTL: the holder's deadline counts from it


class WorkerRefused(Exception):
    """No worker ID now: ``why`` is ``quarantine``, ``full`` or ``lost``; or, for a
    renewal or release, ``released`` (the lease was given back already) or
    ``wrong_secret`` (nothing changed: the caller is not the holder)."""

    def __init__(self, why: str, message: str, retry_ms: int = 0) -> None:
        super().__init__(message)
        self.why = why
        self.retry_ms = retry_ms


class LastTooLate(ValueError):
    """A renewal or release whose ``last_ms`` is past the Redis server's clock by
    more than the lease's TTL and a unit (``bound_ms``): refused, nothing changed.
    No holder within the clock assumptions reaches it; taken, it would keep the
    worker ID from everyone until then."""

    def __init__(self, last_ms: int, bound_ms: int) -> None:
        super().__init__(
            f"last_ms {last_ms} is past the Redis server's clock plus the lease's TTL and a "
            f"unit: at most {bound_ms} now (is this machine's clock far ahead?)"
        )
        self.last_ms = last_ms
        self.bound_ms = bound_ms


CLIENT = "client:"  # the holder field of a client's lease starts with it (counted by caps)


@dataclass(frozen=True)
class ClientCaps:
    """Bounds on the worker IDs of one tag that clients hold at once (POST /worker):
    ``share`` of the tag's worker IDs at most (the rest stay for nodes, which serve
    /id), and ``per_holder`` for one holder name (0: no such cap)."""

    share: float
    per_holder: int

    def most(self, workers: int) -> int:
        """The most client leases a tag of ``workers`` worker IDs takes at once."""
        return max(1, int(workers * self.share))

    def args(self, holder: str, workers: int) -> tuple[str, str, str]:
        """The script's holder, tag cap and holder cap."""
        named = CLIENT + ("".join("_" if c.isspace() else c for c in holder) or "-")
        return named, str(self.most(workers)), str(self.per_holder)


def _check_capped(reply: list[str], tag: str) -> None:
    if reply[0] != "capped":
        return
    if reply[1] == "holder":
        raise WorkerRefused(
            "capped",
            f"this holder already holds {reply[2]} worker IDs of tag {tag!r}, the most one "
            "holder may (IDPOOL_WORKER_HOLDER_MAX): release one (SnowflakeClient.close) first",
        )
    raise WorkerRefused(
        "capped",
        f"clients hold {reply[2]} worker IDs of tag {tag!r}, the most they may at once "
        "(IDPOOL_WORKER_CLIENT_SHARE of its worker IDs; the rest stay for nodes): try "
        "again when one is released or expires, or serve through a node's /id",
    )


class WorkerStore:
    """The worker-ID script's ops, run at most once each (as every Redis call:
    ``send`` is RedisPool.send). A call that fails raises StoreUnavailable: a
    grant whose outcome is unknown leaves a worker ID held until it expires
    (never used); a renewal whose outcome is unknown counts as not renewed."""

    def __init__(self, client: Any, keys: Keys, send: Any) -> None:
        self._script = client.register_script(_WORKERS)
        self._keys = keys
        self._send = send

    async def _run(self, tag: str, args: list[str]) -> list[str]:
        keys = [self._keys.workers(tag), self._keys.worker_lease(tag)]
        reply = await self._send(self._script(keys=keys, args=args))
        return [str(x) for x in reply]

    async def init(self, tag: str, quarantine_ms: int = 0) -> Made | None:
        """Make the hash of a tag just created, with a quarantine of ``quarantine_ms``
        at least (like any new hash: a grant may have run, on a Redis that lost it
        since). Returns what ``lift`` needs when this call made the hash from
        nothing; None when it found one (nothing to lift)."""
        reply = await self._run(tag, ["init", "0", str(quarantine_ms), "0"])
        return Made(reply[1], reply[2]) if reply[0] == "made" else None

    async def lift(self, tag: str, made: Made | None) -> bool:
        """Clear the quarantine ``init`` set, so the new tag serves at once. Call it
        only after ``init`` returned, with the ledger row read again *then* showing
        no generation claimed: a grant that ran before init claimed its generation
        before it. Atomic: lifted only if the hash is still the one init made (same
        incarnation and quarantine) and holds no worker field. True if lifted."""
        if made is None:
            return False
        reply = await self._run(tag, ["lift", "0", "0", "0", made.incarnation, made.quarantine])
        return reply[0] == "ok"

    async def room(self, tag: str, *, workers: int, holder: str, caps: ClientCaps) -> None:
        """Raise WorkerRefused ('capped') when a client grant for ``holder`` would be
        refused by ``caps`` now (read only: checked before the grant claims its
        generation, so a capped caller writes no ledger row; the grant checks again)."""
        named, cap, mine = caps.args(holder, workers)
        reply = await self._run(tag, ["room", "0", "0", "0", str(workers), named, cap, "-", mine])
        _check_capped(reply, tag)

    async def grant(
        self,
        tag: str,
        *,
        generation: int,
        first: bool = False,
        workers: int,
        holder: str,
        ttl_ms: int,
        quarantine_ms: int,
        caps: ClientCaps | None = None,
    ) -> Grant:
        """A worker ID for ``ttl_ms``. ``quarantine_ms`` is how long to wait when the
        hash is missing or of another incarnation: at least the longest lease any
        node may have granted for the tag. ``first`` is ignored: a grant that finds
        no hash always waits (only ``lift``, at tag creation, clears it). ``caps``:
        a client's grant (POST /worker), bounded per tag and per holder."""
        del first  # kept for callers; the generation's value proves nothing (issue 25)
        secret = new_secret()
        args = ["grant", str(ttl_ms), str(quarantine_ms), str(generation), str(workers)]
        if caps is None:
            holder = "".join("_" if c.isspace() else c for c in holder) or "-"  # one field
            args += [holder, "0", hash_secret(secret), "0"]
        else:
            named, cap, mine = caps.args(holder, workers)
            args += [named, cap, hash_secret(secret), mine]
        reply = await self._run(tag, args)
        _check_capped(reply, tag)
        if reply[0] == "ok":
            w, floor, now, expires, ttl = (int(x) for x in reply[1:6])
            return Grant(w, generation, floor, now, expires, secret, ttl)
        if reply[0] == "quarantine":
            left = int(reply[1]) - int(reply[2])
            raise WorkerRefused(
                "quarantine",
                f"a new Redis incarnation was seen: no worker ID is granted for {left} ms more, "
                "until every holder granted before it has stopped",
                left,
            )
        raise WorkerRefused("full", f"every one of the tag's {workers} worker IDs is held")

    async def renew(
        self, tag: str, grant: Grant, last_ms: int, ttl_ms: int, quarantine_ms: int
    ) -> Renewed:
        """Extend the lease by the TTL recorded at its grant (``ttl_ms`` only for a
        lease granted before TTLs were recorded); raises WorkerRefused ('lost',
        'released', 'wrong_secret') or LastTooLate."""
        return await self._change("renew", tag, grant, last_ms, ttl_ms, quarantine_ms)

    async def release(self, tag: str, grant: Grant, last_ms: int, quarantine_ms: int) -> None:
        """Give the worker ID back, with the last time used (a graceful stop)."""
        # the quarantine as TTL: only a lease written before TTLs were recorded uses
        # it, to bound last_ms (at least its TTL, so never a bound below the renewals')
        await self._change("release", tag, grant, last_ms, quarantine_ms, quarantine_ms)

    async def _change(
        self, op: str, tag: str, grant: Grant, last_ms: int, ttl_ms: int, quarantine_ms: int
    ) -> Renewed:
        args = [op, str(ttl_ms), str(quarantine_ms), str(grant.generation), str(grant.worker)]
        reply = await self._run(tag, [*args, str(last_ms), hash_secret(grant.secret)])
        if reply[0] == "bad_last":
            raise LastTooLate(last_ms, int(reply[1]))
        if reply[0] != "ok":
            raise WorkerRefused(reply[0], reply[1])
        return Renewed(int(reply[1]), int(reply[2]), int(reply[3]))


__all__ = [
    "CLIENT",
    "MAX_LAST_MS",
    "ClientCaps",
    "Grant",
    "LastTooLate",
    "Made",
    "Renewed",
    "StoreUnavailable",
    "WorkerRefused",
    "WorkerStore",
]
