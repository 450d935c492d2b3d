"""Where every ID of a scenario's tag went.

Every ID in ``[start_id, max_id)`` was claimed from the ledger once. After the
graceful stop it must be exactly one of: handed out (the clients' bitmap), ready
in the Redis list, or wasted. Waste is charged, in this order, to what the
processes' logs say about it:

1. ``event=range_abandoned ... reason=R`` (a new Redis incarnation dropped the
   list; a push whose outcome was unknown; no pool at shutdown);
2. ``event=stale_ledger``: a range MySQL handed out below the high-water mark;
3. ranges a node run that was killed with ``kill -9`` had taken (its buffers);
4. ranges a killed run's preloader had claimed but not pushed;
5. ranges a node run that stopped gracefully had taken, whose IDs no client
   received: a ``/ids`` batch that ran dry part-way and failed loses the IDs it
   had taken (safe: waste, never reuse), as does a response the client never read;
6. ranges pushed to Redis (by a preloader, or returned by a stopping node) that
   vanished from Redis: the restarted server came back with older data, or a pop
   whose answer was lost took them;
7. ranges a strict tag's refill put in its state, whose IDs no client
   received (a take whose answer was lost, a state a new Redis incarnation
   replaced);
8. the rest: not attributed (e.g. a ledger claim whose answer was lost).
"""

from __future__ import annotations

import re
from collections import Counter
from dataclasses import dataclass, field

from .cluster import Run
from .recorder import IdBitmap

Interval = tuple[int, int]  # [start, end)

_RANGE = r"(?P<ranges>\d+-\d+(?:,\d+-\d+)*)"
_LINE = re.compile(r"event=(?P<event>\w+) tag=(?P<tag>\S+) range=" + _RANGE + r"(?P<rest>.*)")
_REASON = re.compile(r"reason=(\w+)")


@dataclass
class RunLog:
    """The ranges one process run logged, by what happened to them."""

    taken: list[Interval] = field(default_factory=list)
    claimed: list[Interval] = field(default_factory=list)
    pushed: list[Interval] = field(default_factory=list)
    returned: list[Interval] = field(default_factory=list)
    abandoned: dict[str, list[Interval]] = field(default_factory=dict)
    stale: list[Interval] = field(default_factory=list)
    refilled: list[Interval] = field(default_factory=list)  # strict tags' refill claims
    lines: Counter[str] = field(default_factory=Counter)  # event -> count


def parse_ranges(text: str) -> list[Interval]:
    out = []
    for part in text.split(","):
        first, last = part.split("-")
        out.append((int(first), int(last) + 1))
    return out


def read_run(run: Run, tag: str) -> RunLog:
    log = RunLog()
    text = run.log.read_text(errors="replace")
    log.lines.update(re.findall(r"event=(\w+)", text))
    for line in text.splitlines():
        m = _LINE.search(line)
        if m is None or m.group("tag") != tag:
            continue
        ranges = parse_ranges(m.group("ranges"))
        event = m.group("event")
        if event == "range_taken":
            log.taken += ranges
        elif event == "range_claimed":
            log.claimed += ranges
        elif event == "ranges_pushed":
            log.pushed += ranges
        elif event == "range_returned":
            log.returned += ranges
        elif event == "range_abandoned":
            reason = _REASON.search(m.group("rest"))
            log.abandoned.setdefault(reason.group(1) if reason else "?", []).extend(ranges)
        elif event == "stale_ledger":
            log.stale += ranges
        elif event == "strict_refilled":
            log.refilled += ranges
    return log


def normalize(intervals: list[Interval]) -> list[Interval]:
    out: list[Interval] = []
    for a, b in sorted(intervals):
        if out and a <= out[-1][1]:
            out[-1] = (out[-1][0], max(out[-1][1], b))
        else:
            out.append((a, b))
    return out


def split(left: list[Interval], cover: list[Interval]) -> tuple[list[Interval], list[Interval]]:
    """(parts of ``left`` inside ``cover``, parts outside); both normalized."""
    cover = normalize(cover)
    inside: list[Interval] = []
    outside: list[Interval] = []
    j = 0
    for a, b in normalize(left):
        pos = a
        while j < len(cover) and cover[j][1] <= pos:
            j += 1
        k = j
        while pos < b:
            if k >= len(cover) or cover[k][0] >= b:
                outside.append((pos, b))
                break
            c, d = cover[k]
            if c > pos:
                outside.append((pos, c))
                pos = c
            end = min(b, d)
            inside.append((pos, end))
            pos = end
            k += 1
    return inside, outside


def size(intervals: list[Interval]) -> int:
    return sum(b - a for a, b in intervals)


@dataclass
class Accounting:
    start_id: int
    max_id: int
    issued: int
    duplicates: int
    duplicate_examples: list[int]
    in_pool: int
    pool_clean: bool
    pool_overlaps_issued: int  # IDs both handed out and still in the list: duplicates to come
    beyond_ledger: int  # IDs handed out at or above max_id: never claimed
    wasted: dict[str, int]  # reason -> IDs
    unattributed: list[Interval]
    log_events: Counter[str]

    @property
    def claimed(self) -> int:
        return self.max_id - self.start_id

    @property
    def total_duplicates(self) -> int:
        return self.duplicates + self.pool_overlaps_issued


def account(
    bitmap: IdBitmap,
    start_id: int,
    max_id: int,
    pool: list[Interval],
    pool_clean: bool,
    runs: list[Run],
    tag: str,
) -> Accounting:
    logs = [(run, read_run(run, tag)) for run in runs]
    events: Counter[str] = Counter()
    for _, log in logs:
        events.update(log.lines)

    left = bitmap.unset_runs(start_id, max_id)
    overlap = sum(bitmap.count_set(a, b) for a, b in pool)
    wasted: dict[str, int] = {}

    def charge(reason: str, cover: list[Interval]) -> None:
        nonlocal left
        inside, left = split(left, cover)
        if inside:
            wasted[reason] = wasted.get(reason, 0) + size(inside)

    if pool_clean:
        inside, left = split(left, pool)
        in_pool = size(inside)
    else:
        in_pool = 0
        charge("in the list of a Redis incarnation not yet cleaned (dropped on next use)", pool)
    reasons = sorted({r for _, log in logs for r in log.abandoned})
    for reason in reasons:
        charge(
            f"abandoned, reason={reason}",
            [i for _, log in logs for i in log.abandoned.get(reason, [])],
        )
    charge(
        "stale_ledger: refused range below the high-water mark",
        [i for _, g in logs for i in g.stale],
    )
    charge(
        "held by a node run killed with -9 (its buffers)",
        [i for run, g in logs if run.killed for i in g.taken],
    )
    pushed_anywhere = [i for _, g in logs for i in g.pushed]
    charge(
        "claimed by a killed run's preloader, never pushed",
        [i for run, g in logs if run.killed for i in split(g.claimed, pushed_anywhere)[1]],
    )
    charge(
        "taken by a node that stopped gracefully, not received by any client "
        "(a batch that failed part-way, a response lost)",
        [i for run, g in logs if not run.killed for i in g.taken],
    )
    charge(
        "pushed to Redis, then gone from it (Redis came back with older data, "
        "or a pop whose answer was lost)",
        [i for _, g in logs for i in [*g.pushed, *g.returned]],
    )
    charge(
        "refilled into a strict tag's state, not handed out (a take whose answer was "
        "lost, a batch whose node was killed, the state of an older Redis incarnation)",
        [i for _, g in logs for i in g.refilled],
    )
    return Accounting(
        start_id=start_id,
        max_id=max_id,
        issued=bitmap.count,
        duplicates=bitmap.duplicates,
        duplicate_examples=bitmap.duplicate_examples,
        in_pool=in_pool,
        pool_clean=pool_clean,
        pool_overlaps_issued=overlap,
        beyond_ledger=bitmap.count_set(max_id, bitmap.base + len(bitmap.bits) * 8),
        wasted=wasted,
        unattributed=left,
        log_events=events,
    )
