"""The synchronous client: IDs from memory, leases fetched in a background thread.

Per tag one iterator that lives as long as the client:
``itertools.chain.from_iterable(refills)``. While its current *chunk* (a
``range`` iterator over part of a lease) lasts, ``next()`` on it is C code from
end to end: no bytecode runs, so the GIL is never handed over inside a draw, two
threads never draw the same number, and a draw costs about what
``next(itertools.count())`` costs. When a chunk runs out the chain asks
``refills`` (``iter(callable, sentinel)``) for the next one: that is the slow
path, Python under the tag's lock. It cuts the next chunk from the lease (the
first chunk ends at the prefetch trigger, so the fetch of the next lease starts
on time), switches to the next lease, or, only when the tag holds no ID, waits
for one.

Invariant: of all chunks ever made for a tag only the newest (``_Tag.chunk``)
may have numbers left. Cutting it (close, a ``next_ids`` batch) reads where it
stands and exhausts it in one step that no draw can enter (``_stop``), so a
number is either drawn or part of the cut, never both; the rest of the lease
(``_Tag.rest`` on) is never in a chunk. So a lease's unused IDs are always one
tail, returned once at close.

A refill never raises into the chain (a chain whose source raised ends for
good): an error comes back as a one-shot iterator that raises it (``_Raising``).

A tag with a format (``formats.py``: its leases carry it) has no chunks: each
refill takes one number from the lease's rest and answers it rendered, as a
one-item iterator the chain draws from at once (C code: no other thread can
draw it). So every ID of such a tag takes the slow path, under the tag's lock,
with the clock read per ID: its date is the moment it is handed out, clamped to
the lease's reset period (``within``), and a lease whose period has ended by
this clock is cut off (its tail goes back to its period's row at close). A
plain tag's draws never meet any of this.

Needs a Python with the GIL (a free-threaded build does not make a draw atomic).
"""

from __future__ import annotations

import atexit
import functools
import itertools
import operator
import sys
import threading
import time
from collections import deque
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

from .errors import IdPoolClosed, IdPoolError, IdPoolRequestError
from .formats import within
from .holding import (
    RETRY_BACKOFF,
    CloseReport,
    HeldTag,
    LeaseHolder,
    Tail,
    check_batch,
    close_ref,
    render_many,
)
from .transport import Lease

_NEVER = object()  # the refill sentinel: no refill returns it, so the chain never ends


class _Chunk(Protocol):
    """A ``range`` iterator: what the chain draws from."""

    def __iter__(self) -> _Chunk: ...
    def __next__(self) -> int: ...
    def __length_hint__(self) -> int: ...
    def __setstate__(self, index: int) -> None: ...


def _chunk(start: int, stop: int) -> _Chunk:
    chunk: _Chunk = iter(range(start, stop))  # type: ignore[assignment]
    return chunk


def _stop(chunk: _Chunk) -> int:
    """Exhaust ``chunk`` and answer how many numbers it had left, in one step no
    draw can enter: both calls run inside one bytecode (the unpacking), from C, so
    the GIL cannot change hands between them."""
    steps = (chunk.__length_hint__, functools.partial(chunk.__setstate__, sys.maxsize))
    left: int
    left, _ = map(operator.call, steps)  # type: ignore[arg-type]  # operator.call: C, not a lambda
    return left


class _Raising:
    """A refill that failed: raises its error once, then ends (the chain refills again)."""

    __slots__ = ("error",)

    def __init__(self, error: BaseException) -> None:
        self.error: BaseException | None = error

    def __iter__(self) -> _Raising:
        return self

    def __next__(self) -> int:
        error, self.error = self.error, None
        if error is None:
            raise StopIteration
        raise error


@dataclass(eq=False)
class _Tag(HeldTag):
    """A tag's leases (``HeldTag``: ``lease`` is the one chunks are cut from) and
    where the chunks stand in it, all under ``lock``."""

    lock: threading.Lock = field(default_factory=threading.Lock)
    ready: threading.Condition = field(init=False)
    rest: int = 0  # first ID of `lease` in no chunk and no batch yet
    trigger: int = 0  # a chunk from here on starts the fetch of the next lease
    chunk: _Chunk = field(default_factory=lambda: _chunk(0, 0))  # the newest chunk
    chunk_stop: int = 0
    fetcher: threading.Thread | None = None

    def __post_init__(self) -> None:
        self.ready = threading.Condition(self.lock)

    def forget_after_fork(self, initial_count: int) -> None:
        """In a forked child: the leases are the parent's, which goes on serving
        them. The chunk is stopped (a chain the child holds, ``ids(tag)``, then
        refills through this object, from leases of the child's own) and the lock
        is new (one held by another thread at the fork is never released here)."""
        _stop(self.chunk)
        self.lock = threading.Lock()
        self.ready = threading.Condition(self.lock)
        self.lease, self.rest, self.trigger, self.chunk_stop = None, 0, 0, 0
        self.pending = deque()
        self.fetcher, self.error, self.retry_at = None, None, 0.0
        self.ended = []
        self.wish = initial_count  # the parent's rate is not the child's

    def held(self) -> int:
        """IDs in memory: the chunk's, the lease's rest and the next leases'."""
        ids = self.chunk.__length_hint__() + sum(map(len, self.pending))
        return ids + (0 if self.lease is None else self.lease.end - self.rest)


class IdPoolClient(LeaseHolder):
    """Hands out IDs of idpool tags from leased ranges; safe to share between threads.

    ``urls``: idpool nodes, tried in turn on failure. ``max_count``: the most IDs
    one lease holds, so the client holds at most twice that per tag (the lease
    being served and the next one). ``target_seconds``: how long a lease should
    last; the size asked for doubles while leases last less and halves when one
    lasts over twice as long (within ``max_count``). ``prefetch_at``: fraction of
    a lease used before the next is fetched. ``max_batch``: the most IDs one
    ``next_ids`` call takes (a larger ``n`` is a ValueError naming it).
    ``tokens``: a token per guarded tag (``{"orders": "..."}``), sent on its
    leases and returns; ``token``: the one sent for any other tag. Tokens are
    never logged or shown in a repr; a tag that refuses its token raises
    ``IdPoolAuthError`` naming the tag.
    """

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
        self._ids: dict[str, Iterator[Any]] = {}  # tag -> its chain, for next_id
        self._tags: dict[str, _Tag] = {}
        self._tags_lock = threading.Lock()
        self._closed = False
        super().__init__(
            urls, timeout, target_seconds, prefetch_at, initial_count, max_count, max_batch,
            return_at_exit, tokens, token, close_ref,
        )  # fmt: skip

    def _after_fork_in_child(self) -> None:
        """A child process (os.fork: multiprocessing's default start on Linux,
        gunicorn --preload, celery prefork) inherits the leases in memory, which
        its parent goes on serving: both would hand out the same IDs. The child
        forgets them (the parent's to use and return) and leases its own at its
        next call."""
        self._tags_lock = threading.Lock()
        for t in self._tags.values():
            t.forget_after_fork(self.initial_count)
        self._forked()

    # -- the hot path -------------------------------------------------------

    def next_id(self, tag: str) -> Any:
        """The next ID of ``tag``. Blocks only when no ID of the tag is in memory.

        An int; a str for a tag with a template (rendered as the node renders it)."""
        try:
            return next(self._ids[tag])  # try costs nothing until it catches
        except KeyError:
            chain = self._chain(tag, None)  # a tag not asked for before
        except StopIteration:
            chain = self._chain(tag, self._ids[tag])  # its chain ended: a new one
        return next(chain)

    def ids(self, tag: str) -> Iterator[Any]:
        """The IDs of ``tag`` as an iterator, the fastest way to take them one by
        one: ``next(it)`` is C code while a chunk lasts (``next_id`` adds a Python
        call and a dict lookup). Safe to share between threads; raises what
        ``next_id`` raises. Should it ever end (a KeyboardInterrupt delivered
        inside a refill ends a chain), ask for it again."""
        return self._chain(tag, None)

    def next_id_for(self, tag: str) -> Callable[[], Any]:
        """``next_id`` bound to ``tag``, the fastest call form: after
        ``next_id = client.next_id_for("orders")``, ``next_id()`` is the bound
        ``__next__`` of ``ids(tag)``, C code while a chunk lasts (no Python frame,
        no dict lookup). Thread-safe like ``ids``; should it ever raise
        StopIteration (see ``ids``), ask for it again."""
        return self.ids(tag).__next__

    def next_ids(self, tag: str, n: int) -> Sequence[Any]:
        """``n`` IDs of ``tag``: a ``range`` when they come from one lease, else a
        list (of rendered IDs for a formatted tag)."""
        check_batch(n, self.max_batch)
        t = self._tag(tag)
        parts: list[tuple[Lease, range]] = []
        now = time.time()
        with t.lock:
            try:
                while n > 0:
                    lease = self._holding(t)
                    if now >= lease.until and not lease.late:
                        self._period_ended(t, lease)
                        continue
                    take = min(n, lease.end - t.rest)
                    parts.append((lease, range(t.rest, t.rest + take)))
                    t.rest += take
                    n -= take
                    if t.rest >= t.trigger:
                        self._prefetch(t)
            except BaseException as e:
                failed: BaseException | None = e
                tails = self._undo(t, parts)
            else:
                failed, tails = None, []
        if failed is not None:
            self._give_back(tails)  # taken from leases this tag finished: back to the pool
            raise failed
        if parts[0][0].format is not None:
            return [v for lease, part in parts for v in render_many(lease, part, now)]
        if len(parts) == 1:
            return parts[0][1]
        return [i for _, part in parts for i in part]

    # -- the slow path --------------------------------------------------------

    def _refill(self, t: _Tag) -> Iterator[Any]:
        """The chain's next chunk (its source calls this when a chunk runs out).
        Never raises: the chain would end for good."""
        try:
            with t.lock:
                return self._next_chunk(t)
        except BaseException as e:
            return _Raising(e)

    def _next_chunk(self, t: _Tag) -> Iterator[Any]:
        """Called with the lock held."""
        if t.chunk.__length_hint__() > 0:
            # Another thread refilled while this one waited for the lock: both
            # chains' draws go to the same chunk (the chain keeps whichever it is
            # handed last; handing out the same object keeps every number once).
            return t.chunk
        lease = self._holding(t)
        if lease.format is not None:
            return self._next_rendered(t, lease)
        start, stop = t.rest, lease.end
        if start < t.trigger and t.fetcher is None and not t.pending:
            stop = t.trigger  # the next refill starts the prefetch
        else:
            self._prefetch(t)
        t.chunk, t.chunk_stop, t.rest = _chunk(start, stop), stop, stop
        return t.chunk

    def _next_rendered(self, t: _Tag, lease: Lease) -> Iterator[Any]:
        """One ID of a formatted tag, rendered, as a one-item iterator (the chain
        draws it at once). Never a date outside the lease's period: one whose
        period is over by this clock is cut off (a lease from the new period is
        fetched), and one from a period this clock has not reached yet (a node's
        clock ahead of ours) is rendered with its period's first moment.
        Called with the lock held."""
        while True:
            now = time.time()
            if now < lease.until or lease.late:
                break
            self._period_ended(t, lease)
            lease = self._holding(t)
        i = t.rest
        t.rest = i + 1
        if t.rest >= t.trigger:
            self._prefetch(t)
        assert lease.format is not None  # a tag's leases all carry its format
        return iter((lease.format.render(i, within(now, lease.since, lease.until)),))

    def _period_ended(self, t: _Tag, lease: Lease) -> None:
        """``lease``'s reset period is over by this clock: its numbers are never
        rendered with a later date. Cut it off; its tail goes back to its period's
        row at close. Called with the lock held, ``lease`` the one ``_holding``
        answered (no chunk is cut from a formatted tag's leases)."""
        if t.rest < lease.end:
            t.ended.append((lease, t.rest))
            t.rest = lease.end

    def _holding(self, t: _Tag) -> Lease:
        """The lease with IDs in its rest, switching to the next lease (waiting for
        it only when the tag holds no ID). Puts the chunk back first, also after a
        wait (another thread may have cut one meanwhile): what the caller cuts
        next starts where the chunk's draws stopped, and a lease is left only
        once every number of it is drawn or taken. Called with the lock held."""
        while True:
            if self._closed:
                raise IdPoolClosed("the client is closed")
            self._put_back(t)
            lease = t.lease
            if lease is not None and t.rest < lease.end:
                return lease
            if t.pending:
                t.adapt_wish(self.target_seconds, self.max_count)
                lease = t.lease = t.pending.popleft()
                t.rest = lease.start
                t.trigger = lease.start + int(len(lease) * self.prefetch_at)
                t.started_at = time.monotonic()
                continue
            if t.fetcher is None:
                if (error := t.backing_off()) is not None:
                    raise error  # fail fast while the nodes are down
                self._start_fetch(t)
            elif t.error is not None:
                raise t.error  # the fetcher is retrying in the background
            t.ready.wait()

    def _put_back(self, t: _Tag) -> None:
        """Stop the chunk; its undrawn numbers become the start of the lease's rest
        (a chunk is always cut from the rest's start, so they join it). Called with
        the lock held."""
        left = _stop(t.chunk)
        if left:
            t.rest = t.chunk_stop - left

    def _undo(self, t: _Tag, parts: list[tuple[Lease, range]]) -> list[Tail]:
        """A batch that failed half-way hands nothing out: each part is the tail of
        its lease; the current lease's goes back to its rest, the others' (leases
        this tag finished) are answered, to go back to the pool."""
        tails = []
        for lease, part in parts:
            if lease is t.lease and not self._closed:
                t.rest = min(t.rest, part.start)
            else:
                tails.append((lease, part.start))
        return tails

    def _prefetch(self, t: _Tag) -> None:
        if t.fetcher is None and not t.pending and not self._closed:
            if t.backing_off() is None:
                self._start_fetch(t)

    def _start_fetch(self, t: _Tag) -> None:
        thread = threading.Thread(
            target=self._fetch, args=(t,), name=f"idpool-lease-{t.tag}", daemon=True
        )
        t.fetcher = thread
        thread.start()

    def _fetch(self, t: _Tag) -> None:
        """Lease the next range; after a failure try again every RETRY_BACKOFF while
        the tag still holds IDs (the hot path never has to look)."""
        while True:
            leases: list[Lease] = []
            error: IdPoolError | None = None
            asked = time.time()  # a lease whose period had ended by then is late
            try:
                leases = self.transport.lease(t.tag, min(t.wish, self.max_count))
            except IdPoolError as e:
                error = e
            except Exception as e:  # a waiter must always be woken
                error = IdPoolError(f"lease for tag {t.tag!r} failed: {e!r}")
            with t.lock:
                t.error = error
                t.ready.notify_all()
                if error is None:
                    t.fetcher = None
                    if not self._closed:
                        t.pending.extend(lease.asked_at(asked) for lease in leases)
                        return
                    break  # close() ran meanwhile: these go straight back
                t.retry_at = time.monotonic() + RETRY_BACKOFF
                if self._closed or isinstance(error, IdPoolRequestError) or not t.held():
                    t.fetcher = None  # the next draw that finds nothing asks again
                    return
                t.ready.wait(RETRY_BACKOFF)  # close() wakes it
                if self._closed:
                    t.fetcher = None
                    return
        self._give_back([(lease, lease.start) for lease in leases])

    def _chain(self, tag: str, ended: Iterator[Any] | None) -> Iterator[Any]:
        """The tag's chain, made on first use, or again if ``ended`` is it. A chain
        that ended holds no chunk: the tag's state is in ``_Tag``, not in it."""
        t = self._tag(tag)
        with t.lock:
            chain = self._ids.get(tag)
            if chain is None or chain is ended:
                refills = iter(functools.partial(self._refill, t), _NEVER)
                chain = self._ids[tag] = itertools.chain.from_iterable(refills)
            return chain

    def _tag(self, tag: str) -> _Tag:
        t = self._tags.get(tag)
        if t is None:
            if not isinstance(tag, str) or not tag:
                raise ValueError("tag must be a non-empty string")
            with self._tags_lock:
                t = self._tags.setdefault(tag, _Tag(tag, self.initial_count))
        return t

    def held(self, tag: str) -> int:
        """IDs of ``tag`` this client holds now (at most twice ``max_count``)."""
        t = self._tags.get(tag)
        if t is None:
            return 0
        with t.lock:
            return t.held()

    # -- closing ------------------------------------------------------------

    def close(self) -> CloseReport:
        """Stop serving and return every unused tail, once. Safe to call twice."""
        with self._tags_lock:
            if self._closed:
                return self.report
            self._closed = True
            tags = list(self._tags.values())
        atexit.unregister(self._at_exit)
        tails: list[Tail] = []
        fetchers = []
        for t in tags:
            with t.lock:
                self._put_back(t)
                end = 0 if t.lease is None else t.lease.end
                tails += t.unused(t.rest, end)
                t.rest = max(t.rest, end)
                if t.fetcher is not None:
                    fetchers.append(t.fetcher)
                t.ready.notify_all()
        self._give_back(tails)
        for thread in fetchers:  # a lease on its way is returned by its own thread
            thread.join(self.transport.timeout * len(self.transport.servers) + 1)
        return self.report

    def __enter__(self) -> IdPoolClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
