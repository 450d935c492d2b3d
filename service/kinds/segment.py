"""The ``segment`` kind: ranges from the pool or the ledger, served from the
node's double buffers (``buffer.py``), answered from memory by NodeApp's fast
path; with a format (``formats.py``), its numbers rendered as strings.

Everything about the kind is here: its rules for the stores, its policy (pooled,
leasable, the default kind, the one that takes a format), how it serves, what it
shows in /status.json, and how its IDs decode (through their format, if any).
"""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any, TypedDict

from idpool_client.formats import TagFormat, period_row

from idpool.pool.clock import SYSTEM_CLOCK, Clock
from idpool.pool.errors import InvalidInput, UnknownTag
from idpool.pool.kind_rules import KindRules
from idpool.pool.stores import LedgerStore
from idpool.pool.values import TagRow

from ..formats import format_of, public_format
from ..formatted import FormattedTags
from .context import KindContext
from .interface import IdKind, KindSpec

_PLAIN = TagFormat()  # a plain tag's IDs: the number itself, in canonical decimal
DATE_AHEAD_SECONDS = 86_400  # a formatted ID dated further ahead was never handed out


class SegmentHeld(TypedDict):
    """A segment tag's buffer, as /status.json shows it."""

    kind: str
    current: str | None
    used: int
    remaining: int
    next: str | None
    next_ready: bool
    ready: list[str]  # served after current, in order
    in_memory: int
    fetching: bool


class SegmentKind:
    """Ranges from the pool or the ledger, served from the node's double buffers."""

    def __init__(self, ctx: KindContext) -> None:
        self.ctx = ctx
        # the converter a formatted tag's numbers go through (NodeApp's fast path too)
        self.formats = FormattedTags(
            ctx.tags, ctx.buffers, ctx.source.claims, ctx.wall_clock, ctx.fence
        )

    async def next_id(self, tag: str) -> int | str:
        fmt = self.formats.format_for(tag)  # a rendering on top of the segment tag
        if fmt is not None:
            one = await self.formats.take(tag, fmt, 0)
            assert not isinstance(one, list)
            return one
        return await self.ctx.buffers.take(tag)

    async def next_ids(self, tag: str, count: int) -> list[int] | list[str]:
        fmt = self.formats.format_for(tag)
        if fmt is not None:
            many = await self.formats.take(tag, fmt, count)
            assert isinstance(many, list)
            return many
        return await self.ctx.buffers.take_many(tag, count)

    def holding(self, tag: str) -> SegmentHeld | None:
        buf = self.ctx.buffers.buffers.get(tag)
        if buf is None:
            return None
        return {
            "kind": SPEC.name,
            "current": None if buf.current is None else buf.current.to_text(),
            "used": buf.used,
            "remaining": buf.remaining,
            "next": None if buf.next is None else buf.next.to_text(),
            "next_ready": buf.next is not None,
            "ready": [r.to_text() for r in buf.ready],  # served after current, in order
            "in_memory": buf.in_memory,
            "fetching": buf.fetching,
        }

    def not_ready(self) -> str | None:
        return None  # Node.not_ready decides from the stores and buffers

    async def close(self) -> None:
        return None  # Node.shutdown drains the buffers


def decode_segment(row: TagRow, value: str) -> dict[str, Any]:
    """A segment tag's ID: its sequence number (through its format, if any)."""
    fmt = format_of(row)
    try:
        # Strict: only what the tag makes. TagFormat.decode renders the number back
        # and refuses any other spelling (a wrong width, leading zeros, a date no
        # clock shows, a character outside the alphabet); a plain ID is canonical
        # decimal. Both within the tag's bound.
        number, period = (fmt or _PLAIN).decode_period(value)
        if number >= row.end_id and (fmt is None or fmt.obfuscation is None):
            raise ValueError(f"sequence number {number} is above the tag's max {row.end_id - 1}")
    except ValueError as e:
        raise InvalidInput(
            "bad_value", f"{value[:80]!r} is not an ID of tag {row.tag!r}: {e}"
        ) from None
    found: dict[str, Any] = {"tag": row.tag, "kind": row.kind, "value": value, "sequence": number}
    shown = public_format(row)
    if shown is not None:
        found["format"] = shown
        if shown["reset"]:
            found["period"] = period
            found["note"] = (
                f"sequence number within its {shown['reset']} period {period} (the ID's date)"
            )
    return found


async def check_issued(
    ledger: LedgerStore, row: TagRow, found: dict[str, Any], clock: Clock = SYSTEM_CLOCK
) -> None:
    """Refuse (400 ``bad_value``) a decoded segment ID whose number its sequence never
    handed out: at or above the ``max_id`` of the row it comes from (the tag's own,
    or with a reset its period's ``TAG@KEY``, which must exist), or dated over a
    day ahead of this clock. ``max_id`` is the next number a claim would take, so
    every number claimed is below it; a number claimed but still in the pool or a
    buffer passes (the ledger cannot tell). Not ``start_id``: ``tag start`` moves
    it above numbers already handed out. A date that ends over a day before the
    tag was made is refused too (unless the name was removed and added again:
    the earlier tag's IDs are older than this row)."""
    value, number = found["value"], found["sequence"]
    fmt = format_of(row)
    earliest = None if fmt is None else fmt.earliest(value)
    # A client renders a dated template with its own clock: one ahead of this one
    # (by less than a day: any more is a clock no ID service should be given) made it
    if earliest is not None and earliest > clock.now() + DATE_AHEAD_SECONDS:
        raise InvalidInput(
            "bad_value",
            f"{value[:80]!r} was never issued by tag {row.tag!r} (not issued yet): its date "
            f"is {datetime.fromtimestamp(earliest, UTC):%Y-%m-%d %H:%M:%S} UTC at the "
            "earliest, over a day ahead of the clock",
        )
    period = found.get("period")
    source = row
    if period is not None:
        try:
            source = await ledger.get_tag(period_row(row.tag, period))
        except UnknownTag:
            raise InvalidInput(
                "bad_value",
                f"{value[:80]!r} was never issued by tag {row.tag!r}: no number of its "
                f"period {period} was issued (no row {row.tag}@{period})",
            ) from None
    if number >= source.max_id:
        where = f"its period {period}" if period is not None else "it"
        raise InvalidInput(
            "bad_value",
            f"{value[:80]!r} was never issued by tag {row.tag!r} (not issued yet): sequence "
            f"number {number}, while {where} issued numbers below {source.max_id} only",
        )
    made = None if earliest is None else await ledger.first_made(row.tag)
    latest = None if made is None or fmt is None else fmt.latest(value)
    # Behind as well: a client's clock up to a day behind this one dated it so
    if latest is not None and made is not None and latest < made - DATE_AHEAD_SECONDS:
        raise InvalidInput(
            "bad_value",
            f"{value[:80]!r} was never issued by tag {row.tag!r}: its date ends "
            f"{datetime.fromtimestamp(latest, UTC):%Y-%m-%d %H:%M:%S} UTC, over a day before "
            f"the tag was made ({datetime.fromtimestamp(made, UTC):%Y-%m-%d %H:%M:%S} UTC)",
        )


class SegmentSpec(KindSpec):
    name = "segment"
    rank = 0
    default = True
    rules = KindRules("segment", pooled=True, end_negated=False)
    buffered = True
    formats = True
    leasable = True
    summary = "trend-increasing, served from memory"

    def make(self, ctx: KindContext) -> IdKind:
        return SegmentKind(ctx)

    def decode(self, row: TagRow, value: str) -> dict[str, Any] | None:
        return decode_segment(row, value)

    async def check_issued(
        self, ledger: LedgerStore, row: TagRow, found: dict[str, Any], clock: Clock = SYSTEM_CLOCK
    ) -> None:
        await check_issued(ledger, row, found, clock)


SPEC = SegmentSpec()
