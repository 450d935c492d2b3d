"""One picture of a node and its tags, read fresh from the node and both stores.

`/status.json` returns it as is, `/status` renders it as HTML, `/metrics` turns
it into Prometheus series, and `idpool pool show` prints the pool part of it.
"""

from __future__ import annotations

import asyncio
import os
from collections import Counter
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from idpool.pool.clock import SYSTEM_CLOCK, Clock
from idpool.pool.errors import StoreUnavailable
from idpool.pool.stores import LedgerStore, PoolStore
from idpool.pool.values import PoolSummary, TagRow

from .formats import tag_list_entry
from .node import Node
from .stats import rates

Snapshot = dict[str, Any]
STORE_READS_SECONDS = 1.0  # scrapes within this long share one round of store reads
MAX_CLUSTER_TAGS = 100  # rows of the cluster view's tag table: the page stays a few KB
RUNWAY_SHORT_S = 7 * 86400  # a runway under a week is a problem (as in ops/alerts.yml)
# What a tag's row says, not a fault: shown, never in red (status_page.py)
QUIET_STATES = frozenset({"disabled", "removed", "exhausted"})


@dataclass
class StoreView:
    """What the stores said about some tags: ledger rows, list summaries, and
    the errors met reading them."""

    rows: dict[str, TagRow] = field(default_factory=dict)
    pooled: dict[str, PoolSummary] = field(default_factory=dict)
    errors: dict[str, str] = field(default_factory=dict)  # store -> detail
    rows_read: bool = False  # the ledger answered: a name without a row was removed
    nodes: list[dict[str, str]] = field(default_factory=list)  # live nodes' heartbeats
    cluster_tags: list[str] = field(default_factory=list)  # tags live nodes serve


async def read_stores(
    ledger: LedgerStore,
    pool: PoolStore | None,
    names: Sequence[str],
    nodes_ttl: float | None = None,
) -> StoreView:
    """O(1) reads per tag: the rows of ``names`` and one pipelined round of list
    summaries (never a whole list). With ``nodes_ttl``, also the live nodes, and
    the same reads for every tag they serve (the cluster view)."""
    view = StoreView()
    if pool is not None and nodes_ttl is not None:
        try:
            view.nodes = await pool.live_nodes(nodes_ttl)
        except StoreUnavailable as e:
            view.errors[e.store] = e.detail
        served = {t for n in view.nodes for t in n.get("tags", "").split(",") if t}
        view.cluster_tags = sorted(served.union(names))[:MAX_CLUSTER_TAGS]
        names = sorted(set(names).union(view.cluster_tags))
    try:
        view.rows = {row.tag: row for row in await ledger.list_tags(names)}
        view.rows_read = True
    except StoreUnavailable as e:
        view.errors[e.store] = e.detail
    if pool is not None:
        try:
            view.pooled = await pool.summaries(names)
        except StoreUnavailable as e:
            view.errors[e.store] = e.detail
    return view


def runway_seconds(row: TagRow | None, pool_ids: int, rate: float | None) -> float | None:
    """Seconds until a bounded tag reaches its max at the cluster's rate: the IDs
    not yet claimed below the bound plus those ready in the pool, over the rate
    (IDs held in nodes' buffers are not counted: a few seconds' worth at most).
    None for a tag with no bound, or no rate yet; 0 once nothing is left."""
    if row is None or row.max is None:
        return None
    left = row.left + pool_ids
    if left <= 0:
        return 0.0
    return round(left / rate, 1) if rate else None


_YEAR_S = 365 * 86400
_LONGEST_SHOWN_S = 1000 * _YEAR_S  # an idle tag's runway is in the trillions of days


def runway_text(seconds: float | None, bounded: bool = True, sep: str = " ") -> str:
    """A runway for people: 45 s, 12 m, 5.5 h, 30.0 d, 12.5 y, "> 1000 y";
    "unbounded" for a tag with no max, "-" when there is no rate to tell."""
    if not bounded:
        return "unbounded"
    if seconds is None:
        return "-"
    if seconds >= _LONGEST_SHOWN_S:
        return f">{sep}1000{sep}y"
    for unit, size in (("y", _YEAR_S), ("d", 86400), ("h", 3600), ("m", 60)):
        if seconds >= size:
            return f"{seconds / size:.1f}{sep}{unit}"
    return f"{seconds:.0f}{sep}s"


class StoreReadsCache:
    """One round of store reads at a time, reused for STORE_READS_SECONDS: however
    many scrapers call, the stores see at most one round a second. The node's
    own state (buffers, counters) is read fresh by every scrape."""

    def __init__(
        self, read: Callable[[], Awaitable[StoreView]], clock: Clock = SYSTEM_CLOCK
    ) -> None:
        self._read = read
        self._clock = clock
        self._task: asyncio.Task[StoreView] | None = None
        self._started_at = -STORE_READS_SECONDS

    async def get(self) -> StoreView:
        task = self._task
        stale = self._clock.monotonic() - self._started_at >= STORE_READS_SECONDS
        if task is None or (task.done() and stale):
            self._started_at = self._clock.monotonic()
            task = self._task = asyncio.ensure_future(self._read())
        # shield: a scraper that hangs up must not cancel the reads others wait on
        return await asyncio.shield(task)


def tag_entries(node: Node | None, view: StoreView, names: Sequence[str]) -> list[dict[str, Any]]:
    """Per tag, its /status.json entry: what the stores said and, given a node,
    what that node holds and did (``idpool pool show`` has no node)."""
    return [
        _tag(node, tag, view.rows.get(tag), view.pooled.get(tag), view.rows_read) for tag in names
    ]


def tag_state(row: TagRow | None, rows_read: bool) -> str | None:
    """enabled, disabled or removed (no row although the ledger answered); None
    when the ledger could not be read. A disabled or removed tag is an operator's
    doing, not an outage: its pool figures are left out of /metrics (no page)."""
    if row is None:
        return "removed" if rows_read else None
    return "disabled" if row.disabled else "enabled"


def assemble(
    node: Node,
    view: StoreView,
    tags: list[str] | None = None,
    clock: Clock = SYSTEM_CLOCK,
) -> Snapshot:
    """The snapshot from the node's own state now and what the stores said.
    Store health comes from the background probes, not from this call."""
    names = node.shown_tags() if tags is None else tags
    health = node.health
    stores: dict[str, dict[str, Any]] = {}
    for store in filter(None, (health.ledger_name, health.pool_name)):
        stores[store] = {"up": health.is_up(store), "error": None}
    for store, detail in view.errors.items():
        stores[store] = {"up": False, "error": detail}
    for store, (when, detail) in health.last_error.items():
        stores.setdefault(store, {"up": True, "error": None})["last_error"] = {
            "at": when,
            "detail": detail,
        }
    if health.mark_replicas is not None and health.pool_name in stores:
        online, wanted = health.mark_replicas
        stores[health.pool_name]["mark_replicas"] = {
            "wanted": wanted,
            "fewest_online": online,
            "claims_stopped": health.claims_stopped(),
        }
    if health.last_mark_refused is not None and health.pool_name in stores:
        when, detail = health.last_mark_refused
        stores[health.pool_name]["last_mark_refused"] = {"at": when, "detail": detail}
    entries = tag_entries(node, view, names)
    now = clock.now()
    return {
        "updated_at": round(now, 3),
        "cluster": cluster(view, node.node_id, clock),
        "node": {
            "addr": node.identity.get("addr"),
            "pid": os.getpid(),
            "started_at": node.stats.started_at,
            "uptime_s": round(now - node.stats.started_at, 1),
            "draining": node.draining,
            "ready": node.not_ready() is None,
            "store_errors": dict(node.stats.store_errors),
            "ledger_retries": ledger_retries(node),
            "ledger_conflict_failures": ledger_conflict_failures(node),
        },
        "stores": stores,
        "tags": entries,
    }


def ledger_retries(node: Node) -> list[dict[str, Any]]:
    """Ledger transactions run again after a conflict (a Galera certification
    failure), by operation and reason. Only the MySQL ledger has the counter."""
    counts = getattr(node.source.claims.ledger, "retries", {})
    return [{"op": op, "reason": why, "count": n} for (op, why), n in sorted(counts.items())]


def ledger_conflict_failures(node: Node) -> list[dict[str, Any]]:
    """Ledger transactions given up after conflicts in a row until the store
    timeout (a 503 or a claim not made), by operation. MySQL ledger only."""
    counts = getattr(node.source.claims.ledger, "conflict_failures", {})
    return [{"op": op, "count": n} for op, n in sorted(counts.items())]


def cluster(view: StoreView, this_node: str = "", clock: Clock = SYSTEM_CLOCK) -> dict[str, Any]:
    """Every live node and, per tag they serve, the cluster's figures from the
    ledger and the pool, each with the problems worth a colour."""
    now = clock.now()
    nodes = []
    for n in sorted(view.nodes, key=lambda n: n.get("addr", n["id"])):
        draining, ready = n.get("draining") == "1", n.get("ready") == "1"
        problems = ["draining"] * draining + ["not ready"] * (not ready and not draining)
        nodes.append(
            {
                "id": n["id"],
                "addr": n.get("addr"),
                "pid": n.get("pid"),
                "version": n.get("version"),
                "started_at": float(n.get("started_at", 0)),
                "last_seen_s": round(now - float(n.get("seen_at", now)), 1),
                "draining": draining,
                "ready": ready,
                "tags": len([t for t in n.get("tags", "").split(",") if t]),
                "this": n["id"] == this_node,
                "problems": problems,
            }
        )
    return {
        "nodes": nodes,
        "tags": [
            _cluster_tag(tag, view.rows.get(tag), view.pooled.get(tag), view.rows_read)
            for tag in view.cluster_tags
        ],
    }


def _cluster_tag(
    tag: str, row: TagRow | None, pooled: PoolSummary | None, rows_read: bool = True
) -> dict[str, Any]:
    stats = {} if pooled is None else pooled.stats
    rate = float(stats["rate"]) if "rate" in stats else None
    ids = 0 if pooled is None else pooled.ids
    depth = None if pooled is None else pooled.depth
    target = int(stats["target_depth"]) if "target_depth" in stats else None
    runway = runway_seconds(row, ids, rate)
    problems = []
    state = tag_state(row, rows_read)
    if state in QUIET_STATES:
        problems.append(str(state))
    # A disabled, removed or exhausted tag has an empty pool on purpose: no refill.
    serving = state not in QUIET_STATES and runway != 0
    if serving and depth is not None and target and depth < target / 2:
        problems.append("supply under target")
    if runway is not None and runway < RUNWAY_SHORT_S:
        problems.append("exhausted" if runway == 0 else "runway short")
    return {
        "tag": tag,
        "max_id": None if row is None else row.max_id,
        "max": None if row is None else row.max,
        "format": (tag_list_entry(row) or None) if row is not None else None,
        "disabled": None if row is None else row.disabled,
        "depth": depth,
        "target_depth": target,
        "minutes_of_supply": round(ids / rate / 60, 2) if rate else None,
        "ids_per_s": rate,
        "returned": int(stats.get("returned", 0)),
        "wasted": {k[7:]: int(v) for k, v in stats.items() if k.startswith("wasted:")},
        "runway_s": runway,
        "problems": problems,
    }


def _issued(described: Mapping[str, Any] | None) -> int:
    """IDs a kind without segment buffers handed out here: the ``issued`` of its
    ``holding`` (``Held``, kinds/interface.py), 0 where it counts none."""
    return 0 if described is None else int(described.get("issued", 0))


def _tag(
    node: Node | None,
    tag: str,
    row: TagRow | None,
    pooled: PoolSummary | None,
    rows_read: bool = True,
) -> dict[str, Any]:
    counters = None if node is None else node.stats.tags.get(tag)
    buf = None if node is None else node.buffers.get(tag)
    history = () if counters is None else counters.history
    points = [{"t": round(t, 1), "ids_per_s": round(r, 2)} for t, r in rates(history)]
    wasted = Counter[str]() if node is None else node.waste.of(tag)  # and its preloader's
    described = None if node is None else node.holding(tag)
    entry: dict[str, Any] = {
        "tag": tag,
        "kind": None if row is None else row.kind,
        # how its IDs are rendered (never the obfuscation key); None for a plain tag
        "format": (tag_list_entry(row) or None) if row is not None else None,
        "step": None if row is None else row.step,
        "max_id": None if row is None else row.max_id,
        "start_id": None if row is None else row.start_id,
        "max": None if row is None else row.max,
        "disabled": None if row is None else row.disabled,
        "state": tag_state(row, rows_read),
        "runway_s": None,
        "buffer": described,
        "pool": None,
        "rate": {"node_ids_per_s": points[-1]["ids_per_s"] if points else 0.0},
        "history": points,
        "counters": {
            "ids_issued": buf.issued if buf is not None else _issued(described),
            "ranges_from_pool": 0 if counters is None else counters.ranges_from_pool,
            "ranges_from_ledger": 0 if counters is None else counters.ranges_from_ledger,
            "ids_returned": 0 if counters is None else counters.ids_returned,
            "ids_wasted": dict(wasted),
        },
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
        entry["runway_s"] = runway_seconds(row, pooled.ids, cluster_rate)
    return entry
