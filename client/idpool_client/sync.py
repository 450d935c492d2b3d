"""The synchronous client: IDs from memory, leases fetched in a background thread.

Per tag a double buffer: the *run* being served (one ``itertools.count`` over
the current lease) and the leases fetched ahead (``pending``). ``next_id`` takes
no lock: ``next()`` on an ``itertools.count`` is one C call that the GIL makes
atomic, so two threads never draw the same number, and a number is handed out
only if it is below the run's ``limit``, read *after* the draw. Everything else
(the prefetch trigger, the switch to the next lease, a ``next_ids`` batch, the
return at close) happens under the tag's lock, in the slow path.

Retiring a run (close, or a ``next_ids`` batch cut out of it) sets ``limit = 0``
first and only then draws ``from`` from the counter: a thread that draws after
that sees ``limit == 0`` and goes to the slow path, which hands out a number only
below ``from``; a thread that drew before holds a number below ``from``. So no
number is both handed out and returned (or batched), and none above the lease.

Needs a Python with the GIL (a free-threaded build does not make ``next()`` on a
shared count atomic).
"""

from __future__ import annotations

import atexit
import functools
import itertools
import threading
import time
import weakref
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from .errors import IdPoolClosed, IdPoolError, IdPoolRequestError, IdPoolUnavailable
from .formats import within
from .transport import Lease, Transport

RETRY_BACKOFF = 0.5  # seconds between lease attempts after a failed one


class _Run:
    """One counter over ``[start, stop)`` of a lease; what ``next_id`` reads."""

    __slots__ = ("ids", "limit", "stop", "lease", "retired_from")

    def __init__(self, lease: Lease, start: int, limit: int) -> None:
        self.ids = itertools.count(start)
        self.stop = lease.end
        self.limit = min(limit, lease.end)  # below this, no check is needed
        self.lease = lease
        self.retired_from: int | None = None  # set (under the lock) when cut off


@dataclass
class _Tag:
    tag: str
    wish: int
    lock: threading.Lock = field(default_factory=threading.Lock)
    ready: threading.Condition = field(init=False)
    run: _Run | None = None
    pending: deque[Lease] = field(default_factory=deque)
    fetcher: threading.Thread | None = None
    error: IdPoolError | None = None
    retry_at: float = 0.0
    started_at: float = 0.0  # when the current lease was installed
    # tails of leases whose reset period ended (formats.py): returned at close
    ended: list[tuple[Lease, int]] = field(default_factory=list)

    def __post_init__(self) -> None:
        self.ready = threading.Condition(self.lock)


@dataclass
class CloseReport:
    returned: int = 0  # IDs given back to the pool
    # tails not returned, "lease first-last: why" (unknown_lease: Redis restarted or
    # the lease expired; the node unreachable): lost, never served twice
    lost: list[str] = field(default_factory=list)  # "lease first-last: why" for tails not returned


class IdPoolClient:
    """Hands out IDs of idpool tags from leased ranges; safe to share between threads.

    ``urls``: idpool nodes, tried in turn on failure. ``target_seconds``: how long
    a lease should last; the size asked for doubles while leases last less and
    halves when one lasts over twice as long (within ``max_count``).
    ``prefetch_at``: fraction of a lease used before the next is fetched.
    """

    def __init__(
        self,
        urls: Sequence[str] | str,
        *,
        timeout: float = 5.0,
        target_seconds: float = 60.0,
        prefetch_at: float = 0.15,
        initial_count: int = 1,
        max_count: int = 10_000_000,
        return_at_exit: bool = True,
    ) -> None:
        if not 0.0 <= prefetch_at < 1.0:
            raise ValueError("prefetch_at must be in [0, 1)")
        if target_seconds <= 0 or max_count < 1 or initial_count < 1:
            raise ValueError("target_seconds, max_count and initial_count must be positive")
        self.transport = Transport(list([urls] if isinstance(urls, str) else urls), timeout)
        self.target_seconds = target_seconds
        self.prefetch_at = prefetch_at
        self.initial_count = initial_count
        self.max_count = max_count
        self._runs: dict[str, _Run] = {}
        self._tags: dict[str, _Tag] = {}
        self._tags_lock = threading.Lock()
        self._closed = False
        self.report = CloseReport()  # filled by close()
        self._at_exit = functools.partial(_close_ref, weakref.ref(self))
        if return_at_exit:
            atexit.register(self._at_exit)

    # -- the hot path -------------------------------------------------------

    def next_id(self, tag: str) -> Any:
        """The next ID of ``tag``. Blocks only when no ID of the tag is in memory.

        An int; a str for a tag with a template (rendered as the node renders it).
        A formatted tag takes the tag's lock per ID (its runs are not in ``_runs``)."""
        try:
            run = self._runs[tag]  # a subscript is cheaper than .get(); try costs nothing
        except KeyError:
            return self._slow_id(tag, None, 0)
        i = next(run.ids)
        if i < run.limit:
            return i
        return self._slow_id(tag, run, i)

    def next_ids(self, tag: str, n: int) -> Sequence[Any]:
        """``n`` IDs of ``tag``: a ``range`` when they come from one lease, else a
        list (of rendered IDs for a formatted tag)."""
        if n < 1:
            raise ValueError("n must be at least 1")
        t = self._tag(tag)
        parts: list[range] = []
        leases: list[Lease] = []
        with t.lock:
            now = time.time()
            while n > 0:
                run = self._current(t)
                if now >= run.lease.until:
                    self._period_ended(t, run)
                    continue
                self._retire(run)  # run.retired_from: the first ID nobody has drawn
                start = run.retired_from
                assert start is not None
                take = min(n, run.stop - start)
                if take > 0:
                    parts.append(range(start, start + take))
                    leases.append(run.lease)
                    n -= take
                if start + take < run.stop:
                    # the rest of the lease as a new run (a new counter: the old one is dead)
                    self._install(t, run.lease, start + take, fresh=False)
        if leases[0].format is not None:
            return [
                v
                for part, lease in zip(parts, leases, strict=True)
                for v in _render_many(lease, part, now)
            ]
        if len(parts) == 1:
            return parts[0]
        return [i for part in parts for i in part]

    # -- the slow path --------------------------------------------------------

    def _slow_id(self, tag: str, run: _Run | None, i: int) -> Any:
        t = self._tag(tag)
        with t.lock:
            now = time.time()
            if run is None or i >= (run.stop if run.retired_from is None else run.retired_from):
                # i is past the run's end, or the run was cut off: never handed out.
                while True:
                    run = self._current(t)
                    if now >= run.lease.until:
                        self._period_ended(t, run)
                        continue
                    i = next(run.ids)
                    if i < run.stop:
                        break
                    self._retire(run)  # used up: _current switches to the next lease
            if i >= run.limit and run.retired_from is None:
                # Past the prefetch trigger: fetch the next lease, then let the rest
                # of this one go by the lock-free path.
                self._prefetch(t)
                if t.fetcher is not None or t.pending:
                    run.limit = run.stop
            fmt = run.lease.format
            if fmt is None:
                return i
            # never a date outside the lease's period (a node's clock ahead of ours)
            return fmt.render(i, within(now, run.lease.since, run.lease.until))

    def _period_ended(self, t: _Tag, run: _Run) -> None:
        """The lease's reset period is over by this clock: its numbers are never
        rendered with a later date. Cut it off; its tail goes back at close.
        Called with the lock held."""
        self._retire(run)
        assert run.retired_from is not None
        if run.retired_from < run.stop:
            t.ended.append((run.lease, run.retired_from))

    def _current(self, t: _Tag) -> _Run:
        """The tag's run, switching to the next lease (waiting for it if need be).
        Called with the lock held."""
        while True:
            if self._closed:
                raise IdPoolClosed("the client is closed")
            run = t.run
            if run is not None and run.retired_from is None:
                return run
            if t.pending:
                self._finished(t)
                lease = t.pending.popleft()
                self._install(t, lease, lease.start, fresh=True)
                continue
            if t.fetcher is None:
                if t.error is not None and time.monotonic() < t.retry_at:
                    raise t.error  # fail fast while the nodes are down
                self._start_fetch(t)
            t.ready.wait()

    def _install(self, t: _Tag, lease: Lease, start: int, *, fresh: bool) -> None:
        """Serve ``[start, lease.end)`` next; ``fresh``: a new lease (not a batch's cut)."""
        if fresh:
            t.started_at = time.monotonic()
        run = _Run(lease, start, lease.end)
        t.run = run
        if lease.format is None:
            self._runs[t.tag] = run
        else:  # rendered (and its period checked) in the slow path, under the lock
            self._runs.pop(t.tag, None)
        if t.pending or t.fetcher is not None:
            return  # the next lease is here or on its way: no trigger
        trigger = lease.start + int(len(lease) * self.prefetch_at)
        if start < trigger:
            run.limit = trigger
            return
        self._prefetch(t)  # a batch took the lease past its trigger
        run.limit = run.stop if t.fetcher is not None else 0  # 0: retry after the backoff

    def _prefetch(self, t: _Tag) -> None:
        if t.fetcher is None and not t.pending and not self._closed:
            if t.error is None or time.monotonic() >= t.retry_at:
                self._start_fetch(t)

    def _finished(self, t: _Tag) -> None:
        """The current lease is used up: adapt the size of the next lease asked for."""
        run = t.run
        if run is None:
            return
        lasted = time.monotonic() - t.started_at
        size = len(run.lease)
        if lasted < self.target_seconds:
            t.wish = min(self.max_count, 2 * max(t.wish, size))
        elif lasted > 2 * self.target_seconds:
            t.wish = max(1, min(t.wish, size) // 2)

    def _start_fetch(self, t: _Tag) -> None:
        thread = threading.Thread(
            target=self._fetch, args=(t, t.wish), name=f"idpool-lease-{t.tag}", daemon=True
        )
        t.fetcher = thread
        thread.start()

    def _fetch(self, t: _Tag, wish: int) -> None:
        leases: list[Lease] = []
        error: IdPoolError | None = None
        try:
            leases = self.transport.lease(t.tag, wish)
        except IdPoolError as e:
            error = e
        except Exception as e:  # a waiter must always be woken
            error = IdPoolError(f"lease for tag {t.tag!r} failed: {e!r}")
        with t.lock:
            t.fetcher = None
            t.error = error
            if error is not None:
                t.retry_at = time.monotonic() + RETRY_BACKOFF
                run = t.run
                if run is not None and run.retired_from is None:
                    run.limit = 0  # re-arm: the slow path tries again after the backoff
            elif not self._closed:
                t.pending.extend(leases)
                leases = []
            t.ready.notify_all()
        if leases:  # close() ran meanwhile: these go straight back
            self._give_back([(lease, lease.start) for lease in leases])

    def _retire(self, run: _Run) -> None:
        """Cut the run off at the first ID nobody has drawn (see the module docstring).
        Called with the lock held."""
        if run.retired_from is None:
            run.limit = 0  # first: every later draw goes to the slow path...
            run.retired_from = min(next(run.ids), run.stop)  # ...which hands out only below

    def _tag(self, tag: str) -> _Tag:
        t = self._tags.get(tag)
        if t is None:
            if not isinstance(tag, str) or not tag:
                raise ValueError("tag must be a non-empty string")
            with self._tags_lock:
                t = self._tags.setdefault(tag, _Tag(tag, self.initial_count))
        return t

    # -- closing ------------------------------------------------------------

    def close(self) -> CloseReport:
        """Stop serving and return every unused tail, once. Safe to call twice."""
        with self._tags_lock:
            if self._closed:
                return self.report
            self._closed = True
            tags = list(self._tags.values())
        atexit.unregister(self._at_exit)
        tails: list[tuple[Lease, int]] = []
        fetchers = []
        for t in tags:
            with t.lock:
                run = t.run
                if run is not None:
                    self._retire(run)
                    assert run.retired_from is not None
                    if run.retired_from < run.stop:
                        tails.append((run.lease, run.retired_from))
                tails += [(lease, lease.start) for lease in t.pending]
                tails += t.ended
                t.pending.clear()
                t.ended.clear()
                self._runs.pop(t.tag, None)
                if t.fetcher is not None:
                    fetchers.append(t.fetcher)
                t.ready.notify_all()
        self._give_back(tails)
        for thread in fetchers:  # a lease on its way is returned by its own thread
            thread.join(self.transport.timeout * len(self.transport.servers) + 1)
        return self.report

    def _give_back(self, tails: list[tuple[Lease, int]]) -> None:
        for lease, start in tails:
            try:
                returned = self.transport.give_back(lease, start)
            except (IdPoolRequestError, IdPoolUnavailable) as e:
                with self._tags_lock:
                    self.report.lost.append(f"{lease.lease_id} {start}-{lease.end - 1}: {e}")
                continue
            with self._tags_lock:
                self.report.returned += returned

    def __enter__(self) -> IdPoolClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    @property
    def lease_calls(self) -> int:
        """HTTP lease requests sent so far (failovers count each try)."""
        return self.transport.calls["lease"]


def _close_ref(ref: weakref.ref[IdPoolClient]) -> None:
    client = ref()
    if client is not None:
        client.close()


def _render_many(lease: Lease, numbers: range, now: float) -> list[Any]:
    fmt = lease.format
    assert fmt is not None
    return fmt.render_many(numbers, within(now, lease.since, lease.until))
