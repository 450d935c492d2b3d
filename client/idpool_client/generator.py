"""Snowflake IDs: the layout and the generator, one copy for the node and the client.

Guarantee: one worker ID, held by one process at a time (a lease the node's
worker store grants), never makes the same ID twice and never an ID whose time
is below the last one it made, across restarts and holders (the last time
travels with the lease). Two workers never make the same ID (the worker bits
differ). So no ID repeats while no worker ID is held twice at once.

Layout, high bits first::

    | time since the tag's epoch, in units | worker ID | sequence within the unit |

A ``Generator`` takes its clocks as arguments, so tests step them by hand. The
node (``idpool.pool.snowflake``) subclasses both classes: its layout adds
decoding with the ``/decode`` route's refusals, its generator names the tag in
the server's errors. This package depends on nothing of the server, so both
live here, where the server (which installs this package) imports them.
"""

from __future__ import annotations

import functools
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, TypeVar

from .errors import SnowflakeStopped

# A step back of the wall clock up to this is waited out (the generator keeps the
# last time it used); a larger one stops the tag until the clock has caught up.
MAX_WAIT_BACK_MS = 1000

_L = TypeVar("_L", bound="Layout")


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
    def from_text(cls: type[_L], text: str) -> _L:
        parts = dict((p[0], int(p[1:])) for p in text.split("."))
        return cls(parts["t"], parts["w"], parts["s"], parts["u"], parts["e"])

    def encode(self, units: int, worker: int, sequence: int) -> int:
        return (
            (units << (self.worker_bits + self.sequence_bits))
            | (worker << self.sequence_bits)
            | sequence
        )

    def split(self, value: int) -> tuple[int, int, int]:
        """The time units, worker ID and sequence of ``value`` (``encode``'s inverse)."""
        sequence = value & self.max_sequence
        worker = (value >> self.sequence_bits) & (self.workers - 1)
        units = value >> (self.worker_bits + self.sequence_bits)
        return units, worker, sequence

    def fields(self) -> dict[str, Any]:
        return {
            "time_bits": self.time_bits,
            "worker_bits": self.worker_bits,
            "sequence_bits": self.sequence_bits,
            "unit_ms": self.unit_ms,
            "epoch_ms": self.epoch_ms,
        }


def wall_ms() -> int:
    return time.time_ns() // 1_000_000


# The lease deadline's clock: monotonic, and on Linux counting while the machine
# is suspended too (CLOCK_MONOTONIC stops then, and a VM resumed after its lease
# expired must not think it still holds its worker ID). A partial: one C call.
# _BOOTTIME is the clock the client's C run (_clockrun.c) reads.
_BOOTTIME: Callable[[], float] | None = (
    functools.partial(time.clock_gettime, time.CLOCK_BOOTTIME)
    if hasattr(time, "CLOCK_BOOTTIME")
    else None
)
lease_clock: Callable[[], float] = _BOOTTIME or time.monotonic


class Generator:
    """IDs of one worker ID of one tag, made from the wall clock.

    ``take()`` never waits: it returns None when the next ID needs a later time
    unit (sequence used up, or the clock stepped back less than
    ``MAX_WAIT_BACK_MS``), refuses for a larger step back, once ``stop_at``
    (on ``monotonic``, the lease clock) has passed, and for a time unit past
    ``ceiling_ms``: the lease's expiry as the worker store recorded it (grant,
    then each renewal: ``cover``). A new holder of the worker ID starts above
    that expiry, so an ID past it could be made again; a wall clock leaped
    forward beyond the lease stops here instead (issue 28: renewals carrying the
    leaped time were refused, nothing recorded, and the worker ID came back at
    real time: 45,602 duplicates). Refusals raise what ``_stopped``,
    ``_clock_ahead`` and ``_clock_behind`` make: SnowflakeStopped here, the
    node's errors in its subclass. Not thread-safe by itself: the node calls it
    on its event loop; the client under a lock.
    """

    # Why the lease ran out, in the refusal (the node's adds where to look).
    NOT_RENEWED = "the worker ID's lease was not renewed in time"

    def __init__(
        self,
        layout: Layout,
        worker: int,
        floor_ms: int,
        stop_at: float,
        *,
        clock_ms: Callable[[], int] | None = None,
        monotonic: Callable[[], float] = lease_clock,
        ceiling_ms: int | None = None,
    ) -> None:
        self.layout = layout
        self.worker = worker
        self._clock_ms = clock_ms or wall_ms
        # The hot path reads nanoseconds: time.time_ns itself (one C call) unless
        # a test (or a client given its own wall clock) gives a clock of its own.
        self._clock_ns = time.time_ns if clock_ms is None else lambda: clock_ms() * 1_000_000
        self._epoch_ns = layout.epoch_ms * 1_000_000
        self._unit_ns = layout.unit_ms * 1_000_000
        self._max_seq = layout.max_sequence
        self._shift = layout.worker_bits + layout.sequence_bits
        self._worker_part = worker << layout.sequence_bits
        self.monotonic = monotonic  # the lease clock: the client's runs end by it too
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

    def cover(self, ceiling_ms: int | None) -> None:
        """Allow time units up to ``ceiling_ms`` (unix ms, the Redis server's
        clock): the expiry a grant or renewal recorded in the worker's field,
        which every later holder's floor is at or above. Never lowered (a late
        answer of an earlier renewal). None (the client's: a node older than
        ceilings answered the renewal): the expiry is unknown, so the generator
        is unbounded again, as before ceilings (upgrade nodes first)."""
        if ceiling_ms is None:
            self.ceiling_ms, self._top = None, self._max_units
        elif self.ceiling_ms is None or ceiling_ms > self.ceiling_ms:
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
            raise self._stopped(self.lost)
        # The wall clock first, then the deadline: the ID's time is read before the
        # check that the lease still held, so a pause between the two (SIGSTOP, a
        # thread holding the GIL) can only make the check stricter. The other way
        # round, a pause after the check made an ID whose time was past the lease.
        now = (self._clock_ns() - self._epoch_ns) // self._unit_ns
        if self.monotonic() >= self.stop_at:
            raise self._stopped(self.NOT_RENEWED)
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

    def _past_top(self, now: int) -> Exception:
        if now > self._max_units:
            return self._stopped("the layout's time bits are used up")
        assert self.ceiling_ms is not None
        unit_ms = self.layout.unit_ms
        return self._clock_ahead(self.layout.epoch_ms + now * unit_ms - self.ceiling_ms)

    def _behind(self, now: int) -> Exception:
        if not self.behind_ms:
            self.behind_events += 1  # a new episode (logged and counted by the node)
        self.behind_ms = (self.last - now) * self.layout.unit_ms
        return self._clock_behind(self.behind_ms)

    # -- the refusals: the client's messages (the node's subclass has its own) --

    def _stopped(self, why: str) -> Exception:
        return SnowflakeStopped(why)

    def _clock_ahead(self, ahead_ms: int) -> Exception:
        return SnowflakeStopped(
            f"this machine's clock is {ahead_ms} ms past the worker lease's expiry by the "
            "Redis server's clock: no ID until the clock is set right (check NTP)"
        )

    def _clock_behind(self, behind_ms: int) -> Exception:
        return SnowflakeStopped(
            f"the clock is {behind_ms} ms behind the last time used; no ID until it "
            "catches up (check NTP)"
        )

    # -- what callers build on take() --------------------------------------------

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

    def take_unit(self) -> tuple[int, int, int, float] | None:
        """An ID, the end of its unit's IDs, the unix ns at which its unit ends or
        the lease's deadline comes (as the wall clock reads it), whichever is
        first, and the time on this generator's lease clock by which the run ends
        whatever the wall clock reads: the lease's deadline, or one unit from now.
        The rest of the unit's sequence is the caller's to hand out until then
        (this generator moves past it: no time and sequence is used twice, and
        ``last_ms`` already counts the unit). None: wait for the next unit.

        Both ends, since either clock alone can be wrong: the wall clock stepped
        back kept a run going for the whole step (past the lease's deadline, and
        handing out a unit long over while ``take`` says the clock is behind)."""
        value = self.take()
        if value is None:
            return None
        limit = value - self.sequence + self._max_seq + 1
        self.sequence = self._max_seq
        unit_ms = self.layout.unit_ms
        unit_end_ns = (self.layout.epoch_ms + (self.last + 1) * unit_ms) * 1_000_000
        # Nor past the lease's deadline, as the wall clock will read it (the clock in
        # ms rounds down: the run ends no later than the deadline).
        now = self.monotonic()
        left_ns = int((self.stop_at - now) * 1e9)
        until_ns = min(unit_end_ns, self._clock_ms() * 1_000_000 + left_ns)
        return value, limit, until_ns, min(self.stop_at, now + unit_ms / 1000)
