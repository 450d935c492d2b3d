"""How a node serves formatted tags, and the format fence of every name.

``FormattedTags`` is the segment kind's converter over its numbers (as CosId's
IdConverter over its generator): a formatted tag's numbers come from segment
buffers and are rendered (``TagFormat.render``, ``formats.py``) in the step that
takes them. A plain tag never comes here: NodeApp answers it from
``node.buffers``, and only a tag whose row carries a format is in
``TagDirectory.formats`` (read once per row, not per request).

With a reset, each period has a ledger row of its own, ``TAG@KEY`` (created on
first use, fenced like any tag) and a buffer of its own in ``node.buffers``
under that name. A number is rendered with the date read in the same
synchronous step that takes it from the buffer of the period holding that
date, so the period rendered into a string is always the period its number
belongs to. The buffer of a period that ended is no longer asked; it goes back
to its list like any idle buffer (``IDPOOL_IDLE_SECONDS``) or at shutdown.

``FormatFence``: before a tag of any kind is first served here, its row's format
must be the one recorded for its name beside its mark.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

from idpool_client.formats import TagFormat, period_row

from idpool.pool.claims import LedgerClaims, create_tag
from idpool.pool.errors import FormatNotFenced, KindNotServed, TagExists
from idpool.pool.tag_rules import name_fingerprint

from .buffer import Buffers
from .formats import Id, format_of
from .tags import TagDirectory


class FormatFence:
    """Every name's format fence, whatever its kind: a tag is first served here
    only with the format recorded for its name beside its mark."""

    def __init__(
        self,
        tags: TagDirectory,
        claims: LedgerClaims,
        takes_format: Callable[[str], bool],
    ) -> None:
        self.tags = tags  # its rules_of: a kind's rules (its record's prefix)
        self.claims = claims
        self.takes_format = takes_format  # kind name -> may its rows carry a format
        # (tag, fingerprint) whose format this process checked in Redis: keyed on the
        # format too, so a row whose format differs from the one checked is checked
        # again (and refused), never taken as checked
        self._fenced: set[tuple[str, str]] = set()

    async def check_fence(self, tag: str) -> None:
        """Before this process first serves ``tag``, of any kind: its row's
        format must be the one recorded for the name beside its mark
        (``idpool:{tag}:format``, "plain" for none), else FormatNotFenced: a row
        inserted or edited by hand with another format, or with its format added or
        removed, could repeat strings the name handed out. A missing record is
        written (a Redis that lost it gets it back). Raises StoreUnavailable (no
        claim without Redis either)."""
        tags = self.tags
        row = tags.rows.get(tag) or await tags.lookup(tag)
        if row.options and not self.takes_format(row.kind):
            # Strict and snowflake tags have no format (their creation refuses one):
            # a row carrying options was a formatted tag whose kind was edited by hand
            raise FormatNotFenced(tag, f"a {row.kind} tag has no format, and its row carries one")
        if tag in tags.changed:  # read again with another format (TagDirectory._learn_formats)
            raise FormatNotFenced(tag, "its row's format changed since this node read it")
        fingerprint = name_fingerprint(row, tags.rules_of(row.kind))
        if (tag, fingerprint) in self._fenced:
            return
        marks = self.claims.marks
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


class FormattedTags:
    """A converter over a segment tag's numbers (the segment kind's, as CosId's
    IdConverter over its generator): a formatted tag's numbers come from segment
    buffers and are rendered (``TagFormat.render``) in the step that takes them."""

    def __init__(
        self,
        tags: TagDirectory,
        buffers: Buffers,
        claims: LedgerClaims,
        wall_clock: Callable[[], float],
        fence: FormatFence,
    ) -> None:
        self.tags = tags
        self.buffers = buffers
        self.claims = claims
        self.wall_clock = wall_clock  # the dates of formatted IDs
        self.fence = fence
        self._creating: dict[str, asyncio.Task[None]] = {}

    def format_for(self, tag: str) -> TagFormat | None:
        """The tag's format, None for a plain tag; raises KindNotServed for a
        format this node cannot read."""
        formats = self.tags.formats
        if tag not in formats:
            return None
        if tag in self.tags.changed:
            raise FormatNotFenced(tag, "its row's format changed since this node read it")
        fmt = formats[tag]
        if fmt is None:
            raise KindNotServed(tag, "segment, with a format this node cannot read")
        return fmt

    def take_now(self, tag: str, fmt: TagFormat, count: int) -> Id | list[Any] | None:
        """From memory, in one synchronous step (NodeApp's fast path): one ID for
        ``count == 0``, else ``count`` IDs; None when the buffer must be waited for."""
        now = self.wall_clock()
        name = tag if fmt.reset is None else period_row(tag, fmt.period(now)[0])
        buf = self.buffers.buffers.get(name)
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
        await self.fence.check_fence(tag)
        while True:
            value = self.take_now(tag, fmt, count)
            if value is not None:
                return value
            now = self.wall_clock()
            name = tag if fmt.reset is None else period_row(tag, fmt.period(now)[0])
            if name != tag:
                await self._period_row(tag, name)
            buf = await self.buffers.buffer(name)
            if buf.in_memory >= max(1, count):
                continue  # filled meanwhile
            # Wait for what is missing, then take again: with the date read anew, so
            # a midnight passed while waiting takes from the new period's buffer.
            await buf.wait_for(max(1, count) - buf.in_memory)

    async def lease_row(self, tag: str, fmt: TagFormat) -> tuple[str, float, float]:
        """(row name, from, until) of the ledger row a lease of ``tag`` comes from now."""
        await self.fence.check_fence(tag)
        if fmt.reset is None:
            return tag, float("-inf"), float("inf")
        key, start, until = fmt.period(self.wall_clock())
        name = period_row(tag, key)
        await self._period_row(tag, name)
        return name, start, until

    async def _period_row(self, tag: str, name: str) -> None:
        """Make sure the period's ledger row exists (one creation at a time per name)."""
        if name in self.tags.rows:
            return
        task = self._creating.get(name)
        if task is None:
            task = asyncio.ensure_future(self._create(tag, name))
            self._creating[name] = task
            task.add_done_callback(lambda _: self._creating.pop(name, None))
        await asyncio.shield(task)

    async def _create(self, tag: str, name: str) -> None:
        parent = await self.tags.lookup(tag)  # raises UnknownTag, TagDisabled
        claims = self.claims
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
                rules=self.tags.rules_of(parent.kind),
            )
        except TagExists:  # another node made it first
            row = await claims.ledger.get_tag(name)
        self.tags.added(row)
