"""What a node tells the cluster through the pool, every housekeeping round and
once more at shutdown: the IDs it handed out per tag (the consumption the
preloader sizes the pool by), its running totals (returned and wasted IDs, the
cluster view's figures) and its heartbeat (who it is, whether it is ready).

Every report is one round trip, and none carries an ID: a report whose outcome
is unknown is sent again, so a figure may read high a while, never an ID twice.
The Node owns this object and tells it when a buffer leaves (``dropped``).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Mapping

from idpool.pool.errors import StoreUnavailable

from .buffer import SegmentBuffer
from .source import RangeSource

MAX_HEARTBEAT_TAGS = 100  # tags named in a heartbeat: the cluster view's tag rows


def node_ttl(report_seconds: float) -> float:
    """How long a node counts as live after its last heartbeat: three missed beats."""
    return max(10.0, 3 * report_seconds)


class ClusterReports:
    def __init__(
        self,
        source: RangeSource,
        buffers: Mapping[str, SegmentBuffer],
        *,
        node_id: str,
        identity: dict[str, str],
        report_seconds: float,
        draining: Callable[[], bool],
        not_ready: Callable[[], str | None],
        served: Callable[[], set[str]],
    ) -> None:
        self.source = source
        self.buffers = buffers  # the node's segment buffers (SegmentBuffers.buffers)
        self.stats = source.stats
        self.waste = source.waste
        # The cluster view: who this node is (empty: not registered)
        self.node_id = node_id
        self.identity = identity
        self.report_seconds = report_seconds
        self._draining = draining
        self._not_ready = not_ready
        self._served = served
        self._reported: dict[str, int] = {}  # tag -> its buffer's `issued` as last reported
        self._unreported: Counter[str] = Counter()  # IDs handed out by buffers since dropped
        self._reported_totals: dict[tuple[str, str], int] = {}

    def dropped(self, tag: str, buf: SegmentBuffer) -> None:
        """The tag's buffer left the node (released as idle, or stopped): what it
        handed out since the last report is reported with the next."""
        self._unreported[tag] += buf.issued - self._reported.pop(tag, 0)

    async def report(self) -> None:
        """Tell the preloader how many IDs this node handed out per tag since the
        last report: the consumption the pool is sized by. One round trip."""
        pool = self.source.pool
        if pool is None:
            return
        dropped = dict(self._unreported)  # from buffers released as idle
        seen = {t: (b, b.issued, self._reported.get(t, 0)) for t, b in self.buffers.items()}
        counts = Counter(dropped)
        for tag, (_, issued, base) in seen.items():
            counts[tag] += issued - base
        counts = Counter({tag: n for tag, n in counts.items() if n > 0})
        if not counts:
            return
        try:
            await pool.report_issued(counts)
        except StoreUnavailable:
            return  # sent again next time (if it landed after all, a rate reads high a while)
        # Buffers may have been released meanwhile: take off exactly what was sent.
        self._unreported.subtract(dropped)
        for tag, (buf, issued, base) in seen.items():
            if self.buffers.get(tag) is buf:
                self._reported[tag] = issued
            else:  # released: its count moved to _unreported, this part of it was sent
                self._unreported[tag] -= issued - base
        self._unreported = Counter({t: n for t, n in self._unreported.items() if n > 0})

    def totals(self) -> dict[tuple[str, str], int]:
        """(tag, field) -> this process's running totals for the cluster view:
        ``returned`` and ``wasted:{reason}`` IDs."""
        found: Counter[tuple[str, str]] = Counter()
        for tag, counters in list(self.stats.tags.items()):
            if counters.ids_returned:
                found[(tag, "returned")] += counters.ids_returned
        for (tag, reason), ids in self.waste.totals().items():
            found[(tag, f"wasted:{reason}")] += ids
        return dict(found)

    async def report_totals(self) -> None:
        """Add what grew since the last report to each tag's cluster totals in
        the pool's stats hash. A report whose outcome is unknown is sent again:
        totals are figures for people, and may read high, never IDs."""
        pool = self.source.pool
        if pool is None:
            return
        now = self.totals()
        increments: dict[str, dict[str, int]] = {}
        for (tag, name), value in now.items():
            grown = value - self._reported_totals.get((tag, name), 0)
            if grown > 0:
                increments.setdefault(tag, {})[name] = grown
        if not increments:
            return
        try:
            await pool.add_stats(increments)
        except StoreUnavailable:
            return
        for key, value in now.items():
            self._reported_totals[key] = max(value, self._reported_totals.get(key, 0))

    async def heartbeat(self) -> None:
        """Say this node is alive (the cluster view): a few fields, one round trip."""
        pool = self.source.pool
        if pool is None or not self.node_id:
            return
        fields = {
            **self.identity,
            "draining": "1" if self._draining() else "0",
            "ready": "1" if self._not_ready() is None else "0",
            "tags": ",".join(sorted(self._served())[:MAX_HEARTBEAT_TAGS]),
        }
        try:
            await pool.heartbeat(self.node_id, fields, node_ttl(self.report_seconds))
        except StoreUnavailable:
            pass  # shown as gone after the TTL: that is what the others can know

    async def leave(self) -> None:
        """Take this node out of the cluster view (a graceful stop)."""
        pool = self.source.pool
        if pool is None or not self.node_id:
            return
        try:
            await pool.leave(self.node_id)
        except StoreUnavailable:
            pass  # it drops out by itself when its heartbeat expires
