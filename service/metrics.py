"""Prometheus exposition of a status snapshot and the node's counters, written
by prometheus-client's own families and text encoder."""

from __future__ import annotations

import platform
from collections.abc import Iterator
from importlib.metadata import PackageNotFoundError, version

from prometheus_client import CollectorRegistry, ProcessCollector, generate_latest
from prometheus_client.core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
    Metric,
)

from .kinds import SPECS
from .stats import LATENCY_BUCKETS, NodeStats
from .status import Snapshot

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"


def _version() -> str:
    try:
        return version("idpool")
    except PackageNotFoundError:  # run from a checkout that was never installed
        return "unknown"


VERSION = _version()
# process_cpu_seconds_total, process_resident_memory_bytes, process_open_fds, ...
# read from /proc at each scrape; registered in no global registry.
_PROCESS = ProcessCollector(registry=None)


class _SnapshotCollector:
    def __init__(self, snap: Snapshot, stats: NodeStats) -> None:
        self.snap = snap
        self.stats = stats

    def collect(self) -> Iterator[Metric]:
        yield from self._tag_metrics()
        yield from self._node_metrics()

    def _tag_metrics(self) -> Iterator[Metric]:
        """Per tag, from the snapshot."""
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
        disabled = GaugeMetricFamily(
            "idpool_tag_disabled",
            "1 while an operator has the tag disabled (its pool is empty on purpose), else 0",
            labels=["tag"],
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
            state = t.get("state")
            if state in ("enabled", "disabled"):
                disabled.add_metric([tag], 1 if state == "disabled" else 0)
            pool = t["pool"]
            # A disabled or removed tag's pool is empty on purpose: no supply series
            # (they read 0 and paged as IdpoolPoolRunningDry).
            if pool is not None and state not in ("disabled", "removed"):
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
        yield disabled
        yield from self._kind_metrics()

    def _kind_metrics(self) -> Iterator[Metric]:
        """Each kind's own families (service/kinds: KindSpec.metrics), in the registry's
        order, from what this node holds of its tags."""
        for name, spec in SPECS.items():
            held = [
                (t["tag"], t["buffer"])
                for t in self.snap["tags"]
                if t["buffer"] and t["buffer"].get("kind") == name
            ]
            yield from spec.metrics(held)

    def _node_metrics(self) -> Iterator[Metric]:
        """The node's stores, errors, latencies, requests and version."""
        up = GaugeMetricFamily("idpool_store_up", "1 when the store answered", labels=["store"])
        short = GaugeMetricFamily(
            "idpool_mark_replicas_short",
            "1 while a Redis primary has fewer replicas online than IDPOOL_REDIS_MARK_REPLICAS "
            "wants: no high-water raise can count, so no claim is made",
        )
        for store, health in self.snap["stores"].items():
            up.add_metric([store], 1 if health["up"] else 0)
            replicas = health.get("mark_replicas")
            if replicas is not None:
                short.add_metric([], 1 if replicas["claims_stopped"] else 0)
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
        requests = CounterMetricFamily(
            "idpool_http_requests",
            "HTTP requests answered by this node, by route and status code",
            labels=["route", "code"],
        )
        for (route, code), n in sorted(self.stats.requests.items()):
            requests.add_metric([route, str(code)], n)
        answered_errors = CounterMetricFamily(
            "idpool_http_errors",
            "Error answers of this node, by route and error code (the body's `error`)",
            labels=["route", "error"],
        )
        for (route, error_code), n in sorted(self.stats.errors.items()):
            answered_errors.add_metric([route, error_code], n)
        retries = CounterMetricFamily(
            "idpool_ledger_retries",
            "Ledger transactions run again after the server rolled them back on a conflict "
            "(Galera certification failure): not applied, so safe to repeat",
            labels=["op", "reason"],
        )
        for retry in self.snap["node"].get("ledger_retries", ()):
            retries.add_metric([retry["op"], retry["reason"]], retry["count"])
        gave_up = CounterMetricFamily(
            "idpool_ledger_conflict_failures",
            "Ledger transactions given up after conflicts in a row (Galera certification "
            "failures) until the store timeout: nothing applied, the request got a 503",
            labels=["op"],
        )
        for failed in self.snap["node"].get("ledger_conflict_failures", ()):
            gave_up.add_metric([failed["op"]], failed["count"])
        build = GaugeMetricFamily(
            "idpool_build_info", "Always 1: the running version", labels=["version", "python"]
        )
        build.add_metric([VERSION, platform.python_version()], 1)
        # short: a sample only with IDPOOL_REDIS_MARK_REPLICAS set (the family always)
        yield from (up, short, errors, retries, gave_up, latency, requests, answered_errors, build)


def _bound(value: float) -> str:
    return "+Inf" if value == float("inf") else repr(value)


def render(snap: Snapshot, stats: NodeStats) -> bytes:
    registry = CollectorRegistry(auto_describe=False)
    registry.register(_SnapshotCollector(snap, stats))
    registry.register(_PROCESS)
    return generate_latest(registry)
