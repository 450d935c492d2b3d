"""The double buffer of one tag: the range being served and the next one.

Taking an ID is synchronous and touches no store. When ``prefetch_at`` of the
current range is used, the next range is fetched in a background task; when the
current range runs out, the next one takes its place. A request waits on a store
only when both are exhausted.

Everything here runs on one event loop thread, so a check-and-increment without
an ``await`` between them is atomic: two requests can never take the same ID.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable

from pool.errors import IdPoolError
from pool.ranges import MAX_ID, IdRange

Fetch = Callable[[str], Awaitable[IdRange]]
# (tag, IDs in the range, seconds it was served for): a range was used up
Finished = Callable[[str, int, float], None]
_NEVER = MAX_ID + 1  # a trigger no ID reaches (an int: int-to-float compares cost more)
RETRY_BACKOFF = 0.2  # seconds between background fetches after a failed one


class Draining(IdPoolError):
    """The node is stopping; its remainders are being returned to the pool."""


class SegmentBuffer:
    def __init__(
        self, tag: str, fetch: Fetch, prefetch_at: float, on_finished: Finished | None = None
    ) -> None:
        self.tag = tag
        self._fetch = fetch
        self._prefetch_at = prefetch_at
        self._on_finished = on_finished
        self._issued_before = 0  # IDs handed out from ranges before `current`
        self._installed_at = 0.0
        self.current: IdRange | None = None
        self.next: IdRange | None = None
        self._cur = 0  # next ID to hand out from `current`
        self._end = 0  # end of `current`
        self._trigger = _NEVER  # take this ID and the prefetch starts
        self._task: asyncio.Task[None] | None = None
        self._retry_at = 0.0
        self.last_error: BaseException | None = None
        self.draining = False

    @property
    def remaining(self) -> int:
        return self._end - self._cur

    @property
    def in_memory(self) -> int:
        """IDs this buffer can hand out without waiting: the current range's rest and `next`."""
        return self._end - self._cur + (0 if self.next is None else len(self.next))

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
        """The next ID, or None when both ranges are exhausted."""
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
            await self._wait_for_range()

    async def take_many_waiting(self, count: int) -> list[int]:
        ids = self.take_many(count)
        while len(ids) < count:
            await self._wait_for_range()
            ids.extend(self.take_many(count - len(ids)))
        return ids

    async def drain(self) -> list[IdRange]:
        """Stop serving and hand over the unused remainder, exactly once.

        Waits for a fetch under way (its range is part of the remainder). The
        buffer is emptied in the same synchronous step that reads the remainder,
        so no request can take an ID from a range that is being returned.
        """
        self.draining = True
        task = self._task
        if task is not None:
            await asyncio.wait([task])
        remainder = []
        if self._cur < self._end:
            remainder.append(IdRange(self._cur, self._end))
        if self.next is not None:
            remainder.append(self.next)
        self._issued_before = self.issued
        self.current = None
        self._cur = self._end = 0
        self.next = None
        self._trigger = _NEVER
        return remainder

    def _switch(self) -> bool:
        new = self.next
        if new is None:
            return False
        # Clear `next` first: _install arms the prefetch only when no next range is held.
        self.next = None
        self._install(new)
        return True

    def _install(self, new: IdRange) -> None:
        now = time.monotonic()
        old = self.current
        if old is not None:
            self._issued_before += self._cur - old.start
            if self._cur >= self._end and self._on_finished is not None:
                self._on_finished(self.tag, len(old), now - self._installed_at)
        self._installed_at = now
        self.current = new
        self._cur = new.start
        self._end = new.end
        self._trigger = new.start + int(len(new) * self._prefetch_at)
        if self.next is not None or self._task is not None:
            self._trigger = _NEVER

    def _prefetch(self) -> None:
        if self.next is not None or self._task is not None or self.draining:
            self._trigger = _NEVER
            return
        if time.monotonic() < self._retry_at:
            return  # stays armed: the next take tries again after the backoff
        self._trigger = _NEVER
        self._start_fetch()

    def _start_fetch(self) -> asyncio.Task[None]:
        task = asyncio.ensure_future(self._fetch_next())
        self._task = task
        task.add_done_callback(_consume_exception)
        return task

    async def _fetch_next(self) -> None:
        try:
            new = await self._fetch(self.tag)
        except BaseException as e:
            self.last_error = e
            self._retry_at = time.monotonic() + RETRY_BACKOFF
            self._trigger = self._cur  # re-arm the prefetch
            raise
        finally:
            self._task = None
        self.last_error = None
        if self.current is None or self._cur >= self._end:
            self._install(new)  # nothing being served: use it at once
        else:
            self.next = new

    async def _wait_for_range(self) -> None:
        if self.draining:
            raise Draining(f"node is shutting down; tag {self.tag!r} is not served here now")
        task = self._task
        if task is None:
            error = self.last_error
            if error is not None and time.monotonic() < self._retry_at:
                raise error.with_traceback(None)  # fail fast while the stores are down
            task = self._start_fetch()
        # shield: a client that hangs up must not cancel a fetch other requests wait on
        await asyncio.shield(task)


def _consume_exception(task: asyncio.Task[None]) -> None:
    if not task.cancelled():
        task.exception()  # read by waiters; avoids "exception never retrieved"
