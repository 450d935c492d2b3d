"""Formatted tags on a node: a rendering on top of a segment tag.

The rendering itself (templates, periods, obfuscation) is ``idpool_client/formats.py``,
one module shared with the client so both render alike. Here: a tag's options
as the ledger keeps them (``options``: JSON, ``secret``: the obfuscation key),
how they are checked at tag add and shown, and the names of period rows. How a
node serves a formatted tag from its segment buffers, and the format fence of
every name: ``formatted.py``.
"""

from __future__ import annotations

import json
import secrets
from typing import Any

from idpool_client.formats import (
    KEY_BYTES,
    MAX_TEMPLATE,
    RESETS,
    FormatError,
    Obfuscation,
    TagFormat,
    period_of_row,
)

from idpool.pool.errors import InvalidInput
from idpool.pool.ranges import MAX_ID
from idpool.pool.values import TagRow

Id = int | str
MAX_RESET_TAG = 64 - 9  # a period's row name (TAG@YYYYMMDD) must fit the ledger's 64
# The ``secret`` of an obfuscated reset tag whose periods each have their own key
# (period_key), before the key's hex. Tags made before it keep their bare hex (one
# key for every period: a new key could render a number as one already handed out
# in the same period). An idpool that predates it cannot read the secret and
# refuses the tag, never renders it with the tag's key beside nodes that do not.
PERIOD_KEYS = "period:"


def options_for(
    tag: str, template: object, reset: object, obfuscate: object, end_id: int
) -> tuple[str, str]:
    """(options JSON, secret) for a new tag; raises InvalidInput saying what is wrong.

    The obfuscation key is made here, once, with ``secrets``; it is kept in the
    ledger's ``secret`` column and never shown (a lease carries a key derived for
    its period, and only to a holder of the tag's token). With a reset, each
    period gets its own key (PERIOD_KEYS).
    """
    if template is None and reset is None and not obfuscate:
        return "", ""
    if template is not None and not isinstance(template, str):
        raise InvalidInput("bad_format", f"format must be a string of at most {MAX_TEMPLATE}")
    if reset is not None and reset not in RESETS:
        raise InvalidInput("bad_reset", f"reset {str(reset)[:20]!r}: use {', '.join(RESETS)}")
    if not isinstance(obfuscate, bool):
        raise InvalidInput("bad_obfuscate", "obfuscate must be true or false")
    if reset is not None and len(tag) > MAX_RESET_TAG:
        raise InvalidInput(
            "bad_reset",
            f"a tag with a reset may have at most {MAX_RESET_TAG} characters "
            "(each period is a ledger row TAG@YYYYMMDD)",
        )
    key = secrets.token_bytes(KEY_BYTES) if obfuscate else b""
    try:
        TagFormat(
            template,
            reset,
            Obfuscation(key, end_id - 1) if obfuscate else None,
        )
    except FormatError as e:
        raise InvalidInput(e.code, str(e)) from None
    options: dict[str, Any] = {"format": template, "reset": reset}
    if obfuscate:
        options["obfuscate"] = True
        options["max"] = end_id - 1
    secret = key.hex() if reset is None or not obfuscate else PERIOD_KEYS + key.hex()
    return json.dumps(options, ensure_ascii=False), secret


def format_of(row: TagRow) -> TagFormat | None:
    """The row's format, or None for a plain tag."""
    if not row.options:
        return None
    options = json.loads(row.options)
    ob = None
    per_period = row.secret.startswith(PERIOD_KEYS)
    if options.get("obfuscate"):
        key = bytes.fromhex(row.secret.removeprefix(PERIOD_KEYS))
        ob = Obfuscation(key, int(options.get("max", MAX_ID - 1)))
    return TagFormat(options.get("format"), options.get("reset"), ob, period_keys=per_period)


def public_format(row: TagRow) -> dict[str, Any] | None:
    """A tag's format as lists and pages show it: never the key."""
    if not row.options:
        return None
    options = json.loads(row.options)
    return {
        "format": options.get("format"),
        "reset": options.get("reset"),
        "obfuscate": bool(options.get("obfuscate")),
    }


def parent_of(name: str) -> str | None:
    """The tag of a period's row (``TAG@KEY``), None for any other name."""
    found = period_of_row(name)
    return None if found is None else found[0]


def formats_of(rows: list[TagRow] | tuple[TagRow, ...]) -> dict[str, TagFormat | None]:
    """What ``TagDirectory.formats`` learns from rows: a format per formatted tag,
    None per period row (never served by its own name)."""
    found: dict[str, TagFormat | None] = {}
    for row in rows:
        if period_of_row(row.tag) is not None:
            found[row.tag] = None
        elif row.options:
            try:
                found[row.tag] = format_of(row)
            except (ValueError, TypeError, AttributeError):
                # Options this idpool cannot read (a newer one, or a hand edit): None,
                # so the tag is refused (format_for), never served as bare numbers.
                found[row.tag] = None
    return found


def tag_list_entry(row: TagRow) -> str:
    """The format column of ``idpool tag list``."""
    shown = public_format(row)
    if shown is None:
        return ""
    parts = [repr(shown["format"])] if shown["format"] else []
    if shown["reset"]:
        parts.append(f"reset {shown['reset']}")
    if shown["obfuscate"]:
        parts.append("obfuscated")
    return " ".join(parts)


def split_periods(rows: list[TagRow]) -> tuple[list[TagRow], dict[str, dict[str, TagRow]]]:
    """(the tags, and per reset tag its period rows by key): lists show tags only."""
    tags: list[TagRow] = []
    periods: dict[str, dict[str, TagRow]] = {}
    for row in rows:
        found = period_of_row(row.tag)
        if found is None:
            tags.append(row)
        else:
            periods.setdefault(found[0], {})[found[1]] = row
    return tags, periods
