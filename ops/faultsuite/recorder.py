"""Client threads that draw IDs from every node and record what they got.

Every ID received is one bit in a bitmap (offset from the tag's ``start_id``),
so a 30-minute run at tens of thousands of IDs a second holds a few megabytes,
not a Python set of millions of ints; a bit already set is a duplicate. Every
request attempt records its latency; a failed attempt records its status (an
HTTP status, or the name of the socket error) and the request moves on to the
next node, as a client behind a load balancer would. With an ``OrderLog``, each
answer is also recorded with when it was sent and answered, for the real-time
order check of strict tags (``order.py``).
"""

from __future__ import annotations

import random
import re
import threading
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Protocol

from ops.toolkit import NodeConnections

from .order import OrderLog

MAX_ATTEMPTS = 8  # per request, across nodes, before the request counts as failed
RETRY_PAUSE = 0.05  # seconds between attempts
REQUEST_TIMEOUT = 15.0  # longer than any store timeout a node waits out
# A node closes a keep-alive connection idle for 5 s (IDPOOL_KEEP_ALIVE_SECONDS, on
# either server); a request sent on it as it closes fails with RemoteDisconnected.
# Like a pooling client, open a new one instead.
IDLE_REUSE = 4.0


class IdSink(Protocol):
    """Where clients put the IDs they receive (IdBitmap; snowflake.SnowflakeIds)."""

    def add(self, ids: list[int]) -> None: ...


class IdBitmap:
    """One bit per ID from ``base`` up; grows on demand."""

    def __init__(self, base: int) -> None:
        self.base = base
        self.bits = bytearray(1 << 16)
        self.count = 0
        self.duplicates = 0
        self.duplicate_examples: list[int] = []

    def add(self, ids: list[int]) -> None:
        bits, base = self.bits, self.base
        top = max(ids) - base
        if top < 0 or min(ids) < base:
            raise ValueError(f"ID below the tag's start_id {base}: {min(ids)}")
        if top >> 3 >= len(bits):
            bits.extend(bytes(max(len(bits), (top >> 3) + 1 - len(bits))))
        for i in ids:
            o = i - base
            mask = 1 << (o & 7)
            if bits[o >> 3] & mask:
                self.duplicates += 1
                if len(self.duplicate_examples) < 20:
                    self.duplicate_examples.append(i)
            else:
                bits[o >> 3] |= mask
        self.count += len(ids)

    def is_set(self, i: int) -> bool:
        o = i - self.base
        return 0 <= o and (o >> 3) < len(self.bits) and bool(self.bits[o >> 3] & (1 << (o & 7)))

    def count_set(self, start: int, end: int) -> int:
        """How many IDs in [start, end) were received."""
        total = 0
        i = start
        while i < end and (i - self.base) & 7:
            total += self.is_set(i)
            i += 1
        whole_end = i + ((end - i) // 8) * 8
        if whole_end > i:
            a, b = (i - self.base) >> 3, (whole_end - self.base) >> 3
            total += int.from_bytes(self.bits[a:b], "little").bit_count()
        for j in range(whole_end, end):
            total += self.is_set(j)
        return total

    def unset_runs(self, start: int, end: int) -> list[tuple[int, int]]:
        """The runs [a, b) of IDs in [start, end) that were never received."""
        runs: list[tuple[int, int]] = []

        def add(a: int, b: int) -> None:
            if runs and runs[-1][1] == a:
                runs[-1] = (runs[-1][0], b)
            else:
                runs.append((a, b))

        lo = (start - self.base) >> 3
        hi = min(len(self.bits), ((end - self.base) >> 3) + 1)
        # Whole bytes of 0x00 or 0xff go in one step; only mixed bytes are read bit by bit.
        pos = lo
        for m in re.finditer(rb"\x00+|\xff+", bytes(self.bits[lo:hi])):
            for byte_index in range(pos, lo + m.start()):
                self._bits_of(byte_index, add)
            if m.group()[0] == 0:
                add(self.base + (lo + m.start()) * 8, self.base + (lo + m.end()) * 8)
            pos = lo + m.end()
        for byte_index in range(pos, hi):
            self._bits_of(byte_index, add)
        tail = self.base + hi * 8
        if tail < end:
            add(tail, end)
        clipped = [(max(a, start), min(b, end)) for a, b in runs]
        return [(a, b) for a, b in clipped if a < b]

    def _bits_of(self, byte_index: int, add: Callable[[int, int], None]) -> None:
        byte = self.bits[byte_index]
        for bit in range(8):
            if not byte & (1 << bit):
                add(self.base + byte_index * 8 + bit, self.base + byte_index * 8 + bit + 1)


@dataclass
class Tally:
    requests: int = 0  # requests that got their IDs (possibly after retries)
    failed_requests: int = 0  # requests that got no ID after MAX_ATTEMPTS
    failed_at: list[float] = field(default_factory=list)  # when each failed, s from `origin`
    failed_attempts: Counter[str] = field(default_factory=Counter)  # status -> attempts
    max_latency: float = 0.0  # longest single attempt, seconds
    max_latency_at: float = 0.0  # when it ended, seconds from `origin`
    max_request_latency: float = 0.0  # longest request including its retries
    messages: dict[str, str] = field(default_factory=dict)  # status -> first error message
    requests_since_failure: int = 0  # requests served after the last failed attempt
    # attempts per latency bucket: upper bound in seconds -> count
    histogram: Counter[float] = field(default_factory=Counter)

    def failure_windows(self, gap: float = 1.0) -> list[tuple[float, float]]:
        """Stretches of time in which requests failed (failures ``gap`` s apart or less
        are one stretch), as (first, last) seconds from the clients' origin."""
        windows: list[tuple[float, float]] = []
        for t in sorted(self.failed_at):
            if windows and t - windows[-1][1] <= gap:
                windows[-1] = (windows[-1][0], t)
            else:
                windows.append((t, t))
        return windows

    def quantile(self, q: float) -> float:
        """Upper bound of the bucket holding the q-quantile of attempt latencies."""
        total = sum(self.histogram.values())
        seen = 0
        for bound in sorted(self.histogram):
            seen += self.histogram[bound]
            if seen >= q * total:
                return bound
        return 0.0


BUCKETS = (0.001, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1, 0.2, 0.5, 1.0, 2.0, 5.0, 10.0, float("inf"))


class Clients:
    """``threads`` threads drawing IDs (``/id`` and ``/ids?count=``) at a bounded rate."""

    def __init__(
        self,
        ports: list[int],
        tag: str,
        bitmap: IdSink,
        *,
        threads: int,
        rate: float,
        seed: int,
        origin: float = 0.0,
        order: OrderLog | None = None,
    ) -> None:
        self.ports = ports
        self.order = order  # when given, each answer's send and answer times too (strict tags)
        self.tag = tag
        self.bitmap = bitmap
        self.tally = Tally()
        self.lock = threading.Lock()
        self.stopping = threading.Event()
        self.per_thread_interval = threads / rate  # seconds between one thread's requests
        self.seed = seed
        self.origin = origin  # monotonic time that latency timestamps count from
        self.threads = [
            threading.Thread(target=self._run, args=(n,), daemon=True) for n in range(threads)
        ]

    def start(self) -> None:
        for t in self.threads:
            t.start()

    def stop(self) -> None:
        self.stopping.set()
        for t in self.threads:
            t.join(REQUEST_TIMEOUT * 2)

    def _run(self, n: int) -> None:
        rng = random.Random(self.seed * 1000 + n)
        conns = NodeConnections(REQUEST_TIMEOUT, IDLE_REUSE)
        turn = n
        next_at = time.monotonic()
        while not self.stopping.is_set():
            single = rng.random() < 0.3
            path = f"/id/{self.tag}" if single else f"/ids/{self.tag}?count={rng.randint(1, 100)}"
            started = time.monotonic()
            for _attempt in range(MAX_ATTEMPTS):
                port = self.ports[turn % len(self.ports)]
                turn += 1
                sent = time.monotonic()
                answer = conns.get_ids(f"127.0.0.1:{port}", path)
                answered = time.monotonic()
                self._observe(answer.seconds)
                if answer.ids is not None:
                    if self.order is not None:
                        self.order.add(sent, answered, answer.ids)
                    self.bitmap_add(answer.ids, answered - started)
                    break
                if answer.message:
                    with self.lock:
                        self.tally.messages.setdefault(answer.status, answer.message)
                self._fail(answer.status)
                time.sleep(RETRY_PAUSE)
            else:
                with self.lock:
                    self.tally.failed_requests += 1
                    self.tally.failed_at.append(time.monotonic() - self.origin)
            next_at = max(next_at + self.per_thread_interval, time.monotonic() - 1.0)
            pause = next_at - time.monotonic()
            if pause > 0:
                self.stopping.wait(pause)
        conns.close()

    def bitmap_add(self, ids: list[int], request_latency: float) -> None:
        with self.lock:
            self.bitmap.add(ids)
            self.tally.requests += 1
            self.tally.requests_since_failure += 1
            self.tally.max_request_latency = max(self.tally.max_request_latency, request_latency)

    def _observe(self, took: float) -> None:
        with self.lock:
            tally = self.tally
            if took > tally.max_latency:
                tally.max_latency = took
                tally.max_latency_at = time.monotonic() - self.origin
            tally.histogram[next(b for b in BUCKETS if took <= b)] += 1

    def _fail(self, status: str) -> None:
        with self.lock:
            self.tally.failed_attempts[status] += 1
            self.tally.requests_since_failure = 0
