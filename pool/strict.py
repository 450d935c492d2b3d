"""Strict tags: IDs that increase in real time, across every node.

The guarantee (docs/design/strict.md): if one request's answer arrives
before another request is sent, to any node, the second gets a larger ID; the
IDs of one batch are consecutive; no ID is ever handed out twice. Gaps are
allowed (waste), order and uniqueness are not negotiable.

Redis serializes: one hash per strict tag, ``idpool:{tag}:strict`` (in the
tag's slot: every strict script touches that one key), holds ``[next, limit)``
(IDs claimed from the ledger, ready) and ``inc``, the Redis incarnation
(``run_id:master_replid``, of the server the tag's slot is on) it was set
under. A take is one script: it computes the incarnation on the server (as the
pool scripts' prelude does) and moves ``next`` up by the batch only if the
state is of that incarnation and holds the batch. Otherwise it answers "refill
needed" with the current incarnation. A refill claims from the ledger through
``LedgerClaims`` (fenced by the high-water mark) *after* having seen that
incarnation, then one script extends the state, only if the incarnation is still the one seen:

- a state of an older incarnation (Redis restarted empty, restored from a
  snapshot, failed over) is replaced by the claim: claimed after this
  incarnation began, it is above every range any older incarnation served;
- a range adjacent to ``limit`` extends it;
- a range above ``limit`` replaces the rest of the state (that rest is waste);
- a range below ``limit`` is refused (waste): another node extended first;
- a range below ``floor`` is refused (waste): the state was fenced when the tag
  was made (again) under its name, and the range was claimed for an earlier tag
  of that name (``RedisPool.fence_state``).

Under Sentinel a take is answered only if most Sentinels name its server as the
master; on a Redis Cluster only once every replica its primary knows of
acknowledged it (``WAIT``): a deposed primary's takes are waste, never answered.

Every outcome this process cannot know (a timeout, a reset) is waste and is
never retried: a lost take loses its batch, a lost extension its range.

Numbers cross into Lua as decimal strings and are added and compared digit by
digit there: Lua numbers are doubles, exact only below 2^53.

The embedded mode (one SQLite file) has no Redis: its strict take is one
transaction on the ledger row itself (``SqliteStrict``).
"""

from __future__ import annotations

import asyncio
import contextlib
import math
import sqlite3
import time
import uuid
from collections.abc import Callable
from typing import Any, NamedTuple, Protocol

from redis.asyncio import Redis
from redis.asyncio.cluster import RedisCluster

from .claims import Claim, LedgerClaims
from .cluster import run_then_wait
from .errors import (
    IdPoolError,
    MarkNotRaised,
    StoreNotSent,
    StoreUnavailable,
    StrictNotConfirmed,
    TagExhausted,
)
from .ranges import IdRange
from .redis_pool import INCARNATION_LUA, Lua, RedisPool, run_script
from .sentinel import named_master_by_majority
from .sqlite_file import SqliteFile
from .sqlite_ledger import _select
from .tag_rules import check_kind
from .values import next_range
from .waste import Reason, WasteRecorder

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

# Refills one take may run before it gives up (each one met a race or a new
# incarnation; more than this means something is badly wrong, not busy).
_ATTEMPTS = 4
MAX_REFILL_RANGES = 100_000  # steps one refill claims at most
_RATE_MIN_SECONDS = 1.0
_WAIT_FIRST = 0.002  # seconds before a take asks again while another node refills
_WAIT_MOST = 0.05


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


class StrictEvents:
    """What a strict counter reports besides its waste (which goes to the
    process's ``WasteRecorder``): the claims its refills made. The node logs and
    counts them (``service/kinds/strict.py``); this default drops them."""

    def claimed(self, tag: str, claim: Claim, how: str) -> None:
        """A refill's claim, and what the extension did with it."""


class StrictRaced(IdPoolError):
    """A strict take lost every refill race it ran (or met a new incarnation each time)."""


class StrictSupply(Protocol):
    name: str  # the store a 503 names

    async def take(self, tag: str, n: int) -> int:
        """The first of ``n`` consecutive IDs, above every ID handed out before this call."""
        ...

    async def close(self) -> None: ...


class StrictCounter:
    """Strict takes from Redis, refilled from the ledger (fenced by the mark).

    The state is refilled before it runs out: when a take leaves less than half
    of ``hold_seconds`` of the tag's consumption (at least one step), the one
    caller Redis grants the refill to claims ``hold_seconds`` worth in the
    background. So a MySQL outage shorter than about half of that is not seen,
    and a Redis that loses the state wastes at most that much. A take that
    finds the state short waits for the refill under way (its own node's, or
    another node's grant) rather than claim a second time.
    """

    name = "redis"

    def __init__(
        self,
        store: RedisStrict,
        claims: LedgerClaims,
        *,
        kind: str,
        step_of: Callable[[str], int],
        hold_seconds: float = 30.0,
        grant_seconds: float = 4.0,
        events: StrictEvents | None = None,
        waste: WasteRecorder | None = None,
    ) -> None:
        self.store = store
        self.claims = claims
        self.kind = kind  # its tags' kind (the ledger's kind column): what a refill claims
        self.step_of = step_of
        self.hold_seconds = hold_seconds
        # how long other nodes leave a refill to the node granted it (it outlasts
        # the refill's four store calls at their timeout; a dead holder's expires)
        self.grant_ms = max(1, int(grant_seconds * 1000))
        self.asker = uuid.uuid4().hex
        self.events = events or StrictEvents()
        self.waste = waste or WasteRecorder()  # the process's: every ID given up
        self._refills: dict[str, asyncio.Task[None]] = {}
        self._target: dict[str, int] = {}  # tag -> IDs a refill claims (hold_seconds' worth)

    async def take(self, tag: str, n: int) -> int:
        """The first of ``n`` IDs taken. Raises StoreUnavailable (Redis, or the
        ledger during a refill), MarkNotRaised, UnknownTag, TagDisabled,
        TagExhausted, StaleLedger, StrictRaced."""
        answer = await self._take(tag, n)
        refills, wait = 0, _WAIT_FIRST
        deadline = asyncio.get_running_loop().time() + self.grant_ms / 1000 + 1
        while answer.first is None:
            running = self._refills.get(tag)
            if running is not None:  # this node refills: wait for it, then take again
                await asyncio.wait([running])
            elif answer.granted:
                refills += 1
                if refills > _ATTEMPTS:
                    raise StrictRaced(
                        f"tag {tag!r}: {_ATTEMPTS} refills of its strict counter in a row "
                        "lost a race or met a new Redis incarnation; retry"
                    )
                answer = await self._refill(tag, answer, n)
                continue
            elif asyncio.get_running_loop().time() > deadline:
                raise StrictRaced(f"tag {tag!r}: waited too long for another node's refill")
            else:  # another node refills: ask again shortly
                await asyncio.sleep(wait)
                wait = min(wait * 2, _WAIT_MOST)
            answer = await self._take(tag, n)
        if not answer.confirmed:
            # Taken on a cluster primary whose replicas did not all acknowledge it:
            # maybe one deposed while paused, whose promoted replica answered larger
            # IDs already (RedisStrict._run). Given up, never served.
            self.waste.lost(tag, n, Reason.STRICT_NOT_CONFIRMED)
            raise StrictNotConfirmed(
                f"the Redis Cluster primary that answered for tag {tag!r} could not show "
                "its replicas have the take (WAIT); its IDs are given up, retry in a moment "
                "(a failover may be under way, or a replica of that shard is down: strict "
                "tags of that shard serve again once it is back, or once it is removed with "
                "CLUSTER FORGET on every node; ops/README.md, 'Redis Cluster')",
            )
        if not await self.store.from_master(answer.incarnation):
            # Two masters during a failover: IDs from the one the Sentinels left
            # could be below IDs the other already answered. Given up, never served.
            self.waste.lost(tag, n, Reason.STRICT_NOT_MASTER)
            raise StoreUnavailable(
                "redis",
                f"the Redis that answered for tag {tag!r} is not the master most Sentinels "
                "name (a failover is under way); its IDs are given up, retry in a moment",
            )
        if answer.granted and tag not in self._refills:
            self._prefetch(tag, answer)
        return answer.first

    async def close(self) -> None:
        if self._refills:
            await asyncio.wait(list(self._refills.values()), timeout=5)

    async def _take(self, tag: str, n: int) -> StrictAnswer:
        step = max(1, self.step_of(tag))
        low = max(step, self._target.get(tag, step)) // 2
        try:
            answer = await self.store.take(tag, n, low, self.grant_ms, self.asker)
        except StoreUnavailable as e:
            if not isinstance(e, StoreNotSent):
                self.waste.lost(tag, n, Reason.STRICT_TAKE_OUTCOME_UNKNOWN)
            raise
        self._remember_limit(tag, answer)
        if answer.granted and answer.rate is not None:
            # up at once with the rate, down by halves (a window just begun reads low)
            want = max(answer.rate * self.hold_seconds, self._target.get(tag, step) / 2)
            self._target[tag] = int(min(max(want, step), step * MAX_REFILL_RANGES))
        return answer

    async def _refill(self, tag: str, seen: StrictAnswer, n: int) -> StrictAnswer:
        """Claim from the ledger after having seen ``seen.incarnation``, extend the
        state with it, and take ``n`` IDs (0: none) in the same script. A refill
        that fails gives its grant back: the other nodes' takes would otherwise
        wait for it to expire (4 s) before one of them may refill (issue 28)."""
        try:
            return await self._refill_granted(tag, seen, n)
        except IdPoolError:
            # The grant is a hint against waste only: giving it back can cost a
            # second claim, never an order (the extension rules keep it).
            with contextlib.suppress(StoreUnavailable):
                await self.store.release(tag, self.asker)
            raise

    async def _refill_granted(self, tag: str, seen: StrictAnswer, n: int) -> StrictAnswer:
        step = max(1, self.step_of(tag))
        # the whole batch, not what `seen` lacked: other nodes may take the rest
        # before the extension lands, and the extension takes the batch with it
        want = max(self._target.get(tag, step), n, 1)
        if not await self.store.from_master(seen.incarnation):
            # A promoted replica the Sentinels do not name yet (the leader already
            # does): the old master may still claim above a claim made now and
            # answer its IDs, which this state would then answer below. Claim only
            # once most Sentinels name it: after every claim the old master served.
            raise StoreUnavailable(
                "redis",
                f"the Redis that answered for tag {tag!r} is not the master most Sentinels "
                "name (a failover is under way); nothing claimed, retry in a moment",
            )
        try:
            claim = await self.claims.claim(
                tag, min(math.ceil(want / step), MAX_REFILL_RANGES), kind=self.kind
            )
        except MarkNotRaised as e:  # claimed, but the mark could not be raised past it
            self.waste.record(tag, [e.wasted], Reason.MARK_NOT_RAISED, e.detail)
            raise
        self.waste.record(tag, claim.refused, Reason.STALE_LEDGER, raised_to=claim.raised_to)
        try:
            ext = await self.store.extend(tag, seen.incarnation, claim.range, n)
        except StoreUnavailable as e:
            # Maybe extended (and maybe taken from), maybe not: never sent again.
            sent = not isinstance(e, StoreNotSent)
            reason = (
                Reason.STRICT_EXTEND_OUTCOME_UNKNOWN if sent else Reason.STRICT_EXTEND_NOT_SENT
            )
            self.events.claimed(tag, claim, "unknown")
            self.waste.record(tag, [claim.range], reason, e.detail)
            if n and sent:
                self.waste.lost(tag, n, Reason.STRICT_TAKE_OUTCOME_UNKNOWN)
            raise
        self._remember_limit(tag, ext.answer)
        self.events.claimed(tag, claim, ext.how)
        if ext.how == "refused":  # another node extended first: ours is below its limit
            self.waste.record(tag, [claim.range], Reason.STRICT_REFILL_RACED)
        elif ext.how == "moved":  # a restart or failover since we looked
            self.waste.record(tag, [claim.range], Reason.REDIS_NEW_INCARNATION)
        elif ext.how == "fenced":  # claimed from the row of a tag of this name since removed
            self.waste.record(tag, [claim.range], Reason.TAG_REMOVED)
        if ext.lost is not None:
            # jumped: the rest was never handed out; replaced: a state of an older
            # incarnation, which may have served part of it after its last save
            skipped = ext.how == "jumped"
            reason = Reason.STRICT_STATE_SKIPPED if skipped else Reason.REDIS_NEW_INCARNATION
            self.waste.record(tag, [ext.lost], reason)
        # granted again if the refill did not cover the batch (a race): the caller decides
        return ext.answer._replace(granted=ext.answer.first is None)

    def _remember_limit(self, tag: str, answer: StrictAnswer) -> None:
        """Keep the state's limit as this node's in-memory mark: every ID the state
        handed out is below it, and so must be every later claim. When Redis loses
        the state and its mark while MySQL goes back (two faults), the marks in the
        nodes' memory are the only fence left, and a node that only ever took (the
        refills were other nodes') would otherwise refill from the rewound ledger."""
        if answer.limit is not None:  # only a state of the current incarnation says one
            self.claims.observe_end(tag, answer.limit)

    def _prefetch(self, tag: str, answer: StrictAnswer) -> None:
        async def refill() -> None:
            try:
                await self._refill(tag, answer, 0)
            except IdPoolError:
                pass  # reported as waste where it was; the next take meets the fault itself
            finally:
                self._refills.pop(tag, None)

        self._refills[tag] = asyncio.ensure_future(refill())


class SqliteStrict:
    """The embedded mode's strict take: one transaction on the ledger row.

    ``max_id`` is the counter: a take of ``n`` moves it up by ``n`` under the
    file's write lock, fsynced before it returns, so takes are ordered by the
    lock and every later one starts where the last ended.
    """

    name = "sqlite"

    def __init__(self, file: SqliteFile, kind: str) -> None:
        self.file = file
        self.kind = kind  # its tags' kind: a take from a row of another is refused

    async def take(self, tag: str, n: int) -> int:
        """Raises UnknownTag, KindChanged, TagDisabled, TagExhausted (the batch does not fit
        under the tag's max: nothing is taken), StoreUnavailable."""
        def op(conn: sqlite3.Connection) -> int:
            # BEGIN IMMEDIATE: the write lock from the read to the COMMIT.
            row = _select(conn, tag)
            check_kind(tag, self.kind, row.kind)  # see Ledger.claim
            fresh = next_range(tag, row.max_id, n, row.end_id, row.disabled)
            if len(fresh) < n:
                raise TagExhausted(
                    f"tag {tag!r} has {len(fresh)} IDs left below its max, fewer than the {n} asked"
                )
            conn.execute(
                "UPDATE idpool_tags SET max_id = ?, updated_at = ? WHERE tag = ?",
                (fresh.end, time.time(), tag),
            )
            return fresh.start

        return await self.file.write(op)

    async def close(self) -> None:
        """The file belongs to the ledger, which closes it."""
