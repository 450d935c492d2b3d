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

import contextlib
from collections.abc import Callable
from dataclasses import dataclass, field

from .clock import SYSTEM_CLOCK
from .errors import (
    FormatChanged,
    KindKept,
    MarkNotRaised,
    MarkNotReplicated,
    NameUsedBefore,
    StaleLedger,
    StartAboveMax,
    StartBelowIssued,
    StartOnReset,
    StoreBusy,
    StoreSkipped,
    StoreUnavailable,
    TagExists,
    TooFewReplicas,
    UnknownTag,
)
from .kind_rules import DEFAULT_KIND, DEFAULT_RULES, KindRules
from .ranges import MAX_ID, IdRange
from .roles import HighWaterMarks, LedgerStore, RangeLists
from .tag_rules import (
    check_tombstone,
    fence_refused,
    format_fingerprint,
    kind_fingerprint,
    name_fingerprint,
    used_as,
)
from .values import TagRow

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


async def create_tag(
    ledger: LedgerStore,
    pool: HighWaterMarks | None,
    tag: str,
    *,
    step: int,
    start: int,
    description: str = "",
    end_id: int = MAX_ID,
    rules: KindRules = DEFAULT_RULES,
    layout: str = "",
    options: str = "",
    secret: str = "",
) -> TagRow:
    """Add a tag, starting above any ID ever issued under that name, and never
    handing out ``end_id`` or above (ValueError unless ``start < end_id``).

    A tag deleted by hand and added again would otherwise start from ``start``
    and repeat its old IDs; the high-water mark in Redis remembers them.

    A name used before keeps its format (``options``, ``secret``): another
    template or obfuscation key could render a new number as a string the old
    tag handed out, which no fence on numbers prevents. A removed name's
    tombstone keeps the format: added again with the same options it gets the
    same key back (and goes on above its ``max_id``), with others FormatChanged.
    A row deleted by hand leaves no tombstone: the fingerprint beside the mark
    (``idpool:{tag}:format``, ``fence_format``) refuses it the same way, so a
    formatted tag is made only when that fingerprint could be written.
    The tag is of the kind ``rules`` (its KindRules: the pool names no kind). A
    kind made only under a new name (``new_name_only``: snowflake) is made only
    under a name that never issued IDs: no tombstone, and a mark in Redis read as
    0 (NameUsedBefore otherwise). Its IDs come from the clock since its epoch (its
    creation), so no ``max_id`` fences the old tag's numbers. Race: a live tag of
    the name claims and is removed between these reads and the INSERT: add_tag
    reads the tombstone again under its lock and refuses too. A row deleted by
    hand leaves its mark, read here. Raises TagExists, FormatChanged,
    NameUsedBefore, StoreUnavailable (a formatted tag, or one of a kind that
    ``needs_redis``, with Redis down: nothing made).
    """
    secret = await _kept_secret(ledger, pool, tag, rules, options, secret)
    fingerprint = kind_fingerprint(rules, options, secret, layout)
    floor, fenced = 0, ""
    if pool is not None:
        floor, fenced = await _fence_name(ledger, pool, tag, rules, fingerprint, options, start)
    try:
        return await ledger.add_tag(
            tag,
            step=step,
            start=start,
            description=description,
            floor=floor,
            end_id=end_id,
            rules=rules,
            layout=layout,
            options=options,
            secret=secret,
        )
    except (TagExists, FormatChanged, KindKept):
        if pool is not None and fenced == "set":
            await _unfence_lost(ledger, pool, tag, rules, fingerprint)
        raise


async def _kept_secret(
    ledger: LedgerStore,
    pool: HighWaterMarks | None,
    tag: str,
    rules: KindRules,
    options: str,
    secret: str,
) -> str:
    """The key a new tag is made with (a removed tag's of the same options, else
    ``secret``); raises what the name's past refuses (NameUsedBefore, TagExists,
    FormatChanged, StoreUnavailable)."""
    kept = await ledger.removed_format(tag)
    if rules.new_name_only:
        await _check_unused(ledger, pool, tag, rules, removed=kept is not None)
    if kept is not None:
        if options and kept[0] == options:
            secret = kept[1]  # the removed tag's key: its strings, continued above max_id
        # its kind: checked by add_tag (removed_format reads only the format)
        check_tombstone(tag, (kept[0], kept[1], ""), options, secret, rules.name)
    return secret


async def _fence_name(
    ledger: LedgerStore,
    pool: HighWaterMarks,
    tag: str,
    rules: KindRules,
    fingerprint: str,
    options: str,
    start: int,
) -> tuple[int, str]:
    """The name's high-water mark (0 unread) and the answer of fencing its format
    (``fence_format``; "" unfenced), before its row is made; raises TagExists or
    FormatChanged when the fence refuses, StoreUnavailable when the tag needs Redis."""
    floor, fenced = 0, ""
    try:
        floor = await pool.high_water(tag)
        # Before the row exists: no node can serve the tag before its format is
        # fenced. A plain tag is recorded as plain too (a format added to its row
        # by hand is then refused), but is made with Redis down, as before: the
        # first node to serve it writes the record.
        fenced = await pool.fence_format(tag, fingerprint)
        if rules.fences_state and not fence_refused(fenced):
            # Also before the row: a strict state an earlier life of the name left
            # (strict, removed, maybe a segment life since) is never served from;
            # the first refill claims from the new row, above its start and
            # every ID the name issued (the mark, the tombstone).
            await pool.fence_state(tag, max(start, floor))
    except StoreUnavailable as e:
        if options or rules.needs_redis:
            raise _not_fenced(e, rules, options) from e
        # Redis down: MySQL's own row (if any) still refuses a duplicate tag; the
        # floor stays what was read (0 if not even the mark answered).
    if fence_refused(fenced):
        with contextlib.suppress(UnknownTag):
            await ledger.get_tag(tag)
            raise TagExists(tag)  # a live tag of that name: say so, not "used before"
        raise FormatChanged(tag, used_as(fenced))
    return floor, fenced


def _not_fenced(e: StoreUnavailable, rules: KindRules, options: str) -> StoreUnavailable:
    """The error of a tag not made: Redis did not answer the fence it needs."""
    what = "formatted" if options else rules.name
    record = (
        f"{rules.name} state is fenced"
        if rules.fences_state and not options
        else "record is beside its high-water mark"
    )
    return StoreUnavailable(
        e.store,
        f"a {what} tag is made only once its {record} ({e.detail}); nothing was "
        "made: try again",
    )


async def _unfence_lost(
    ledger: LedgerStore, pool: HighWaterMarks, tag: str, rules: KindRules, fingerprint: str
) -> None:
    """Take back the format fingerprint this add set, when the name's row is not ours."""
    # The name is another tag's (made meanwhile): take our fingerprint back,
    # unless it is that tag's too. Race: two adds of one new name with one
    # template both fence ('set', then 'same': byte-identical, no key), the
    # 'same' one INSERTs first; a compare-and-delete by the loser then took
    # the winner's fingerprint, and the name could come back plain.
    with contextlib.suppress(StoreUnavailable):
        if await _owner_fingerprint(ledger, tag, rules) != fingerprint:
            await pool.unfence_format(tag, fingerprint)


async def _check_unused(
    ledger: LedgerStore, pool: HighWaterMarks | None, tag: str, rules: KindRules, *,
    removed: bool,
) -> None:
    """Refuse a tag of a new-name-only kind under a name that issued IDs
    (NameUsedBefore), or a live tag's name (TagExists); with Redis down,
    StoreUnavailable (the mark unread)."""
    mark = 0
    if pool is not None:
        try:
            mark = await pool.high_water(tag)
        except StoreUnavailable as e:
            raise StoreUnavailable(
                e.store,
                f"a {rules.name} tag is made only once its name is known never to have issued "
                f"IDs (its high-water mark in Redis: {e.detail}); nothing was made: try again",
            ) from e
    if not removed and mark <= 0:
        return
    with contextlib.suppress(UnknownTag):
        await ledger.get_tag(tag)
        raise TagExists(tag)  # a live tag of that name: say so, not "used before"
    raise NameUsedBefore(
        tag, "a removed tag's tombstone" if removed else f"its high-water mark in Redis is {mark}"
    )


async def _owner_fingerprint(ledger: LedgerStore, tag: str, rules: KindRules) -> str | None:
    """The fingerprint of the format the name now has in the ledger: its live row's,
    else its tombstone's; None when neither is there (then no tag of the name renders
    with ours). Raises StoreUnavailable: the caller then keeps the fingerprint (a
    fingerprint left behind only refuses other formats under the name, never repeats).
    A live row of another kind than ours (``rules``) is read by its format alone: the
    pool knows only our kind's record prefix. Ours with a prefix differs from any such
    fingerprint, as it differs from the row's real record; ours without one may then
    match a prefixed kind's row (by a format that kind never has): ours is kept, the
    safe side, as above."""
    try:
        row = await ledger.get_tag(tag)
        return name_fingerprint(row, rules if row.kind == rules.name else KindRules(row.kind))
    except UnknownTag:
        kept = await ledger.removed_format(tag)
        return None if kept is None else format_fingerprint(*kept)


async def move_start(
    ledger: LedgerStore, pool: HighWaterMarks | None, tag: str, start: int
) -> TagRow:
    """Make ``start`` the lowest ID any future claim of ``tag`` can return.

    The start only ever moves forward: a start below what the ledger (or the
    high-water mark) already passed would hand those IDs out again, so it raises
    StartBelowIssued. A start past the tag's max would exhaust it: StartAboveMax.
    Ranges claimed before (in the pool, in nodes' buffers) are still served.
    A tag with a reset refuses any start (StartOnReset).
    Raises UnknownTag, StoreUnavailable.
    """
    row = await ledger.get_tag(tag)
    if row.by_period:
        # Its numbers come from a row per period, each from the tag's start: the
        # own row's max_id fences nothing, and a period row's may never go down.
        raise StartOnReset(tag)
    if start >= row.end_id:  # end_id never changes after the tag is made
        raise StartAboveMax(tag, start, row.end_id - 1)
    floor = row.max_id
    if pool is not None:
        try:
            floor = max(floor, await pool.high_water(tag))
        except StoreUnavailable:
            pass  # the ledger's own max_id still refuses a start below it
    if start < floor:
        raise StartBelowIssued(tag, floor)
    # GREATEST in the ledger: a claim that lands between the read above and this
    # write only moves max_id up, and the start can never pull it back down.
    await ledger.raise_floor(tag, start, start=True)
    return await ledger.get_tag(tag)


async def disable_tag(
    ledger: LedgerStore, pool: RangeLists | None, tag: str
) -> tuple[TagRow, list[IdRange]]:
    """Stop ``tag``: no claim from now on, and its ready ranges taken out of the
    pool (returned, for the caller to count as waste). Its row, ``max_id`` and
    high-water mark stay, so enabling it again serves IDs above all it issued.

    The flag is set first: a claim after it is refused, so no new range can
    reach the list once it is drained. A range a preloader claimed just before
    and pushes just after the drain stays there unissued, served after enable.
    Raises UnknownTag, StoreUnavailable (the ledger: nothing changed; the pool:
    disabled but not drained; calling again drains it).
    """
    row = await ledger.set_disabled(tag, True)
    drained = [] if pool is None else await pool.take_all(tag)
    return row, drained


class ListNotEmptied(StoreUnavailable):
    """``remove_tag`` removed the tag's row, but the pool did not answer: its ready
    ranges may still be in its list (``pool.take_all(tag)`` empties it). Says what
    the pool's error said (``error``), so a caller answers it as that one."""

    def __init__(self, row: TagRow, error: StoreUnavailable) -> None:
        super().__init__(error.store, error.detail)
        self.row = row
        self.error = error


async def remove_tag(
    ledger: LedgerStore, pool: RangeLists | None, tag: str
) -> tuple[TagRow, list[IdRange]]:
    """Remove ``tag``: its row and tokens go (requests get 404 ``unknown_tag``),
    its ready ranges are taken out of the pool (returned, for the caller to count
    as waste), and its tombstone and high-water mark stay, so the name added
    again starts above every ID it ever issued.

    The ledger first: a claim after it finds no row, so no new range can reach
    the list once it is drained (one claimed just before and pushed just after
    stays there unissued). Raises UnknownTag, StoreUnavailable (the ledger:
    nothing changed), ListNotEmptied (the pool: removed but its list not emptied).
    """
    row = await ledger.remove_tag(tag)
    try:
        drained = [] if pool is None else await pool.take_all(tag)
    except StoreUnavailable as e:
        raise ListNotEmptied(row, e) from e
    return row, drained


async def enable_tag(ledger: LedgerStore, tag: str) -> TagRow:
    """Serve ``tag`` again, from fresh ranges above its ``max_id``."""
    return await ledger.set_disabled(tag, False)
