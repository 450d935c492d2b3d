"""Formatted tags on a node: a rendering on top of a segment tag.

The rendering itself (templates, periods, obfuscation) is ``idpool_client/formats.py``,
one module shared with the client so both render alike. Here: a tag's options
as the ledger keeps them (``options``: JSON, ``secret``: the obfuscation key),
and how a node serves a formatted tag from its segment buffers.

A plain tag never comes here: NodeApp answers it from ``node.buffers`` as
before, and only a tag whose row carries a format is in ``TagDirectory.formats``
(read once per row, not per request).

With a reset, each period has a ledger row of its own, ``TAG@KEY`` (created on
first use, fenced like any tag) and a buffer of its own in ``node.buffers``
under that name. A number is rendered with the date read in the same
synchronous step that takes it from the buffer of the period holding that
date, so the period rendered into a string is always the period its number
belongs to. The buffer of a period that ended is no longer asked; it goes back
to its list like any idle buffer (``IDPOOL_IDLE_SECONDS``) or at shutdown.
"""

from __future__ import annotations

import asyncio
import json
import secrets
from typing import TYPE_CHECKING, Any

from idpool_client.formats import (
    KEY_BYTES,
    MAX_TEMPLATE,
    RESETS,
    FormatError,
    Obfuscation,
    TagFormat,
    period_of_row,
    period_row,
)

from idpool.pool.claims import create_tag
from idpool.pool.errors import FormatNotFenced, InvalidInput, KindNotServed, TagExists
from idpool.pool.ranges import MAX_ID
from idpool.pool.tag_rules import name_fingerprint
from idpool.pool.values import TagRow

from .kinds import SEGMENT, rules_of

if TYPE_CHECKING:
    from .node import Node

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


def describe(row: TagRow) -> dict[str, Any] | None:
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


class FormattedTags:
    """How a node serves formatted tags: numbers from segment buffers, rendered."""

    def __init__(self, node: Node) -> None:
        self.node = node
        self._creating: dict[str, asyncio.Task[None]] = {}
        # (tag, fingerprint) whose format this process checked in Redis: keyed on the
        # format too, so a row whose format differs from the one checked is checked
        # again (and refused), never taken as checked
        self._fenced: set[tuple[str, str]] = set()

    def format_for(self, tag: str) -> TagFormat | None:
        """The tag's format, None for a plain tag; raises KindNotServed for a
        format this node cannot read."""
        formats = self.node.tags.formats
        if tag not in formats:
            return None
        if tag in self.node.tags.changed:
            raise FormatNotFenced(tag, "its row's format changed since this node read it")
        fmt = formats[tag]
        if fmt is None:
            raise KindNotServed(tag, "segment, with a format this node cannot read")
        return fmt

    def take_now(self, tag: str, fmt: TagFormat, count: int) -> Id | list[Any] | None:
        """From memory, in one synchronous step (NodeApp's fast path): one ID for
        ``count == 0``, else ``count`` IDs; None when the buffer must be waited for."""
        node = self.node
        now = node.wall_clock()
        name = tag if fmt.reset is None else period_row(tag, fmt.period(now)[0])
        buf = node.buffers.get(name)
        if buf is None:
            return None
        if count == 0:
            n = buf.take()
            return None if n is None else fmt.render(n, now)
        if buf.in_memory < count:
            return None
        return fmt.render_many(buf.take_many(count), now)

    async def take(self, tag: str, fmt: TagFormat, count: int) -> Id | list[Any]:
        """What ``take_now`` answers, waiting for a range (or a period's row) if need be."""
        node = self.node
        await self.check_fence(tag)
        while True:
            value = self.take_now(tag, fmt, count)
            if value is not None:
                return value
            now = node.wall_clock()
            name = tag if fmt.reset is None else period_row(tag, fmt.period(now)[0])
            if name != tag:
                await self._period_row(tag, name)
            buf = await node.buffer(name)
            if buf.in_memory >= max(1, count):
                continue  # filled meanwhile
            # Wait for what is missing, then take again: with the date read anew, so
            # a midnight passed while waiting takes from the new period's buffer.
            await buf.wait_for(max(1, count) - buf.in_memory)

    async def sequence(self, tag: str, fmt: TagFormat) -> tuple[str, float, float]:
        """(row name, from, until) of the sequence a lease of ``tag`` comes from now."""
        await self.check_fence(tag)
        if fmt.reset is None:
            return tag, float("-inf"), float("inf")
        key, start, until = fmt.period(self.node.wall_clock())
        name = period_row(tag, key)
        await self._period_row(tag, name)
        return name, start, until

    async def check_fence(self, tag: str) -> None:
        """Before this process first serves ``tag``, of any kind: its row's
        format must be the one recorded for the name beside its mark
        (``idpool:{tag}:format``, "plain" for none), else FormatNotFenced: a row
        inserted or edited by hand with another format, or with its format added or
        removed, could repeat strings the name handed out. A missing record is
        written (a Redis that lost it gets it back). Raises StoreUnavailable (no
        claim without Redis either)."""
        tags = self.node.tags
        row = tags.rows.get(tag) or await tags.lookup(tag)
        if row.options and row.kind != SEGMENT:
            # Strict and snowflake tags have no format (their creation refuses one):
            # a row carrying options was a formatted tag whose kind was edited by hand
            raise FormatNotFenced(tag, f"a {row.kind} tag has no format, and its row carries one")
        if tag in tags.changed:  # read again with another format (TagDirectory._learn_formats)
            raise FormatNotFenced(tag, "its row's format changed since this node read it")
        fingerprint = name_fingerprint(row, rules_of(row.kind))
        if (tag, fingerprint) in self._fenced:
            return
        marks = self.node.source.claims.marks
        if marks is not None:
            found = await marks.fence_format(tag, fingerprint, serving=True)
            if found not in ("same", "set"):
                raise FormatNotFenced(tag)
        fmt = format_of(row) if row.options else None
        if fmt is not None and fmt.obfuscation is not None and row.end_id - 1 > fmt.obfuscation.top:
            # end_id edited by hand past the permutation's domain: numbers above it
            # have no string (a 500 per request, a lease the client cannot render)
            raise FormatNotFenced(
                tag,
                f"its end_id {row.end_id} is above its obfuscation's max {fmt.obfuscation.top} "
                "(a row edited by hand)",
            )
        self._fenced.add((tag, fingerprint))

    async def _period_row(self, tag: str, name: str) -> None:
        """Make sure the period's ledger row exists (one creation at a time per name)."""
        if name in self.node.tags.rows:
            return
        task = self._creating.get(name)
        if task is None:
            task = asyncio.ensure_future(self._create(tag, name))
            self._creating[name] = task
            task.add_done_callback(lambda _: self._creating.pop(name, None))
        await asyncio.shield(task)

    async def _create(self, tag: str, name: str) -> None:
        node = self.node
        parent = await node.tags.lookup(tag)  # raises UnknownTag, TagDisabled
        claims = node.source.claims
        try:
            # Fenced like any tag: create_tag starts it above the high-water mark
            # of that name, so a row deleted by hand never repeats its numbers.
            row = await create_tag(
                claims.ledger,
                claims.marks,
                name,
                step=parent.step,
                start=parent.start_id,
                description=f"{tag}: numbers of period {name.rpartition('@')[2]}",
                end_id=parent.end_id,
                rules=rules_of(parent.kind),
            )
        except TagExists:  # another node made it first
            row = await claims.ledger.get_tag(name)
        node.tags.added(row)


def tag_list_entry(row: TagRow) -> str:
    """The format column of ``idpool tag list``."""
    shown = describe(row)
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
