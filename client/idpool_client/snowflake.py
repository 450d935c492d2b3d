"""Snowflake IDs made in this process: no network call per ID.

``SnowflakeClient.next_id(tag)`` leases a worker ID of a snowflake tag from a
node once (``POST /worker/{tag}``), then makes time-ordered IDs from the wall
clock, the worker ID and a sequence, under a lock. A thread renews the lease
every quarter of its TTL with the last time used (``POST /worker/{tag}/renew``,
any node; it shows the lease's secret, which only the grant's answer carries).
The client stops making IDs ``margin_ms`` before the lease could
expire, by its own monotonic clock counted from when the last successful
renewal was *sent*, and at once when a renewal is refused (409
``worker_lost``): it then asks for a new worker ID, whose time floor is above
everything the old one used. So no worker ID is ever used by two holders, and
no ID is made twice (docs/design/snowflake.md).

The layout and the generator are ``generator.py``'s, the same the node makes
its IDs with (``idpool.pool.snowflake`` subclasses them); this module is the
client's holding of a worker ID: its grant, renewals, release and the runs of
one time unit that ``next_id`` draws from without a lock.

    from idpool_client.snowflake import SnowflakeClient
    with SnowflakeClient(["http://10.0.0.1:8000"]) as ids:
        event_id = ids.next_id("events")
"""

from __future__ import annotations

import atexit
import functools
import operator
import os
import socket
import sys
import threading
import time
import weakref
from collections import deque
from collections.abc import Callable, Iterator
from itertools import compress, takewhile
from typing import Any
from urllib.parse import quote

from .errors import IdPoolClosed, IdPoolError, IdPoolRequestError, SnowflakeStopped
from .generator import _BOOTTIME, Generator, Layout, lease_clock
from .holding import _LIVE, close_at_child_exit, close_ref
from .transport import Transport

try:  # built from _clockrun.c where a compiler was at hand (optional, see pyproject.toml)
    from ._clockrun import ClockRun
except ImportError:  # pragma: no cover - a pure-Python install
    ClockRun = None  # type: ignore[assignment,misc]

# A batch (next_ids) returns no ID made more than this before it returns, as a
# node's /ids (service/kinds/snowflake_leases.py BATCH_MS): time order at a second with others.
BATCH_MS = 500


class SnowflakeBatchTooLarge(IdPoolError, ValueError):
    """``next_ids`` asked for more IDs than one worker ID makes in BATCH_MS; the
    message names the tag's maximum (``limit``)."""

    def __init__(self, tag: str, n: int, limit: int) -> None:
        super().__init__(
            f"next_ids({tag!r}, {n}): at most {limit} IDs per batch for this tag (what one "
            f"worker ID makes in {BATCH_MS} ms); collected over longer, its first IDs would "
            "be older than IDs others handed out meanwhile: ask in batches of that size"
        )
        self.limit = limit


def batch_limit(layout: Layout) -> int:
    """The most IDs one worker ID makes in BATCH_MS (as the server's)."""
    return (1 << layout.sequence_bits) * max(1, BATCH_MS // layout.unit_ms)


def _clock_run(
    first: int,
    limit: int,
    until_lease: float,
    lease_now: Callable[[], float],
    until_ns: int | None = None,
    clock_ns: Callable[[], int] | None = None,
) -> tuple[Iterator[int], Callable[[], None]]:
    """The rest of one time unit's sequence, what ``next_id`` draws from without a
    lock, and what ends it at once (``close``, a refused renewal): ``first``,
    ``first + 1``, ... below ``limit``, while the lease clock, read at each draw
    after the number is taken, is before ``until_lease`` (the run's deadline:
    the lease's, one unit of real time, or the unit's end on the wall clock
    projected onto the lease clock; see ``_slow_id``), and, given ``clock_ns``
    (a test's own wall clock, which real time does not move), that clock before
    ``until_ns``. So an ID never carries a time unit that had ended when it was
    drawn: a process paused (SIGSTOP, a VM stalled, a long GC) with a run half
    used finds its unit over on the first draw after, and the run ends for good
    (its rest never handed out, never made again: the generator is already past
    it). The lease clock, not the wall clock: a wall clock stepped back kept a
    run going for the whole step, past the lease's deadline.

    Each draw is one C call under the GIL (two threads never draw the same): the
    C ClockRun (``_clockrun.c``, which reads CLOCK_BOOTTIME as ``lease_clock``
    does) where it was built and the clock is that one, else ``range`` iterators
    cut by ``takewhile`` over the clock's readings, the same logic in C building
    blocks with a Python clock call per ID (~2.5x the segment client's
    ``next_id``, where ClockRun is ~1.3x; BENCHMARKS.md).

    A ticker thread that ended each run every 0.1 s did not do this: after a
    pause, the thread that held the GIL went on handing out the old run for up
    to a switch interval before the ticker could run, IDs over a second older
    than ones nodes had made meanwhile.
    """
    if ClockRun is not None and clock_ns is None and lease_now is _BOOTTIME:
        run = ClockRun(first, limit, int(until_lease * 1e9))
        return run, run.end
    numbers = iter(range(first, limit))
    # compress draws the number first, then reads the clock: as ClockRun.
    drawn: Iterator[int] = compress(
        numbers, takewhile(functools.partial(operator.gt, until_lease), iter(lease_now, None))
    )
    if clock_ns is not None and until_ns is not None:
        before = takewhile(functools.partial(operator.gt, until_ns), iter(clock_ns, None))
        drawn = compress(drawn, before)
    ended = functools.partial(numbers.__setstate__, sys.maxsize)  # type: ignore[attr-defined]
    return drawn, ended


class _Held:
    def __init__(self, tag: str, grant: dict[str, Any], gen: Generator) -> None:
        self.tag = tag
        self.worker = int(grant["worker"])
        self.generation = int(grant["generation"])
        # Renewals and the release show it: the generation alone is guessable. Kept
        # here only (never logged); a node older than worker secrets gives none.
        self.secret = str(grant.get("secret", ""))
        self.ttl = int(grant["ttl_ms"]) / 1000
        self.margin = int(grant["margin_ms"]) / 1000
        self.gen = gen
        self.lock = threading.Lock()
        self.done = threading.Event()
        self.renew_failed: str | None = None  # why the last renewal did not land, if so

    def stopped(self, e: SnowflakeStopped) -> SnowflakeStopped:
        """``e`` naming the tag, the worker ID and, for a lease run out, why the
        renewals failed (the generator knows neither)."""
        why = f"{e}; the last renewal failed: {self.renew_failed}" if self.renew_failed else e
        return SnowflakeStopped(f"tag {self.tag!r}, worker ID {self.worker}: {why}")


def _expiry(answer: object) -> int | None:
    """The lease's expiry (server unix ms) a grant or renewal answered: the
    ceiling of the IDs' time. From a node older than ``expires_ms``, a grant's is
    its ``server_ms + ttl_ms`` (the script grants exactly that); a renewal's is
    not known (None)."""
    if not isinstance(answer, dict):
        return None
    value = answer.get("expires_ms")
    if isinstance(value, int) and not isinstance(value, bool):
        return value
    server, ttl = answer.get("server_ms"), answer.get("ttl_ms")
    if isinstance(server, int) and isinstance(ttl, int) and "renewed" not in answer:
        return server + ttl
    return None


def _default_holder() -> str:
    return f"{socket.gethostname()}-{os.getpid()}"


class SnowflakeClient:
    def __init__(
        self,
        urls: list[str] | tuple[str, ...] | str,
        *,
        timeout: float = 5.0,
        holder: str | None = None,
        transport: Transport | None = None,
        clock_ns: Callable[[], int] = time.time_ns,
        release_at_exit: bool = True,
    ) -> None:
        self.transport = transport or Transport(
            [urls] if isinstance(urls, str) else list(urls), timeout
        )
        self.transport.calls.setdefault("worker", 0)
        self._named_holder = holder
        self.holder = holder or _default_holder()
        self._held: dict[str, _Held] = {}
        # tag -> the current unit's run (the hot path), and what ends it (_clock_run)
        self._runs: dict[str, Iterator[int]] = {}
        self._run_ends: dict[str, Callable[[], None]] = {}
        # tag -> the last ms a lost worker ID used: its replacement starts above it
        self._floor_ms: dict[str, int] = {}
        self._lock = threading.Lock()
        self._closed = False
        self._clock_ns = clock_ns  # the wall clock IDs are made from (a test passes its own)
        # At exit, the worker IDs go back (as close()): a process that ends without
        # closing held them for their lease's TTL, one per process of a pool.
        self._at_exit = functools.partial(close_ref, weakref.ref(self))
        self._release_at_exit = release_at_exit
        if release_at_exit:
            atexit.register(self._at_exit)
        _LIVE.add(self)

    def _after_fork_in_child(self) -> None:
        """A child process (os.fork: multiprocessing's default start on Linux,
        gunicorn --preload, celery prefork) inherits this client's worker IDs and
        runs, which its parent goes on using: parent and child then made the same
        IDs (50 of 50). The child forgets them (its parent's to renew and release)
        and leases worker IDs of its own at its next call; its locks are new (one
        held by another thread at the fork would never be released here)."""
        for end in self._run_ends.values():
            end()  # in the child's copy only: a run a child thread still holds
        self._runs = {}
        self._run_ends = {}
        for held in self._held.values():
            held.gen.lost = "the parent process holds this worker ID"
        self._held = {}
        self._lock = threading.Lock()
        if self._named_holder is None:
            self.holder = _default_holder()
        if self._release_at_exit:
            close_at_child_exit(self._at_exit)

    def next_id(self, tag: str) -> int:
        """One ID of ``tag``; raises SnowflakeStopped (no lease renewal in time,
        or the clock far behind), IdPoolUnavailable (no worker ID to be had).

        No lock while the current run lasts: one C call, which reads the clock
        (see _clock_run)."""
        try:  # try costs nothing until it catches
            return next(self._runs[tag])
        except (KeyError, StopIteration):  # no run yet; the unit over or used up
            return self._slow_id(tag)

    def next_ids(self, tag: str, n: int) -> list[int]:
        """``n`` IDs of ``tag``, none made more than BATCH_MS before they are
        returned (as a node's ``/ids``). Raises SnowflakeBatchTooLarge (also a
        ValueError) when ``n`` is more than one worker ID makes in BATCH_MS; IDs
        that grew stale while the batch waited (other threads sharing the
        sequence, a pause) are dropped, never returned, and made again."""
        if n < 1:
            raise ValueError("n must be at least 1")
        held = self._held.get(tag) or self._grant(tag)
        limit = batch_limit(held.gen.layout)
        if n > limit:
            raise SnowflakeBatchTooLarge(tag, n, limit)
        found: deque[tuple[float, int]] = deque()  # (monotonic time made, ID)
        while len(found) < n:
            value = self.next_id(tag)
            made = time.monotonic()
            found.append((made, value))
            while made - found[0][0] > BATCH_MS / 1000:
                found.popleft()  # too old to return: skipped, never handed out
        return [value for _, value in found]

    def _slow_id(self, tag: str) -> int:
        """A new run for the current unit, under the tag's lock: the lease's
        deadline and the clock's steps are checked here (Generator.take), once
        per run. A unit chosen while the lease held is safe to finish later: a
        new holder of the worker ID starts above the lease's expiry."""
        while True:
            held = self._held.get(tag) or self._grant(tag)
            try:
                with held.lock:
                    run = self._runs.get(tag)
                    if run is not None and held.gen.lost is None:
                        # Another thread made a run while this one waited for the
                        # lock: draw from it while its unit lasts (asking the
                        # generator would find the unit used up and wait for the next).
                        i = next(run, None)
                        if i is not None:
                            return i
                    got = held.gen.take_unit()
                    if got is not None:
                        value, limit, until_ns, until_lease = got
                        # The rest of this unit's sequence goes to the lock-free path,
                        # for as long as the unit lasts: with the real wall clock, its
                        # end projected onto the lease clock, one clock read per ID
                        # (the lease clock first: a pause between the two reads only
                        # ends the run sooner). A test's own wall clock is read as is.
                        lease_now = held.gen.monotonic
                        if self._clock_ns is time.time_ns:
                            boot = lease_now()
                            left_s = (until_ns - time.time_ns()) / 1e9
                            until = min(until_lease, boot + left_s)
                            run, end = _clock_run(value + 1, limit, until, lease_now)
                        else:
                            run, end = _clock_run(
                                value + 1, limit, until_lease, lease_now, until_ns,
                                self._clock_ns,
                            )  # fmt: skip
                        self._run_ends[tag] = end
                        self._runs[tag] = run
                        # Race: close() set _closed and ended the runs it found between
                        # the take and the store above. Read after the store: either
                        # close() found this run, or this thread sees _closed.
                        if self._closed or held.gen.lost is not None:
                            end()
                        return value
            except SnowflakeStopped as e:
                self._runs.pop(tag, None)
                self._run_ends.pop(tag, None)
                if held.gen.lost is None or self._closed:
                    raise held.stopped(e) from None
                # Lost (a renewal refused): forget it; the next round asks for a
                # new worker ID. Its IDs start above every unit this one used (its
                # floor from the node may be lower: a lower worker ID in the same
                # unit would make smaller IDs than this thread's last).
                with self._lock:
                    if self._held.get(tag) is held:
                        del self._held[tag]
                        self._floor_ms[tag] = max(self._floor_ms.get(tag, 0), held.gen.last_ms)
                continue
            time.sleep(held.gen.wait_seconds())  # the next time unit

    def _grant(self, tag: str) -> _Held:
        with self._lock:
            if self._closed:
                raise IdPoolClosed("the client was closed")
            held = self._held.get(tag)
            if held is not None:
                return held
            sent = lease_clock()
            path = f"/worker/{quote(tag, safe='')}?holder={quote(self.holder, safe='')}"
            grant = self.transport._post("worker", path, None, f"worker ID for tag {tag!r}", tag)
            lay = grant["layout"]
            layout = Layout(
                lay["time_bits"], lay["worker_bits"], lay["sequence_bits"], lay["unit_ms"],
                lay["epoch_ms"],
            )  # fmt: skip
            stop_at = sent + (int(grant["ttl_ms"]) - int(grant["margin_ms"])) / 1000
            clock = self._clock_ns
            gen = Generator(
                layout,
                int(grant["worker"]),
                max(int(grant["floor_ms"]), self._floor_ms.get(tag, 0)),
                stop_at,
                # The real wall clock is the generator's own (time.time_ns, one C call).
                clock_ms=None if clock is time.time_ns else lambda: clock() // 1_000_000,
                ceiling_ms=_expiry(grant),
            )
            held = _Held(tag, grant, gen)
            self._held[tag] = held
            threading.Thread(target=self._renew, args=(held,), daemon=True).start()
            return held

    def _body(self, held: _Held) -> dict[str, Any]:
        with held.lock:
            last_ms = held.gen.last_ms
        return {
            "worker": held.worker,
            "generation": held.generation,
            "secret": held.secret,
            "last_ms": last_ms,
        }

    def _renew(self, held: _Held) -> None:
        path = f"/worker/{quote(held.tag, safe='')}/renew"
        while not held.done.wait(held.ttl / 4):
            sent = lease_clock()
            try:
                got = self.transport._post("worker", path, self._body(held), "renewal", held.tag)
            except IdPoolRequestError as e:
                held.gen.lost = f"the worker ID's lease was lost: {e.message}"
                with held.lock:  # the tag's run, if it is this worker ID's: ended now
                    if self._held.get(held.tag) is held and (end := self._run_ends.get(held.tag)):
                        end()
                return
            except IdPoolError as e:
                held.renew_failed = str(e)
                continue  # not renewed: the generator stops on its own deadline
            held.renew_failed = None
            # The deadline counts from the TTL this renewal gave (the lease's own,
            # recorded at its grant), never a longer one of this client's.
            # Not the larger of that and the last deadline: a node older than recorded
            # TTLs renews by its own, which may have moved the server's expiry earlier.
            answered = got.get("ttl_ms") if isinstance(got, dict) else None
            if isinstance(answered, int) and not isinstance(answered, bool) and answered > 0:
                held.ttl = answered / 1000
            held.gen.stop_at = sent + held.ttl - held.margin
            held.gen.cover(_expiry(got))  # the expiry the store recorded: no ID past it

    def close(self) -> None:
        """Give every worker ID back with the last time it used; safe twice."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
            atexit.unregister(self._at_exit)
            held_now = list(self._held.values())
            self._held.clear()
            for end in self._run_ends.values():
                end()  # one C call: a thread that read the run before the clear draws no more
            self._runs.clear()
            self._run_ends.clear()
        for held in held_now:
            held.done.set()
            with held.lock:
                lost = held.gen.lost
                held.gen.lost = "the client was closed"
            if lost is None:
                try:
                    path = f"/worker/{quote(held.tag, safe='')}/release"
                    self.transport._post("worker", path, self._body(held), "release", held.tag)
                except IdPoolError:
                    pass  # the lease expires by itself; its floor covers what was used

    def __enter__(self) -> SnowflakeClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
