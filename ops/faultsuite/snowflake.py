"""Snowflake scenarios of the fault suite: what replaces the range accounting.

A snowflake tag claims no ranges, so there is nothing to account for but the
IDs themselves: every ID handed out must be new (no duplicate), and time
ordered at the scale of a second: an ID received more than a second (plus the
slowest request) after another was received is larger.
"""

from __future__ import annotations

import bisect
import threading
import time
from collections import Counter

from .accounting import Accounting, read_run
from .cluster import Run

# Lease settings of the snowflake scenarios: short, so a quarantine after a Redis
# restart (one lease) fits the short form's recovery time.
SNOWFLAKE_ENV = (
    ("IDPOOL_WORKER_LEASE_SECONDS", "3"),
    ("IDPOOL_WORKER_MARGIN_SECONDS", "1"),
)


class SnowflakeIds:
    """Every ID received, with when (wall clock): the IdBitmap of snowflake tags."""

    def __init__(self) -> None:
        self.seen: set[int] = set()
        self.received: list[tuple[float, int, int]] = []  # (time, lowest, highest) per batch
        self.count = 0
        self.duplicates = 0
        self.duplicate_examples: list[int] = []
        self._lock = threading.Lock()

    def add(self, ids: list[int]) -> None:
        now = time.time()
        with self._lock:
            for i in ids:
                if i in self.seen:
                    self.duplicates += 1
                    if len(self.duplicate_examples) < 20:
                        self.duplicate_examples.append(i)
                else:
                    self.seen.add(i)
            self.count += len(ids)
            self.received.append((now, min(ids), max(ids)))

    def order_violations(self, slack: float) -> tuple[int, list[str]]:
        """IDs received more than ``1 + slack`` seconds after another that are not
        larger than it (``slack``: the slowest request, so the later one was
        asked for at least a second after the earlier one was answered)."""
        batches = sorted(self.received)
        times = [t for t, _, _ in batches]
        top, highest = [], 0
        for _, _, hi in batches:
            highest = max(highest, hi)
            top.append(highest)
        bad, examples = 0, list[str]()
        for t, lo, _ in batches:
            before = bisect.bisect_left(times, t - 1.0 - slack)
            if before and top[before - 1] >= lo:
                bad += 1
                if len(examples) < 5:
                    examples.append(
                        f"{lo} at {t:.3f} <= {top[before - 1]} before {t - 1 - slack:.3f}"
                    )
        return bad, examples


def account_snowflake(ids: SnowflakeIds, runs: list[Run], tag: str) -> Accounting:
    events: Counter[str] = Counter()
    for run in runs:
        events.update(read_run(run, tag).lines)
    return Accounting(
        start_id=0,
        max_id=0,
        issued=ids.count,
        duplicates=ids.duplicates,
        duplicate_examples=ids.duplicate_examples,
        in_pool=0,
        pool_clean=True,
        pool_overlaps_issued=0,
        beyond_ledger=0,
        wasted={},
        unattributed=[],
        log_events=events,
    )
