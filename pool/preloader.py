"""The preloader job: keep every tag's Redis list topped up from the ledger.

One tick, per tag: take the tag's refill lease (SET NX PX), read the list depth,
claim ``depth target - depth`` ranges from MySQL in one UPDATE, and RPUSH them in
one script call. The lease keeps several preloaders (one per service process by
default) from filling the same tag at once, so the list overfills by at most the
ranges of one tick whose lease ran out mid-way.

A push whose outcome is unknown (timeout, broken connection) is not retried:
the ranges are abandoned and logged as waste, never pushed a second time.
"""

from __future__ import annotations

import asyncio
import logging
import os
import socket
import uuid
from dataclasses import dataclass, field
from datetime import UTC, datetime

from apscheduler.schedulers.asyncio import AsyncIOScheduler

from .claims import LedgerClaims
from .errors import IdPoolError, StoreUnavailable
from .ranges import IdRange
from .settings import Settings
from .stores import LedgerStore, PoolStore

logger = logging.getLogger("idpool.preloader")


@dataclass
class RefillReport:
    tag: str
    pushed: list[IdRange] = field(default_factory=list)
    abandoned: list[IdRange] = field(default_factory=list)
    skipped: str = ""  # why nothing was done: "lease held", "full", or an error


def owner_id() -> str:
    return f"{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:8]}"


class Preloader:
    def __init__(
        self,
        settings: Settings,
        ledger: LedgerStore,
        redis_pool: PoolStore,
        claims: LedgerClaims | None = None,
    ) -> None:
        self.settings = settings
        self.ledger = ledger
        self.redis_pool = redis_pool
        self.claims = claims or LedgerClaims(ledger, redis_pool)
        self.owner = owner_id()
        self._scheduler: AsyncIOScheduler | None = None
        self._tick_task: asyncio.Task[list[RefillReport]] | None = None
        self._closing = False

    def start(self) -> None:
        """Run a tick now and then every ``preload_interval`` seconds."""
        if self._scheduler is not None:
            return
        self._scheduler = AsyncIOScheduler()
        self._scheduler.add_job(
            self._scheduled_tick,
            "interval",
            seconds=self.settings.preload_interval,
            max_instances=1,
            coalesce=True,
            next_run_time=datetime.now(UTC),
        )
        self._scheduler.start()

    async def close(self) -> None:
        """Stop the schedule and wait for a tick under way, so its claims get pushed."""
        self._closing = True
        if self._scheduler is not None:
            scheduler, self._scheduler = self._scheduler, None
            scheduler.shutdown(wait=False)
        task = self._tick_task
        if task is not None and not task.done():
            await asyncio.wait([task])

    async def _scheduled_tick(self) -> None:
        if self._closing or (self._tick_task is not None and not self._tick_task.done()):
            return
        # The tick runs as its own task: if the scheduler cancels this job on
        # shutdown, a claim already made still gets pushed (or logged as waste).
        self._tick_task = asyncio.ensure_future(self.refill_all())
        await asyncio.shield(self._tick_task)

    async def refill_all(self) -> list[RefillReport]:
        try:
            rows = await self.ledger.list_tags()
        except StoreUnavailable as e:
            logger.warning("event=preload_skipped reason=%r", e.detail)
            return []
        reports = []
        for row in rows:
            if self._closing:
                break
            reports.append(await self.refill_tag(row.tag, row.step))
        return reports

    async def refill_tag(self, tag: str, step: int) -> RefillReport:
        report = RefillReport(tag)
        target = self.settings.pool_depth
        try:
            if not await self.redis_pool.acquire_lease(
                tag, self.owner, self.settings.lease_seconds
            ):
                report.skipped = "lease held"
                return report
        except StoreUnavailable as e:
            report.skipped = e.detail
            return report
        try:
            depth = await self.redis_pool.depth(tag)
            if depth >= target:
                report.skipped = "full"
                return report
            await self._claim_and_push(report, tag, step, target - depth)
        except IdPoolError as e:
            report.skipped = str(e)
            logger.warning("event=preload_failed tag=%s reason=%r", tag, str(e))
        finally:
            await self._release(tag)
        return report

    async def _claim_and_push(self, report: RefillReport, tag: str, step: int, need: int) -> None:
        claim = await self.claims.claim(tag, need)
        log_refused(logger, tag, claim.refused, claim.raised_to)
        # The ledger's step may have changed since list_tags(): split by what was claimed.
        ranges = claim.range.split(len(claim.range) // need)
        logger.info("event=range_claimed tag=%s range=%s for=pool", tag, claim.range.to_text())
        try:
            result = await self.redis_pool.push(tag, ranges, head=False)
        except StoreUnavailable as e:
            # Maybe pushed, maybe not: never push again; count the range as waste.
            report.abandoned = ranges
            logger.error(
                "event=range_abandoned tag=%s range=%s reason=push_outcome_unknown detail=%r",
                tag,
                claim.range.to_text(),
                e.detail,
            )
            return
        log_dropped(logger, result.dropped)
        report.pushed = ranges
        logger.info(
            "event=ranges_pushed tag=%s range=%s ranges=%d depth=%d",
            tag,
            claim.range.to_text(),
            len(ranges),
            result.depth,
        )

    async def _release(self, tag: str) -> None:
        try:
            await self.redis_pool.release_lease(tag, self.owner)
        except StoreUnavailable:
            pass  # the lease expires by itself


def log_refused(log: logging.Logger, tag: str, refused: list[IdRange], raised: int | None) -> None:
    for r in refused:
        log.error(
            "event=stale_ledger tag=%s range=%s raised_max_id_to=%s "
            "detail='MySQL returned a range below the high-water mark; range abandoned'",
            tag,
            r.to_text(),
            raised,
        )


def log_dropped(log: logging.Logger, dropped: list[str]) -> None:
    """Ranges a new Redis incarnation held when it was cleaned: abandoned, never served."""
    for item in dropped:
        tag, _, text = item.partition("=")
        log.warning("event=range_abandoned tag=%s range=%s reason=redis_new_incarnation", tag, text)
