"""The preloader job: keep every tag's Redis list topped up from the ledger.

One preloader is active at a time, cluster-wide: each holds the leadership
``idpool:preloader`` (SET NX PX, renewed every tick) or stands by, trying to
take it once a tick. The active one visits only the tags that moved: those a
node popped from or reported IDs for since its last tick (the set
``idpool:moved``), and for a window after, so their published rate decays to
what they now use. Once every ``IDPOOL_SWEEP_SECONDS`` (and when it takes over)
it also reads every list's depth in one pipelined round and fills those under
the minimum: tags nobody asked for yet, lists a Redis restart emptied. So idle
tags cost nothing per tick, and more nodes do not multiply the work.

A visit: adapt the step to how long ranges last at the nodes, size the list to
cover ``pool_seconds`` of the IDs nodes actually handed out, and if the list is
short claim what is missing from MySQL in one UPDATE and RPUSH it in one script
call. Reads and figures for all visited tags go in one round trip each.

A push whose outcome is unknown (timeout, broken connection) is not retried:
the ranges are abandoned and logged as waste, never pushed a second time.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import socket
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime
from typing import TypeVar

from apscheduler.schedulers.asyncio import AsyncIOScheduler

from .claims import LedgerClaims
from .clock import SYSTEM_CLOCK, Clock
from .errors import (
    IdPoolError,
    MarkNotRaised,
    StoreNotSent,
    StoreUnavailable,
    TagDisabled,
    TagExhausted,
    UnknownTag,
)
from .kind_rules import KindRules, default_rules_of
from .ranges import IdRange
from .roles import LedgerStore, PoolStore
from .settings import Settings
from .sizing import RateMeter, next_step, target_depth
from .values import PoolSummary, PushResult, TagRow, period_over
from .waste import Reason, WasteRecorder

logger = logging.getLogger("idpool.preloader")

_BUSY_RETRIES = 3  # a push that found every connection busy (never sent) is sent again
_VISIT_CHUNK = 500  # tags read and written per round trip
_DECAY_VISIT_EVERY = 5.0  # seconds between visits of a tag that stopped moving
_REFILLS_AT_ONCE = 4  # as many as the ledger has connections
# A refill that finds its tag gone is skipped, not failed (RefillReport.skipped)
_STOPPED: dict[type[IdPoolError], str] = {
    UnknownTag: "removed",
    TagDisabled: "disabled",
    TagExhausted: "exhausted",
}
# A reset tag's period that ended this long ago has its list emptied (waste) and its
# figures deleted. Nodes stop asking for it at its end by their own clocks, and hand
# back what their buffers held after IDPOOL_IDLE_SECONDS (300 s by default): an hour
# leaves room for both and for clocks minutes apart.
PERIOD_GRACE_SECONDS = 3600.0
T = TypeVar("T")


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
        pool: PoolStore,
        claims: LedgerClaims | None = None,
        waste: WasteRecorder | None = None,
        clock: Clock = SYSTEM_CLOCK,
        *,
        rules_of: Callable[[str], KindRules] = default_rules_of,
    ) -> None:
        self.settings = settings
        # sweeps, rates and refill_soon's limit (apscheduler runs the ticks)
        self.clock = clock
        self.rules_of = rules_of  # a row's kind -> its rules (service/kinds): pooled or not
        self.ledger = ledger
        self.pool = pool
        self.claims = claims or LedgerClaims(ledger, pool)
        self.owner = owner_id()
        self.leading = False  # held the preloader leadership at the last tick
        self._scheduler: AsyncIOScheduler | None = None
        self._tick_task: asyncio.Task[list[RefillReport]] | None = None
        self._closing = False
        self._meters: dict[str, RateMeter] = {}
        self._rows: dict[str, TagRow] = {}  # the ledger's rows, as of the last sweep
        self._moved_at: dict[str, float] = {}  # tag -> when it was last seen moving
        self._visited_at: dict[str, float] = {}
        self._next_sweep = 0.0
        self._refilling: set[str] = set()  # tags being refilled by this process now
        self.waste = waste or WasteRecorder()  # the process's, shared with its node
        self._urgent: set[asyncio.Task[None]] = set()
        self._urgent_after: dict[str, float] = {}
        self.period_grace = PERIOD_GRACE_SECONDS
        self._forgotten: set[str] = set()  # ended periods whose figures this process deleted

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
        """Wait for a tick under way, so its claims get pushed, then stop the schedule
        and hand the leadership on.

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
        if self.leading:
            self.leading = False
            with contextlib.suppress(StoreUnavailable):
                await self.pool.resign(self.owner)  # a standby takes over at once

    async def _scheduled_tick(self) -> None:
        if self._closing or (self._tick_task is not None and not self._tick_task.done()):
            return
        # The tick runs as its own task: if the scheduler cancels this job, a
        # claim already made still gets pushed (or logged as waste).
        self._tick_task = asyncio.ensure_future(self.refill_all())
        with contextlib.suppress(asyncio.CancelledError):
            await asyncio.shield(self._tick_task)

    async def refill_all(self) -> list[RefillReport]:
        """One tick: lead or stand by; when leading, visit the tags that moved."""
        try:
            leading = await self.pool.lead(self.owner, self.settings.leader_seconds)
            if not leading:
                self.leading = False
                return []
            if not self.leading:
                self.leading = True
                self._next_sweep = 0.0  # taking over: look at every list now
                logger.info("event=preloader_leading owner=%s", self.owner)
            visit = await self._tags_to_visit(self.clock.monotonic())
        except StoreUnavailable as e:
            logger.warning("event=preload_skipped reason=%r", e.detail)
            return []
        reports = []
        for chunk in _chunks(sorted(visit), _VISIT_CHUNK):
            if self._closing:
                break
            try:
                states = await self.pool.summaries(chunk)
            except StoreUnavailable as e:
                logger.warning("event=preload_skipped reason=%r", e.detail)
                break
            figures: dict[str, dict[str, str]] = {}
            rows = [self._rows[tag] for tag in chunk if tag in self._rows]
            # A few tags at a time (the ledger's connection pool is small): a sweep
            # that finds thousands of lists short fills them in seconds.
            for group in _chunks(rows, _REFILLS_AT_ONCE):
                if self._closing:
                    break
                reports += await asyncio.gather(
                    *(self.refill_tag(row, states[row.tag], figures) for row in group)
                )
            with contextlib.suppress(StoreUnavailable):  # figures only: the next tick writes again
                await self.pool.write_stats_many(figures)
        return reports

    async def _tags_to_visit(self, now: float) -> set[str]:
        """Moved tags, tags that moved within the rate window (every few seconds,
        so their published rate follows them down), and at a sweep every list
        under the minimum. Raises StoreUnavailable."""
        taken = await self.pool.take_moved()
        self.waste.dropped(taken.dropped)
        for tag in taken.tags:
            self._moved_at[tag] = now
        window = self.settings.rate_window
        visit = set()
        for tag, moved in list(self._moved_at.items()):
            if moved == now or now - self._visited_at.get(tag, 0.0) >= _DECAY_VISIT_EVERY:
                visit.add(tag)
            if now - moved > window + _DECAY_VISIT_EVERY:
                del self._moved_at[tag]  # visited once after its last move: its rate is 0
        wall = self.clock.now()
        if now >= self._next_sweep:
            self._rows = {row.tag: row for row in await self.ledger.list_tags()}
            self._next_sweep = now + self.settings.sweep_seconds
            ended: dict[str, int] = {}
            for chunk in _chunks(sorted(self._rows), _VISIT_CHUNK):
                depths = await self.pool.depths(chunk)
                visit.update(t for t, n in depths.items() if n < self.settings.pool_depth)
                long_ago = wall - self.period_grace
                ended.update((t, n) for t, n in depths.items() if period_over(t, long_ago))
            try:
                await self.clean_ended_periods(ended)
            except StoreUnavailable as e:  # a chore: the refills of this tick go on
                logger.warning("event=period_cleanup_failed reason=%r", e.detail)
        # A period that ended (formats with a reset) is asked for no more: no refill.
        visit = {t for t in visit if not period_over(t, wall)}
        unknown = sorted(t for t in visit if t not in self._rows)
        if unknown:  # created since the last sweep
            self._rows.update((row.tag, row) for row in await self.ledger.list_tags(unknown))
        # A tag with a reset serves from its period rows, never from its own row.
        return {t for t in visit if t not in self._rows or not self._rows[t].by_period}

    async def clean_ended_periods(self, depths: dict[str, int]) -> None:
        """Period rows (``TAG@KEY``) whose period ended over ``period_grace`` ago, with
        their lists' depths: what a list still holds is taken out and counted as
        waste (``period_ended``), and the row's figures (``:stats``, ``:clean``) go.

        The ledger row (its ``max_id``) and the high-water mark stay: a node whose
        clock is so far behind that it claims for such a period again goes on above
        every number the period handed out, never from its start. Raises
        StoreUnavailable (the next sweep tries again; a take_all whose answer was
        lost may have emptied a list uncounted: waste unseen, never a repeat)."""
        for tag, depth in sorted(depths.items()):
            if depth:
                # A range handed back late (a node stopping, or one whose clock is
                # behind) is emptied at the next sweep the same way.
                drained = await self.pool.take_all(tag)
                self.waste.record(tag, drained, Reason.PERIOD_ENDED, "its period ended")
        fresh = sorted(t for t in depths if t not in self._forgotten)
        await self.pool.forget_periods(fresh)
        self._forgotten.update(fresh)

    def refill_soon(self, tag: str) -> None:
        """A node here saw the tag's list run low: refill it now rather than at the
        next tick, when this process is the active preloader.

        At most one such refill per tag at a time, and one a second.
        """
        now = self.clock.monotonic()
        if self._closing or not self.leading or now < self._urgent_after.get(tag, 0.0):
            return
        if len(self._urgent_after) >= 10_000:
            self._urgent_after.clear()  # bounded however many tags
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

    async def refill_tag(
        self,
        row: TagRow,
        state: PoolSummary | None = None,
        figures: dict[str, dict[str, str]] | None = None,
    ) -> RefillReport:
        """Size the tag's list and fill it. ``state`` is its summary when the
        caller read it; ``figures`` collects what to publish (written here when
        not given)."""
        tag = row.tag
        report = RefillReport(tag)
        if not self.rules_of(row.kind).pooled:
            # Only a pooled kind's tags are served from the pool (segment): a strict
            # tag's IDs come from its sequence in Redis (pool/strict.py), claimed by
            # the nodes as needed; a snowflake tag's are made in memory from a leased
            # worker ID (its max_id counts worker-ID grants: it has no pool list).
            report.skipped = f"kind {row.kind}"
            return report
        if row.disabled or not row.left:
            # Nothing to claim (the ledger refuses it anyway): no warning every tick.
            report.skipped = "disabled" if row.disabled else "exhausted"
            return report
        if tag in self._refilling:
            report.skipped = "being refilled"
            return report
        self._refilling.add(tag)
        self._visited_at[tag] = self.clock.monotonic()
        try:
            if state is None:
                state = (await self.pool.summaries([tag]))[tag]
            step, target, published = await self._size(row, state.stats)
            if figures is None:
                await self.pool.write_stats(tag, published)
            else:
                figures[tag] = published
            if state.depth >= target:
                report.skipped = "full"
                return report
            await self._claim_and_push(report, tag, target - state.depth)
        except (UnknownTag, TagDisabled, TagExhausted) as e:
            # Not a failure: an operator removed or disabled the tag (or it reached its
            # max) after the sweep read its row. The cached row goes, so the next visit
            # reads the row again and skips it quietly (or never visits a removed tag).
            report.skipped = _STOPPED[type(e)]
            self._rows.pop(tag, None)
            logger.info("event=preload_stopped tag=%s reason=%s", tag, report.skipped)
        except IdPoolError as e:
            report.skipped = str(e)
            logger.warning("event=preload_failed tag=%s reason=%r", tag, str(e))
        finally:
            self._refilling.discard(tag)
        return report

    async def _size(self, row: TagRow, stats: dict[str, str]) -> tuple[int, int, dict[str, str]]:
        """Adapt the step and size the list in time; the figures to publish."""
        tag, step, s = row.tag, row.step, self.settings
        meter = self._meters.setdefault(tag, RateMeter(s.rate_window))
        # IDs handed out, as the nodes report them (not ranges taken: a node that
        # takes a range of a million and serves three used three).
        # Rounded as published, so `rate` and `target_depth` in the hash agree exactly.
        rate = round(meter.add(self.clock.monotonic(), int(stats.get("issued", 0))), 3)
        if not meter.ready and "rate" in stats:
            # A preloader that just took over has one sample: keep the last
            # published rate rather than publish 0 and shrink the pool.
            rate = float(stats["rate"])
        if s.step_seconds > 0 and "lifetime_ids" in stats:
            seen = await self.pool.take_lifetime(tag)
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
                        self._rows[tag] = replace(row, step=new)
                    step = new
        target = target_depth(rate, step, s.pool_seconds, s.pool_depth, s.max_pool_depth)
        return step, target, {"rate": f"{rate:.3f}", "target_depth": str(target), "step": str(step)}

    async def _claim_and_push(self, report: RefillReport, tag: str, need: int) -> None:
        # Ask again before each claim: a preloader frozen past its lease (SIGSTOP,
        # swap) wakes mid-tick while another holds it and fills the same lists.
        if not await self.pool.lead(self.owner, self.settings.leader_seconds):
            self.leading = False
            report.skipped = "lease lost"
            return
        try:
            claim = await self.claims.claim(tag, need)
        except MarkNotRaised as e:
            # Claimed but unfenced: never pushed (a rewound MySQL could repeat it).
            self._abandon(report, tag, e.wasted, [e.wasted], Reason.MARK_NOT_RAISED, e.detail)
            raise
        self.waste.record(tag, claim.refused, Reason.STALE_LEDGER, raised_to=claim.raised_to)
        # The ledger's step may have changed since list_tags(): split by what was claimed.
        # At a tag's bound the claim may be short: never a size of 0.
        ranges = claim.range.split(-(-len(claim.range) // need))
        logger.info("event=range_claimed tag=%s range=%s for=pool", tag, claim.range.to_text())
        try:
            result = await self._push(tag, ranges)
        except StoreNotSent as e:
            self._abandon(report, tag, claim.range, ranges, Reason.PUSH_NOT_SENT, e.detail)
            return
        except StoreUnavailable as e:
            # Maybe pushed, maybe not: never push again; count the range as waste.
            self._abandon(report, tag, claim.range, ranges, Reason.PUSH_OUTCOME_UNKNOWN, e.detail)
            return
        self.waste.dropped(result.dropped)
        if result.lease_lost:  # lost between the check above and the push: not pushed
            self.leading = False
            self._abandon(
                report, tag, claim.range, ranges, Reason.LEADERSHIP_LOST, "another is the leader"
            )
            return
        report.pushed = ranges
        logger.info(
            "event=ranges_pushed tag=%s range=%s ranges=%d depth=%d",
            tag,
            claim.range.to_text(),
            len(ranges),
            result.depth,
        )

    def _abandon(
        self,
        report: RefillReport,
        tag: str,
        claimed: IdRange,
        ranges: list[IdRange],
        reason: Reason,
        detail: str,
    ) -> None:
        """Give up a claimed range: counted and logged as waste, never pushed."""
        report.abandoned = ranges
        self.waste.record(tag, [claimed], reason, detail)

    async def _push(self, tag: str, ranges: list[IdRange]) -> PushResult:
        """Push, sending again only what was never sent (no connection, or all busy)."""
        for _ in range(_BUSY_RETRIES - 1):
            try:
                return await self.pool.push(tag, ranges, head=False, leader=self.owner)
            except StoreNotSent:
                continue
        return await self.pool.push(tag, ranges, head=False, leader=self.owner)


def _chunks(items: list[T], size: int) -> list[list[T]]:
    return [items[i : i + size] for i in range(0, len(items), size)]
