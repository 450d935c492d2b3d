"""A tag's life in the ledger and the pool: added above any ID ever issued under
its name, its start moved (only forward), disabled, enabled, removed (its
tombstone and high-water mark kept, so the name added again starts above them).

An add fences the name in Redis (its format's record, a strict state) before
its row exists, so no node serves it unfenced; disable and remove write the
ledger first, so a claim after them is refused and no new range reaches the
pool's list once it is drained (the ranges taken out are returned, for the
caller to count as waste). The fenced claims are in ``claims.py``, which
re-exports these names.
"""

from __future__ import annotations

import contextlib

from .errors import (
    FormatChanged,
    KindKept,
    NameUsedBefore,
    StartAboveMax,
    StartBelowIssued,
    StartOnReset,
    StoreUnavailable,
    TagExists,
    UnknownTag,
)
from .kind_rules import DEFAULT_RULES, KindRules
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
        await _refuse_live(ledger, tag)
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
    await _refuse_live(ledger, tag)
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
        # Redis down: the ledger's own max_id still refuses a start below it
        with contextlib.suppress(StoreUnavailable):
            floor = max(floor, await pool.high_water(tag))
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


async def _refuse_live(ledger: LedgerStore, tag: str) -> None:
    """Raise TagExists if a live tag has the name: say so, not "used before"."""
    with contextlib.suppress(UnknownTag):
        await ledger.get_tag(tag)
        raise TagExists(tag)
