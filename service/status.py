"""One picture of a node and its tags, read fresh from the node and both stores.

`/status.json` returns it as is, `/status` renders it as HTML, `/metrics` turns
it into Prometheus series, and `idpool pool show` prints the pool part of it.
"""

from __future__ import annotations

import os
import time
from collections import Counter
from typing import Any

from pool.errors import StoreUnavailable
from pool.ranges import IdRange
from pool.stores import LedgerStore, PoolStore, store_name

from .node import Node
from .stats import rates

Snapshot = dict[str, Any]


async def snapshot(
    node: Node,
    ledger: LedgerStore,
    pool: PoolStore | None,
    preloader_waste: Counter[tuple[str, str]] | None = None,
) -> Snapshot:
    stores: dict[str, dict[str, Any]] = {}
    rows: dict[str, Any] = {}
    ledger_name = store_name(ledger, "mysql")
    try:
        rows = {row.tag: row for row in await ledger.list_tags()}
        stores[ledger_name] = {"up": True, "error": None}
    except StoreUnavailable as e:
        stores[ledger_name] = {"up": False, "error": e.detail}
    names = sorted(set(rows) | set(node.buffers))
    pooled: dict[str, tuple[list[IdRange], dict[str, str]]] = {}
    if pool is not None:
        pool_name = store_name(pool, "redis")
        try:
            for tag in names:
                pooled[tag] = (await pool.ranges(tag), await pool.read_stats(tag))
            stores[pool_name] = {"up": True, "error": None}
        except StoreUnavailable as e:
            stores[pool_name] = {"up": False, "error": e.detail}
    for store, (when, detail) in node.source.last_error.items():
        stores.setdefault(store, {"up": True, "error": None})["last_error"] = {
            "at": when,
            "detail": detail,
        }
    waste = Counter[tuple[str, str]]() if preloader_waste is None else preloader_waste
    tags = [_tag(node, tag, rows.get(tag), pooled.get(tag), waste) for tag in names]
    return {
        "node": {
            "pid": os.getpid(),
            "started_at": node.stats.started_at,
            "uptime_s": round(time.time() - node.stats.started_at, 1),
            "draining": node.draining,
            "store_errors": dict(node.stats.store_errors),
        },
        "stores": stores,
        "tags": tags,
    }


def _tag(
    node: Node,
    tag: str,
    row: Any,
    pooled: tuple[list[IdRange], dict[str, str]] | None,
    preloader_waste: Counter[tuple[str, str]],
) -> dict[str, Any]:
    counters = node.stats.tags[tag]
    buf = node.buffers.get(tag)
    history = [{"t": round(t, 1), "ids_per_s": round(r, 2)} for t, r in rates(counters.history)]
    wasted = Counter(counters.wasted)
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
        "rate": {"node_ids_per_s": history[-1]["ids_per_s"] if history else 0.0},
        "history": history,
        "counters": {
            "ids_issued": 0 if buf is None else buf.issued,
            "ranges_from_pool": counters.ranges_from_pool,
            "ranges_from_ledger": counters.ranges_from_ledger,
            "ids_returned": counters.ids_returned,
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
        ranges, stats = pooled
        ids = sum(map(len, ranges))
        cluster_rate = float(stats["rate"]) if "rate" in stats else None
        minutes = round(ids / cluster_rate / 60, 2) if cluster_rate else None
        entry["pool"] = {
            "depth": len(ranges),
            "ids": ids,
            "head": ranges[0].to_text() if ranges else None,
            "target_depth": int(stats["target_depth"]) if "target_depth" in stats else None,
            "minutes_of_supply": minutes,
        }
        entry["rate"]["cluster_ids_per_s"] = cluster_rate
    return entry
