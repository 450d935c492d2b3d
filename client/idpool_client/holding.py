"""Lease holding, the part both clients share: ``IdPoolClient`` (threads) and
``AsyncIdPoolClient`` (one event loop) differ in how they take IDs and fetch
leases, not in what they hold.

Here: the options and their checks, the state of a tag's leases (``HeldTag``:
the lease served, the next ones, the tails of ended periods, the last fetch's
error and the size to ask for next), the size rule, the cut of the unused tails
at close and their return (each tail once, counted in a ``CloseReport``), and
what a forked child and the interpreter's exit do (``_LIVE``,
``close_at_child_exit``). Each client keeps its own locking and I/O: where its
cursor into the lease stands, its fetcher (a thread, or a task), its hot path.

Nothing here takes an ID: the asyncio client's exit hook waits for threads
inside that client's own methods (``aio._CLIENT_CODE``), which call what is
here, never the other way round.
"""

from __future__ import annotations

import atexit
import functools
import os
import sys
import threading
import time
import weakref
from collections import deque
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from .errors import IdPoolError, IdPoolRequestError, IdPoolUnavailable
from .formats import within
from .transport import Lease, Tokens, Transport

RETRY_BACKOFF = 0.5  # seconds between lease attempts after a failed one

Tail = tuple[Lease, int]  # a lease and the first ID of it not handed out


@dataclass
class CloseReport:
    returned: int = 0  # IDs given back to the pool
    # tails not returned, "fingerprint first-last: why" (unknown_lease: Redis restarted
    # or the lease expired; the node unreachable): lost, never served twice
    lost: list[str] = field(default_factory=list)


@dataclass(eq=False)
class HeldTag:
    """One tag's leases in a client. The client's own subclass adds where its
    cursor stands in ``lease`` and its fetcher; it reads and writes all of it
    under its lock (threads) or on its loop (asyncio)."""

    tag: str
    wish: int  # the size of the next lease asked for
    lease: Lease | None = None  # the lease served now
    pending: deque[Lease] = field(default_factory=deque)  # fetched, served next
    error: IdPoolError | None = None  # the last fetch's failure, if it failed
    retry_at: float = 0.0  # monotonic: no new fetch before this after a failure
    started_at: float = 0.0  # monotonic: when the current lease was installed
    # tails of leases whose reset period ended (formats.py): returned at close
    ended: list[Tail] = field(default_factory=list)

    def backing_off(self) -> IdPoolError | None:
        """The last fetch's failure while its backoff lasts (no new fetch now: a
        take that finds no ID raises it, failing fast while the nodes are down),
        else None."""
        if self.error is not None and time.monotonic() < self.retry_at:
            return self.error
        return None

    def adapt_wish(self, target_seconds: float, max_count: int) -> None:
        """The current lease is used up: the next one asked for doubles while
        leases last less than ``target_seconds``, halves when one lasted over
        twice that, within ``max_count``."""
        lease = self.lease
        if lease is None:
            return
        lasted = time.monotonic() - self.started_at
        size = len(lease)
        if lasted < target_seconds:
            self.wish = min(max_count, 2 * max(self.wish, size))
        elif lasted > 2 * target_seconds:
            self.wish = max(1, min(self.wish, size) // 2)

    def unused(self, rest: int, end: int) -> list[Tail]:
        """Every tail to give back at close, once: the current lease's from
        ``rest`` (when below ``end``, where the client's cursor stops), the next
        leases whole, the ended periods' tails. The client moves its cursor past
        ``end`` itself."""
        tails: list[Tail] = []
        if self.lease is not None and rest < end:
            tails.append((self.lease, rest))
        tails += [(lease, lease.start) for lease in self.pending]
        tails += self.ended
        self.pending.clear()
        self.ended.clear()
        return tails


class LeaseHolder:
    """The options, the transport, the close report and the exit and fork hooks
    of a leasing client; ``at_exit(ref)`` runs at interpreter exit (or a forked
    child's) with a weak reference to the client."""

    def __init__(
        self,
        urls: Sequence[str] | str,
        timeout: float,
        target_seconds: float,
        prefetch_at: float,
        initial_count: int,
        max_count: int,
        max_batch: int,
        return_at_exit: bool,
        tokens: Mapping[str, str] | None,
        token: str | None,
        at_exit: Callable[[weakref.ref[Any]], None],
    ) -> None:
        if not 0.0 <= prefetch_at < 1.0:
            raise ValueError("prefetch_at must be in [0, 1)")
        if target_seconds <= 0 or min(max_count, max_batch, initial_count) < 1:
            raise ValueError(
                "target_seconds, max_count, max_batch and initial_count must be positive"
            )
        self.transport = Transport(
            list([urls] if isinstance(urls, str) else urls), timeout, Tokens(tokens, token)
        )
        self.target_seconds = target_seconds
        self.prefetch_at = prefetch_at
        self.initial_count = min(initial_count, max_count)
        self.max_count = max_count
        self.max_batch = max_batch
        self.report = CloseReport()  # filled by close()
        self._report_lock = threading.Lock()
        self._at_exit = functools.partial(at_exit, weakref.ref(self))
        self._return_at_exit = return_at_exit
        if return_at_exit:
            atexit.register(self._at_exit)
        _LIVE.add(self)

    def _forked(self) -> None:
        """In a forked child: a report of its own, and its exit hook run at the
        child's end (see ``close_at_child_exit``)."""
        self.report = CloseReport()
        self._report_lock = threading.Lock()
        if self._return_at_exit:
            close_at_child_exit(self._at_exit)

    def _give_back(self, tails: Iterable[Tail]) -> None:
        """Give tails back (blocking HTTP), counting each in the report: returned,
        or lost with why (never retried elsewhere: never served twice)."""
        for lease, start in tails:
            try:
                count = self.transport.give_back(lease, start)
            except (IdPoolRequestError, IdPoolUnavailable) as e:
                with self._report_lock:
                    self.report.lost.append(f"{lease.fingerprint} {start}-{lease.end - 1}: {e}")
                continue
            with self._report_lock:
                self.report.returned += count

    @property
    def lease_calls(self) -> int:
        """HTTP lease requests sent so far (failovers count each try)."""
        return self.transport.calls["lease"]


def check_batch(n: int, max_batch: int) -> None:
    """Refuse a ``next_ids`` count below 1 or above the client's ``max_batch``
    before any lease: ``next_ids(tag, 10**9)`` leased a billion IDs (all wasted)
    and built a list of them."""
    if isinstance(n, bool) or not isinstance(n, int) or n < 1:
        raise ValueError(f"n must be a positive integer, not {n!r}")
    if n > max_batch:
        raise ValueError(
            f"n is {n}: next_ids takes at most max_batch={max_batch} IDs per call "
            "(ask in batches, or raise the client's max_batch)"
        )


def render_many(lease: Lease, numbers: range, now: float) -> list[Any]:
    """``numbers`` of a formatted tag's ``lease``, rendered with the moment
    ``now`` clamped to the lease's reset period."""
    fmt = lease.format
    assert fmt is not None  # a tag's leases all carry its format
    return fmt.render_many(numbers, within(now, lease.since, lease.until))


# -- processes: fork and exit -------------------------------------------------

# Every client of this process (both leasing clients and SnowflakeClient), for a
# forked child to reset: weak, so a client dropped is not kept.
_LIVE: weakref.WeakSet[Any] = weakref.WeakSet()


def _reset_after_fork() -> None:
    for client in list(_LIVE):
        client._after_fork_in_child()


def close_at_child_exit(close: Callable[[], None]) -> None:
    """In a child multiprocessing forked: ``close`` runs when the child ends
    normally. Its children end with os._exit, which runs no atexit handler, so a
    client used in a Pool worker or a Process kept every lease it took (64k IDs
    wasted by two Pool workers that drew 10 each); multiprocessing runs its own
    finalizers first. A child forked otherwise has atexit, as any process.

    Registered as one of multiprocessing's after-fork callbacks, which its child
    runs after clearing the finalizers it inherited (a Finalize made here, in
    os.fork's own hook, was cleared before the child's target ran)."""
    util = sys.modules.get("multiprocessing.util")
    if util is not None:
        util.register_after_fork(close, _finalize_at_exit)


def _finalize_at_exit(close: Callable[[], None]) -> None:
    import multiprocessing.util

    multiprocessing.util.Finalize(None, close, exitpriority=10)


def close_ref(ref: weakref.ref[Any]) -> None:
    """close() of a client still alive (atexit, a multiprocessing finalizer)."""
    client = ref()
    if client is not None:
        client.close()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_reset_after_fork)
