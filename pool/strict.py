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

The hash and its scripts are ``pool/redis_strict.py`` (``RedisStrict``), the
embedded take ``pool/sqlite_strict.py``; here is the counter that refills the
hash from the ledger (``StrictCounter``). ``RedisStrict`` and ``SqliteStrict``
stay importable from here.
"""

from __future__ import annotations

import asyncio
import contextlib
import math
import uuid
from collections.abc import Callable
from typing import Protocol

from .claims import Claim, LedgerClaims
from .errors import (
    IdPoolError,
    MarkNotRaised,
    StoreNotSent,
    StoreUnavailable,
    StrictNotConfirmed,
)
from .redis_strict import (
    RedisStrict,
    StrictAnswer,
)
from .sqlite_strict import SqliteStrict
from .waste import Reason, WasteRecorder

__all__ = [
    "MAX_REFILL_RANGES",
    "RedisStrict",
    "SqliteStrict",
    "StrictAnswer",
    "StrictCounter",
    "StrictEvents",
    "StrictRaced",
    "StrictSupply",
]

# Refills one take may run before it gives up (each one met a race or a new
# incarnation; more than this means something is badly wrong, not busy).
_ATTEMPTS = 4
MAX_REFILL_RANGES = 100_000  # steps one refill claims at most
_WAIT_FIRST = 0.002  # seconds before a take asks again while another node refills
_WAIT_MOST = 0.05


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
