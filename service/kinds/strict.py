"""The ``strict`` kind of ID on a node, and group commit.

A strict tag's IDs increase in real time across every node (docs/design/strict.md,
"Strict tags"): every request needs the shared counter in Redis
(``pool/strict.py``), since a node cannot be strict from memory. Concurrent
requests for one tag share one call: while a call is in flight, new requests
queue for the next; the next call takes the sum of the queue, and its IDs are
handed out in queue order. So a busy node makes one Redis round trip per batch
of requests, not per request, and ``/ids`` is one call however large.

Why this keeps real-time order: a request is queued when it arrives and its
call is sent only after that, so if request A was answered before request B was
sent (to any node), A's call ran on the server before B's call was sent, and
the server hands out larger IDs to later calls. Two requests in one call were
both waiting at once: no order is owed between them, and the earlier in the
queue gets the smaller IDs anyway.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from typing import TypedDict

from idpool.pool.claims import Claim, RedisSkip
from idpool.pool.clock import SYSTEM_CLOCK
from idpool.pool.errors import (
    Draining,
    MarkNotReplicated,
    StoreBusy,
    StoreSkipped,
    StoreUnavailable,
    StrictNotConfirmed,
    TooFewReplicas,
)
from idpool.pool.kind_rules import KindRules
from idpool.pool.strict import StrictCounter, StrictEvents, StrictSupply

from ..errors import HttpRefusal
from ..stats import NodeStats
from .context import KindContext
from .interface import IdKind, KindSpec

logger = logging.getLogger("idpool.strict")

Take = Callable[[str, int], Awaitable[int]]  # (tag, n) -> first of n consecutive IDs


class GroupCommit:
    """One tag's queue: at most one call in flight; the requests that arrive
    meanwhile go together in the next."""

    def __init__(self, tag: str, take: Take) -> None:
        self.tag = tag
        self._take = take
        self._queue: list[tuple[int, asyncio.Future[int]]] = []
        self._running: asyncio.Task[None] | None = None
        self.calls = 0  # calls made (for tests and /status)
        self.issued = 0  # IDs handed out through this queue

    async def take(self, n: int) -> int:
        """The first of ``n`` consecutive IDs, all above every ID this tag handed
        out before the call was made."""
        future: asyncio.Future[int] = asyncio.get_running_loop().create_future()
        self._queue.append((n, future))
        if self._running is None:
            self._running = asyncio.ensure_future(self._drain())
        return await future

    async def _drain(self) -> None:
        try:
            while self._queue:
                # Everything queued so far goes in this call; whatever arrives
                # while it is in flight waits for the next one.
                batch, self._queue = self._queue, []
                total = sum(n for n, _ in batch)
                self.calls += 1
                try:
                    first = await self._take(self.tag, total)
                except BaseException as e:
                    failed = e if isinstance(e, Exception) else _stopping()
                    for _, future in batch:
                        if not future.done():
                            future.set_exception(failed)
                    if failed is not e:
                        raise  # cancelled: the node is stopping
                    continue
                self.issued += total
                for n, future in batch:
                    if not future.done():  # a request cancelled meanwhile: its IDs are waste
                        future.set_result(first)
                    first += n
        finally:
            self._running = None
            for _, future in self._queue:  # only if cancelled: never leave a request hanging
                if not future.done():
                    future.set_exception(_stopping())
            self._queue = []


def _stopping() -> Draining:
    return Draining("node is shutting down")


class StrictTags:
    """A node's strict tags: one group commit per tag, over one supply; fails
    fast for a second after the counter's store failed, like the segment path
    (on Redis, the process's one RedisSkip: a failed pop or claim skips strict
    takes too, and a failed strict take skips pops and claims)."""

    def __init__(
        self,
        take: Take,
        store: str,
        clock: Callable[[], float] = SYSTEM_CLOCK.monotonic,  # the node's (KindContext.clock)
        on_error: Callable[[StoreUnavailable], None] = lambda e: None,
        also_down: Callable[[str], Awaitable[str]] | None = None,
        skip: RedisSkip | None = None,
    ) -> None:
        self._take = take
        self.store = store  # the counter's store: "redis", or "sqlite" embedded
        self._on_error = on_error  # the node's store health and error counts
        self._also_down = also_down  # the other stores the health probe finds down
        self.queues: dict[str, GroupCommit] = {}
        self._skip = skip or RedisSkip(clock)  # after the counter's store failed

    async def take(self, tag: str, n: int) -> int:
        queue = self.queues.get(tag)
        if queue is None:
            queue = self.queues[tag] = GroupCommit(tag, self._guarded)
        return await queue.take(n)

    async def _guarded(self, tag: str, n: int) -> int:
        skipped = self._skip.skipping()
        if skipped is not None:
            raise StoreSkipped(
                skipped.store,
                f"strict tags need {skipped.store}, which failed under a second ago: "
                f"{skipped.detail}",
            )
        try:
            return await self._take(tag, n)
        except StoreBusy:
            raise  # never sent: says nothing of the store's health
        except StoreUnavailable as e:
            self._on_error(e)
            others = "" if self._also_down is None else await self._also_down(e.store)
            detail = f"strict tags need {e.store}: {e.detail}{others}"
            named = StoreUnavailable(e.store, detail)
            # The counter's own store: fail fast for a moment. Not after a raise
            # too few replicas took: Redis answers, and takes need no claim. Nor after
            # a take a cluster shard's replicas did not confirm: other shards serve.
            quiet = StoreSkipped | MarkNotReplicated | TooFewReplicas | StrictNotConfirmed
            if e.store == self.store and not isinstance(e, quiet):
                # The store's own error, not strict's wording: the skip is shared
                # with the segment path, whose 503s quote it.
                self._skip.failed(e)
            raise named from e


class StrictHeld(TypedDict):
    """A strict tag's queue, as /status.json shows it (``mode``: its older key)."""

    kind: str
    mode: str
    issued: int
    calls: int


class StrictKind:
    """The ``strict`` kind: every request goes to the shared counter (Redis, or
    the embedded ledger's file), group-committed per tag."""

    def __init__(self, ctx: KindContext) -> None:
        self.ctx = ctx
        self.supply = strict_supply(ctx)
        claims = ctx.source.claims
        self.tags = StrictTags(
            self.supply.take,
            self.supply.name,
            clock=ctx.clock.monotonic,
            on_error=ctx.health.failed,
            also_down=self._also_down,
            skip=claims.redis_skip if self.supply.name == "redis" else None,
        )

    async def _also_down(self, failed: str) -> str:
        """The other stores the node's health probe finds down, for the 503: one
        message names every store to fix, as the segment path's does (a fresh
        probe first, at most twice a second, bounded by half a second)."""
        health = self.ctx.health
        await health.probe_soon()
        down = [
            f"; {store} down too: {detail}"
            for store, (_, detail) in health.last_error.items()
            if store != failed and not health.is_up(store)
        ]
        return "".join(down)

    async def next_id(self, tag: str) -> int:
        if tag not in self.tags.queues:
            await self._check_format(tag)
        return await self.tags.take(tag, 1)

    async def next_ids(self, tag: str, count: int) -> list[int]:
        if tag not in self.tags.queues:
            await self._check_format(tag)
        first = await self.tags.take(tag, count)
        return list(range(first, first + count))

    async def _check_format(self, tag: str) -> None:
        """Before this process first serves the strict tag (its queue is made by
        the take that follows): a strict tag has no format, so a row that carries
        one, or a name recorded with one (``idpool:{tag}:format``), was edited by
        hand from a formatted tag (its ``kind`` set to strict, its options kept or
        cleared): its bare numbers would repeat the strings it handed out, and the
        strict path never renders. Refused (FormatNotFenced, 503); a name with no
        record gets ``plain`` (a strict tag made with Redis down has none).
        Once per tag and process, as the segment path's buffer: a strict tag
        served here goes on with the bare numbers it always handed out, whatever
        its row then reads (a formatted tag's buffer was never its queue)."""
        await self.ctx.fence.check_fence(tag)

    def not_ready(self) -> str | None:
        """Strict tags need Redis per request: a node without it answers their
        requests 503 by itself, and its readiness is the stores' (service/health.py)."""
        return None

    def holding(self, tag: str) -> StrictHeld | None:
        queue = self.tags.queues.get(tag)
        if queue is None:
            return None
        name = SPEC.name
        return {"kind": name, "mode": name, "issued": queue.issued, "calls": queue.calls}

    def served(self) -> set[str]:
        """The strict tags this node was asked for."""
        return set(self.tags.queues)

    async def close(self) -> None:
        await self.supply.close()


def strict_supply(ctx: KindContext) -> StrictSupply:
    """Where a node's strict takes go: the Redis counter, refilled from the
    node's fenced ledger claims; or, embedded, the SQLite ledger itself."""
    parts = ctx.parts
    if parts.redis_strict is not None:
        return StrictCounter(
            parts.redis_strict(),
            ctx.source.claims,
            kind=SPEC.name,
            step_of=ctx.tags.step,
            hold_seconds=ctx.reserve_seconds,
            events=NodeStrictEvents(ctx.stats),
            waste=ctx.waste,
        )
    if parts.file_strict is not None:
        return parts.file_strict(SPEC.name)
    return _NoSupply()


class _NoSupply:
    """Stores that can hold no strict counter (test doubles): every take is a 503."""

    name = "redis"

    async def take(self, tag: str, n: int) -> int:
        raise StoreUnavailable("redis", f"tag {tag!r} is strict: it needs Redis, and there is none")

    async def close(self) -> None:
        pass


class NodeStrictEvents(StrictEvents):
    """Logs a strict counter's refills as the segment path logs its claims, and
    counts them in the node's stats (its waste goes to the node's WasteRecorder)."""

    def __init__(self, stats: NodeStats) -> None:
        self.stats = stats

    def claimed(self, tag: str, claim: Claim, how: str) -> None:
        self.stats.tags[tag].ranges_from_ledger += 1
        # ops/faults accounts for a strict tag's IDs by these lines
        logger.info(
            "event=strict_refilled tag=%s range=%s how=%s", tag, claim.range.to_text(), how
        )


class StrictSpec(KindSpec):
    name = "strict"
    rank = 1
    # Its state in Redis is fenced before its row is made (tag_changes.create_tag).
    rules = KindRules("strict", fences_state=True, needs_redis=True)
    direct = True  # no memory to answer from: NodeApp awaits its counter
    api_flag = True  # {"strict": true}, as it was asked for before kinds
    summary = "strictly increasing in real time across every node"
    api_fields = {
        "strict": {
            "type": "boolean",
            "default": False,
            "description": "true: kind strict (IDs strictly increasing in real time "
            "across every node; no client leases)",
        }
    }
    cli_flag_help = (
        "kind strict: IDs strictly increasing in real time across every node "
        "(each request needs Redis; no client leases); chosen now, never changed"
    )

    def make(self, ctx: KindContext) -> IdKind:
        return StrictKind(ctx)

    def refuse_lease(self, tag: str) -> Exception | None:
        return HttpRefusal(
            "strict_tag",
            f"tag {tag!r} is strict: its IDs increase in real time across every caller, "
            "which only the nodes can do, so it cannot be leased to a client that hands "
            f"out IDs itself; ask a node for each ID (GET /id/{tag}, GET /ids/{tag}?count=N)",
        )


SPEC = StrictSpec()
