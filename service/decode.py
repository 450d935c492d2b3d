"""``idpool tag decode`` and ``GET /admin/tags/{tag}/decode?value=``: an ID back to
what it was made from, for operators.

One decoder per kind of ID (``DECODERS``), chosen by the tag's ``kind`` column:
a new kind that can decode its IDs adds a line there, and the command and the
admin call take it as they are.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from idpool.pool.errors import InvalidInput
from idpool.pool.values import TagRow

from .formats import describe, format_of
from .kinds import SEGMENT

Decoder = Callable[[TagRow, str], dict[str, Any]]


def decode_segment(row: TagRow, value: str) -> dict[str, Any]:
    """A segment tag's ID: its sequence number (through its format, if any)."""
    fmt = format_of(row)
    try:
        if fmt is None:
            number = int(value)
        else:
            number = fmt.decode(value if fmt.text else int(value))
    except ValueError as e:
        raise InvalidInput(
            "bad_value", f"{value[:80]!r} is not an ID of tag {row.tag!r}: {e}"
        ) from None
    found: dict[str, Any] = {"tag": row.tag, "kind": row.kind, "value": value, "sequence": number}
    shown = describe(row)
    if shown is not None:
        found["format"] = shown
        if shown["reset"]:
            found["note"] = f"sequence number within its {shown['reset']} period (the ID's date)"
    return found


# Every kind whose IDs can be decoded: its name -> its decoder.
DECODERS: dict[str, Decoder] = {SEGMENT: decode_segment}


def decode(row: TagRow, value: str) -> dict[str, Any]:
    """What ``value`` was made from; raises InvalidInput (``bad_value``)."""
    decoder = DECODERS.get(row.kind)
    if decoder is None:
        raise InvalidInput("bad_value", f"IDs of kind {row.kind!r} cannot be decoded")
    return decoder(row, value)
