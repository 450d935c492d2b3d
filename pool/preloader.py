"""The preloader job: keep every tag's Redis list topped up from the ledger.

One tick, per tag: adapt the step to how long ranges last at the nodes, size the
list to cover ``pool_seconds`` of recent consumption, take the tag's refill lease
(SET NX PX), read the list depth, claim ``target - depth`` ranges from MySQL in
one UPDATE, and RPUSH them in one script call. The lease keeps several
preloaders (one per service process by default) from filling the same tag at
once, so the list overfills by at most the ranges of one tick whose lease ran
out mid-way.

A push whose outcome is unknown (timeout, broken connection) is not retried:
the ranges are abandoned and logged as waste, never pushed a second time.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import socket
import time
import uuid
from collections import Counter
from dataclasses import dataclass, field
from datetime import UTC, datetime

from apscheduler.schedulers.asyncio import AsyncIOScheduler

from .claims import LedgerClaims
from .errors import IdPoolError, MarkNotRaised, StoreBusy, StoreUnavailable
from .ledger import TagRow
from .ranges import IdRange
from .redis_pool import PushResult
from .settings import Settings
from .sizing import RateMeter, next_step, target_depth
from .stores import LedgerStore, PoolStore

logger = logging.getLogger("idpool.preloader")

_BUSY_RETRIES = 3  # a push that found every connection busy (never sent) is sent again


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
        self._meters: dict[str, RateMeter] = {}
        self.wasted: Counter[tuple[str, str]] = Counter()  # (tag, reason) -> IDs
        self._urgent: set[asyncio.Task[None]] = set()
        self._urgent_after: dict[str, float] = {}

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
        """Wait for a tick under way, so its claims get pushed, then stop the schedule.

        In that order: a scheduler shut down mid-tick cancels the job, and
        apscheduler logs every cancelled job as an error.
        """
        self._closing = True
        pending = [t for t in (self._tick_task, *self._urgent) if t is not None and not t.done()]
        if pending:
            await asyncio.wait(pending)
        if self._scheduler is not None:
            scheduler, self._scheduler = self._scheduler, None
            await asyncio.sleep(0)  # let the job see its tick end before the executor stops
            scheduler.shutdown(wait=False)

    async def _scheduled_tick(self) -> None:
        if self._closing or (self._tick_task is not None and not self._tick_task.done()):
            return
        # The tick runs as its own task: if the scheduler cancels this job, a
        # claim already made still gets pushed (or logged as waste).
        self._tick_task = asyncio.ensure_future(self.refill_all())
        with contextlib.suppress(asyncio.CancelledError):
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
            reports.append(await self.refill_tag(row))
        return reports

    def refill_soon(self, tag: str) -> None:
        """A node saw the tag's list run low: refill it now rather than at the next tick.

        At most one such refill per tag at a time, and one a second.
        """
        now = time.monotonic()
        if self._closing or now < self._urgent_after.get(tag, 0.0):
            return
        if len(self._urgent_after) >= 10_000:
            self._urgent_after.clear()  # bounded: requests may name tags that do not exist
        self._urgent_after[tag] = now + 1.0
        task = asyncio.ensure_future(self._refill_by_name(tag))
        self._urgent.add(task)
        task.add_done_callback(self._urgent.discard)

    async def _refill_by_name(self, tag: str) -> None:
        try:
            row = await self.ledger.get_tag(tag)
        except IdPoolError:
            return
        await self.refill_tag(row)

    async def refill_tag(self, row: TagRow) -> RefillReport:
        tag = row.tag
        report = RefillReport(tag)
        try:
            step, target = await self._size(row)
            if not await self.redis_pool.acquire_lease(
                tag, self.owner, self.settings.lease_seconds
            ):
                report.skipped = "lease held"
                return report
        except IdPoolError as e:
            report.skipped = str(e)
            return report
        try:
            depth = await self.redis_pool.depth(tag)
            if depth >= target:
                report.skipped = "full"
                return report
            await self._claim_and_push(report, tag, target - depth)
        except IdPoolError as e:
            report.skipped = str(e)
            logger.warning("event=preload_failed tag=%s reason=%r", tag, str(e))
        finally:
            await self._release(tag)
        return report

    async def _size(self, row: TagRow) -> tuple[int, int]:
        """Adapt the step and size the list in time; publish both for nodes and operators."""
        tag, step, s = row.tag, row.step, self.settings
        stats = await self.redis_pool.read_stats(tag)
        meter = self._meters.setdefault(tag, RateMeter(s.rate_window))
        # Rounded as published, so `rate` and `target_depth` in the hash agree exactly.
        rate = round(meter.add(time.monotonic(), int(stats.get("taken", 0))), 3)
        if s.step_seconds > 0:
            seen = await self.redis_pool.take_lifetime(tag)
            if seen is not None:
                wanted = next_step(step, seen[0], seen[1], s.step_seconds)
                if wanted != step:
                    new = await self.ledger.adapt_step(tag, wanted)
                    if new != step:
                        logger.info(
                            "event=step_changed tag=%s old=%d new=%d range_ids=%d lasted_s=%.3f",
                            tag,
                            step,
                            new,
                            seen[0],
                            seen[1],
                        )
                    step = new
        target = target_depth(rate, step, s.pool_seconds, s.pool_depth, s.max_pool_depth)
        fields = {"rate": f"{rate:.3f}", "target_depth": str(target), "step": str(step)}
        await self.redis_pool.write_stats(tag, fields)
        return step, target

    async def _claim_and_push(self, report: RefillReport, tag: str, need: int) -> None:
        try:
            claim = await self.claims.claim(tag, need)
        except MarkNotRaised as e:
            # Claimed but unfenced: never pushed (a rewound MySQL could repeat it).
            report.abandoned = [e.wasted]
            self.wasted[tag, "mark_not_raised"] += len(e.wasted)
            logger.error(
                "event=range_abandoned tag=%s range=%s reason=mark_not_raised detail=%r",
                tag,
                e.wasted.to_text(),
                e.detail,
            )
            raise
        log_refused(logger, tag, claim.refused, claim.raised_to)
        for refused in claim.refused:
            self.wasted[tag, "stale_ledger"] += len(refused)
        # The ledger's step may have changed since list_tags(): split by what was claimed.
        ranges = claim.range.split(len(claim.range) // need)
        logger.info("event=range_claimed tag=%s range=%s for=pool", tag, claim.range.to_text())
        try:
            result = await self._push(tag, ranges)
        except StoreBusy:
            report.abandoned = ranges
            self.wasted[tag, "push_not_sent"] += len(claim.range)
            logger.error(
                "event=range_abandoned tag=%s range=%s reason=push_not_sent",
                tag,
                claim.range.to_text(),
            )
            return
        except StoreUnavailable as e:
            # Maybe pushed, maybe not: never push again; count the range as waste.
            report.abandoned = ranges
            self.wasted[tag, "push_outcome_unknown"] += len(claim.range)
            logger.error(
                "event=range_abandoned tag=%s range=%s reason=push_outcome_unknown detail=%r",
                tag,
                claim.range.to_text(),
                e.detail,
            )
            return
        log_dropped(logger, result.dropped)
        for item in result.dropped:
            dropped_tag, _, text = item.partition("=")
            self.wasted[dropped_tag, "redis_new_incarnation"] += len(IdRange.from_text(text))
        report.pushed = ranges
        logger.info(
            "event=ranges_pushed tag=%s range=%s ranges=%d depth=%d",
            tag,
            claim.range.to_text(),
            len(ranges),
            result.depth,
        )

    async def _push(self, tag: str, ranges: list[IdRange]) -> PushResult:
        """Push, sending again only what was never sent (every connection busy)."""
        for _ in range(_BUSY_RETRIES - 1):
            try:
                return await self.redis_pool.push(tag, ranges, head=False)
            except StoreBusy:
                continue
        return await self.redis_pool.push(tag, ranges, head=False)

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
