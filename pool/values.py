"""The values both ledgers (MySQL, SQLite) and both pools (Redis, SQLite) hand
out, so each twin imports them from here rather than from the other: a tag's
row, a pop's or a push's result, a list's summary, a claim's cut. The rules a
name and a new row obey are in ``pool/tag_rules.py``.
"""

from __future__ import annotations

import json
import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any, NamedTuple

from .errors import TagDisabled, TagExhausted
from .kind_rules import DEFAULT_KIND
from .ranges import MAX_ID, IdRange, TaggedRange

DEFAULT_MAX_STEP = 1_000_000
MAX_POP_RANGES = 10_000  # ranges one pop may take, whatever count a batch asks for


def step_bounds(step: int, min_step: int | None, max_step: int | None) -> tuple[int, int]:
    """A new tag's dynamic-step bounds: ``[step, max(step, DEFAULT_MAX_STEP)]`` unless given."""
    lo = step if min_step is None else min_step
    hi = max(step, DEFAULT_MAX_STEP) if max_step is None else max_step
    return lo, hi


def check_bound(start: int, end_id: int) -> None:
    """A tag's bound must leave it at least its first ID."""
    if not start < end_id <= MAX_ID:
        raise ValueError(f"max must be from start ({start}) to {MAX_ID - 1}")


@dataclass(frozen=True)
class TagRow:
    tag: str
    max_id: int
    step: int
    start_id: int
    description: str
    updated_at: datetime
    min_step: int
    max_step: int
    end_id: int = MAX_ID  # first ID never handed out; MAX_ID: no bound but 64 bits
    disabled: bool = False
    kind: str = DEFAULT_KIND  # how its IDs are made (service/kinds/)
    layout: str = ""  # a snowflake tag's layout (pool/snowflake.py, Layout.to_text)
    # JSON of how its numbers are rendered (a format, a reset, obfuscation; "" for
    # none): read by idpool_client/formats.py through service/formats.py
    options: str = ""
    # the obfuscation key (hex), made at creation; never in a repr, a log or a page
    secret: str = field(default="", repr=False)

    @classmethod
    def from_columns(cls, values: Sequence[Any], updated_at: datetime) -> TagRow:
        """A row as both ledgers select it: tag, max_id, step, start_id, description,
        (updated_at, converted by the caller), min_step, max_step, end_id, disabled,
        kind, layout, options, secret."""
        tag, max_id, step, start_id, description = values[:5]
        min_step, max_step, end, off, kind, layout, options, secret = values[6:14]
        return cls(
            tag, max_id, step, start_id, description, updated_at, min_step, max_step,
            read_end(end), bool(off), kind, layout, options, secret,
        )  # fmt: skip

    @property
    def max(self) -> int | None:
        """The highest ID the tag may hand out (``--max``), or None when unbounded."""
        return None if self.end_id >= MAX_ID else self.end_id - 1

    @property
    def by_period(self) -> bool:
        """True for a tag with a reset (ID formats): its numbers come from a row per
        period (``TAG@KEY``), never from its own row, whose list stays empty."""
        if not self.options:
            return False
        try:
            return bool(json.loads(self.options).get("reset"))  # service/formats.py wrote it
        except (ValueError, AttributeError):
            return False

    @property
    def left(self) -> int:
        """IDs not yet claimed below the bound."""
        return max(0, self.end_id - self.max_id)


def read_end(stored: int) -> int:
    """A row's bound from its ``end_id`` column (``tag_rules.stored_end``)."""
    return -stored if stored < 0 else stored


def period_rows_between(tag: str) -> tuple[str, str]:
    """Bounds (inclusive) of the names of a tag's period rows, ``TAG@`` and digits
    (formats with a reset: ``idpool_client/formats.py``); no other row is between."""
    return f"{tag}@0", f"{tag}@:"  # ":" sorts right after "9"


def period_over(name: str, now: float) -> bool:
    """True for a period row (``TAG@YYYYMMDD``, ``@YYYYMM``, ``@YYYY``) whose UTC
    period ended before ``now``: nothing will ask for its numbers again."""
    _, mark, key = name.rpartition("@")
    if not mark or not key.isdigit() or len(key) not in _PERIOD_KEYS:
        return False
    # The whole second (fromtimestamp rounds to the microsecond: the last float
    # before a midnight would read as the next day), as the formats choose periods.
    return key < datetime.fromtimestamp(math.floor(now), UTC).strftime(_PERIOD_KEYS[len(key)])


_PERIOD_KEYS = {8: "%Y%m%d", 6: "%Y%m", 4: "%Y"}
_PERIOD_NAMES = {8: "today's", 6: "this month's", 4: "this year's"}


def row_named(name: str) -> str:
    """A ledger row as a message names it: a period row (``TAG@KEY``, formats with a
    reset) as its tag's period, which is what a user knows, rather than the row."""
    tag, mark, key = name.rpartition("@")
    if not mark or not key.isdigit() or len(key) not in _PERIOD_NAMES:
        return f"tag {name!r}"
    return f"tag {tag!r}, in {_PERIOD_NAMES[len(key)]} period {key} (ledger row {name!r}),"


def next_range(tag: str, start: int, ids: int, end_id: int, disabled: bool) -> IdRange:
    """The range a claim of ``ids`` IDs from ``start`` gets: cut short at the
    tag's bound, never past it. Shared by both ledgers so they agree."""
    if disabled:
        raise TagDisabled(f"tag {tag!r} is disabled; enable it with `idpool tag enable {tag}`")
    if start >= end_id:
        bound = "64-bit IDs" if end_id >= MAX_ID else f"IDs up to its max {end_id - 1}"
        raise TagExhausted(f"{row_named(tag)} has run out of {bound}")
    # Written as start < end_id - ids so the sum cannot leave 64 bits.
    return IdRange(start, start + ids if start < end_id - ids else end_id)


class PopResult(NamedTuple):
    ranges: list[IdRange]  # taken from the head, in serving order (empty: none left)
    dropped: list[TaggedRange]  # abandoned because Redis is a new incarnation
    depth: int = 0  # ranges left in the list after the pop
    target_depth: int = 0  # what the preloader fills the list to (0: not known yet)

    @property
    def range(self) -> IdRange | None:
        """The first range taken, or None when the list was empty."""
        return self.ranges[0] if self.ranges else None


class Moved(NamedTuple):
    tags: list[str]  # tags that moved since the last read
    dropped: list[TaggedRange]  # abandoned because Redis is a new incarnation


class PoolSummary(NamedTuple):
    """A list's state from O(1) reads: what /status and /metrics show per tag."""

    depth: int
    head: IdRange | None
    ids: int  # the head range's IDs plus (depth - 1) full ranges of the published step
    stats: dict[str, str]


class PushResult(NamedTuple):
    depth: int
    dropped: list[TaggedRange]  # abandoned because Redis is a new incarnation
    lease_lost: bool = False  # a preloader's push refused: another preloader leads


def summary(depth: int, head_text: str | None, stats: dict[str, str]) -> PoolSummary:
    head = None if head_text is None else IdRange.from_text(head_text)
    step = int(stats.get("step", 0))
    ids = 0 if head is None else len(head) + max(0, depth - 1) * (step or len(head))
    return PoolSummary(depth, head, ids, stats)
