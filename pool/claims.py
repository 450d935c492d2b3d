"""Claiming from the ledger, fenced by a high-water mark kept outside MySQL.

A MySQL that fails over to a lagging replica, or is restored from a backup, can
return a ``max_id`` below what it already handed out; claiming from it would
repeat IDs. The mark in Redis (``idpool:{tag}:hwm``) is the highest ledger
position any process has claimed up to. A claim reads it first and refuses a
range that starts below it (then raises ``max_id`` past it and claims again),
and raises it past the new range *before* the range is pushed or served.

That order is the whole fence: a range that some process may serve is always
below the shared mark, so a rewound MySQL can never hand it out again to
anyone who reads the mark. It follows that a claim needs Redis: when the mark
cannot be read the claim is not made, and when it cannot be raised the range
is given up (``MarkNotRaised``), never served. While Redis is down, nodes serve
what their buffers hold. With ``IDPOOL_REDIS_MARK_REPLICAS=N`` a raise counts
only once N replicas acknowledged it (``MarkNotReplicated`` otherwise), and
no claim is made while fewer are online (``TooFewReplicas`` from the mark's
read): claims stop, and nodes serve the pool and their buffers.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

from .clock import SYSTEM_CLOCK
from .errors import (
    MarkNotRaised,
    MarkNotReplicated,
    StaleLedger,
    StoreBusy,
    StoreSkipped,
    StoreUnavailable,
    TooFewReplicas,
)
from .kind_rules import DEFAULT_KIND
from .ranges import IdRange
from .roles import HighWaterMarks, LedgerStore

# A tag's changes (add, start, disable, enable, remove) are in tag_changes.py;
# importable from here as before.
from .tag_changes import (
    ListNotEmptied,
    create_tag,
    disable_tag,
    enable_tag,
    move_start,
    remove_tag,
)

__all__ = [
    "REDIS_SKIP_SECONDS",
    "Claim",
    "LedgerClaims",
    "ListNotEmptied",
    "RedisSkip",
    "create_tag",
    "disable_tag",
    "enable_tag",
    "move_start",
    "remove_tag",
]

_MAX_STALE_RETRIES = 3
# After a Redis error, claims fail at once for this long, as if the mark's read had
# failed again: a hung Redis then costs a fetch one timeout, not one for the pop
# and one for the mark's read.
REDIS_SKIP_SECONDS = 1.0


class RedisSkip:
    """The one-second Redis skip of a process: after a Redis error (a node's pop,
    a claim's mark), neither pops nor claims try Redis for REDIS_SKIP_SECONDS."""

    def __init__(self, clock: Callable[[], float] = SYSTEM_CLOCK.monotonic) -> None:
        self._clock = clock  # monotonic seconds (the runtime's Clock.monotonic)
        self._until = 0.0
        self._error: StoreUnavailable | None = None

    def failed(self, error: StoreUnavailable) -> None:
        self._until = self._clock() + REDIS_SKIP_SECONDS
        self._error = error

    def skipping(self) -> StoreUnavailable | None:
        """The error that started the skip while it lasts, else None: try Redis."""
        return self._error if self._clock() < self._until else None


@dataclass
class Claim:
    range: IdRange
    # ranges MySQL handed out below the high-water mark: abandoned, never used
    refused: list[IdRange] = field(default_factory=list)
    # set when the ledger was moved up past the mark: (old max_id seen, new max_id)
    raised_to: int | None = None


class LedgerClaims:
    def __init__(
        self,
        ledger: LedgerStore,
        marks: HighWaterMarks | None,
        clock: Callable[[], float] = SYSTEM_CLOCK.monotonic,  # the runtime's, for its skips
    ) -> None:
        self.ledger = ledger
        self.marks = marks  # the shared high-water marks (the pool); None: this process only
        self._high_water: dict[str, int] = {}  # tag -> highest range end seen here
        self.redis_skip = RedisSkip(clock)  # shared with the node's pops (RangeSource)
        # After a raise too few replicas acknowledged (IDPOOL_REDIS_MARK_REPLICAS):
        # claims only fail at once for a moment (each refused raise wastes its
        # range); Redis answers, so pops go on.
        self.replicas_skip = RedisSkip(clock)

    def redis_failed(self, error: StoreUnavailable | None = None) -> None:
        """Redis just failed (here, or a node's pop): claims fail fast for a while."""
        self.redis_skip.failed(error or StoreUnavailable("redis", "failed a moment ago"))

    def observe(self, tag: str, seen: IdRange) -> None:
        """Record a range seen from anywhere (pool or ledger): the ledger is past its end."""
        self.observe_end(tag, seen.end)

    def observe_end(self, tag: str, end: int) -> None:
        """Record that the ledger was claimed up to ``end`` (e.g. a strict state's limit)."""
        if end > self._high_water.get(tag, 0):
            self._high_water[tag] = end

    def high_water(self, tag: str) -> int:
        return self._high_water.get(tag, 0)

    async def claim(self, tag: str, ranges: int = 1, kind: str = DEFAULT_KIND) -> Claim:
        """Claim ``ranges`` steps of fresh IDs of ``tag``, a tag of ``kind``, fenced
        by the shared mark.

        Raises UnknownTag (KindChanged: the row is of another kind now),
        TagExhausted, StaleLedger, StoreUnavailable (no claim made, or its outcome
        unknown) and MarkNotRaised (claimed, but given up).
        """
        refused: list[IdRange] = []
        raised_to: int | None = None
        for _ in range(_MAX_STALE_RETRIES):
            # Read the mark *before* claiming: every claim that finished before
            # this read ended at or below it, and MySQL orders claims, so ours
            # must start at or above it. (Read after, a faster claim by another
            # process would raise the mark past our good range.)
            mark = max(self.high_water(tag), await self._shared_high_water(tag))
            claimed = await self.ledger.claim(tag, ranges, kind)
            if claimed.start < mark:
                # MySQL went back in time: this range overlaps IDs already issued.
                refused.append(claimed)
                raised_to = await self.ledger.raise_floor(tag, mark)
                continue
            self.observe(tag, claimed)
            await self._raise_shared(tag, claimed)
            return Claim(claimed, refused, raised_to)
        raise StaleLedger(
            f"tag {tag!r}: MySQL kept returning ranges below the high-water mark "
            f"{self.high_water(tag)}; refused {[r.to_text() for r in refused]}"
        )

    async def _shared_high_water(self, tag: str) -> int:
        if self.marks is None:
            return 0  # classic mode (no pool tier): the in-memory mark only
        if self.redis_skip.skipping() is not None:
            raise StoreSkipped(
                "redis", "a claim needs the high-water mark in Redis, which just failed"
            )
        short = self.replicas_skip.skipping()
        if short is not None:
            raise StoreSkipped(
                "redis", f"a claim needs its high-water mark on enough replicas: {short.detail}"
            )
        try:
            return await self.marks.high_water_to_claim(tag)
        except StoreBusy:
            raise  # never sent: says nothing about Redis's health
        except TooFewReplicas as e:
            # Redis answers (pops go on); a raise could not count now: no claim,
            # so nothing to waste. Claims wait a moment before asking again.
            self.replicas_skip.failed(e)
            raise
        except StoreUnavailable as e:
            self.redis_failed(e)
            raise

    async def _raise_shared(self, tag: str, claimed: IdRange) -> None:
        if self.marks is None:
            return
        try:
            await self.marks.raise_high_water(tag, claimed.end)
        except TooFewReplicas as e:
            # On the primary, not on enough replicas: a failover could promote one
            # without it. Given up like any unraised mark; Redis itself is fine.
            self.replicas_skip.failed(e)
            raise MarkNotReplicated(
                e.store, f"high-water mark not replicated past the claim: {e.detail}", claimed
            ) from e
        except StoreUnavailable as e:
            # Maybe raised, maybe not. Unraised, a rewound MySQL could hand this
            # range to a process that reads the old mark: give it up instead.
            if not isinstance(e, StoreBusy):
                self.redis_failed(e)
            raise MarkNotRaised(
                e.store, f"high-water mark not raised past the claim: {e.detail}", claimed
            ) from e
