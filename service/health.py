"""Whether each store answers, probed in the background.

Readiness (``/readyz``) is read from here, never from what one request or one
tag went through: a node that a load balancer takes out gets no requests, so a
state that only a request could clear would keep it out for good.

With ``IDPOOL_REDIS_MARK_REPLICAS`` set, the pool's probe also counts the
replicas online on each Redis primary: fewer than the setting wants means no
high-water raise can count, so no claim is made. The node stays ready (it
serves its buffers and the pool, and every node shares the cause), but
/status, /metrics (``idpool_mark_replicas_short``) and the log say so.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Awaitable

from idpool.pool.clock import SYSTEM_CLOCK, Clock
from idpool.pool.errors import (
    MarkNotReplicated,
    StoreBusy,
    StoreSkipped,
    StoreUnavailable,
    StrictNotConfirmed,
    TooFewReplicas,
)
from idpool.pool.stores import LedgerStore, PoolStore, store_name

PROBE_EVERY = 1.0  # seconds between probes of each store

logger = logging.getLogger("idpool.health")


class StoreHealth:
    def __init__(
        self, ledger: LedgerStore, pool: PoolStore | None, clock: Clock = SYSTEM_CLOCK
    ) -> None:
        self.ledger = ledger
        self.pool = pool
        self.ledger_name = store_name(ledger, "mysql")
        self.pool_name = None if pool is None else store_name(pool, "redis")
        self.clock = clock  # the probes' schedule and the times errors are shown with
        # store -> answered its latest probe (or call); unknown stores count as up
        self.up: dict[str, bool] = {}
        self.last_error: dict[str, tuple[float, str]] = {}  # store -> (unix time, detail)
        self._probed_at = 0.0  # monotonic time of the last probe_soon
        # (fewest replicas online on a Redis primary, replicas a raise waits for),
        # from the latest probe; None: IDPOOL_REDIS_MARK_REPLICAS is 0 (or no probe yet)
        self.mark_replicas: tuple[int, int] | None = None
        self.last_mark_refused: tuple[float, str] | None = None  # (unix time, detail)

    def failed(self, e: StoreUnavailable) -> None:
        if isinstance(e, MarkNotReplicated | TooFewReplicas):
            # Redis answered; too few replicas are online for a raise to count,
            # or acknowledged one (a replica online but not answering).
            self.last_mark_refused = (self.clock.now(), e.detail)
            return
        if isinstance(e, StoreBusy | StoreSkipped | StrictNotConfirmed):
            # busy (the store answers), not tried, or a strict take a cluster shard's
            # replicas did not all confirm (Redis answered; counted as down, every
            # strict request logged store_down then store_up): nothing new about it
            return
        if self.up.get(e.store, True):
            logger.warning("event=store_down store=%s detail=%r", e.store, e.detail)
        self.up[e.store] = False
        self.last_error[e.store] = (self.clock.now(), e.detail)

    def answered(self, store: str) -> None:
        if self.up.get(store) is False:
            logger.info("event=store_up store=%s", store)
        self.up[store] = True

    def claims_stopped(self) -> str | None:
        """Why no claim can be made now (IDPOOL_REDIS_MARK_REPLICAS), or None."""
        if self.mark_replicas is None:
            return None
        online, wanted = self.mark_replicas
        if online >= wanted:
            return None
        return (
            f"claims stopped: a Redis primary has {online} replicas online and each "
            f"high-water raise needs {wanted} (IDPOOL_REDIS_MARK_REPLICAS); serving the "
            "pool and buffers only"
        )

    def _replicas_seen(self, seen: tuple[int, int] | None) -> None:
        was = self.claims_stopped()
        self.mark_replicas = seen
        now = self.claims_stopped()
        if now is not None and was is None and seen is not None:
            logger.warning("event=mark_replicas_short online=%d wanted=%d detail=%r", *seen, now)
        elif now is None and was is not None:
            logger.info("event=mark_replicas_back")

    def is_up(self, store: str | None) -> bool:
        return store is not None and self.up.get(store, True)

    async def probe(self) -> None:
        """Probe both stores at once (a hung one must not delay the other's answer)."""
        probes = [self._probe(self.ledger_name, self.ledger.ping())]
        if self.pool is not None and self.pool_name is not None:
            probes.append(self._probe(self.pool_name, self._probe_pool()))
        await asyncio.gather(*probes)

    async def probe_soon(self, max_age: float = 0.5, timeout: float = 0.5) -> None:
        """Probe now unless a probe ran within ``max_age`` s, waiting at most
        ``timeout``: a 503 should name every store that is down, also in the
        second before the background probe notices. (The wait is real time: it
        bounds a call to a real store.)"""
        now = self.clock.monotonic()
        if now - self._probed_at < max_age:
            return
        self._probed_at = now
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(asyncio.shield(self.probe()), timeout)

    async def run(self) -> None:
        while True:
            await self.probe()
            await self.clock.sleep(PROBE_EVERY)

    async def _probe_pool(self) -> None:
        assert self.pool is not None
        await self.pool.check()
        replicas = getattr(self.pool, "mark_replicas", None)  # Redis only
        if replicas is not None:
            self._replicas_seen(await replicas())

    async def _probe(self, store: str, call: Awaitable[None]) -> None:
        try:
            await call
        except StoreUnavailable as e:
            self.failed(e)
        else:
            self.answered(store)
