"""Real-time order of the IDs answered: the check of a strict tag's guarantee.

Each request is recorded with when it was sent and when its answer arrived
(``time.monotonic()`` of the one recording process, so every client thread
reads the same clock), and the lowest and highest ID it got. The guarantee is:
for any two requests A and B, if A's answer arrived before B was sent, every
ID of B is above every ID of A. Checking all pairs is quadratic; instead the
requests are sorted by send time and swept with the highest ID of every
request answered before that moment (a second list, sorted by answer time, is
consumed as the sweep goes): a request whose lowest ID is not above that
maximum is a violation. O(n log n), a few seconds for millions of requests.

Duplicates are found the same way: every request's IDs as runs of consecutive
IDs, sorted by their first ID; a run that starts at or below the end of the
runs before it repeats an ID.

Send and answer times are taken just before the request is written and just
after the answer is read, so the interval recorded contains the real one: the
check can miss a violation that happened within that slack, never report one
that did not happen.
"""

from __future__ import annotations

import threading
from array import array
from dataclasses import dataclass, field

EXAMPLES = 10


@dataclass
class Violation:
    """B was sent after A's answer arrived, yet B's lowest ID is not above A's highest."""

    earlier_sent: float
    earlier_answered: float
    earlier_ids: tuple[int, int]  # (lowest, highest)
    later_sent: float
    later_answered: float
    later_ids: tuple[int, int]

    def __str__(self) -> str:
        return (
            f"IDs {self.earlier_ids[0]}..{self.earlier_ids[1]} answered at "
            f"{self.earlier_answered:.6f} s, then a request sent at {self.later_sent:.6f} s "
            f"got {self.later_ids[0]}..{self.later_ids[1]}"
        )


@dataclass
class OrderReport:
    requests: int
    violations: int  # requests whose IDs are not above one answered before they were sent
    unordered_batches: int  # batches whose IDs do not increase within the answer
    duplicates: int  # runs of IDs that repeat an ID of another run
    examples: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not (self.violations or self.unordered_batches or self.duplicates)

    def summary(self) -> str:
        return (
            f"{self.requests:,} requests checked for real-time order: "
            f"{self.violations} out of order, {self.unordered_batches} batches not increasing, "
            f"{self.duplicates} repeating an ID"
        )


class OrderLog:
    """What the order check needs of every answered request; thread-safe, compact
    (four numbers a request, in arrays)."""

    def __init__(self) -> None:
        self.sent = array("d")
        self.answered = array("d")
        self.low = array("q")
        self.high = array("q")
        self.run_low = array("q")  # runs of consecutive IDs, for the duplicate check
        self.run_high = array("q")
        self.unordered_batches = 0
        self.examples: list[str] = []
        self._lock = threading.Lock()

    def __len__(self) -> int:
        return len(self.sent)

    def add(self, sent: float, answered: float, ids: list[int]) -> None:
        if not ids:
            return
        runs: list[tuple[int, int]] = []
        start = prev = ids[0]
        unordered = False
        for i in ids[1:]:
            if i <= prev:
                unordered = True
            if i != prev + 1:
                runs.append((start, prev))
                start = i
            prev = i
        runs.append((start, prev))
        with self._lock:
            self.sent.append(sent)
            self.answered.append(answered)
            self.low.append(min(ids))
            self.high.append(max(ids))
            for a, b in runs:
                self.run_low.append(min(a, b))
                self.run_high.append(max(a, b))
            if unordered:
                self.unordered_batches += 1
                if len(self.examples) < EXAMPLES:
                    self.examples.append(f"batch not increasing: {ids[:10]}")

    def check(self) -> OrderReport:
        with self._lock:
            violations, found = _order_violations(self.sent, self.answered, self.low, self.high)
            duplicates, repeated = _repeats(self.run_low, self.run_high)
            examples = [*self.examples, *map(str, found), *repeated][: EXAMPLES * 2]
            return OrderReport(
                len(self.sent), violations, self.unordered_batches, duplicates, examples
            )


def _order_violations(
    sent: array[float], answered: array[float], low: array[int], high: array[int]
) -> tuple[int, list[Violation]]:
    n = len(sent)
    by_sent = sorted(range(n), key=sent.__getitem__)
    by_answer = sorted(range(n), key=answered.__getitem__)
    count, examples = 0, list[Violation]()
    j, top, top_at = 0, -1, -1  # highest ID answered so far, and by which request
    for b in by_sent:
        moment = sent[b]
        while j < n and answered[by_answer[j]] < moment:
            a = by_answer[j]
            if high[a] > top:
                top, top_at = high[a], a
            j += 1
        if top_at >= 0 and low[b] <= top:
            count += 1
            if len(examples) < EXAMPLES:
                a = top_at
                examples.append(
                    Violation(
                        sent[a], answered[a], (low[a], high[a]),
                        sent[b], answered[b], (low[b], high[b]),
                    )  # fmt: skip
                )
    return count, examples


def _repeats(run_low: array[int], run_high: array[int]) -> tuple[int, list[str]]:
    order = sorted(range(len(run_low)), key=run_low.__getitem__)
    count, examples = 0, list[str]()
    reach: int | None = None
    for r in order:
        if reach is not None and run_low[r] <= reach:
            count += 1
            if len(examples) < EXAMPLES:
                examples.append(f"IDs {run_low[r]}..{min(run_high[r], reach)} handed out twice")
        reach = run_high[r] if reach is None else max(reach, run_high[r])
    return count, examples
