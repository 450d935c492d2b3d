"""How big a range is and how many to keep ready: the dynamic step and the
time-sized pool depth. Pure functions and a rate meter; the clock is passed in.
"""

from __future__ import annotations

import math
from collections import deque

MIN_SPAN = 5.0  # seconds: the shortest history a rate is read from


class RateMeter:
    """IDs per second from samples of a growing counter, over a sliding window."""

    def __init__(self, window: float) -> None:
        self.window = window
        self._samples: deque[tuple[float, int]] = deque()

    def add(self, now: float, total: int) -> float:
        """Record ``total`` at ``now``; return the rate over the window (0 until known)."""
        if self._samples and total < self._samples[-1][1]:
            self._samples.clear()  # the counter restarted (Redis lost it): start over
        self._samples.append((now, total))
        # Keep one sample at or before the window's start, so the window is full.
        while len(self._samples) > 2 and self._samples[1][0] <= now - self.window:
            self._samples.popleft()
        return self.rate()

    def rate(self) -> float:
        """IDs/s over the window, also while the samples span less than a window.

        The counter moves a whole range at a time, so two samples a few ms apart
        around one range taken would read as a burst of millions of IDs/s and
        size the pool for it; the count is spread over at least MIN_SPAN seconds
        (or the window, if shorter). Spreading it over the whole window instead
        left the pool sized far too small for the first minute after a start,
        when an outage could empty it (ops/faults mysql-down).
        """
        if len(self._samples) < 2:
            return 0.0
        (t0, n0), (t1, n1) = self._samples[0], self._samples[-1]
        return (n1 - n0) / max(t1 - t0, min(self.window, MIN_SPAN))

    @property
    def ready(self) -> bool:
        """Two samples at least: a rate can be read (a new meter has none yet)."""
        return len(self._samples) >= 2

    def history(self) -> list[tuple[float, int]]:
        return list(self._samples)


def next_step(step: int, lifetime_ids: int, lifetime_s: float, target_s: float) -> int:
    """Leaf's rule, on what one node saw: double the step when a full range would
    last less than the target, halve it when it would last over twice the target.

    A node reports how long it took to serve ``lifetime_ids`` IDs; at that pace a
    range of ``step`` IDs lasts ``lifetime_s * step / lifetime_ids`` seconds.
    Bounds (the tag's min_step and max_step) are applied by the ledger.
    """
    if lifetime_ids <= 0 or target_s <= 0:
        return step
    lasts = lifetime_s * step / lifetime_ids
    if lasts < target_s:
        return step * 2
    if lasts > 2 * target_s:
        return max(1, step // 2)
    return step


def target_depth(rate: float, step: int, seconds: float, least: int, most: int) -> int:
    """Ranges needed to cover ``seconds`` of consumption at ``rate`` IDs/s."""
    wanted = math.ceil(rate * seconds / step) if step > 0 else 0
    return max(least, min(most, wanted))
