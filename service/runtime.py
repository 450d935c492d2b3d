"""What a serving node holds while it runs: one object, opened and closed by the
app's lifespan and read by every handler as ``request.state.run``.

Nothing else keeps state between requests: no module globals, no closures over
settings. ``open_runtime`` builds the node from the settings and the stores;
``Runtime.close`` stops it in reverse order and is safe to call twice.
"""

from __future__ import annotations

import asyncio
import logging
import os
import socket
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field

from idpool.pool.claims import LedgerClaims
from idpool.pool.clock import SYSTEM_CLOCK, Clock
from idpool.pool.lease_store import LeaseStore
from idpool.pool.preloader import Preloader
from idpool.pool.settings import Settings
from idpool.pool.stores import LedgerStore, PoolStore
from idpool.pool.waste import WasteRecorder

from . import metrics, status
from .cluster_reports import node_ttl
from .drain import DrainFlag
from .errors import FailureLog
from .health import StoreHealth
from .kinds import rules_of
from .node import Node
from .remainders import ShutdownReport
from .source import RangeSource
from .stats import NodeStats
from .tags import TagDirectory

logger = logging.getLogger("idpool.runtime")

# Opens the ledger and the pool at startup; open_stores in production, slowed
# or otherwise wrapped stores in the benchmark (ops/bench).
StoreOpener = Callable[[Settings], Awaitable[tuple[LedgerStore, PoolStore]]]


@dataclass
class Runtime:
    """The node, its stores and the caches the handlers share."""

    settings: Settings
    node: Node
    ledger: LedgerStore
    pool: PoolStore
    preloader: Preloader
    store_reads: status.StoreReadsCache
    failures: FailureLog = field(default_factory=FailureLog)
    # name -> (monotonic when rendered, body): /status and /metrics at most once a second
    rendered: dict[str, tuple[float, bytes]] = field(default_factory=dict)
    background: list[asyncio.Future[None]] = field(default_factory=list)
    closed: bool = False
    # The node's drain, shared by its workers (None outside `idpool serve`)
    drain_flag: DrainFlag | None = field(default_factory=DrainFlag.from_env)
    _leases: LeaseStore | None = None
    # The one clock of every part: the preloader, the health probes, the node (its
    # housekeeping, tags, kinds, stats), the claims, waste, failures, the drain's
    # looks, the snapshot and the render cache
    clock: Clock = SYSTEM_CLOCK

    def lease_store(self) -> LeaseStore | None:
        """Where leases are recorded, made on the first lease; None in the
        embedded mode (no Redis to record them in)."""
        if self._leases is None:
            leases = self.node.context.parts.leases  # None: the stores hold no leases
            if leases is not None:
                self._leases = leases(self.settings.client_lease_seconds)
        return self._leases

    async def drain(self) -> ShutdownReport:
        """Drain this worker, and have every other worker of the node drain too."""
        if self.drain_flag is not None:
            self.drain_flag.raise_()
        return await self.node.shutdown()

    def drain_requested(self) -> bool:
        return self.drain_flag is not None and self.drain_flag.raised()

    async def snapshot(self) -> status.Snapshot:
        return status.assemble(self.node, await self.store_reads.get(), clock=self.clock)

    async def render_once_a_second(
        self, name: str, render: Callable[[], Awaitable[bytes]]
    ) -> bytes:
        """The page and the exposition, rendered at most once a second however many
        scrapers ask: rendering runs on the event loop, and four scrapers in a
        tight loop rendering every time took most of it from /id. (/status.json
        is built fresh: tools account for IDs from it.)"""
        made = self.rendered.get(name)
        now = self.clock.monotonic()
        if made is None or now - made[0] >= status.STORE_READS_SECONDS:
            made = self.rendered[name] = (now, await render())
        return made[1]

    def start(self) -> None:
        self.background = [
            asyncio.ensure_future(self.node.run_housekeeping()),
            asyncio.ensure_future(self.node.health.run()),
        ]
        if self.drain_flag is not None:
            is_draining = lambda: self.node.draining  # noqa: E731
            watch = self.drain_flag.watch(is_draining, self.node.shutdown, self.clock)
            self.background.append(asyncio.ensure_future(watch))
        if self.settings.preload:
            self.preloader.start()
        if self.settings.embedded:
            logger.warning(
                "event=embedded_mode file=%s detail='one node; ledger and pool in this SQLite "
                "file; MySQL and Redis are not used'",
                self.settings.sqlite_path(),
            )
        logger.info("event=node_started preload=%s", self.settings.preload)

    async def stop(self) -> None:
        """A graceful stop, in reverse: the preloader's tick under way finishes its
        push; the node stops serving and returns its remainders."""
        await self.preloader.close()
        report = await self.node.shutdown()
        logger.info(
            "event=node_stopped returned=%d abandoned=%d",
            len(report.returned),
            len(report.abandoned),
        )

    async def close(self) -> None:
        """Release everything; after stop(), or alone when the lifespan failed."""
        if self.closed:
            return
        self.closed = True
        for task in self.background:
            task.cancel()
        # Not waited for without a bound: aiomysql lets a query run on past its
        # cancellation, and one stuck on the server must not stall the stop.
        if self.background:
            await asyncio.wait(self.background, timeout=self.settings.store_timeout)
        await self.node.cluster.leave()  # after the heartbeats stopped: none can re-register it
        await self.preloader.close()
        await self.pool.close()
        await self.ledger.close()


async def open_runtime(
    settings: Settings, stores: StoreOpener, clock: Clock = SYSTEM_CLOCK
) -> Runtime:
    ledger, pool = await stores(settings)
    # One clock for every part (pool/clock.py); a part that reads only monotonic
    # time takes the bound ``clock.monotonic`` (time.monotonic itself in production).
    claims = LedgerClaims(ledger, pool, clock.monotonic)
    waste = WasteRecorder(clock.monotonic)  # one per process: the node's and the preloader's
    preloader = Preloader(settings, ledger, pool, claims, waste, clock, rules_of=rules_of)
    stats = NodeStats(clock)
    health = StoreHealth(ledger, pool, clock)
    source = RangeSource(
        claims, pool, stats=stats, on_low=preloader.refill_soon, waste=waste, health=health
    )
    node = _make_node(settings, ledger, source, clock)
    store_reads = status.StoreReadsCache(
        lambda: status.read_stores(
            ledger, pool, node.shown_tags(), node_ttl(settings.report_seconds)
        ),
        clock,
    )
    return Runtime(
        settings=settings,
        node=node,
        ledger=ledger,
        pool=pool,
        preloader=preloader,
        store_reads=store_reads,
        failures=FailureLog(clock),
        clock=clock,
    )


def _make_node(settings: Settings, ledger: LedgerStore, source: RangeSource, clock: Clock) -> Node:
    """The node, from the settings: its tag list read from ``ledger``, its ranges
    from ``source``, and who it is in the cluster view."""
    return Node(
        source,
        prefetch_at=settings.prefetch_at,
        tags=TagDirectory(
            ledger,
            min_interval=settings.unknown_tag_ttl,
            clock=clock.monotonic,
            rules_of=rules_of,
        ),
        idle_seconds=settings.idle_seconds,
        reserve_seconds=settings.reserve_seconds,
        report_seconds=settings.report_seconds,
        tag_reload_seconds=settings.tag_reload_seconds,
        worker_lease_seconds=settings.worker_lease_seconds,
        worker_margin_seconds=settings.worker_margin_seconds,
        node_id=f"{socket.gethostname()}-{os.getpid()}",
        identity={
            "addr": settings.advertise or socket.gethostname(),
            "pid": str(os.getpid()),
            "version": metrics.VERSION,
            "started_at": f"{source.stats.started_at:.0f}",
        },
        clock=clock,
    )
