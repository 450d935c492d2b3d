"""One clock for the server's own timing: the wall time, a monotonic time, and sleep.

``service/runtime.py`` makes one ``Clock`` and hands it to every part that
keeps time: the preloader (its schedule, sweeps, refill-soon limit), the health
probes, the node (its housekeeping loop, the consumption chart, idle release,
tag reloads, its buffers), the kinds (``KindContext.clock``: strict's store
skip, snowflake's waits), the claims' Redis skips, the waste and failure logs'
once-a-second limits, the drain's looks, the status snapshot and the render
cache. A part that only reads monotonic time takes ``clock.monotonic`` (bound
once: ``time.monotonic`` itself in production). Each takes ``SYSTEM_CLOCK``
(``time.time``, ``time.monotonic``, ``asyncio.sleep``) by default; a test
passes a ``FakeClock`` and moves time itself, so it waits on nothing.

What stays on the real clock, on purpose: a bound on a call to a real store
(``IDPOOL_STORE_TIMEOUT``, a probe's wait, the stores' own retries and row
times) guards against or records a real server, the request timings of
``/metrics`` measure real latency, and the kinds' own time (a snowflake tag's
lease clock and ID time, the client's) has its own injection where it is made.
"""

from __future__ import annotations

import asyncio
import heapq
import itertools
import time
from typing import Protocol

# Loop turns a FakeClock gives the tasks it woke, so that each can run up to its
# next sleep when it waits on nothing real in between.
_SETTLE_TURNS = 20


class Clock(Protocol):
    """What the server's timing reads. ``now`` is wall time (Unix seconds: shown to
    people, compared with other machines); ``monotonic`` measures intervals (never
    goes back); ``sleep`` waits on the monotonic clock."""

    def now(self) -> float: ...

    def monotonic(self) -> float: ...

    async def sleep(self, seconds: float) -> None: ...


class SystemClock:
    """The machine's clocks and asyncio's sleep. The functions themselves, not
    wrappers: a part that binds ``SYSTEM_CLOCK.monotonic`` once reads
    ``time.monotonic`` at the same cost as before the clock was injected."""

    now = staticmethod(time.time)
    monotonic = staticmethod(time.monotonic)
    sleep = staticmethod(asyncio.sleep)


SYSTEM_CLOCK: Clock = SystemClock()


class FakeClock:
    """A clock that moves only when a test advances it.

    ``advance(s)`` moves both times on by ``s`` and wakes every sleeper whose time
    has come, in the order they are due (in the order they slept when due
    together); after each wake the event loop runs a few turns, so a loop that
    sleeps again with no real I/O in between is woken again within the same
    advance. Code that does real I/O between its sleeps (a preloader tick against
    Redis) is awaited with ``until_sleeping`` before the next advance.
    """

    def __init__(self, now: float = 1_700_000_000.0, monotonic: float = 1_000.0) -> None:
        self._now = now
        self._monotonic = monotonic
        # (due on the monotonic clock, order slept, the sleeper's future)
        self._sleepers: list[tuple[float, int, asyncio.Future[None]]] = []
        self._order = itertools.count()

    def now(self) -> float:
        return self._now

    def monotonic(self) -> float:
        return self._monotonic

    async def sleep(self, seconds: float) -> None:
        if seconds <= 0:
            await asyncio.sleep(0)  # as asyncio.sleep(0): a turn of the loop, no wait
            return
        wake = asyncio.get_running_loop().create_future()
        heapq.heappush(self._sleepers, (self._monotonic + seconds, next(self._order), wake))
        await wake  # a cancelled sleeper's future is cancelled too: skipped when due

    @property
    def sleeping(self) -> int:
        """How many sleepers wait for time to move."""
        return sum(1 for _, _, wake in self._sleepers if not wake.done())

    def next_due(self) -> float | None:
        """Seconds until the first sleeper is due (None: nobody sleeps)."""
        due = [when for when, _, wake in self._sleepers if not wake.done()]
        return min(due) - self._monotonic if due else None

    async def advance(self, seconds: float) -> None:
        """Move time on by ``seconds``, waking the sleepers due on the way."""
        if seconds < 0:
            raise ValueError("a clock does not go back: advance by 0 or more")
        end = self._monotonic + seconds
        while self._sleepers and self._sleepers[0][0] <= end:
            due = self._sleepers[0][0]
            self._move(due - self._monotonic)
            while self._sleepers and self._sleepers[0][0] <= due:
                _, _, wake = heapq.heappop(self._sleepers)
                if not wake.done():
                    wake.set_result(None)
            await _settle()
        self._move(end - self._monotonic)
        await _settle()

    async def until_sleeping(self, count: int = 1, within: float = 10.0) -> None:
        """Wait (real time, at most ``within`` s) until ``count`` tasks sleep on this
        clock: a loop doing real I/O has finished its round and waits for time."""
        deadline = time.monotonic() + within
        while self.sleeping < count:
            if time.monotonic() > deadline:
                raise TimeoutError(f"{self.sleeping} of {count} sleepers after {within} s")
            await asyncio.sleep(0.001)

    def _move(self, seconds: float) -> None:
        if seconds > 0:
            self._monotonic += seconds
            self._now += seconds


async def _settle() -> None:
    for _ in range(_SETTLE_TURNS):
        await asyncio.sleep(0)
