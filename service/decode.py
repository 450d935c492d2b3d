"""What an ID says, by the kind of its tag: ``GET /decode/{tag}/{id}`` and
``idpool tag decode TAG ID`` both call ``decode``.

A snowflake ID decodes to its time, worker ID and sequence (``pool/snowflake.py``).
A kind with something to say about its IDs adds a function to ``DECODERS``;
the others answer 400 ``not_decodable``.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from idpool.pool.errors import InvalidInput
from idpool.pool.snowflake import Layout
from idpool.pool.values import TagRow

from .errors import json_response
from .snowflake import SNOWFLAKE
from .tag_fields import check_tag


def _snowflake(row: TagRow, text: str) -> dict[str, Any]:
    if not (text.isascii() and text.isdigit()) or len(text) > 19:
        raise InvalidInput("bad_id", f"{text[:40]!r} is not an ID of tag {row.tag!r} (digits)")
    return Layout.from_text(row.layout).decode(int(text))


# kind -> how an ID of a tag of that kind is decoded (the ID as given, as text)
DECODERS: dict[str, Callable[[TagRow, str], dict[str, Any]]] = {SNOWFLAKE: _snowflake}


def decode(row: TagRow, text: str) -> dict[str, Any]:
    """What ``text`` (an ID of ``row``'s tag) says; raises InvalidInput."""
    decoder = DECODERS.get(row.kind)
    if decoder is None:
        raise InvalidInput(
            "not_decodable",
            f"tag {row.tag!r} is a {row.kind} tag: its IDs are plain numbers with nothing "
            f"to decode (decodable kinds: {', '.join(DECODERS)})",
        )
    return {"tag": row.tag, "kind": row.kind, **decoder(row, text)}


def snowflake_fields(row: TagRow) -> dict[str, Any]:
    """A snowflake tag's layout, for the admin API and the CLI's list; {} for others."""
    if row.kind != SNOWFLAKE or not row.layout:
        return {}
    layout = Layout.from_text(row.layout)
    return {"layout": layout.describe(), "bits": layout.bits}


async def decode_id(request: Request) -> Response:
    tag = check_tag(request.path_params["tag"])
    row = await request.state.run.node.tags.lookup(tag)
    return json_response(decode(row, request.path_params["id"]))


ROUTES = [Route("/decode/{tag}/{id}", decode_id, methods=["GET"])]
