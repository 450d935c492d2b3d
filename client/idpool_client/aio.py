"""The asyncio client: the sync client's double buffer on one event loop.

Everything runs on the loop's thread, so taking an ID is a plain
check-and-increment with no ``await`` in between: two tasks never get the same
ID. The two HTTP calls run in the default executor (stdlib ``http.client``),
so no HTTP library is needed. Use one client per event loop.

Except the cut of the tails at exit. The atexit hook runs in the main thread,
and a loop run by another thread (fed by ``run_coroutine_threadsafe``) still
takes meanwhile: a cut between a take's read of ``cur`` and its increment
returned an ID just handed out, and a take after the cut's first
write handed out 0. So the hook first stops new takes (``limit`` 0, closed:
a take that reads either goes to the slow path and raises IdPoolClosed), then
waits until no other thread is inside the client's code (``sys._current_frames``:
a take under way finishes its increment), and only then reads ``cur``. A thread
still inside after a moment keeps the IDs (wasted, never returned while it may
hand them out). Asking the loop to cut was not enough: the fast path does not
say which loop takes (a client warmed up in ``asyncio.run``, then served from
a loop thread, was cut beside that thread). The take's hot path has no lock.
"""

from __future__ import annotations

import asyncio
import atexit
import sys
import threading
import time
import types
import weakref
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from .errors import IdPoolClosed, IdPoolError
from .holding import (
    RETRY_BACKOFF,
    CloseReport,
    HeldTag,
    LeaseHolder,
    Tail,
    check_batch,
    render_many,
)
from .transport import Lease

EXIT_WAIT = 1.0  # seconds the atexit hook waits for takes under way in other threads


@dataclass(eq=False)
class _Tag(HeldTag):
    """A tag's leases (``HeldTag``) and where the takes stand in ``lease``, read
    and written on the loop."""

    cur: int = 0  # next ID to hand out from `lease`
    stop: int = 0  # lease.end
    limit: int = 0  # below this no check is needed (the prefetch trigger, or stop)
    fetch: asyncio.Task[None] | None = None
    formatted: bool = False  # leases carry a format: IDs are rendered in _take


class AsyncIdPoolClient(LeaseHolder):
    """``await client.next_id(tag)``; the same options as ``IdPoolClient`` (tokens,
    ``max_count`` bounding what it holds per tag to twice that, ``max_batch``)."""

    def __init__(
        self,
        urls: Sequence[str] | str,
        *,
        timeout: float = 5.0,
        target_seconds: float = 60.0,
        prefetch_at: float = 0.15,
        initial_count: int = 1000,
        max_count: int = 1_000_000,
        max_batch: int = 100_000,
        return_at_exit: bool = True,
        tokens: Mapping[str, str] | None = None,
        token: str | None = None,
    ) -> None:
        self._tags: dict[str, _Tag] = {}
        self._closed = False
        self._loop: asyncio.AbstractEventLoop | None = None  # the loop it takes on
        # At exit the loop may be gone: _close_ref returns tails with blocking calls.
        super().__init__(
            urls, timeout, target_seconds, prefetch_at, initial_count, max_count, max_batch,
            return_at_exit, tokens, token, _close_ref,
        )  # fmt: skip

    def _after_fork_in_child(self) -> None:
        """A forked child forgets the parent's leases (see IdPoolClient's): it
        leases its own, in its own event loop."""
        self._tags = {}
        self._loop = None
        self._forked()

    async def next_id(self, tag: str) -> Any:
        t = self._tags.get(tag)
        if t is not None and not t.formatted:
            i = t.cur
            if i < t.limit:
                t.cur = i + 1
                return i
        return (await self._rendered(tag, 1))[0]

    async def next_ids(self, tag: str, n: int) -> Sequence[Any]:
        """``n`` IDs of ``tag``: a ``range`` when they come from one lease, else a
        list (of rendered IDs for a formatted tag)."""
        check_batch(n, self.max_batch)
        return await self._rendered(tag, n)

    async def _rendered(self, tag: str, n: int) -> Sequence[Any]:
        leases: list[Lease] = []
        parts = await self._take(tag, n, leases)
        now = time.time()
        if leases and leases[0].format is not None:
            pairs = zip(parts, leases, strict=True)
            return [v for part, lease in pairs for v in render_many(lease, part, now)]
        if len(parts) == 1:
            return parts[0]
        return [i for part in parts for i in part]

    async def _take(self, tag: str, n: int, leases: list[Lease] | None = None) -> list[range]:
        self._one_loop()
        t = self._tags.get(tag)
        if t is None:
            if not isinstance(tag, str) or not tag:
                raise ValueError("tag must be a non-empty string")
            t = self._tags[tag] = _Tag(tag, self.initial_count)
        parts: list[range] = []
        while n > 0:
            if self._closed:
                raise IdPoolClosed("the client is closed")
            # No await from here to the increment: atomic on the loop.
            lease = t.lease
            if (
                lease is not None
                and t.cur < t.stop
                and time.time() >= lease.until
                and not lease.late
            ):
                # Its reset period is over by this clock: never rendered with a later
                # date. Its tail goes back at close.
                t.ended.append((lease, t.cur))
                t.cur = t.stop
                continue
            take = min(n, t.stop - t.cur)
            if take > 0:
                parts.append(range(t.cur, t.cur + take))
                if leases is not None:
                    assert lease is not None
                    leases.append(lease)
                t.cur += take
                n -= take
                if t.cur > t.limit or t.limit == 0:
                    self._prefetch(t)
                continue
            if t.pending:
                self._switch(t)
                continue
            if t.fetch is None:
                if (error := t.backing_off()) is not None:
                    raise error
                self._start_fetch(t)
            task = t.fetch
            assert task is not None
            await asyncio.shield(task)  # a cancelled caller must not cancel the fetch
        return parts

    def _one_loop(self) -> None:
        """Refuse a second event loop running at once (the slow path: every take
        passes here at each lease). Two loops in two threads take with no lock
        between them: an adversarial run saw 5-26 IDs handed out twice. A loop
        that ended (asyncio.run for a warm-up) may hand over to another."""
        loop = asyncio.get_running_loop()
        if loop is not self._loop:
            if self._loop is not None and self._loop.is_running():
                raise RuntimeError(
                    "this AsyncIdPoolClient is in use by another running event loop: "
                    "use one client per event loop (or IdPoolClient across threads)"
                )
            self._loop = loop

    def _switch(self, t: _Tag) -> None:
        t.adapt_wish(self.target_seconds, self.max_count)
        lease = t.pending.popleft()
        t.lease, t.cur, t.stop = lease, lease.start, lease.end
        t.formatted = lease.format is not None
        t.started_at = time.monotonic()
        if t.pending or t.fetch is not None:
            t.limit = t.stop
        else:
            t.limit = lease.start + int(len(lease) * self.prefetch_at)

    def _prefetch(self, t: _Tag) -> None:
        if t.fetch is not None or t.pending or self._closed:
            t.limit = t.stop
        elif t.backing_off() is None:
            self._start_fetch(t)
            t.limit = t.stop
        else:
            t.limit = 0  # stays armed: the next take tries again after the backoff

    def _start_fetch(self, t: _Tag) -> None:
        t.fetch = asyncio.ensure_future(self._fetch(t, t.wish))
        t.fetch.add_done_callback(_consume)

    async def _fetch(self, t: _Tag, wish: int) -> None:
        asked = time.time()  # a lease whose period had ended by then is late
        handoff = _Handoff()
        try:
            try:
                leases = await asyncio.to_thread(handoff.lease, self, t.tag, wish)
            except RuntimeError as e:  # the executor is shut down: the interpreter is ending
                raise IdPoolError(f"lease for tag {t.tag!r} failed: {e}") from e
        except asyncio.CancelledError:
            # The loop is ending (asyncio.run returned) or the task was cancelled:
            # the thread goes on, and a lease that lands is given back from there.
            handoff.abandon(self)
            raise
        except IdPoolError as e:
            t.error = e
            t.retry_at = time.monotonic() + RETRY_BACKOFF
            if t.cur < t.stop:
                t.limit = 0  # re-arm the prefetch
            return
        finally:
            t.fetch = None
        t.error = None
        if self._closed:
            tails = [(x, x.start) for x in leases]
            try:
                await asyncio.to_thread(self._give_back, tails)
            except RuntimeError:  # the executor is shut down: the interpreter is ending
                threading.Thread(target=self._give_back, args=(tails,), daemon=True).start()
            return
        t.pending.extend(lease.asked_at(asked) for lease in leases)
        if t.cur >= t.stop:
            self._switch(t)

    async def aclose(self) -> CloseReport:
        """Stop serving and return every unused tail, once. Safe to call twice."""
        tails = self._cut()
        if tails is None:
            return self.report
        fetches = [t.fetch for t in self._tags.values() if t.fetch is not None]
        await asyncio.to_thread(self._give_back, tails)
        if fetches:  # a lease on its way is returned by its own task
            await asyncio.wait(fetches, timeout=self.transport.timeout * 2 + 1)
        return self.report

    def _cut(self) -> list[Tail] | None:
        """Stop serving; the unused tails (no await: atomic on the loop). None if closed."""
        if self._closed:
            return None
        self._stop_taking()
        return self._tails()

    def _stop_taking(self) -> None:
        """No take starts after this: the fast path reads ``limit`` 0, the slow path
        ``_closed``. (One under way in another thread may still finish.)"""
        self._closed = True
        atexit.unregister(self._at_exit)
        for t in list(self._tags.values()):
            t.limit = 0

    def _tails(self) -> list[Tail]:
        """The unused tails, once no take is under way (``_stop_taking`` first)."""
        tails: list[Tail] = []
        for t in list(self._tags.values()):
            tails += t.unused(t.cur, t.stop)
            t.cur = t.stop = t.limit = 0
        return tails

    def _give_back(self, tails: Iterable[Tail]) -> None:
        """Return tails (blocking: run in a thread). Two threads may: aclose's, and
        a _Handoff's for a lease that landed after its loop ended. Defined here, not
        only inherited, so a thread giving back is inside this class's code for the
        exit hook (``_CLIENT_CODE``), as it always was."""
        super()._give_back(tails)

    async def __aenter__(self) -> AsyncIdPoolClient:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()

    def held(self, tag: str) -> int:
        """IDs of ``tag`` this client holds now (at most twice ``max_count``)."""
        t = self._tags.get(tag)
        if t is None:
            return 0
        return max(0, t.stop - t.cur) + sum(map(len, t.pending))


class _Handoff:
    """A lease fetched in a worker thread for a task that may be cancelled while it
    waits (its loop ending: asyncio.run returned mid-prefetch). The answer was
    then dropped, neither handed out nor returned (100-200 IDs). Whichever of the
    thread's answer and the cancellation comes second gives the leases back."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.abandoned = False
        self.leases: list[Lease] | None = None

    def lease(self, client: AsyncIdPoolClient, tag: str, wish: int) -> list[Lease]:
        leases = client.transport.lease(tag, wish)
        with self.lock:
            if not self.abandoned:
                self.leases = leases
                return leases
        client._give_back([(x, x.start) for x in leases])
        return []

    def abandon(self, client: AsyncIdPoolClient) -> None:
        with self.lock:
            self.abandoned = True
            landed, self.leases = self.leases, None
        if landed:  # answered, but the task was cancelled before it resumed
            threading.Thread(
                target=client._give_back, args=([(x, x.start) for x in landed],)
            ).start()


def _consume(task: asyncio.Task[None]) -> None:
    if not task.cancelled():
        task.exception()


def _close_ref(ref: weakref.ref[AsyncIdPoolClient]) -> None:
    """At exit (atexit, a multiprocessing finalizer), in whatever thread runs it."""
    client = ref()
    if client is not None:
        tails = _cut_at_exit(client)
        if tails:
            client._give_back(tails)


def _cut_at_exit(client: AsyncIdPoolClient) -> list[Tail] | None:
    """The client's tails, cut from whatever thread runs the hook, beside takes in
    other threads: new ones stopped first, those under way waited for (the module
    docstring). None when closed, or when a thread stayed inside the client."""
    if client._closed:
        return None
    client._stop_taking()
    deadline = time.monotonic() + EXIT_WAIT
    # Quiet, then every limit still 0: a take under way may have re-armed one (a
    # prefetch) before it left; any take starting after this reads 0 or _closed.
    while _inside_elsewhere() or any(t.limit for t in list(client._tags.values())):
        if time.monotonic() > deadline:  # paused, or blocked: its IDs stay with it
            client.report.lost.append(
                f"every unused ID: another thread was still taking after {EXIT_WAIT}s at exit"
            )
            return None
        for t in list(client._tags.values()):
            t.limit = 0
        time.sleep(0.001)
    return client._tails()


# Every function of the client's class: a thread with one of them on its stack may
# be between a take's read of ``cur`` and its increment.
_CLIENT_CODE = frozenset(
    f.__code__ for f in vars(AsyncIdPoolClient).values() if isinstance(f, types.FunctionType)
)


def _inside_elsewhere() -> bool:
    """Whether a thread but this one is running the client's code now."""
    here = threading.get_ident()
    for ident, frame in sys._current_frames().items():
        f: types.FrameType | None = frame
        while ident != here and f is not None:
            if f.f_code in _CLIENT_CODE:
                return True
            f = f.f_back
    return False
