"""A node's segment buffers: one ``SegmentBuffer`` per segment tag (or formatted
period's row) served here, made on first use, taken from by the kinds.

The Node owns this object and does its housekeeping (idle release, disabled
tags, shutdown), reading ``buffers``; the kinds and the formats converter reach
only this (``KindContext.buffers``), never the Node. NodeApp's fast path reads
``buffers`` before routing.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable

from idpool.pool.errors import Draining, KindChanged, UnknownTag

from .buffer import SegmentBuffer
from .formatted import FormatFence
from .source import RangeSource
from .stats import NodeStats
from .tags import TagDirectory


class SegmentBuffers:
    def __init__(
        self,
        tags: TagDirectory,
        source: RangeSource,
        fence: FormatFence,
        *,
        prefetch_at: float,
        reserve_seconds: float,
        clock: Callable[[], float],
        draining: Callable[[], bool],
        other_kind: Callable[[str, SegmentBuffer], Awaitable[None]],
        stats: NodeStats,
    ) -> None:
        self.buffers: dict[str, SegmentBuffer] = {}  # tag -> its buffer, served here
        self._tags = tags
        self._source = source
        self._fence = fence
        self._prefetch_at = prefetch_at
        self._reserve_seconds = reserve_seconds
        self._clock = clock  # monotonic seconds
        self._draining = draining
        self._other_kind = other_kind  # the node drops a buffer whose row changed kind
        self._stats = stats

    async def buffer(self, tag: str) -> SegmentBuffer:
        """The tag's buffer, created on first use for a tag the ledger has (raises
        UnknownTag, Draining)."""
        buf = self.buffers.get(tag)
        if buf is not None:
            return buf
        if self._draining():
            raise Draining("node is shutting down")
        await self._tags.lookup(tag)  # raises UnknownTag: no buffer, no pop, no claim
        if tag not in self._tags.formats:
            # A plain tag, first served here: its name must not be a formatted tag's
            # (a format removed from the row by hand would serve numbers the old
            # strings may read as). A formatted tag and its periods' rows were checked
            # by FormattedTags.take. Once per tag and process, off the fast path.
            await self._fence.check_fence(tag)
        buf = self.buffers.get(tag)  # another request may have made it meanwhile
        if buf is None:
            if self._draining():
                raise Draining("node is shutting down")
            buf = SegmentBuffer(
                tag,
                self._source.fetch,
                self._prefetch_at,
                self._source.report_finished,
                self._reserve_seconds,
                clock=self._clock,
            )
            self.buffers[tag] = buf
        return buf

    async def take(self, tag: str) -> int:
        """One ID from the tag's buffer (made on first use), waiting for a range if
        need be."""
        buf = await self.buffer(tag)
        try:
            return await buf.take_waiting()
        except KindChanged:
            await self._other_kind(tag, buf)
            raise
        except UnknownTag:
            self._forget(tag, buf)
            raise

    async def take_many(self, tag: str, count: int) -> list[int]:
        """``count`` IDs from the tag's buffer, in one synchronous step once there."""
        buf = await self.buffer(tag)
        try:
            return await buf.take_many_waiting(count)
        except KindChanged:
            await self._other_kind(tag, buf)
            raise
        except UnknownTag:
            self._forget(tag, buf)
            raise

    def _forget(self, tag: str, buf: SegmentBuffer) -> None:
        # The ledger lost the row (deleted by hand): drop a buffer that holds nothing.
        if buf.current is None and self.buffers.get(tag) is buf:
            del self.buffers[tag]
            self._stats.tags.pop(tag, None)
        self._tags.rows.pop(tag, None)
