"""How a node serves snowflake tags (the ``snowflake`` kind, ``snowflake.py``):
one leased worker ID per tag per process, IDs made in memory
(``pool/snowflake.py``), no store call per ID.

The first request for a snowflake tag claims a generation from the ledger and
asks Redis for a worker ID (``pool/worker_store.py``) for the tag's lease TTL
(recorded in its row when it was added; ``IDPOOL_WORKER_LEASE_SECONDS`` for a
tag made before; the grant, this node's or a client's: ``snowflake_grants.py``);
a background task renews the lease every quarter of it,
carrying the last time used. The generator stops by itself ``IDPOOL_WORKER_MARGIN_SECONDS``
before the lease could expire, by this process's monotonic clock, from the
moment the last successful renewal was *sent*; a lost lease stops it at once.
Either way requests get 503 naming the cause, and the task asks for a new
worker ID (whose time floor is above what the old one used).

The kind's time is its own, on purpose: a lease's deadline is on the lease
clock (``lease_clock``: CLOCK_BOOTTIME, which counts a suspend) and the IDs'
time on the wall clock (``wall_ms``), both the client generator's, injected here
as ``monotonic`` and ``clock_ms``. Only the waits (for the next time unit, a
quarter of the TTL between renewals) sleep on the node's clock
(``KindContext.clock``).

``SnowflakeKind.generators`` (tag -> Generator) is what NodeApp's fast path
takes from (``take_now``).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections import Counter, deque
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, TypedDict

from idpool.pool.errors import IdPoolError, InvalidInput, StoreUnavailable
from idpool.pool.snowflake import (
    ClockAhead,
    ClockBehind,
    Generator,
    Layout,
    WorkerLeaseLost,
    lease_clock,
    wall_ms,
)
from idpool.pool.worker_store import Grant, LastTooLate, WorkerRefused, WorkerStore

from .context import KindContext
from .snowflake_grants import SNOWFLAKE, WorkerGrants

# A batch (/ids) answers no ID made more than this before it is answered, so a
# batch keeps time order at the scale of a second with IDs other nodes hand out.
BATCH_MS = 500
logger = logging.getLogger("idpool.snowflake")


def batch_limit(layout: Layout) -> int:
    """The most IDs one worker ID makes in BATCH_MS (at least one unit's sequence)."""
    return (layout.max_sequence + 1) * max(1, BATCH_MS // layout.unit_ms)


def check_count(tag: str, layout: Layout, count: int) -> None:
    """Refuse a batch longer than the tag makes in BATCH_MS (400 ``bad_count``,
    naming this tag's maximum)."""
    limit = batch_limit(layout)
    if count > limit:
        raise InvalidInput(
            "bad_count",
            f"count {count} is more than tag {tag!r} makes in {BATCH_MS} ms per worker ID "
            f"({layout.max_sequence + 1} per {layout.unit_ms} ms unit): at most "
            f"{limit} per batch here, or IDs would be answered older than ones handed out "
            "meanwhile",
        )


@dataclass
class Held:
    """A worker ID this node holds for a tag, and the task that renews it."""

    grant: Grant
    generator: Generator
    renewer: asyncio.Task[None] | None = None


class Unheld(TypedDict):
    """A snowflake tag this node holds no worker ID of, as /status.json shows it."""

    kind: str
    worker: None
    refused: str | None
    refusals: dict[str, int]


class WorkerHeld(TypedDict):
    """A snowflake tag's worker ID held here, as /status.json shows it."""

    refusals: dict[str, int]  # grants refused here, by why: "full" is a tag out of worker IDs
    kind: str
    current: str  # the status page's buffer column
    used: int
    worker: int
    generation: int
    issued: int
    last_ms: int
    lease_left_s: float
    lost: str | None
    clock_behind_ms: int
    clock_behind_events: int
    clock_ahead_ms: int
    layout: dict[str, Any]


class SnowflakeKind(WorkerGrants):
    """Time-ordered IDs from a leased worker ID, served from memory (its grants,
    and the client leases of POST /worker/{tag}: ``WorkerGrants``)."""

    def __init__(
        self,
        ctx: KindContext,
        *,
        clock_ms: Callable[[], int] = wall_ms,
        monotonic: Callable[[], float] = lease_clock,
    ) -> None:
        super().__init__(ctx, monotonic)
        self.generators: dict[str, Generator] = {}  # tag -> Generator: the fast path's view
        self.held: dict[str, Held] = {}
        self._clock_ms = clock_ms
        self._granting: dict[str, asyncio.Future[Generator]] = {}
        self.clock_behind: Counter[str] = Counter()  # tag -> episodes of a large step back
        self._logged: dict[int, int] = {}  # id(generator) -> episodes logged
        self._logged_ahead: dict[int, int | None] = {}  # id(generator) -> ceiling logged at
        self.closed = False

    # -- serving ---------------------------------------------------------

    async def next_id(self, tag: str) -> int:
        while True:
            gen = await self.generator(tag)
            value = self._take(gen)
            if value is not None:
                return value
            await self.ctx.clock.sleep(gen.wait_seconds())  # the next time unit

    async def next_ids(self, tag: str, count: int) -> list[int]:
        """``count`` IDs, none made more than BATCH_MS before the answer.

        A batch longer than the layout makes in BATCH_MS (one worker ID) is
        refused up front (400 ``bad_count``, naming this tag's maximum): collected
        over seconds, its first IDs would be older than IDs other nodes handed out
        before it was answered (time order at a second). IDs that still grew
        stale while the batch waited (other requests sharing the sequence) are
        dropped, never served, and made again."""
        # Before any worker grant: a tag in quarantine answers the 400 it will end in.
        check_count(tag, Layout.from_text((await self.ctx.tags.lookup(tag)).layout), count)
        found: deque[tuple[float, int]] = deque()  # (monotonic time made, ID)
        while len(found) < count:
            gen = await self.generator(tag)
            value = self._take(gen)
            if value is None:
                await self.ctx.clock.sleep(gen.wait_seconds())
                continue
            made = self._monotonic()
            found.append((made, value))
            while made - found[0][0] > BATCH_MS / 1000:
                found.popleft()  # too old to answer: skipped, never served
        return [value for _, value in found]

    def _take(self, gen: Generator) -> int | None:
        try:
            return gen.take()
        except ClockAhead as e:
            if self._logged_ahead.get(id(gen)) != gen.ceiling_ms:  # once per renewal
                self._logged_ahead[id(gen)] = gen.ceiling_ms
                logger.error(
                    "event=clock_ahead tag=%s worker=%d ahead_ms=%d detail=%r",
                    gen.tag,
                    gen.worker,
                    e.ahead_ms,
                    "no snowflake ID past the worker lease's expiry (the clock leaped forward?)",
                )
            raise
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

    def take_now(self, tag: str, count: int) -> int | list[int] | None:
        """From memory, for NodeApp's fast path (``count`` 0: one ID): None when no
        worker ID is held, the batch is over the tag's cap (the route's 400, before
        take_many used up the rest of the unit's sequence on a batch it then skips),
        or the generator refuses (the route answers it, naming the cause, and logs)."""
        gen = self.generators.get(tag)
        if gen is None or count > batch_limit(gen.layout):
            return None
        try:
            # synchronous: no two requests get the same ID; a batch is all or
            # none (a partial batch is skipped, never served)
            return gen.take() if count == 0 else gen.take_many(count)
        except IdPoolError:
            return None

    def stop(self, tags: set[str], why: str) -> None:
        """Stop serving ``tags`` (an operator disabled or removed them): no generator
        serves them from memory any more; a request asks for a worker ID again."""
        for tag in tags & set(self.generators):
            self.generators.pop(tag).lost = why

    def served(self) -> set[str]:
        """The snowflake tags this node holds a generator of."""
        return set(self.generators)

    async def generator(self, tag: str) -> Generator:
        """The tag's generator, granting a worker ID first when none is held."""
        gen = self.generators.get(tag)
        if gen is not None and gen.lost is None:
            return gen
        await self.ctx.tags.lookup(tag)
        if self.closed or self.ctx.draining():
            raise WorkerLeaseLost(tag, "the node is shutting down")
        pending = self._granting.get(tag)
        if pending is None:
            pending = self._granting[tag] = asyncio.ensure_future(self._grant(tag))
            pending.add_done_callback(lambda _: self._granting.pop(tag, None))
        return await asyncio.shield(pending)

    async def _grant(self, tag: str) -> Generator:
        grant, layout, sent = await self.lease_worker(tag, self.ctx.node_id or "node")
        store = self.store(tag)
        gen = Generator(
            tag,
            layout,
            grant.worker,
            grant.floor_ms,
            sent + grant.ttl_ms / 1000 - self.margin,
            clock_ms=self._clock_ms,
            monotonic=self._monotonic,
            # No ID past the expiry the script recorded: the floor of every later
            # holder of this worker ID is at or above it, whatever this clock does.
            ceiling_ms=grant.expires_ms,
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
        ttl = held.grant.ttl_ms / 1000  # the lease's own, as Redis recorded it
        while gen.lost is None:
            await self.ctx.clock.sleep(ttl / 4)
            sent = self._monotonic()
            row = self.ctx.tags.rows.get(tag)
            _, quarantine_ms = self.lease_ms(row) if row else (0, int(self.ttl * 1000))
            quarantine_ms = max(quarantine_ms, held.grant.ttl_ms)
            try:
                renewed = await store.renew(
                    tag, held.grant, gen.last_ms, held.grant.ttl_ms, quarantine_ms
                )
            except (WorkerRefused, LastTooLate) as e:
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
            # The deadline counts from the TTL the renewal extended by (the lease's).
            gen.stop_at = max(gen.stop_at, sent + renewed.ttl_ms / 1000 - self.margin)
            gen.cover(renewed.expires_ms)  # recorded in the field before this answer
        if self.generators.get(tag) is gen:
            del self.generators[tag]  # the next request asks for a new worker ID

    # -- lifecycle and views ---------------------------------------------

    async def close(self) -> None:
        """Release every worker ID with the last time it used (a graceful stop)."""
        if self.closed:
            return
        self.closed = True
        try:
            store = self.store("-")  # releases: only tags that were granted (Redis)
        except IdPoolError:
            return
        for tag, held in list(self.held.items()):
            gen = held.generator
            if held.renewer is not None:
                held.renewer.cancel()
            if gen.lost is not None:
                continue
            gen.lost = "the node is shutting down"
            with contextlib.suppress(StoreUnavailable, WorkerRefused, LastTooLate):
                row = self.ctx.tags.rows.get(tag)
                own = self.lease_ms(row)[1] if row else int(self.ttl * 1000)
                quarantine_ms = max(own, held.grant.ttl_ms)
                await store.release(tag, held.grant, gen.last_ms, quarantine_ms)
                logger.info("event=worker_released tag=%s worker=%d", tag, gen.worker)
        self.generators.clear()

    def not_ready(self) -> str | None:
        behind = sorted(t for t, g in self.generators.items() if g.behind_ms)
        if behind:
            return f"the clock stepped back behind the last time used for snowflake tag(s) {behind}"
        # Only while the lease holds: past its deadline (Redis unreachable) the clock
        # passes the last expiry answered without having leaped.
        now = self._monotonic()
        ahead = sorted(t for t, g in self.generators.items() if now < g.stop_at and g.ahead_ms())
        if ahead:
            return (
                "the clock is past the worker lease's expiry by the Redis server's clock "
                f"(leaped forward?) for snowflake tag(s) {ahead}"
            )
        return None

    def holding(self, tag: str) -> Unheld | WorkerHeld | None:
        held = self.held.get(tag)
        refusals = {why: n for (t, why), n in self.refusals.items() if t == tag}
        if held is None:
            why = self._refused.get(tag)
            if why is None and not refusals:
                return None
            return {"kind": SNOWFLAKE, "worker": None, "refused": why, "refusals": refusals}
        gen = held.generator
        return {
            # grants refused here, by why: "full" is a tag out of worker IDs
            "refusals": refusals,
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
            "clock_ahead_ms": gen.ahead_ms(),
            "layout": gen.layout.fields(),
        }
