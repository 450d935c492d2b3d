"""What an ID says, by the kind of its tag: ``idpool tag decode TAG ID``,
``GET /admin/tags/{tag}/decode?value=`` and ``GET /decode/{tag}/{id}``.

Each kind decodes its own IDs (``KindSpec.decode`` in ``kinds/<name>.py``),
chosen by the tag's ``kind`` column: the command and the admin call take a new
kind's decoder as they are. A snowflake ID decodes to its time, worker ID and
sequence; a segment ID to its sequence number, through its format (an
obfuscated one too).

The public ``GET /decode/{tag}/{id}`` answers only for kinds whose spec says
``public_decode``: a snowflake layout hides nothing, while decoding an
obfuscated ID is what its key keeps from anyone but an operator (400
``not_decodable`` for the others, sending a kind that decodes to the operator's
calls, and saying plainly that a kind without a decoder, strict, cannot be
decoded at all). A tag with tokens needs one of them here too (401 before
anything about the tag).
"""

from __future__ import annotations

from typing import Any

from starlette.requests import Request
from starlette.responses import Response

from idpool.pool.errors import InvalidInput
from idpool.pool.stores import LedgerStore
from idpool.pool.values import TagRow

from . import preamble
from .errors import json_response
from .kinds import names, spec_of


async def decode_issued(ledger: LedgerStore, row: TagRow, value: str) -> dict[str, Any]:
    """``decode``, and for a segment tag the ledger's word that the number was issued
    (``check_issued``): what ``idpool tag decode`` and the admin call answer."""
    found = decode(row, value)
    await spec_of(row.kind).check_issued(ledger, row, found)
    return found


def decode(row: TagRow, value: str) -> dict[str, Any]:
    """What ``value`` was made from; raises InvalidInput (``bad_value``, ``bad_id``)."""
    found = spec_of(row.kind).decode(row, value)
    if found is None:
        raise InvalidInput("bad_value", f"IDs of kind {row.kind!r} cannot be decoded")
    return found


def kind_fields(row: TagRow) -> dict[str, Any]:
    """What a tag's kind adds to its row for the admin API and the CLI (a
    snowflake tag's layout); {} for most."""
    return spec_of(row.kind).row_fields(row)


async def decode_id(request: Request) -> Response:
    # A guarded tag's token first, as /id: its kind and its IDs' parts are the tag's
    # to tell (issue 28: decode answered them where every other route said 401).
    run, tag = await preamble.tag_request(request)
    row = await run.node.tags.lookup(tag)
    spec = spec_of(row.kind)
    if not spec.public_decode:
        public = ", ".join(sorted(names(lambda spec: spec.public_decode)))
        if not spec.decodes:  # no decoder: an operator would be refused as well
            raise InvalidInput(
                "not_decodable",
                f"tag {row.tag!r} is a {row.kind} tag: its IDs cannot be decoded, "
                f"not even by an operator; decoded here: {public} tags",
            )
        raise InvalidInput(
            "not_decodable",
            f"tag {row.tag!r} is a {row.kind} tag: its IDs are decoded only for an operator "
            f"(`idpool tag decode {row.tag} ID`, GET /admin/tags/{row.tag}/decode?value=ID); "
            f"here: {public} tags",
        )
    return json_response(decode(row, request.path_params["id"]))
