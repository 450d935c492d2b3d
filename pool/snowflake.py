"""Snowflake IDs on the node: time-ordered 63-bit (or 53-bit) IDs made in memory.

The layout and the generator are the client package's
(``idpool_client/generator.py``): one copy, which the node and
``SnowflakeClient`` both make IDs with. Its guarantee: one worker ID, held by
one process at a time (a lease, see ``pool/worker_store.py``), never makes the
same ID twice and never an ID whose time is below the last one it made, across
restarts and holders. This module adds what is the server's: the presets and
the checks at ``tag add``, decoding with the ``/decode`` route's refusals, and
errors that name the tag (``service/errors.py`` maps them to HTTP).

The default (``LAYOUTS["default"]``) is 41 bits of milliseconds (69 years), 10
worker bits (1,024 holders at once per tag), 12 sequence bits (4,096 IDs per
millisecond per worker): 63 bits. ``js53`` fits JavaScript's exact integers
(below 2^53): 37 bits of 10 ms (43 years), 8 worker bits (256), 8 sequence bits
(25,600 IDs a second per worker).

A ``Layout`` is checked when the tag is made (bits add up, epoch not in the
future, a unit from 1 ms to 1 s, at least a year of time bits left).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

from idpool_client import generator
from idpool_client.generator import MAX_WAIT_BACK_MS, lease_clock, wall_ms

from .errors import IdPoolError, InvalidInput

__all__ = [
    "DECODE_AHEAD_MS",
    "JS_BITS",
    "LAYOUTS",
    "LAYOUT_FIELDS",
    "LAYOUT_RANGES",
    "MAX_BITS",
    "MAX_WAIT_BACK_MS",
    "MS_PER_YEAR",
    "ClockAhead",
    "ClockBehind",
    "Generator",
    "Layout",
    "WorkerLeaseLost",
    "check_layout",
    "lease_clock",
    "lease_ms_of",
    "wall_ms",
]

MAX_BITS = 63  # IDs are positive signed 64-bit integers
JS_BITS = 53  # Number.MAX_SAFE_INTEGER is 2^53 - 1
MS_PER_YEAR = 365 * 24 * 3600 * 1000
# Decode refuses an ID whose time is more than this past the decoding machine's
# clock: no holder makes one (a holder's IDs run at most MAX_WAIT_BACK_MS ahead of
# its own clock, and hosts' clocks agree within IDPOOL_WORKER_MARGIN_SECONDS).
DECODE_AHEAD_MS = 60_000


class ClockBehind(IdPoolError):
    """The wall clock is behind the last time this worker ID used (a large step
    back, or a previous holder whose clock ran ahead): no ID until it catches up."""

    def __init__(self, tag: str, behind_ms: int) -> None:
        super().__init__(
            f"tag {tag!r}: this machine's clock is {behind_ms} ms behind the last time "
            "its worker ID used; no snowflake ID until it catches up (check NTP)"
        )
        self.tag = tag
        self.behind_ms = behind_ms


class WorkerLeaseLost(IdPoolError):
    """No worker ID held for the tag (not granted yet, lost, or about to expire
    unrenewed): no snowflake ID rather than risk a second holder."""

    def __init__(self, tag: str, why: str) -> None:
        super().__init__(f"tag {tag!r}: no snowflake ID: {why}")
        self.tag = tag
        self.why = why


class ClockAhead(WorkerLeaseLost):
    """The wall clock reads past the lease's expiry by the Redis server's clock
    (``ceiling_ms``): a time the worker store has not recorded for this worker
    ID, which it may grant again above its expiry. No ID until a renewal covers
    it or the clock is set right (a leap forward beyond the lease)."""

    def __init__(self, tag: str, ahead_ms: int) -> None:
        super().__init__(
            tag,
            f"this machine's clock is {ahead_ms} ms past the worker lease's expiry by the "
            "Redis server's clock (a time not recorded for its worker ID): no ID until the "
            "clock is set right (check NTP)",
        )
        self.ahead_ms = ahead_ms


class Layout(generator.Layout):
    """The layout (``idpool_client.generator.Layout``: bits, text form, encoding)
    with the node's decoding."""

    def decode(self, value: int, now_ms: int | None = None) -> dict[str, Any]:
        """Time, worker ID and sequence of an ID of this layout. With ``now_ms``,
        also refuses (InvalidInput ``bad_id``, saying why) what no holder of the
        layout can have made by then: time unit 0 (never used: a generator starts
        above it) or a time more than DECODE_AHEAD_MS past ``now_ms``. Every worker
        ID and sequence the bits can hold is one a holder may have used, so those
        tell nothing; nor can a tag of the same layout and epoch be told apart."""
        if value < 0 or value >> self.bits:
            raise InvalidInput(
                "bad_id",
                f"{value} is not an ID of this tag: above its {self.bits}-bit layout "
                "(another tag's, or made up)",
            )
        units, worker, sequence = self.split(value)
        unix_ms = self.epoch_ms + units * self.unit_ms
        if now_ms is not None and units == 0:
            raise InvalidInput(
                "bad_id",
                f"{value} is not an ID of this tag: its time is the layout's epoch "
                f"({self.epoch_ms}), which no ID uses (made up, or another layout's)",
            )
        if now_ms is not None and unix_ms > now_ms + DECODE_AHEAD_MS:
            raise InvalidInput(
                "bad_id",
                f"{value} is not an ID of this tag: its time would be unix ms {unix_ms}, "
                f"{(unix_ms - now_ms) // 1000} s in the future (another tag's with an earlier "
                "epoch or another layout, or made up)",
            )
        stamp = time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(unix_ms // 1000))
        return {
            "id": value,
            "time_ms": unix_ms,
            "time": f"{stamp}.{unix_ms % 1000:03d}Z",
            "units": units,
            "worker": worker,
            "sequence": sequence,
        }


def lease_ms_of(text: str) -> int:
    """The tag's worker-lease TTL in ms, recorded in its ``layout`` column at
    creation (``.l10000``), or 0 for a tag made before it was recorded. One
    value per tag, read by every node: grants use it, whatever the node's
    ``IDPOOL_WORKER_LEASE_SECONDS``, so a quarantine of that length (or more)
    outlasts every lease of the tag, even after Redis lost all it knew."""
    for part in text.split("."):
        if part[:1] == "l" and part[1:].isdigit():
            return int(part[1:])
    return 0


LAYOUTS = {
    "default": Layout(41, 10, 12, 1),
    "js53": Layout(37, 8, 8, 10),  # every ID below 2^53: exact in JavaScript
}
LAYOUT_FIELDS = ("time_bits", "worker_bits", "sequence_bits", "unit_ms", "epoch_ms")


def check_layout(
    fields: dict[str, object], now_ms: int, name: Callable[[str], str] = lambda f: f
) -> Layout:
    """A layout from a preset (``layout``: default or js53) and overrides of
    its fields; every value checked. Raises InvalidInput ``bad_layout``."""
    preset = fields.get("layout", "default")
    if not isinstance(preset, str) or preset not in LAYOUTS:
        raise InvalidInput(
            "bad_layout", f"{name('layout')} must be one of {', '.join(LAYOUTS)}, not {preset!r}"
        )
    values: dict[str, int] = {**LAYOUTS[preset].fields(), "epoch_ms": now_ms}
    for field, (low, high) in LAYOUT_RANGES.items():
        raw = fields.get(field)
        if raw is None:
            continue
        if isinstance(raw, bool) or not isinstance(raw, int) or not low <= raw <= high:
            raise InvalidInput(
                "bad_layout", f"{name(field)} must be an integer from {low} to {high}"
            )
        values[field] = raw
    layout = Layout(**values)
    if layout.bits > MAX_BITS:
        raise InvalidInput(
            "bad_layout",
            f"time, worker and sequence bits add up to {layout.bits}; at most {MAX_BITS} "
            f"({JS_BITS} to stay exact in JavaScript)",
        )
    if layout.epoch_ms > now_ms:
        raise InvalidInput("bad_layout", f"{name('epoch_ms')} {layout.epoch_ms} is in the future")
    if layout.end_ms - now_ms < MS_PER_YEAR:
        raise InvalidInput(
            "bad_layout",
            f"{layout.time_bits} time bits of {layout.unit_ms} ms from epoch {layout.epoch_ms} "
            "leave less than a year: give more time bits, a larger unit or a later epoch",
        )
    return layout


LAYOUT_RANGES = {
    "time_bits": (20, 61),
    "worker_bits": (1, 20),
    "sequence_bits": (1, 22),
    "unit_ms": (1, 1000),  # 1 ms to 1 s: coarser units make a smaller ID
    "epoch_ms": (0, 1 << 50),
}


class Generator(generator.Generator):
    """``idpool_client.generator.Generator`` of one tag on the node: its refusals
    are the server's errors, naming the tag (WorkerLeaseLost, ClockAhead,
    ClockBehind); ``behind_ms`` and ``behind_events`` feed the node's log and
    metrics. The node calls it on its event loop (``take`` is its fast path)."""

    NOT_RENEWED = "the worker ID's lease was not renewed in time (is Redis reachable?)"
    layout: Layout

    def __init__(
        self,
        tag: str,
        layout: Layout,
        worker: int,
        floor_ms: int,
        stop_at: float,
        *,
        clock_ms: Callable[[], int] | None = None,
        monotonic: Callable[[], float] = lease_clock,
        ceiling_ms: int | None = None,
    ) -> None:
        self.tag = tag
        super().__init__(
            layout,
            worker,
            floor_ms,
            stop_at,
            clock_ms=clock_ms,
            monotonic=monotonic,
            ceiling_ms=ceiling_ms,
        )

    def _stopped(self, why: str) -> WorkerLeaseLost:
        return WorkerLeaseLost(self.tag, why)

    def _clock_ahead(self, ahead_ms: int) -> ClockAhead:
        return ClockAhead(self.tag, ahead_ms)

    def _clock_behind(self, behind_ms: int) -> ClockBehind:
        return ClockBehind(self.tag, behind_ms)
