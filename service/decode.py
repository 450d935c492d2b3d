"""What an ID says, by the kind of its tag: ``idpool tag decode TAG ID``,
``GET /admin/tags/{tag}/decode?value=`` and ``GET /decode/{tag}/{id}``.

One decoder per kind of ID (``DECODERS``), chosen by the tag's ``kind`` column:
a new kind that can decode its IDs adds a line there, and the command and the
admin call take it as they are. A snowflake ID decodes to its time, worker ID
and sequence (``pool/snowflake.py``); a segment ID to its sequence number,
through its format (``service/formats.py``: an obfuscated one too).

The public ``GET /decode/{tag}/{id}`` answers only for kinds in ``PUBLIC``: a
snowflake layout hides nothing, while decoding an obfuscated ID is what its key
keeps from anyone but an operator (400 ``not_decodable`` for the others). A
tag with tokens needs one of them here too (401 before anything about the tag).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any

from idpool_client.formats import TagFormat, period_row
from starlette.requests import Request
from starlette.responses import Response

from idpool.pool.errors import InvalidInput, UnknownTag
from idpool.pool.snowflake import Layout, wall_ms
from idpool.pool.stores import LedgerStore
from idpool.pool.values import TagRow

from . import auth
from .errors import json_response
from .formats import describe, format_of
from .kinds import SEGMENT
from .snowflake import SNOWFLAKE
from .tag_fields import check_tag

Decoder = Callable[[TagRow, str], dict[str, Any]]
_PLAIN = TagFormat()  # a plain tag's IDs: the number itself, in canonical decimal
DATE_AHEAD_SECONDS = 86_400  # a formatted ID dated further ahead was never handed out


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
    shown = describe(row)
    if shown is not None:
        found["format"] = shown
        if shown["reset"]:
            found["period"] = period
            found["note"] = (
                f"sequence number within its {shown['reset']} period {period} (the ID's date)"
            )
    return found


async def check_issued(ledger: LedgerStore, row: TagRow, found: dict[str, Any]) -> None:
    """Refuse (400 ``bad_value``) a decoded segment ID whose number its sequence never
    handed out: at or above the ``max_id`` of the row it comes from (the tag's own,
    or with a reset its period's ``TAG@KEY``, which must exist), or dated over a
    day ahead of this clock. ``max_id`` is the next number a claim would take, so
    every number claimed is below it; a number claimed but still in the pool or a
    buffer passes (the ledger cannot tell). Not ``start_id``: ``tag start`` moves
    it above numbers already handed out. A date that ends over a day before the
    tag was made is refused too (unless the name was removed and added again:
    the earlier tag's IDs are older than this row)."""
    if row.kind != SEGMENT:
        return
    value, number = found["value"], found["sequence"]
    fmt = format_of(row)
    earliest = None if fmt is None else fmt.earliest(value)
    # A client renders a dated template with its own clock: one ahead of this one
    # (by less than a day: any more is a clock no ID service should be given) made it
    if earliest is not None and earliest > time.time() + DATE_AHEAD_SECONDS:
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


async def decode_issued(ledger: LedgerStore, row: TagRow, value: str) -> dict[str, Any]:
    """``decode``, and for a segment tag the ledger's word that the number was issued
    (``check_issued``): what ``idpool tag decode`` and the admin call answer."""
    found = decode(row, value)
    await check_issued(ledger, row, found)
    return found


def decode_snowflake(row: TagRow, value: str) -> dict[str, Any]:
    """A snowflake tag's ID: its time, worker ID and sequence."""
    if not (value.isascii() and value.isdigit()) or len(value) > 19:
        raise InvalidInput("bad_id", f"{value[:40]!r} is not an ID of tag {row.tag!r} (digits)")
    # Refuses what the tag's layout cannot have made by now (another tag's ID, a
    # made-up number); what it cannot tell apart is in docs/design/snowflake.md ("Decode refuses").
    parts = Layout.from_text(row.layout).decode(int(value), now_ms=wall_ms())
    return {"tag": row.tag, "kind": row.kind, "value": value, **parts}


# Every kind whose IDs can be decoded: its name -> its decoder.
DECODERS: dict[str, Decoder] = {SEGMENT: decode_segment, SNOWFLAKE: decode_snowflake}
# Kinds the node's public GET /decode/{tag}/{id} decodes (their IDs hide nothing)
PUBLIC = frozenset({SNOWFLAKE})


def decode(row: TagRow, value: str) -> dict[str, Any]:
    """What ``value`` was made from; raises InvalidInput (``bad_value``, ``bad_id``)."""
    decoder = DECODERS.get(row.kind)
    if decoder is None:
        raise InvalidInput("bad_value", f"IDs of kind {row.kind!r} cannot be decoded")
    return decoder(row, value)


def snowflake_fields(row: TagRow) -> dict[str, Any]:
    """A snowflake tag's layout, for the admin API and the CLI's list; {} for others."""
    if row.kind != SNOWFLAKE or not row.layout:
        return {}
    layout = Layout.from_text(row.layout)
    return {"layout": layout.describe(), "bits": layout.bits}


async def decode_id(request: Request) -> Response:
    tag = check_tag(request.path_params["tag"])
    tags = request.state.run.node.tags
    # A guarded tag's token first, as /id: its kind and its IDs' parts are the tag's
    # to tell (issue 28: decode answered them where every other route said 401).
    await auth.check_token(tags, tag, request)
    row = await tags.lookup(tag)
    if row.kind not in PUBLIC:
        raise InvalidInput(
            "not_decodable",
            f"tag {row.tag!r} is a {row.kind} tag: its IDs are decoded only for an operator "
            f"(`idpool tag decode {row.tag} ID`, GET /admin/tags/{row.tag}/decode?value=ID); "
            f"here: {', '.join(sorted(PUBLIC))} tags",
        )
    return json_response(decode(row, request.path_params["id"]))
