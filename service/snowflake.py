"""Snowflake tags on a node: one leased worker ID per tag per process, IDs made
in memory (``pool/snowflake.py``), no store call per ID.

The first request for a snowflake tag claims a generation from the ledger and
asks Redis for a worker ID (``pool/worker_store.py``); a background task renews
the lease every quarter of ``IDPOOL_WORKER_LEASE_SECONDS``, carrying the last
time used. The generator stops by itself ``IDPOOL_WORKER_MARGIN_SECONDS``
before the lease could expire, by this process's monotonic clock, from the
moment the last successful renewal was *sent*; a lost lease stops it at once.
Either way requests get 503 naming the cause, and the task asks for a new
worker ID (whose time floor is above what the old one used).

``Node.snowflakes`` (tag -> Generator) is what NodeApp's fast path reads.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from idpool.pool.errors import (
    IdPoolError,
    InvalidInput,
    StoreUnavailable,
    TagDisabled,
    UnknownTag,
)
from idpool.pool.lease_store import fingerprint
from idpool.pool.redis_pool import RedisPool
from idpool.pool.snowflake import (
    ClockBehind,
    Generator,
    Layout,
    WorkerLeaseLost,
    lease_clock,
    wall_ms,
)
from idpool.pool.values import TagRow
from idpool.pool.worker_store import Grant, WorkerRefused, WorkerStore

if TYPE_CHECKING:
    from .node import Node

SNOWFLAKE = "snowflake"
RETRY_SECONDS = 0.5  # after a failed grant, requests fail at once for this long
logger = logging.getLogger("idpool.snowflake")


@dataclass
class Held:
    """A worker ID this node holds for a tag, and the task that renews it."""

    grant: Grant
    generator: Generator
    renewer: asyncio.Task[None] | None = None


class SnowflakeKind:
    """Time-ordered IDs from a leased worker ID, served from memory."""

    name = SNOWFLAKE
    from_memory = True

    def __init__(
        self,
        node: Node,
        *,
        clock_ms: Callable[[], int] = wall_ms,
        monotonic: Callable[[], float] = lease_clock,
    ) -> None:
        self.node = node
        self.generators = node.snowflakes  # tag -> Generator: the fast path's view
        self.held: dict[str, Held] = {}
        self._clock_ms = clock_ms
        self._monotonic = monotonic
        self._granting: dict[str, asyncio.Future[Generator]] = {}
        self._store: WorkerStore | None = None
        self._retry: dict[str, tuple[float, str]] = {}  # tag -> (no grant before, why)
        self._refused: dict[str, str] = {}  # tag -> why the last grant failed
        self.clock_behind: Counter[str] = Counter()  # tag -> episodes of a large step back
        self._logged: dict[int, int] = {}  # id(generator) -> episodes logged
        self.closed = False
        self.ttl = node.worker_lease_seconds
        self.margin = node.worker_margin_seconds

    def store(self) -> WorkerStore:
        if self._store is None:
            pool = self.node.source.pool
            if not isinstance(pool, RedisPool):
                raise WorkerLeaseLost(
                    "-", "snowflake tags need Redis for worker IDs (not embedded)"
                )
            self._store = WorkerStore(pool.client, pool.keys, pool.send)
        return self._store

    # -- serving ---------------------------------------------------------

    async def next_id(self, tag: str) -> int:
        while True:
            gen = await self.generator(tag)
            value = self._take(gen)
            if value is not None:
                return value
            await asyncio.sleep(gen.wait_seconds())  # the next time unit

    async def next_ids(self, tag: str, count: int) -> list[int]:
        found: list[int] = []
        while len(found) < count:
            gen = await self.generator(tag)
            value = self._take(gen)
            if value is None:
                await asyncio.sleep(gen.wait_seconds())
            else:
                found.append(value)
        return found

    def _take(self, gen: Generator) -> int | None:
        try:
            return gen.take()
        except ClockBehind as e:
            # once per episode, whichever path (fast or routed) met it first
            if self._logged.get(id(gen), 0) < gen.behind_events:
                self._logged[id(gen)] = gen.behind_events
                self.clock_behind[gen.tag] += 1
                logger.error(
                    "event=clock_behind tag=%s worker=%d behind_ms=%d detail=%r",
                    gen.tag,
                    gen.worker,
                    e.behind_ms,
                    "no snowflake ID until the clock passes the last time used",
                )
            raise

    async def generator(self, tag: str) -> Generator:
        """The tag's generator, granting a worker ID first when none is held."""
        gen = self.generators.get(tag)
        if gen is not None and gen.lost is None:
            return gen
        await self.node.tags.lookup(tag)
        if self.closed or self.node.draining:
            raise WorkerLeaseLost(tag, "the node is shutting down")
        pending = self._granting.get(tag)
        if pending is None:
            pending = self._granting[tag] = asyncio.ensure_future(self._grant(tag))
            pending.add_done_callback(lambda _: self._granting.pop(tag, None))
        return await asyncio.shield(pending)

    async def lease_worker(self, tag: str, holder: str) -> tuple[Grant, Layout, float]:
        """A worker ID of ``tag`` for ``holder`` (this node, or a client through
        POST /worker/{tag}), and the monotonic time the grant was sent (the
        holder's lease runs from then). Raises WorkerLeaseLost naming why not."""
        row = await self.node.tags.lookup(tag)
        if row.kind != SNOWFLAKE:
            raise InvalidInput("wrong_kind", f"tag {tag!r} is a {row.kind} tag, not snowflake")
        layout = Layout.from_text(row.layout)
        store = self.store()
        # After a refusal, ask again only once it may be answered otherwise: a
        # quarantine's end, or a moment after a store failed (no claim per request).
        retry_at, why = self._retry.get(tag, (0.0, ""))
        if self._monotonic() < retry_at:
            raise WorkerLeaseLost(tag, why)
        try:
            # A generation from the ledger (fenced by the high-water mark): names the
            # lease, and tells the tag's first grant ever (no holder can exist before it).
            claim = await self.node.source.claims.claim(tag, 1)
        except (UnknownTag, TagDisabled):
            raise
        except IdPoolError as e:
            raise self._refuse(tag, f"no worker ID: {e}", RETRY_SECONDS) from e
        generation = claim.range.start
        sent = self._monotonic()
        try:
            grant = await store.grant(
                tag,
                generation=generation,
                first=generation == row.start_id,
                workers=layout.workers,
                holder=holder,
                ttl_ms=int(self.ttl * 1000),
                quarantine_ms=int(self.ttl * 1000),
            )
        except WorkerRefused as e:
            raise self._refuse(tag, str(e), max(RETRY_SECONDS, e.retry_ms / 1000)) from None
        except StoreUnavailable as e:
            raise self._refuse(tag, f"no worker ID: Redis: {e.detail}", RETRY_SECONDS) from e
        self._refused.pop(tag, None)
        self._retry.pop(tag, None)
        logger.info(
            "event=worker_granted tag=%s worker=%d generation=%d floor_ms=%d holder=%s lease=%s",
            tag,
            grant.worker,
            generation,
            grant.floor_ms,
            holder,
            fingerprint(grant.secret),  # never the secret: a log line cannot renew or release
        )
        return grant, layout, sent

    def _refuse(self, tag: str, why: str, wait: float) -> WorkerLeaseLost:
        self._refused[tag] = why
        self._retry[tag] = (self._monotonic() + wait, why)
        return WorkerLeaseLost(tag, why)

    async def _grant(self, tag: str) -> Generator:
        grant, layout, sent = await self.lease_worker(tag, self.node.node_id or "node")
        store = self.store()
        gen = Generator(
            tag,
            layout,
            grant.worker,
            grant.floor_ms,
            sent + self.ttl - self.margin,
            clock_ms=self._clock_ms,
            monotonic=self._monotonic,
        )
        held = Held(grant, gen)
        old = self.held.get(tag)
        if old is not None and old.renewer is not None:
            old.renewer.cancel()
        self.held[tag] = held
        self.generators[tag] = gen
        held.renewer = asyncio.ensure_future(self._renew(tag, held, store))
        return gen

    async def _renew(self, tag: str, held: Held, store: WorkerStore) -> None:
        gen = held.generator
        ttl_ms = int(self.ttl * 1000)
        while gen.lost is None:
            await asyncio.sleep(self.ttl / 4)
            sent = self._monotonic()
            try:
                await store.renew(tag, held.grant, gen.last_ms, ttl_ms, ttl_ms)
            except WorkerRefused as e:
                gen.lost = f"the worker ID's lease was lost: {e}"
                logger.error(
                    "event=worker_lease_lost tag=%s worker=%d detail=%r", tag, gen.worker, str(e)
                )
                break
            except StoreUnavailable as e:
                # Not renewed (or not known to be): the generator stops on its own
                # deadline unless a later renewal succeeds.
                logger.warning(
                    "event=worker_renew_failed tag=%s worker=%d left_s=%.1f detail=%r",
                    tag,
                    gen.worker,
                    gen.stop_at - self._monotonic(),
                    e.detail,
                )
                continue
            gen.stop_at = max(gen.stop_at, sent + self.ttl - self.margin)
        if self.generators.get(tag) is gen:
            del self.generators[tag]  # the next request asks for a new worker ID

    # -- lifecycle and views ---------------------------------------------

    async def close(self) -> None:
        """Release every worker ID with the last time it used (a graceful stop)."""
        if self.closed:
            return
        self.closed = True
        try:
            store = self.store()
        except IdPoolError:
            return
        for tag, held in list(self.held.items()):
            gen = held.generator
            if held.renewer is not None:
                held.renewer.cancel()
            if gen.lost is not None:
                continue
            gen.lost = "the node is shutting down"
            with contextlib.suppress(StoreUnavailable, WorkerRefused):
                await store.release(tag, held.grant, gen.last_ms, int(self.ttl * 1000))
                logger.info("event=worker_released tag=%s worker=%d", tag, gen.worker)
        self.generators.clear()

    def not_ready(self) -> str | None:
        behind = sorted(t for t, g in self.generators.items() if g.behind_ms)
        if behind:
            return f"the clock stepped back behind the last time used for snowflake tag(s) {behind}"
        return None

    def describe(self, tag: str) -> dict[str, Any] | None:
        held = self.held.get(tag)
        if held is None:
            why = self._refused.get(tag)
            return None if why is None else {"kind": SNOWFLAKE, "worker": None, "refused": why}
        gen = held.generator
        return {
            "kind": SNOWFLAKE,
            "current": f"worker {gen.worker}",  # the status page's buffer column
            "used": gen.issued,
            "worker": gen.worker,
            "generation": held.grant.generation,
            "issued": gen.issued,
            "last_ms": gen.last_ms,
            "lease_left_s": round(gen.stop_at - self._monotonic(), 3),
            "lost": gen.lost,
            "clock_behind_ms": gen.behind_ms,
            "clock_behind_events": self.clock_behind[tag],
            "layout": gen.layout.describe(),
        }


def check_removable(row: TagRow) -> None:
    """Refuse to remove a snowflake tag (InvalidInput ``wrong_kind``): its IDs come
    from the clock since its layout's epoch, not from ranges, so the tombstone's
    max_id cannot fence them, and the name added again (a new epoch: its creation)
    would make the old tag's IDs again as its clock catches up."""
    if row.kind == SNOWFLAKE:
        raise InvalidInput(
            "wrong_kind",
            f"tag {row.tag!r} is a snowflake tag and cannot be removed: added again, its "
            "IDs would restart from a new epoch and repeat the old ones; disable it instead "
            f"(`idpool tag disable {row.tag}`)",
        )


async def prepare_tag(pool: object, row: TagRow) -> None:
    """Make the worker hash of a snowflake tag just created, so that its first
    grants need no quarantine even when several nodes race for them. Only while
    no generation was claimed (``max_id == start_id``); with Redis down the first
    grant waits out one quarantine instead (safe, only slower)."""
    if row.kind != SNOWFLAKE or row.max_id != row.start_id or not isinstance(pool, RedisPool):
        return
    with contextlib.suppress(StoreUnavailable):
        await WorkerStore(pool.client, pool.keys, pool.send).init(row.tag)
