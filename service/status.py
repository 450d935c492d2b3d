"""One picture of a node and its tags, read fresh from the node and both stores.

`/status.json` returns it as is, `/status` renders it as HTML, `/metrics` turns
it into Prometheus series, and `idpool pool show` prints the pool part of it.
"""

from __future__ import annotations

import asyncio
import os
import time
from collections import Counter
from collections.abc import Awaitable, Callable
from typing import Any

from pool.errors import StoreUnavailable
from pool.redis_pool import PoolSummary
from pool.stores import LedgerStore, PoolStore, store_name

from .node import Node
from .stats import rates

Snapshot = dict[str, Any]
SNAPSHOT_SECONDS = 1.0  # scrapes within this long of a snapshot share it


class SnapshotCache:
    """One snapshot at a time, reused for SNAPSHOT_SECONDS: however many scrapers
    call, the stores see at most one round of reads a second."""

    def __init__(self, take: Callable[[], Awaitable[Snapshot]]) -> None:
        self._take = take
        self._task: asyncio.Task[Snapshot] | None = None
        self._taken_at = -SNAPSHOT_SECONDS

    async def get(self) -> Snapshot:
        task = self._task
        if task is None or (task.done() and time.monotonic() - self._taken_at >= SNAPSHOT_SECONDS):
            self._taken_at = time.monotonic()
            task = self._task = asyncio.ensure_future(self._take())
        # shield: a scraper that hangs up must not cancel the snapshot others wait on
        return await asyncio.shield(task)


async def snapshot(
    node: Node,
    ledger: LedgerStore,
    pool: PoolStore | None,
    preloader_waste: Counter[tuple[str, str]] | None = None,
    tags: list[str] | None = None,
) -> Snapshot:
    """The node and the tags it serves (or ``tags``), from O(1) reads per tag:
    the store health comes from the background probes, not from this call."""
    names = sorted(node.buffers) if tags is None else tags
    stores: dict[str, dict[str, Any]] = {}
    health = node.health
    for store in filter(None, (health.ledger_name, health.pool_name)):
        stores[store] = {"up": health.is_up(store), "error": None}
    rows: dict[str, Any] = {}
    try:
        rows = {row.tag: row for row in await ledger.list_tags(names)}
    except StoreUnavailable as e:
        stores[health.ledger_name] = {"up": False, "error": e.detail}
    pooled: dict[str, PoolSummary] = {}
    if pool is not None:
        try:
            pooled = await pool.summaries(names)
        except StoreUnavailable as e:
            stores[store_name(pool, "redis")] = {"up": False, "error": e.detail}
    for store, (when, detail) in health.last_error.items():
        stores.setdefault(store, {"up": True, "error": None})["last_error"] = {
            "at": when,
            "detail": detail,
        }
    waste = Counter[tuple[str, str]]() if preloader_waste is None else preloader_waste
    tag_entries = [_tag(node, tag, rows.get(tag), pooled.get(tag), waste) for tag in names]
    return {
        "node": {
            "pid": os.getpid(),
            "started_at": node.stats.started_at,
            "uptime_s": round(time.time() - node.stats.started_at, 1),
            "draining": node.draining,
            "ready": node.not_ready() is None,
            "store_errors": dict(node.stats.store_errors),
        },
        "stores": stores,
        "tags": tag_entries,
    }


def _tag(
    node: Node,
    tag: str,
    row: Any,
    pooled: PoolSummary | None,
    preloader_waste: Counter[tuple[str, str]],
) -> dict[str, Any]:
    counters = node.stats.tags.get(tag)
    buf = node.buffers.get(tag)
    history = () if counters is None else counters.history
    points = [{"t": round(t, 1), "ids_per_s": round(r, 2)} for t, r in rates(history)]
    wasted = Counter[str]() if counters is None else Counter(counters.wasted)
    for (waste_tag, reason), ids in preloader_waste.items():
        if waste_tag == tag:
            wasted[reason] += ids
    entry: dict[str, Any] = {
        "tag": tag,
        "step": None if row is None else row.step,
        "max_id": None if row is None else row.max_id,
        "start_id": None if row is None else row.start_id,
        "buffer": None,
        "pool": None,
        "rate": {"node_ids_per_s": points[-1]["ids_per_s"] if points else 0.0},
        "history": points,
        "counters": {
            "ids_issued": 0 if buf is None else buf.issued,
            "ranges_from_pool": 0 if counters is None else counters.ranges_from_pool,
            "ranges_from_ledger": 0 if counters is None else counters.ranges_from_ledger,
            "ids_returned": 0 if counters is None else counters.ids_returned,
            "ids_wasted": dict(wasted),
        },
    }
    if buf is not None:
        entry["buffer"] = {
            "current": None if buf.current is None else buf.current.to_text(),
            "used": buf.used,
            "remaining": buf.remaining,
            "next": None if buf.next is None else buf.next.to_text(),
            "next_ready": buf.next is not None,
            "fetching": buf.fetching,
        }
    if pooled is not None:
        stats = pooled.stats
        cluster_rate = float(stats["rate"]) if "rate" in stats else None
        minutes = round(pooled.ids / cluster_rate / 60, 2) if cluster_rate else None
        entry["pool"] = {
            "depth": pooled.depth,
            "ids": pooled.ids,
            "head": None if pooled.head is None else pooled.head.to_text(),
            "target_depth": int(stats["target_depth"]) if "target_depth" in stats else None,
            "minutes_of_supply": minutes,
        }
        entry["rate"]["cluster_ids_per_s"] = cluster_rate
    return entry
