"""A node: the per-tag buffers of one process, and where their ranges come from.

A range comes from the Redis pool (one atomic pop) or, when the pool is empty
or Redis is unreachable, straight from the MySQL ledger. On shutdown the unused
remainders go back to the head of each tag's list, so the next node serves them
first: IDs are trend-increasing across nodes, not strictly rising.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Coroutine
from dataclasses import dataclass, field
from typing import Any

from pool.claims import REDIS_SKIP_SECONDS, LedgerClaims
from pool.errors import IdPoolError, StoreUnavailable, UnknownTag
from pool.preloader import log_dropped, log_refused
from pool.ranges import IdRange
from pool.stores import PoolStore

from .buffer import Draining, SegmentBuffer
from .stats import SAMPLE_EVERY, NodeStats

logger = logging.getLogger("idpool.node")

_UNKNOWN_CACHE_LIMIT = 10_000


class NoRangeAvailable(IdPoolError):
    """Neither store could supply a range; the message says which is down and why."""

    def __init__(self, tag: str, errors: list[StoreUnavailable]) -> None:
        stores = " and ".join(e.store for e in errors)
        details = "; ".join(str(e) for e in errors)
        super().__init__(f"no ID range available for tag {tag!r}: {stores} down ({details})")
        self.stores = [e.store for e in errors]


class RangeSource:
    def __init__(
        self,
        claims: LedgerClaims,
        redis_pool: PoolStore | None,
        stats: NodeStats | None = None,
        on_low: Callable[[str], None] | None = None,
    ) -> None:
        self.claims = claims
        self.redis_pool = redis_pool
        self.stats = stats or NodeStats()
        self.on_low = on_low  # called when a tag's list runs low: refill it now
        self._skip_redis_until = 0.0
        self._redis_error: StoreUnavailable | None = None
        self.last_error: dict[str, tuple[float, str]] = {}  # store -> (unix time, detail)
        self._background: set[asyncio.Task[None]] = set()
        # monotonic times of the last fetch that found a range / found none anywhere
        self.last_fetched = 0.0
        self.last_starved = 0.0

    @property
    def starved(self) -> bool:
        """The latest fetch found no range in any store (readiness fails until one does)."""
        return self.last_starved > self.last_fetched

    async def fetch(self, tag: str) -> IdRange:
        errors: list[StoreUnavailable] = []
        taken = await self._pop(tag, errors)
        if taken is not None:
            self.last_fetched = time.monotonic()
            return taken
        try:
            claim = await self.claims.claim(tag)
        except StoreUnavailable as e:
            self._failed(e)
            errors.append(e)
            self.last_starved = time.monotonic()
            raise NoRangeAvailable(tag, errors) from e
        self.last_fetched = time.monotonic()
        log_refused(logger, tag, claim.refused, claim.raised_to)
        for refused in claim.refused:
            self.stats.waste(tag, "stale_ledger", len(refused))
        self.stats.tags[tag].ranges_from_ledger += 1
        logger.info("event=range_taken tag=%s range=%s source=ledger", tag, claim.range.to_text())
        self._count_taken(tag, len(claim.range))
        return claim.range

    def report_finished(self, tag: str, ids: int, seconds: float) -> None:
        """A buffer used up a range: tell the preloader's dynamic step how long it lasted."""
        if self.redis_pool is not None:
            self.spawn(self.redis_pool.report_lifetime(tag, ids, seconds))

    def spawn(self, coro: Coroutine[Any, Any, None]) -> None:
        """Best-effort store write off the request path (a lost figure only skews sizing)."""

        async def guarded() -> None:
            try:
                await coro
            except StoreUnavailable:
                pass

        task = asyncio.ensure_future(guarded())
        self._background.add(task)
        task.add_done_callback(self._background.discard)

    async def close(self) -> None:
        if self._background:
            await asyncio.wait(list(self._background), timeout=5)

    def _count_taken(self, tag: str, ids: int) -> None:
        if self.redis_pool is not None and time.monotonic() >= self._skip_redis_until:
            self.spawn(self.redis_pool.count_taken(tag, ids))

    def _failed(self, e: StoreUnavailable) -> None:
        self.stats.store_errors[e.store] += 1
        self.last_error[e.store] = (time.time(), e.detail)

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
            self.claims.redis_failed()  # the claim that follows skips Redis too
            self._failed(e)
            logger.warning("event=pool_pop_failed tag=%s detail=%r", tag, e.detail)
            errors.append(e)
            return None
        log_dropped(logger, result.dropped)
        for item in result.dropped:
            dropped_tag, _, text = item.partition("=")
            self.stats.waste(dropped_tag, "redis_new_incarnation", len(IdRange.from_text(text)))
        # target_depth is 0 until a preloader has sized this tag's list (and for
        # tags that do not exist): leave those to the preloader's next tick.
        if self.on_low is not None and result.depth < result.target_depth / 2:
            self.on_low(tag)
        if result.range is None:
            return None
        self.claims.observe(tag, result.range)
        self.stats.tags[tag].ranges_from_pool += 1
        logger.info("event=range_taken tag=%s range=%s source=pool", tag, result.range.to_text())
        self._count_taken(tag, len(result.range))
        return result.range


@dataclass
class ShutdownReport:
    returned: list[tuple[str, IdRange]] = field(default_factory=list)
    abandoned: list[tuple[str, IdRange]] = field(default_factory=list)


class Node:
    def __init__(self, source: RangeSource, *, prefetch_at: float, unknown_tag_ttl: float) -> None:
        self.source = source
        self.stats = source.stats
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
        buf = SegmentBuffer(tag, self.source.fetch, self.prefetch_at, self.source.report_finished)
        self.buffers[tag] = buf
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

    def sample(self, now: float | None = None) -> None:
        """Record IDs issued per tag, for the consumption chart."""
        now = time.time() if now is None else now
        for tag, buf in self.buffers.items():
            self.stats.tags[tag].history.append((now, buf.issued))

    async def run_sampler(self) -> None:
        while True:
            self.sample()
            await asyncio.sleep(SAMPLE_EVERY)

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
        await self.source.close()
        return report

    async def _return(self, tag: str, remainder: list[IdRange], report: ShutdownReport) -> None:
        texts = ",".join(r.to_text() for r in remainder)
        ids = sum(map(len, remainder))
        pool = self.source.redis_pool
        if pool is None:
            report.abandoned += [(tag, r) for r in remainder]
            self.stats.waste(tag, "no_pool", ids)
            logger.warning("event=range_abandoned tag=%s range=%s reason=no_pool", tag, texts)
            return
        try:
            result = await pool.push(tag, remainder, head=True)
        except StoreUnavailable as e:
            # Maybe pushed, maybe not: never retried, the remainder is waste.
            report.abandoned += [(tag, r) for r in remainder]
            self.stats.waste(tag, "push_outcome_unknown", ids)
            logger.error(
                "event=range_abandoned tag=%s range=%s reason=push_outcome_unknown detail=%r",
                tag,
                texts,
                e.detail,
            )
            return
        log_dropped(logger, result.dropped)
        report.returned += [(tag, r) for r in remainder]
        self.stats.tags[tag].ids_returned += ids
        logger.info("event=range_returned tag=%s range=%s depth=%d", tag, texts, result.depth)
