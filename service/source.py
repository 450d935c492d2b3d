"""Where a node's ranges come from: one atomic pop from the pool (Redis, or the
embedded SQLite pool) and, for what the pool lacks or while Redis is
unreachable, one claim from the ledger, fenced by the high-water mark
(``pool/claims.py``). After a Redis error the pool is not tried for a moment
(the process's one RedisSkip, shared with the claims).
"""

from __future__ import annotations

import asyncio
import logging
import math
from collections.abc import Callable, Coroutine
from typing import Any

from idpool.pool.claims import LedgerClaims
from idpool.pool.errors import (
    IdPoolError,
    MarkNotRaised,
    MarkNotReplicated,
    NoRangeAvailable,
    StoreBusy,
    StoreSkipped,
    StoreUnavailable,
    TooFewReplicas,
)
from idpool.pool.ranges import IdRange
from idpool.pool.stores import PoolStore
from idpool.pool.waste import Reason, WasteRecorder

from .health import StoreHealth
from .stats import NodeStats

logger = logging.getLogger("idpool.node")


class RangeSource:
    def __init__(
        self,
        claims: LedgerClaims,
        pool: PoolStore | None,
        stats: NodeStats | None = None,
        on_low: Callable[[str], None] | None = None,
        health: StoreHealth | None = None,
        step_of: Callable[[str], int] = lambda tag: 1,
        waste: WasteRecorder | None = None,
    ) -> None:
        self.claims = claims
        self.pool = pool
        self.stats = stats or NodeStats()
        self.on_low = on_low  # called when a tag's list runs low: refill it now
        self.health = health or StoreHealth(claims.ledger, pool)
        self.step_of = step_of  # a tag's step as last known: sizes a batch's claim
        self.waste = waste or WasteRecorder()  # the process's, shared with its preloader
        self._background: set[asyncio.Task[None]] = set()

    async def fetch(self, tag: str, ids: int = 1) -> list[IdRange]:
        """Ranges holding at least ``ids`` IDs (at least one range): one pop from
        the pool, and for what it lacks one claim from the ledger.

        Raises NoRangeAvailable when neither store gives anything; returns what
        the pool gave when only the claim failed (the caller asks again).
        """
        errors: list[StoreUnavailable] = []
        taken = await self._pop(tag, ids, errors)
        missing = ids - sum(map(len, taken))
        if missing <= 0 and taken:
            return taken
        try:
            claim = await self.claims.claim(tag, math.ceil(max(missing, 1) / self.step_of(tag)))
        except IdPoolError as e:
            if not isinstance(e, StoreUnavailable):  # unknown or exhausted tag, stale ledger
                if taken:
                    return taken  # popped ranges are served; the caller asks again
                raise
            self._failed(e)
            errors.append(e)
            if isinstance(e, MarkNotRaised):
                self.waste.record(tag, [e.wasted], Reason.MARK_NOT_RAISED, e.detail)
            if taken:
                return taken
            await self.health.probe_soon()
            raise NoRangeAvailable(tag, self._with_probed(errors)) from e
        self.health.answered(self.health.ledger_name)
        self.waste.record(tag, claim.refused, Reason.STALE_LEDGER, raised_to=claim.raised_to)
        self.stats.tags[tag].ranges_from_ledger += 1
        logger.info("event=range_taken tag=%s range=%s source=ledger", tag, claim.range.to_text())
        return [*taken, claim.range]

    def report_finished(self, tag: str, ids: int, seconds: float) -> None:
        """A buffer used up a range: tell the preloader's dynamic step how long it lasted."""
        if self.pool is not None:
            self.spawn(self.pool.report_lifetime(tag, ids, seconds))

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

    def _with_probed(self, errors: list[StoreUnavailable]) -> list[StoreUnavailable]:
        """The errors met, plus stores the health probe found down: a claim that
        failed on Redis never asked MySQL, and the 503 should name both."""
        named = {e.store for e in errors}
        for store, (_, detail) in self.health.last_error.items():
            if store not in named and not self.health.is_up(store):
                errors.append(StoreUnavailable(store, detail))
        return errors

    def _failed(self, e: StoreUnavailable) -> None:
        # busy, not tried, or answered (too few replicas took the mark): no store error
        if not isinstance(e, StoreBusy | StoreSkipped | MarkNotReplicated | TooFewReplicas):
            self.stats.store_errors[e.store] += 1
        self.health.failed(e)

    async def _pop(self, tag: str, ids: int, errors: list[StoreUnavailable]) -> list[IdRange]:
        if self.pool is None:
            return []
        skipped = self.claims.redis_skip.skipping()
        if skipped is not None:
            errors.append(skipped)  # still counted as down, for the 503 message
            return []
        try:
            result = await self.pool.pop(tag, ids)
        except StoreBusy as e:
            errors.append(e)  # never sent: nothing was taken, and Redis is not at fault
            return []
        except StoreUnavailable as e:
            # The pop may have happened: whatever it took is lost, never reused.
            self.claims.redis_failed(e)  # the claim that follows fails fast too
            self._failed(e)
            logger.warning("event=pool_pop_failed tag=%s detail=%r", tag, e.detail)
            errors.append(e)
            return []
        if self.health.pool_name is not None:
            self.health.answered(self.health.pool_name)
        self.waste.dropped(result.dropped)
        # target_depth is 0 until a preloader has sized this tag's list: leave
        # those to the preloader's next tick.
        if self.on_low is not None and result.depth < result.target_depth / 2:
            self.on_low(tag)
        for taken in result.ranges:
            self.claims.observe(tag, taken)
            self.stats.tags[tag].ranges_from_pool += 1
            logger.info("event=range_taken tag=%s range=%s source=pool", tag, taken.to_text())
        return result.ranges
