"""Snowflake IDs: time-ordered 63-bit (or 53-bit) IDs made in memory.

Guarantee: one worker ID, held by one process at a time (a lease, see
``pool/worker_store.py``), never makes the same ID twice and never an ID whose
time is below the last one it made, across restarts and holders (the last time
travels with the lease). Two workers never make the same ID (the worker bits
differ). So no ID repeats while no worker ID is held twice at once.

Layout, high bits first::

    | time since the tag's epoch, in units | worker ID | sequence within the unit |

The default (``LAYOUTS["default"]``) is 41 bits of milliseconds (69 years), 10
worker bits (1,024 holders at once per tag), 12 sequence bits (4,096 IDs per
millisecond per worker): 63 bits. ``js53`` fits JavaScript's exact integers
(below 2^53): 37 bits of 10 ms (43 years), 8 worker bits (256), 8 sequence bits
(25,600 IDs a second per worker).

A ``Layout`` is checked when the tag is made (bits add up, epoch not in the
future, a unit from 1 ms to 1 s, at least a year of time bits left); a
``Generator`` takes its clocks as arguments, so tests step them by hand.
"""

from __future__ import annotations

import functools
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from .errors import IdPoolError, InvalidInput

MAX_BITS = 63  # IDs are positive signed 64-bit integers
JS_BITS = 53  # Number.MAX_SAFE_INTEGER is 2^53 - 1
MS_PER_YEAR = 365 * 24 * 3600 * 1000
# A step back of the wall clock up to this is waited out (the generator keeps the
# last time it used); a larger one stops the tag until the clock has caught up.
MAX_WAIT_BACK_MS = 1000
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


@dataclass(frozen=True)
class Layout:
    time_bits: int = 41
    worker_bits: int = 10
    sequence_bits: int = 12
    unit_ms: int = 1
    epoch_ms: int = 0  # unix milliseconds of time 0; the tag's creation by default

    @property
    def bits(self) -> int:
        return self.time_bits + self.worker_bits + self.sequence_bits

    @property
    def workers(self) -> int:
        return 1 << self.worker_bits

    @property
    def max_sequence(self) -> int:
        return (1 << self.sequence_bits) - 1

    @property
    def end_ms(self) -> int:
        """Unix ms at which the time bits run out."""
        return self.epoch_ms + (1 << self.time_bits) * self.unit_ms

    def to_text(self) -> str:
        """The ledger's ``layout`` column, e.g. ``t41.w10.s12.u1.e1764000000000``."""
        return (
            f"t{self.time_bits}.w{self.worker_bits}.s{self.sequence_bits}"
            f".u{self.unit_ms}.e{self.epoch_ms}"
        )

    @classmethod
    def from_text(cls, text: str) -> Layout:
        parts = dict((p[0], int(p[1:])) for p in text.split("."))
        return cls(parts["t"], parts["w"], parts["s"], parts["u"], parts["e"])

    def encode(self, units: int, worker: int, sequence: int) -> int:
        return (
            (units << (self.worker_bits + self.sequence_bits))
            | (worker << self.sequence_bits)
            | sequence
        )

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
        sequence = value & self.max_sequence
        worker = (value >> self.sequence_bits) & (self.workers - 1)
        units = value >> (self.worker_bits + self.sequence_bits)
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

    def describe(self) -> dict[str, Any]:
        return {
            "time_bits": self.time_bits,
            "worker_bits": self.worker_bits,
            "sequence_bits": self.sequence_bits,
            "unit_ms": self.unit_ms,
            "epoch_ms": self.epoch_ms,
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
    values: dict[str, int] = {**LAYOUTS[preset].describe(), "epoch_ms": now_ms}
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


def wall_ms() -> int:
    return time.time_ns() // 1_000_000


# The lease deadline's clock: monotonic, and on Linux counting while the machine
# is suspended too (CLOCK_MONOTONIC stops then, and a VM resumed after its lease
# expired must not think it still holds its worker ID). A partial: one C call.
lease_clock: Callable[[], float] = (
    functools.partial(time.clock_gettime, time.CLOCK_BOOTTIME)
    if hasattr(time, "CLOCK_BOOTTIME")
    else time.monotonic
)


class Generator:
    """IDs of one worker ID of one tag, made from the wall clock.

    ``take()`` never waits: it returns None when the next ID needs a later time
    unit (sequence used up, or the clock stepped back less than
    ``MAX_WAIT_BACK_MS``), raises ClockBehind for a larger step back,
    WorkerLeaseLost once ``stop_at`` (monotonic) has passed, and ClockAhead for a
    time unit past ``ceiling_ms``: the lease's expiry as the worker store
    recorded it (grant, then each renewal: ``cover``). A new holder of the worker
    ID starts above that expiry, so an ID past it could be made again; a wall
    clock leaped forward beyond the lease stops here instead (issue 28: renewals
    carrying the leaped time were refused, nothing recorded, and the worker ID
    came back at real time: 45,602 duplicates). Not thread-safe by itself: the
    node calls it on its event loop; the client under a lock.
    """

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
        self.layout = layout
        self.worker = worker
        self._clock_ms = clock_ms or wall_ms
        # The hot path reads nanoseconds: time.time_ns itself (one C call) unless
        # a test gives a clock of its own.
        self._clock_ns = time.time_ns if clock_ms is None else lambda: clock_ms() * 1_000_000
        self._epoch_ns = layout.epoch_ms * 1_000_000
        self._unit_ns = layout.unit_ms * 1_000_000
        self._max_seq = layout.max_sequence
        self._shift = layout.worker_bits + layout.sequence_bits
        self._worker_part = worker << layout.sequence_bits
        self._monotonic = monotonic
        self.stop_at = stop_at  # monotonic: the lease's own end, less its margin
        self.lost: str | None = None  # why no ID may be made (lease lost), or None
        # No ID at the floor's unit or below: above the previous holder's last time.
        self.last = max(0, self._units(floor_ms))  # unit 0 unused: no ID is 0
        self.sequence = layout.max_sequence
        self.issued = 0
        self.behind_ms = 0  # how far the clock was behind at the last refusal (0: not)
        self.behind_events = 0  # large steps back seen (each stopped the tag a while)
        self._max_units = (1 << layout.time_bits) - 1
        # The highest unit an ID may carry: the time bits' last, or the lease's
        # expiry's (None: not bounded, a test's generator without a store).
        self.ceiling_ms: int | None = None
        self._top = self._max_units
        if ceiling_ms is not None:
            self.cover(ceiling_ms)

    def cover(self, ceiling_ms: int) -> None:
        """Allow time units up to ``ceiling_ms`` (unix ms, the Redis server's
        clock): the expiry a grant or renewal recorded in the worker's field,
        which every later holder's floor is at or above. Never lowered (a late
        answer of an earlier renewal)."""
        if self.ceiling_ms is None or ceiling_ms > self.ceiling_ms:
            self.ceiling_ms = ceiling_ms
            self._top = min(self._max_units, self._units(ceiling_ms))

    def ahead_ms(self) -> int:
        """How far the wall clock is past the lease's ceiling now (0: not)."""
        if self.ceiling_ms is None:
            return 0
        return max(0, self._clock_ms() - self.ceiling_ms)

    def _units(self, unix_ms: int) -> int:
        return (unix_ms - self.layout.epoch_ms) // self.layout.unit_ms

    @property
    def last_ms(self) -> int:
        """Unix ms of the last unit used (reported with every renewal)."""
        return self.layout.epoch_ms + (self.last + 1) * self.layout.unit_ms - 1

    def take(self) -> int | None:
        # On every request of the node's fast path: attributes read once, no call
        # but the two clocks.
        if self.lost is not None:
            raise WorkerLeaseLost(self.tag, self.lost)
        # The wall clock first, then the deadline: the ID's time is read before the
        # check that the lease still held, so a pause between the two (SIGSTOP, a
        # thread holding the GIL) can only make the check stricter. The other way
        # round, a pause after the check made an ID whose time was past the lease.
        now = (self._clock_ns() - self._epoch_ns) // self._unit_ns
        if self._monotonic() >= self.stop_at:
            raise WorkerLeaseLost(
                self.tag, "the worker ID's lease was not renewed in time (is Redis reachable?)"
            )
        last = self.last
        if now > last:
            if now > self._top:  # one test for the lease's ceiling and the time bits
                raise self._past_top(now)
            self.last, self.sequence, self.behind_ms = now, 0, 0
            last, sequence = now, 0
        else:
            if (last - now) * self.layout.unit_ms > MAX_WAIT_BACK_MS:
                raise self._behind(now)
            sequence = self.sequence
            if sequence >= self._max_seq:
                return None  # the next unit: wait for it
            sequence = self.sequence = sequence + 1
        self.issued += 1
        return (last << self._shift) | self._worker_part | sequence

    def _past_top(self, now: int) -> WorkerLeaseLost:
        if now > self._max_units:
            return WorkerLeaseLost(self.tag, "the layout's time bits are used up")
        assert self.ceiling_ms is not None
        unit_ms = self.layout.unit_ms
        return ClockAhead(self.tag, self.layout.epoch_ms + now * unit_ms - self.ceiling_ms)

    def _behind(self, now: int) -> ClockBehind:
        if not self.behind_ms:
            self.behind_events += 1  # a new episode (logged and counted by the node)
        self.behind_ms = (self.last - now) * self.layout.unit_ms
        return ClockBehind(self.tag, self.behind_ms)

    def take_many(self, count: int) -> list[int] | None:
        """``count`` IDs now, or None (what was made is skipped, never served)."""
        found = []
        for _ in range(count):
            value = self.take()
            if value is None:
                return None
            found.append(value)
        return found

    def wait_seconds(self) -> float:
        """How long until ``take()`` can make an ID again (the next unit)."""
        next_ms = self.layout.epoch_ms + (self.last + 1) * self.layout.unit_ms
        return max(0.0005, (next_ms - self._clock_ms()) / 1000)
