"""The double buffer of one tag: the range being served and the ranges ready next.

Taking an ID is synchronous and touches no store. When ``prefetch_at`` of the
current range is used, the next range is fetched in a background task; when the
current range runs out, the next one takes its place. A request waits on a store
only when the buffer does not hold what it asks for.

Everything here runs on one event loop thread, so a check-and-increment without
an ``await`` between them is atomic: two requests can never take the same ID.
A batch takes nothing until the buffer holds all of it, so a batch that fails
(stores down, node draining) has handed out nothing and lost nothing.
"""

from __future__ import annotations

import asyncio
import time
from collections import deque
from collections.abc import Awaitable, Callable
from typing import Protocol

from idpool.pool.errors import Draining, InvalidInput, TagExhausted
from idpool.pool.ranges import MAX_ID, IdRange

Fetch = Callable[[str, int], Awaitable[list[IdRange]]]  # (tag, IDs wanted) -> ranges
# (tag, IDs in the range, seconds it was served for): a range was used up
Finished = Callable[[str, int, float], None]
_NEVER = MAX_ID + 1  # a trigger no ID reaches (an int: int-to-float compares cost more)
RETRY_BACKOFF = 0.2  # seconds between background fetches after a failed one
# seconds: a buffer's rate (which sizes its reserve) is measured over at least this
# long; over 50 ms one batch of 10,000 read as 200,000 IDs/s, a reserve of millions.
# Not much longer: a node must have its reserve soon after it starts.
MIN_RATE_SPAN = 1.0


class SegmentBuffer:
    def __init__(
        self,
        tag: str,
        fetch: Fetch,
        prefetch_at: float,
        on_finished: Finished | None = None,
        reserve_seconds: float = 0.0,
        rate_span: float = MIN_RATE_SPAN,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.tag = tag
        self._clock = clock  # monotonic seconds; a test passes a fake one
        self._fetch = fetch
        self._prefetch_at = prefetch_at
        self._on_finished = on_finished
        # Hold at least this many seconds of this buffer's own consumption: a
        # claim needs Redis, so while Redis is down or failing over, this is
        # what the node serves from.
        self.reserve_seconds = reserve_seconds
        self.rate = 0.0  # IDs/s served here, measured at range switches over >= rate_span
        self._rate_span = rate_span
        self._rate_since = clock()
        self._rate_issued = 0
        self._issued_before = 0  # IDs handed out from ranges before `current`
        self._installed_at = 0.0
        self.current: IdRange | None = None
        self.ready: deque[IdRange] = deque()  # fetched, served after `current`, in order
        self._ready_ids = 0  # IDs in `ready`
        self._cur = 0  # next ID to hand out from `current`
        self._end = 0  # end of `current`
        self._trigger = _NEVER  # take this ID and the prefetch starts
        self._task: asyncio.Task[None] | None = None
        self._retry_at = 0.0
        self.last_error: BaseException | None = None
        self.draining = False

    @property
    def next(self) -> IdRange | None:
        """The range served after the current one, if one is ready."""
        return self.ready[0] if self.ready else None

    @property
    def remaining(self) -> int:
        return self._end - self._cur

    @property
    def in_memory(self) -> int:
        """IDs this buffer can hand out without waiting: the current range's rest and `ready`."""
        return self._end - self._cur + self._ready_ids

    @property
    def used(self) -> int:
        return 0 if self.current is None else self._cur - self.current.start

    @property
    def issued(self) -> int:
        """IDs this buffer has handed out since the node started."""
        return self._issued_before + self.used

    @property
    def fetching(self) -> bool:
        return self._task is not None

    def take(self) -> int | None:
        """The next ID, or None when nothing is in memory."""
        cur = self._cur
        if cur < self._end:
            self._cur = cur + 1
            if cur >= self._trigger:
                self._prefetch()
            return cur
        if self._switch():
            return self.take()
        return None

    def take_many(self, count: int) -> list[int]:
        """Up to ``count`` IDs from what is in memory, in increasing order per range."""
        ids: list[int] = []
        while count > 0:
            available = self._end - self._cur
            if available <= 0:
                if not self._switch():
                    break
                continue
            first = self._cur
            n = min(count, available)
            self._cur = first + n
            ids.extend(range(first, first + n))
            count -= n
            if self._cur > self._trigger:
                self._prefetch()
        return ids

    async def take_waiting(self) -> int:
        while True:
            value = self.take()
            if value is not None:
                return value
            await self._wait_for(1)

    async def take_many_waiting(self, count: int) -> list[int]:
        """``count`` IDs, all taken in one synchronous step once the buffer holds them.

        Nothing is taken before that: a batch that fails hands out nothing.
        """
        while self.in_memory < count:
            # One fetch sized to what is missing (one pop or one claim), not range by range.
            try:
                await self._wait_for(count - self.in_memory)
            except TagExhausted:
                if not self.in_memory:
                    raise  # nothing left here at all: the tag has run out
                left = self.in_memory
                raise InvalidInput(
                    "bad_count",
                    f"only {left} IDs of tag {self.tag!r} are left below its max at this node, "
                    f"fewer than the {count} asked for; a batch is all or nothing: ask for "
                    f"{left} or fewer to get them",
                ) from None
        return self.take_many(count)

    async def wait_for(self, ids: int) -> None:
        """Wait for a fetch of ``ids`` more IDs (the one under way, or a new one) to
        land; raises what it raised. Takes nothing: the caller takes after."""
        await self._wait_for(ids)

    async def drain(self) -> list[IdRange]:
        """Stop serving and hand over the unused remainder, exactly once.

        Waits for a fetch under way (its ranges are part of the remainder). The
        buffer is emptied in the same synchronous step that reads the remainder,
        so no request can take an ID from a range that is being returned.
        """
        self.draining = True
        task = self._task
        if task is not None:
            await asyncio.wait([task])
        return self.drain_now()

    def drain_now(self) -> list[IdRange]:
        """drain() for a buffer with no fetch under way: one synchronous step."""
        self.draining = True
        remainder = []
        if self._cur < self._end:
            remainder.append(IdRange(self._cur, self._end))
        remainder += self.ready
        self._issued_before = self.issued
        self.current = None
        self._cur = self._end = 0
        self.ready.clear()
        self._ready_ids = 0
        self._trigger = _NEVER
        return remainder

    def _switch(self) -> bool:
        if not self.ready:
            return False
        # Take it out of `ready` first: _install arms the prefetch only when none is left.
        new = self.ready.popleft()
        self._ready_ids -= len(new)
        self._install(new)
        return True

    def _install(self, new: IdRange) -> None:
        now = self._clock()
        old = self.current
        if old is not None:
            self._issued_before += self._cur - old.start
            if self._cur >= self._end and self._on_finished is not None:
                self._on_finished(self.tag, len(old), now - self._installed_at)
        if now - self._rate_since >= self._rate_span:
            self.rate = (self._issued_before - self._rate_issued) / (now - self._rate_since)
            self._rate_since, self._rate_issued = now, self._issued_before
        self._installed_at = now
        self.current = new
        self._cur = new.start
        self._end = new.end
        self._arm()

    def _reserve_ids(self) -> int:
        return int(self.rate * self.reserve_seconds)

    def _arm(self) -> None:
        """Set the ID whose take starts the next fetch: Leaf's point in the
        current range when nothing is ready, or where what is left in memory
        falls under the reserve, whichever comes first."""
        if self._task is not None or self.draining or self.current is None:
            self._trigger = _NEVER
            return
        trigger = _NEVER
        if not self.ready:
            trigger = self.current.start + int(len(self.current) * self._prefetch_at)
        reserve = self._reserve_ids()
        if reserve:
            trigger = min(trigger, max(self._cur, self._end + self._ready_ids - reserve))
        self._trigger = trigger

    def _prefetch(self) -> None:
        if self._task is not None or self.draining:
            self._trigger = _NEVER
            return
        if self._clock() < self._retry_at:
            return  # stays armed: the next take tries again after the backoff
        self._trigger = _NEVER
        # One fetch for what the reserve lacks (at least one range).
        self._start_fetch(max(1, self._reserve_ids() - self.in_memory))

    def _start_fetch(self, ids: int) -> asyncio.Task[None]:
        task = asyncio.ensure_future(self._fetch_next(ids))
        self._task = task
        task.add_done_callback(_consume_exception)
        return task

    async def _fetch_next(self, ids: int) -> None:
        try:
            fetched = await self._fetch(self.tag, ids)
        except BaseException as e:
            self.last_error = e
            self._retry_at = self._clock() + RETRY_BACKOFF
            self._trigger = self._cur  # re-arm the prefetch
            raise
        finally:
            self._task = None
        self.last_error = None
        # Appended in the same synchronous step as the task ends: drain(), which
        # waits for this task, always sees these ranges.
        self.ready.extend(fetched)
        self._ready_ids += sum(map(len, fetched))
        if self._cur >= self._end:
            self._switch()  # nothing being served: use the first at once
        else:
            self._arm()

    async def _wait_for(self, ids: int) -> None:
        """Wait for a fetch to land: the one under way, or a new one for ``ids`` IDs."""
        if self.draining:
            raise Draining(f"node is shutting down; tag {self.tag!r} is not served here now")
        task = self._task
        if task is None:
            error = self.last_error
            if error is not None and self._clock() < self._retry_at:
                raise error.with_traceback(None)  # fail fast while the stores are down
            task = self._start_fetch(ids)
        # shield: a client that hangs up must not cancel a fetch other requests wait on
        await asyncio.shield(task)


def _consume_exception(task: asyncio.Task[None]) -> None:
    if not task.cancelled():
        task.exception()  # read by waiters; avoids "exception never retrieved"


class Buffers(Protocol):
    """A node's segment buffers as the formats converter reaches them
    (``segment_buffers.SegmentBuffers``, which imports the converter's fence)."""

    buffers: dict[str, SegmentBuffer]

    async def buffer(self, tag: str) -> SegmentBuffer:
        """The tag's buffer, made on first use (raises UnknownTag, Draining)."""
        ...
