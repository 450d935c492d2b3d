"""Prometheus exposition of a status snapshot and the node's counters, written
by prometheus-client's own families and text encoder."""

from __future__ import annotations

from collections.abc import Iterator

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
    Metric,
)

from .stats import LATENCY_BUCKETS, NodeStats
from .status import Snapshot

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"


class _SnapshotCollector:
    def __init__(self, snap: Snapshot, stats: NodeStats) -> None:
        self.snap = snap
        self.stats = stats

    def collect(self) -> Iterator[Metric]:
        issued = CounterMetricFamily(
            "idpool_ids_issued", "IDs handed out by this node", labels=["tag"]
        )
        taken = CounterMetricFamily(
            "idpool_ranges_taken", "Ranges this node took, by source", labels=["tag", "source"]
        )
        returned = CounterMetricFamily(
            "idpool_remainder_ids_returned", "IDs returned to the pool at shutdown", labels=["tag"]
        )
        wasted = CounterMetricFamily(
            "idpool_ids_wasted",
            "IDs given up, never handed out, by reason",
            labels=["tag", "reason"],
        )
        depth = GaugeMetricFamily("idpool_pool_depth", "Ranges ready in the pool", labels=["tag"])
        pool_ids = GaugeMetricFamily("idpool_pool_ids", "IDs ready in the pool", labels=["tag"])
        target = GaugeMetricFamily(
            "idpool_pool_target_depth", "Ranges the preloader fills the pool to", labels=["tag"]
        )
        supply = GaugeMetricFamily(
            "idpool_pool_supply_seconds", "Pool supply at the cluster's recent rate", labels=["tag"]
        )
        step = GaugeMetricFamily("idpool_step", "Current range size", labels=["tag"])
        runway = GaugeMetricFamily(
            "idpool_tag_runway_seconds",
            "Time until a bounded tag reaches its max at the cluster's rate",
            labels=["tag"],
        )
        rate = GaugeMetricFamily(
            "idpool_consumption_ids_per_second", "Recent IDs/s", labels=["tag", "scope"]
        )
        for t in self.snap["tags"]:
            tag, c = t["tag"], t["counters"]
            issued.add_metric([tag], c["ids_issued"])
            taken.add_metric([tag, "pool"], c["ranges_from_pool"])
            taken.add_metric([tag, "ledger"], c["ranges_from_ledger"])
            returned.add_metric([tag], c["ids_returned"])
            for reason, ids in c["ids_wasted"].items():
                wasted.add_metric([tag, reason], ids)
            if t["step"] is not None:
                step.add_metric([tag], t["step"])
            if t.get("runway_s") is not None:
                runway.add_metric([tag], t["runway_s"])
            rate.add_metric([tag, "node"], t["rate"]["node_ids_per_s"])
            pool = t["pool"]
            if pool is not None:
                depth.add_metric([tag], pool["depth"])
                pool_ids.add_metric([tag], pool["ids"])
                if pool["target_depth"] is not None:
                    target.add_metric([tag], pool["target_depth"])
                if pool["minutes_of_supply"] is not None:
                    supply.add_metric([tag], pool["minutes_of_supply"] * 60)
                if t["rate"].get("cluster_ids_per_s") is not None:
                    rate.add_metric([tag, "cluster"], t["rate"]["cluster_ids_per_s"])
        yield from (issued, taken, returned, wasted, depth, pool_ids, target, supply, step, rate)
        yield runway

        up = GaugeMetricFamily("idpool_store_up", "1 when the store answered", labels=["store"])
        for store, health in self.snap["stores"].items():
            up.add_metric([store], 1 if health["up"] else 0)
        errors = CounterMetricFamily(
            "idpool_store_errors", "Failed calls to a store", labels=["store"]
        )
        for store, n in self.stats.store_errors.items():
            errors.add_metric([store], n)
        latency = HistogramMetricFamily(
            "idpool_request_seconds",
            "Time to answer an ID request, from handler start",
            labels=["route"],
        )
        for route, hist in self.stats.latency.items():
            cumulative, buckets = 0, []
            for bound, n in zip((*LATENCY_BUCKETS, float("inf")), hist.counts, strict=True):
                cumulative += n
                buckets.append((_bound(bound), cumulative))
            latency.add_metric([route], buckets, sum_value=hist.total)
        yield from (up, errors, latency)


def _bound(value: float) -> str:
    return "+Inf" if value == float("inf") else repr(value)


def render(snap: Snapshot, stats: NodeStats) -> bytes:
    registry = CollectorRegistry(auto_describe=False)
    registry.register(_SnapshotCollector(snap, stats))
    return generate_latest(registry)
