"""What a node counts, kept as plain numbers so counting costs almost nothing on
the request path; `service/metrics.py` turns them into Prometheus series. A
request's ``route`` label comes from the route table (``routes.label_of``)."""

from __future__ import annotations

import bisect
from collections import Counter, defaultdict, deque
from collections.abc import Iterable
from dataclasses import dataclass, field

from idpool.pool.clock import SYSTEM_CLOCK, Clock

# Upper bounds, in seconds, of the request latency buckets.
LATENCY_BUCKETS = (
    0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5,
)  # fmt: skip
HISTORY_SECONDS = 600  # consumption history kept for the status page
SAMPLE_EVERY = 10.0


class LatencyHistogram:
    """Bucket counts for one route. prometheus-client's Histogram.observe takes
    ~0.85 us (a lock and a loop); this takes ~0.15 us on the hot path, and
    prometheus-client still writes the exposition (see metrics.py)."""

    __slots__ = ("counts", "total")

    def __init__(self) -> None:
        self.counts = [0] * (len(LATENCY_BUCKETS) + 1)  # last bucket: +Inf; sum = count
        self.total = 0.0

    def observe(self, seconds: float) -> None:
        self.counts[bisect.bisect_left(LATENCY_BUCKETS, seconds)] += 1
        self.total += seconds


@dataclass
class TagCounters:
    ranges_from_pool: int = 0
    ranges_from_ledger: int = 0
    ids_returned: int = 0
    # (unix time, IDs issued so far) every SAMPLE_EVERY seconds, for the rate chart
    history: deque[tuple[float, int]] = field(
        default_factory=lambda: deque(maxlen=int(HISTORY_SECONDS / SAMPLE_EVERY) + 1)
    )


class NodeStats:
    def __init__(self, clock: Clock = SYSTEM_CLOCK) -> None:
        self.tags: defaultdict[str, TagCounters] = defaultdict(TagCounters)
        self.store_errors: Counter[str] = Counter()
        self.latency: defaultdict[str, LatencyHistogram] = defaultdict(LatencyHistogram)
        # (route, HTTP status) -> requests answered; a plain dict increment on the fast path
        self.requests: Counter[tuple[str, int]] = Counter()
        # (route, error code) -> error answers, e.g. ("id", "tag_exhausted")
        self.errors: Counter[tuple[str, str]] = Counter()
        self.started_at = clock.now()  # the runtime's clock (pool/clock.py)


def rates(history: Iterable[tuple[float, int]]) -> list[tuple[float, float]]:
    """(unix time, IDs/s over the interval ending then) between consecutive samples."""
    points = list(history)
    return [
        (t1, (n1 - n0) / (t1 - t0))
        for (t0, n0), (t1, n1) in zip(points, points[1:], strict=False)
        if t1 > t0
    ]
