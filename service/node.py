"""A node: the per-tag buffers of one process and their lifecycle (made on first
use, released when idle, dropped when disabled, returned at shutdown), the
kinds of ID it serves (``kinds/``, each made from a ``KindContext``, never the
Node), and its reports to the cluster (``cluster_reports.py``).

Its ranges come from a RangeSource (``source.py``). On shutdown the unused
remainders go back to the head of each tag's list (``remainders.py``), so the next
node serves them first: IDs are trend-increasing across nodes, not strictly rising.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Mapping, Sequence
from typing import Any

from idpool.pool.clock import SYSTEM_CLOCK, Clock
from idpool.pool.errors import Draining, KindChanged, KindNotServed, StoreUnavailable
from idpool.pool.stores import parts_of
from idpool.pool.waste import Reason

from .buffer import SegmentBuffer
from .cluster_reports import ClusterReports
from .formats import Id, parent_of
from .formatted import FormatFence
from .kinds import (
    KINDS,
    IdKind,
    KeepsTags,
    KindContext,
    SegmentKind,
    Stops,
    TakesFromMemory,
    rules_of,
    spec_of,
)
from .kinds.snowflake import LeasesWorkers
from .remainders import ShutdownReport, return_all, return_remainder
from .segment_buffers import SegmentBuffers
from .source import RangeSource
from .stats import SAMPLE_EVERY
from .tags import TagDirectory

logger = logging.getLogger("idpool.node")


class Node:
    def __init__(
        self,
        source: RangeSource,
        *,
        prefetch_at: float,
        tags: TagDirectory | None = None,
        idle_seconds: float = 0.0,
        reserve_seconds: float = 0.0,
        report_seconds: float = 2.0,
        tag_reload_seconds: float = 5.0,
        node_id: str = "",
        identity: dict[str, str] | None = None,
        worker_lease_seconds: float = 10.0,
        worker_margin_seconds: float = 2.0,
        clock: Clock = SYSTEM_CLOCK,
    ) -> None:
        self.clock = clock  # the runtime's one clock (pool/clock.py): its sleeps too
        self._clock = clock.monotonic  # monotonic seconds, for idleness and reloads
        self.wall_clock = clock.now  # the same, for the dates of formatted IDs (tests set it)
        self.source = source
        # how often the tag list is read again: how soon a disabled tag stops here
        self.tag_reload_seconds = tag_reload_seconds
        self.reserve_seconds = reserve_seconds
        self.stats = source.stats
        self.waste = source.waste
        self.health = source.health
        self.prefetch_at = prefetch_at
        self.tags = tags or TagDirectory(
            source.claims.ledger, clock=clock.monotonic, rules_of=rules_of
        )
        source.step_of = self.tags.step
        self.idle_seconds = idle_seconds  # 0: buffers are kept until shutdown
        self.draining = False
        # every name's format fence (formats.py), checked before a tag is first served
        self.fence = FormatFence(
            self.tags, source.claims, lambda kind: spec_of(kind).formats
        )
        # The segment buffers: the kinds and the converter take from them, the
        # housekeeping below releases, drops and returns them.
        self.segments = self._make_segments()
        self.buffers = self.segments.buffers  # segment tags served here (the fast path reads it)
        # What the kinds may reach (built before them, never the Node itself), and
        # one object per kind of ID: how a tag of that kind is served (kinds/)
        self.context, self.kinds = self._make_kinds(
            node_id, worker_lease_seconds, worker_margin_seconds
        )
        # the kind whose tags have buffers here (NodeApp reads them before routing)
        self.buffered = next(name for name in self.kinds if spec_of(name).buffered)
        # the converter its formatted tags are rendered with (NodeApp's fast path)
        self.formatted = next(k.formats for k in self.kinds.values() if isinstance(k, SegmentKind))
        # the other kinds NodeApp's fast path asks, synchronously, before routing
        self.from_memory = [k for k in self.kinds.values() if isinstance(k, TakesFromMemory)]
        # the kinds NodeApp hands a request to without routing (no memory to answer from)
        self.direct = {name: kind for name, kind in self.kinds.items() if spec_of(name).direct}
        self.report_seconds = report_seconds
        self._activity: dict[str, tuple[int, float]] = {}  # tag -> (issued, monotonic since)
        self._shutdown_report: ShutdownReport | None = None
        # The cluster view: who this node is (empty: not registered)
        self.node_id = node_id
        self.identity = identity or {}
        # what it tells the cluster: IDs handed out, running totals, heartbeats
        self.cluster = self._make_cluster()

    def _make_segments(self) -> SegmentBuffers:
        """The node's segment buffers, over its tags, source and format fence."""
        return SegmentBuffers(
            self.tags,
            self.source,
            self.fence,
            prefetch_at=self.prefetch_at,
            reserve_seconds=self.reserve_seconds,
            clock=self._clock,
            draining=lambda: self.draining,
            other_kind=self._drop_other_kind,
            stats=self.stats,
        )

    def _make_kinds(
        self, node_id: str, worker_lease_seconds: float, worker_margin_seconds: float
    ) -> tuple[KindContext, dict[str, IdKind]]:
        """The ``KindContext`` (what the kinds may reach: the node's parts and
        settings, never the Node itself) and one object per kind made from it."""
        source = self.source
        context = KindContext(
            tags=self.tags,
            source=source,
            parts=parts_of(source.claims.ledger, source.pool),
            health=self.health,
            stats=self.stats,
            waste=self.waste,
            buffers=self.segments,
            fence=self.fence,
            draining=lambda: self.draining,
            clock=self.clock,
            wall_clock=lambda: self.wall_clock(),  # read when called: tests set it
            node_id=node_id,
            reserve_seconds=self.reserve_seconds,
            worker_lease_seconds=worker_lease_seconds,
            worker_margin_seconds=worker_margin_seconds,
        )
        return context, {name: make(context) for name, make in KINDS.items()}

    def _make_cluster(self) -> ClusterReports:
        """The node's reports to the cluster, reading its buffers and its state."""
        return ClusterReports(
            self.source,
            self.buffers,
            node_id=self.node_id,
            identity=self.identity,
            report_seconds=self.report_seconds,
            draining=lambda: self.draining,
            not_ready=self.not_ready,
            served=self.served,
        )

    def not_ready(self) -> str | None:
        """Why this node cannot serve now, or None when it can.

        It can while Redis answers (ranges for any tag, from the pool or, fenced
        by the mark in Redis, from the ledger) or while any buffer holds IDs.
        Never about one tag: one tag's trouble must not take the node out.
        """
        if self.draining:
            return "node is draining or shutting down"
        for kind in self.kinds.values():
            why = kind.not_ready()
            if why is not None:
                return why
        if self.health.is_up(self.health.pool_name):
            return None
        if any(buf.in_memory for buf in self.buffers.values()):
            return None
        return f"no IDs in memory and {self.health.pool_name or 'the pool'} is not answering"

    def shown_tags(self) -> list[str]:
        """The tags /status and /metrics show: those served here, and those that
        wasted IDs here (a disabled tag's waste stays visible after its buffer goes)."""
        return sorted(self.waste.tags().union(self.served()))

    def served(self) -> set[str]:
        """Every tag served here, of every kind."""
        kept = (k.served() for k in self.kinds.values() if isinstance(k, KeepsTags))
        return set(self.buffers).union(*kept)

    @property
    def snowflakes(self) -> dict[str, object]:
        """What the kinds that make IDs from leased worker IDs hold, by tag (tests read it)."""
        held: dict[str, object] = {}
        for kind in self.kinds.values():
            if isinstance(kind, LeasesWorkers):
                held.update(kind.generators)
        return held

    async def kind_of(self, tag: str) -> IdKind:
        """The object of the tag's kind; raises UnknownTag, TagDisabled, Draining."""
        if tag in self.buffers:
            return self.kinds[self.buffered]  # only its tags have buffers
        if self.draining:
            raise Draining("node is shutting down")
        row = await self.tags.lookup(tag)
        kind = self.kinds.get(row.kind)
        if kind is None:
            raise KindNotServed(tag, row.kind)
        return kind

    async def next_id(self, tag: str) -> Id:
        try:
            return await (await self.kind_of(tag)).next_id(tag)
        except KindChanged:  # the old tag's buffer and row are gone: served as its kind now
            return await (await self.kind_of(tag)).next_id(tag)

    async def next_ids(self, tag: str, count: int) -> list[int] | list[str]:
        try:
            return await (await self.kind_of(tag)).next_ids(tag, count)
        except KindChanged:
            return await (await self.kind_of(tag)).next_ids(tag, count)

    def holding(self, tag: str) -> Mapping[str, Any] | None:
        """What this node holds for the tag, as its kind shows it (/status.json)."""
        row = self.tags.rows.get(tag)
        kind = self.kinds.get(self.buffered if row is None else row.kind)
        return None if kind is None else kind.holding(tag)

    async def _drop_other_kind(self, tag: str, buf: SegmentBuffer) -> None:
        """The buffer's claim found the name's row of another kind (removed and
        added again, e.g. as strict, since this node's last reload): what the buffer
        holds is the old tag's, waste, never served as the new tag's; the row this
        node read goes too, so the next request reads the new one."""
        self.tags.rows.pop(tag, None)
        await self._stop_disabled(tag, buf, Reason.TAG_REMOVED)

    def undelivered(self, tag: str, ids: Sequence[Id]) -> None:
        """IDs taken for an answer the client never got (it hung up first): waste,
        never served again. One log line a second at most: a client that hangs
        up in a loop must not flood the log. A formatted tag's IDs are counted by
        their sequence numbers (with a reset: numbers within their period)."""
        fmt = self.tags.formats.get(tag)
        try:
            numbers = [int(v) for v in ids] if fmt is None else [fmt.decode(v) for v in ids]
        except ValueError:
            # Rendered with a format this node has since refused (a row edited by
            # hand, TagDirectory.changed): its numbers cannot be read back here.
            logger.warning("event=undelivered_unread tag=%s ids=%d", tag, len(ids))
            return
        self.waste.undelivered(tag, numbers)

    def sample(self, now: float | None = None, mono: float | None = None) -> None:
        """Record IDs issued per tag (the consumption chart); let idle buffers go."""
        now = self.clock.now() if now is None else now
        mono = self._clock() if mono is None else mono
        for tag, buf in list(self.buffers.items()):
            issued = buf.issued
            self.stats.tags[tag].history.append((now, issued))
            seen, since = self._activity.get(tag, (-1, mono))
            if issued != seen:
                self._activity[tag] = (issued, mono)
            elif self.idle_seconds and mono - since >= self.idle_seconds and not buf.fetching:
                self._release_idle(tag, buf)

    def _release_idle(self, tag: str, buf: SegmentBuffer) -> None:
        """Return an idle tag's remainder to the pool and forget the tag here.

        Removed from ``buffers`` and emptied in one synchronous step (no fetch
        is under way), so no request can take an ID from what is returned; the
        next request for the tag makes a new buffer.
        """
        del self.buffers[tag]
        self._activity.pop(tag, None)
        self.cluster.dropped(tag, buf)
        remainder = buf.drain_now()
        # Counters stay (one small entry per real tag); the chart's history goes.
        self.stats.tags[tag].history.clear()
        logger.info("event=buffer_released tag=%s reason=idle", tag)
        if remainder:
            self.source.spawn(return_remainder(self.source, tag, remainder, ShutdownReport()))

    async def refresh_tags(self, changed: str | None = None) -> None:
        """Read the ledger's tag list again and stop serving tags disabled since.

        The tags served here (and ``changed``, one an operator just changed
        through this node) every time; the whole list once a minute."""
        full = self.tags.full_at
        whole = full is None or self._clock() - full >= _FULL_TAG_RELOAD_SECONDS
        served = self.served()
        names = served if changed is None else {*served, changed}
        # A period row (formats with a reset) is read with its tag, and its tag with it.
        names |= {parent for parent in map(parent_of, names) if parent is not None}
        names |= {n for n, row in self.tags.rows.items() if row.disabled and parent_of(n) in names}
        try:
            await self.tags.refresh(None if whole else sorted(names))
        except StoreUnavailable:
            return  # the copy stands; tried again next time
        for kind in self.kinds.values():
            if isinstance(kind, Stops):
                kind.stop(self.tags.disabled(), "an operator disabled the tag")
                # A removed tag (idpool tag remove): not served from memory any more.
                kind.stop(kind.served() - set(self.tags.rows), "an operator removed the tag")
        for tag in self.tags.disabled() & set(self.buffers):
            await self._stop_disabled(tag, self.buffers[tag])
        for tag in set(self.buffers) - set(self.tags.rows):
            await self._stop_disabled(tag, self.buffers[tag], Reason.TAG_REMOVED)
        # Only a segment tag has a buffer: a row of another kind under its name was
        # added after a removal this reload did not see (or edited by hand). Its
        # buffer is the old tag's: the fast path would serve it before any kind check.
        for tag in {t for t, row in self.tags.rows.items() if not spec_of(row.kind).buffered}:
            if tag in self.buffers:
                await self._stop_disabled(tag, self.buffers[tag], Reason.TAG_REMOVED)
        # A removed formatted tag's format goes once no buffer of its name is left
        # (never a formatted tag's buffer served as a plain one): its name is then
        # unknown (404), or a tag added again under it is read with its own format.
        known = set(self.tags.formats) | set(self.tags.fingerprints)
        for tag in known - set(self.tags.rows) - set(self.buffers):
            self.tags.forget_format(tag)

    async def _stop_disabled(
        self, tag: str, buf: SegmentBuffer, reason: Reason = Reason.TAG_DISABLED
    ) -> None:
        """Drop a disabled (or removed) tag's buffer; what it held is waste, never
        served again (enabled or added again, the tag goes on from fresh ranges
        above its ledger's max_id, or its tombstone's)."""
        if self.buffers.get(tag) is not buf:
            return
        # Out of `buffers` first, in one synchronous step: the fast path and new
        # requests no longer find it, and buffer() answers TagDisabled.
        del self.buffers[tag]
        self._activity.pop(tag, None)
        remainder = await buf.drain()  # waits for a fetch under way: it is waste too
        self.cluster.dropped(tag, buf)
        self.stats.tags[tag].history.clear()
        self.waste.record(tag, remainder, reason)

    async def run_housekeeping(self) -> None:
        sampled = reloaded = 0.0
        while True:
            now = self._clock()
            if now - sampled >= SAMPLE_EVERY:
                self.sample()
                sampled = now
            if now - reloaded >= self.tag_reload_seconds:
                await self.refresh_tags()
                reloaded = now
            await self.cluster.report()
            await self.cluster.report_totals()
            await self.cluster.heartbeat()
            await self.clock.sleep(self.report_seconds)

    async def shutdown(self) -> ShutdownReport:
        """Stop serving, then push every unused remainder back to the pool, once.

        Safe to call twice: the second call returns the first call's report.
        """
        if self._shutdown_report is not None:
            return self._shutdown_report
        report = self._shutdown_report = ShutdownReport()
        self.draining = True
        buffers = list(self.buffers.items())
        remainders = await asyncio.gather(*(buf.drain() for _, buf in buffers))
        for kind in self.kinds.values():
            await kind.close()  # e.g. snowflake worker IDs, released with their last time
        tags = [tag for tag, _ in buffers]
        await return_all(self.source, zip(tags, remainders, strict=True), report)
        await self.cluster.report()
        await self.cluster.report_totals()
        await self.cluster.heartbeat()  # shown as draining until the process leaves
        for kind in self.kinds.values():
            if isinstance(kind, KeepsTags):
                await kind.close()
        await self.source.close()
        return report


_FULL_TAG_RELOAD_SECONDS = 60.0  # the whole tag list; the served tags every reload
