"""In-process timing of the hot path: taking the next ID from a node's buffer."""

from __future__ import annotations

import asyncio
import time
import timeit
from typing import Any

from pool.ranges import IdRange
from service.buffer import SegmentBuffer
from service.stats import LatencyHistogram


def _best_ns_per_call(statement: str, names: dict[str, Any], calls: int, repeat: int) -> float:
    best = min(timeit.repeat(statement, globals=names, number=1, repeat=repeat))
    return best / calls * 1e9


def steady_take(calls: int = 2_000_000, repeat: int = 7) -> dict[str, float]:
    """``buf.take()`` inside one range (no switch), best of ``repeat`` loops, the
    loop's own cost included; the empty loop is reported beside it."""

    async def fetch(tag: str) -> IdRange:
        return IdRange(1, 1 + 10 * calls * repeat)  # one range that outlasts every loop

    # prefetch_at=1: no prefetch, which would need an event loop; the test costs the same
    buf = SegmentBuffer("micro", fetch, prefetch_at=1.0)
    asyncio.run(buf.take_waiting())
    names: dict[str, Any] = {"take": buf.take, "r": range(calls)}
    take_ns = _best_ns_per_call("for _ in r: take()", names, calls, repeat)
    loop_ns = _best_ns_per_call("for _ in r: pass", names, calls, repeat)
    return {"take_ns": take_ns, "empty_loop_ns": loop_ns}


def switching_take(ids: int = 2_000_000, step: int = 1000) -> dict[str, float]:
    """``buf.take()`` across ranges of ``step`` IDs on an event loop: the range
    switch and the start of each prefetch are timed, the fetch itself (a store
    call, off the request path) is not."""

    async def run() -> float:
        next_start = 1

        async def fetch(tag: str) -> IdRange:
            nonlocal next_start
            r = IdRange(next_start, next_start + step)
            next_start = r.end
            return r

        buf = SegmentBuffer("micro", fetch, prefetch_at=0.1)
        await buf.take_waiting()
        take = buf.take
        spent = 0.0
        chunk = range(100)
        for _ in range(ids // 100):
            started = time.perf_counter()
            for _ in chunk:
                take()
            spent += time.perf_counter() - started
            await asyncio.sleep(0)  # let a prefetch started in the chunk land
        return spent

    return {"take_ns": min(asyncio.run(run()) for _ in range(3)) / ids * 1e9, "step": step}


def histogram_observe(calls: int = 1_000_000, repeat: int = 5) -> dict[str, float]:
    """What one request adds for its latency: two clock reads and one observe."""
    hist = LatencyHistogram()
    names: dict[str, Any] = {"obs": hist.observe, "clock": time.perf_counter, "r": range(calls)}
    ns = _best_ns_per_call("for _ in r: s = clock(); obs(clock() - s)", names, calls, repeat)
    return {"clock_and_observe_ns": ns}


def run_all(quick: bool) -> dict[str, dict[str, float]]:
    scale = 4 if quick else 1
    return {
        "steady": steady_take(calls=2_000_000 // scale),
        "switching": switching_take(ids=2_000_000 // scale),
        "histogram": histogram_observe(calls=1_000_000 // scale),
    }
