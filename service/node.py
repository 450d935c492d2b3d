"""A node: the per-tag buffers of one process, and where their ranges come from.

A range comes from the Redis pool (one atomic pop) or, when the pool is empty
or Redis is unreachable, straight from the MySQL ledger. On shutdown the unused
remainders go back to the head of each tag's list, so the next node serves them
first: IDs are trend-increasing across nodes, not strictly rising.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass, field

from pool.claims import LedgerClaims
from pool.errors import IdPoolError, StoreUnavailable, UnknownTag
from pool.preloader import log_dropped, log_refused
from pool.ranges import IdRange
from pool.stores import PoolStore

from .buffer import Draining, SegmentBuffer

logger = logging.getLogger("idpool.node")

REDIS_SKIP_SECONDS = 1.0  # after a Redis error, go straight to MySQL for this long
_UNKNOWN_CACHE_LIMIT = 10_000


class NoRangeAvailable(IdPoolError):
    """Neither store could supply a range; the message says which is down and why."""

    def __init__(self, tag: str, errors: list[StoreUnavailable]) -> None:
        stores = " and ".join(e.store for e in errors)
        details = "; ".join(str(e) for e in errors)
        super().__init__(f"no ID range available for tag {tag!r}: {stores} down ({details})")
        self.stores = [e.store for e in errors]


class RangeSource:
    def __init__(self, claims: LedgerClaims, redis_pool: PoolStore | None) -> None:
        self.claims = claims
        self.redis_pool = redis_pool
        self._skip_redis_until = 0.0
        self._redis_error: StoreUnavailable | None = None

    async def fetch(self, tag: str) -> IdRange:
        errors: list[StoreUnavailable] = []
        taken = await self._pop(tag, errors)
        if taken is not None:
            return taken
        try:
            claim = await self.claims.claim(tag)
        except StoreUnavailable as e:
            errors.append(e)
            raise NoRangeAvailable(tag, errors) from e
        log_refused(logger, tag, claim.refused, claim.raised_to)
        logger.info("event=range_taken tag=%s range=%s source=ledger", tag, claim.range.to_text())
        return claim.range

    async def _pop(self, tag: str, errors: list[StoreUnavailable]) -> IdRange | None:
        if self.redis_pool is None:
            return None
        if time.monotonic() < self._skip_redis_until and self._redis_error is not None:
            errors.append(self._redis_error)  # still counted as down, for the 503 message
            return None
        try:
            result = await self.redis_pool.pop(tag)
        except StoreUnavailable as e:
            # The pop may have happened: whatever it took is lost, never reused.
            self._skip_redis_until = time.monotonic() + REDIS_SKIP_SECONDS
            self._redis_error = e
            logger.warning("event=pool_pop_failed tag=%s detail=%r", tag, e.detail)
            errors.append(e)
            return None
        log_dropped(logger, result.dropped)
        if result.range is None:
            return None
        self.claims.observe(tag, result.range)
        logger.info("event=range_taken tag=%s range=%s source=pool", tag, result.range.to_text())
        return result.range


@dataclass
class ShutdownReport:
    returned: list[tuple[str, IdRange]] = field(default_factory=list)
    abandoned: list[tuple[str, IdRange]] = field(default_factory=list)


class Node:
    def __init__(self, source: RangeSource, *, prefetch_at: float, unknown_tag_ttl: float) -> None:
        self.source = source
        self.prefetch_at = prefetch_at
        self.unknown_tag_ttl = unknown_tag_ttl
        self.buffers: dict[str, SegmentBuffer] = {}
        self.draining = False
        self._unknown_until: dict[str, float] = {}
        self._shutdown_report: ShutdownReport | None = None

    def buffer(self, tag: str) -> SegmentBuffer:
        """The tag's buffer, created on first use (tags added after start need no restart)."""
        buf = self.buffers.get(tag)
        if buf is not None:
            return buf
        if self.draining:
            raise Draining("node is shutting down")
        until = self._unknown_until.get(tag)
        if until is not None and time.monotonic() < until:
            raise UnknownTag(tag)
        buf = self.buffers[tag] = SegmentBuffer(tag, self.source.fetch, self.prefetch_at)
        return buf

    async def next_id(self, tag: str) -> int:
        buf = self.buffer(tag)
        try:
            return await buf.take_waiting()
        except UnknownTag:
            self._forget(tag, buf)
            raise

    async def next_ids(self, tag: str, count: int) -> list[int]:
        buf = self.buffer(tag)
        try:
            return await buf.take_many_waiting(count)
        except UnknownTag:
            self._forget(tag, buf)
            raise

    def _forget(self, tag: str, buf: SegmentBuffer) -> None:
        # Only a buffer that never held a range is dropped; the tag may be created later.
        if buf.current is None and self.buffers.get(tag) is buf:
            del self.buffers[tag]
        if len(self._unknown_until) >= _UNKNOWN_CACHE_LIMIT:
            self._unknown_until.clear()
        self._unknown_until[tag] = time.monotonic() + self.unknown_tag_ttl

    async def shutdown(self) -> ShutdownReport:
        """Stop serving, then push every unused remainder back to the pool, once.

        Safe to call twice: the second call returns the first call's report.
        """
        if self._shutdown_report is not None:
            return self._shutdown_report
        report = self._shutdown_report = ShutdownReport()
        self.draining = True
        for tag, buf in list(self.buffers.items()):
            remainder = await buf.drain()
            if remainder:
                await self._return(tag, remainder, report)
        return report

    async def _return(self, tag: str, remainder: list[IdRange], report: ShutdownReport) -> None:
        texts = ",".join(r.to_text() for r in remainder)
        pool = self.source.redis_pool
        if pool is None:
            report.abandoned += [(tag, r) for r in remainder]
            logger.warning("event=range_abandoned tag=%s range=%s reason=no_pool", tag, texts)
            return
        try:
            result = await pool.push(tag, remainder, head=True)
        except StoreUnavailable as e:
            # Maybe pushed, maybe not: never retried, the remainder is waste.
            report.abandoned += [(tag, r) for r in remainder]
            logger.error(
                "event=range_abandoned tag=%s range=%s reason=push_outcome_unknown detail=%r",
                tag,
                texts,
                e.detail,
            )
            return
        log_dropped(logger, result.dropped)
        report.returned += [(tag, r) for r in remainder]
        logger.info("event=range_returned tag=%s range=%s depth=%d", tag, texts, result.depth)
