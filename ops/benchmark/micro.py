"""In-process timing of the hot path: taking the next ID from a node's buffer."""

from __future__ import annotations

import asyncio
import time
import timeit
from typing import Any

from starlette.types import ASGIApp, Message, Scope

from idpool.pool.ledger import Ledger
from idpool.pool.ranges import IdRange
from idpool.pool.redis_pool import RedisPool
from idpool.pool.settings import Settings
from idpool.service.app import create_app
from idpool.service.buffer import SegmentBuffer
from idpool.service.stats import LatencyHistogram

from .apps import bare_asgi, ceiling


def _best_ns_per_call(statement: str, names: dict[str, Any], calls: int, repeat: int) -> float:
    best = min(timeit.repeat(statement, globals=names, number=1, repeat=repeat))
    return best / calls * 1e9


def steady_take(calls: int = 2_000_000, repeat: int = 7) -> dict[str, float]:
    """``buf.take()`` inside one range (no switch), best of ``repeat`` loops, the
    loop's own cost included; the empty loop is reported beside it."""

    async def fetch(tag: str, ids: int) -> list[IdRange]:
        return [IdRange(1, 1 + 10 * calls * repeat)]  # one range that outlasts every loop

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

        async def fetch(tag: str, ids: int) -> list[IdRange]:
            nonlocal next_start
            r = IdRange(next_start, next_start + step)
            next_start = r.end
            return [r]

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


def handler_overhead(
    settings: Settings,
    tag: str,
    calls: int = 20_000,
    repeat: int = 15,
    formatted: str | None = None,
) -> dict[str, float]:
    """``GET /id/{tag}`` through each whole ASGI app, called in-process with a
    fresh scope per call and a ``send`` that does nothing: idpool (its fast path,
    an ID in memory), the ceiling (Starlette's middleware, router, Request and
    Response) and the bare ASGI counter. What uvicorn does around it (HTTP
    parsing, the socket) is the same for all three and not counted. The range
    must hold calls * repeat IDs. ``formatted``: a tag with a format template,
    measured as ``idpool_formatted`` through the same app."""

    async def sent(message: Message) -> None:
        pass

    async def request_received() -> Message:
        # The fast path reads one message: a client that hung up gets no IDs (issue 19).
        return {"type": "http.request", "body": b"", "more_body": False}

    def best_ns(app: ASGIApp, path: str = f"/id/{tag}") -> float:
        started = time.perf_counter()
        for _ in range(calls):
            scope: Scope = {"type": "http", "method": "GET", "path": path}
            scope.update(headers=[], query_string=b"", root_path="")
            coro = app(scope, request_received, sent).__await__()
            try:
                next(coro)
            except StopIteration:
                continue
            raise RuntimeError("the app waited: no ID in memory")
        return (time.perf_counter() - started) / calls * 1e9

    async def run() -> dict[str, float]:
        app = create_app(settings.with_changes(preload=False))
        contenders: dict[str, ASGIApp] = {"idpool": app, "ceiling": ceiling(), "bare": bare_asgi()}
        async with app.router.lifespan_context(app):
            assert app.node is not None
            await app.node.next_id(tag)  # fill the buffer
            if formatted is not None:
                await app.node.next_id(formatted)
            best: dict[str, list[float]] = {name: [] for name in contenders}
            if formatted is not None:
                best["idpool_formatted"] = []
            for _ in range(repeat):  # interleaved, so all see the same machine
                for name, contender in contenders.items():
                    best[name].append(best_ns(contender))
                if formatted is not None:
                    best["idpool_formatted"].append(best_ns(app, f"/id/{formatted}"))
                await asyncio.sleep(0.01)  # let the prefetch and the stores' timers run
        return {f"{name}_ns": min(ns) for name, ns in best.items()}

    return asyncio.run(run())


def store_costs(settings: Settings, tag: str, calls: int = 300) -> dict[str, float]:
    """One connection, one call at a time: a ledger claim (the MySQL transaction)
    and a pool pop (the Lua script), in microseconds. The claimed ranges go through
    a scratch list and are then dropped (waste in the benchmark's own database)."""

    async def run() -> dict[str, float]:
        ledger = await Ledger.connect(settings)
        pool = RedisPool.from_settings(settings)
        scratch = f"{tag}_costs"
        try:
            started = time.perf_counter()
            claimed = [await ledger.claim(tag) for _ in range(calls)]
            claim_us = (time.perf_counter() - started) / calls * 1e6
            await pool.push(scratch, claimed, head=False)
            before = await _script_stats(pool)
            started = time.perf_counter()
            for _ in range(calls):
                await pool.pop(scratch)
            pop_us = (time.perf_counter() - started) / calls * 1e6
            after = await _script_stats(pool)
        finally:
            await pool.close()
            await ledger.close()
        # Redis's own CPU per script call over the pops (other clients' scripts
        # would count too: the benchmark's private redis-server has none)
        calls_seen = max(1, after[0] - before[0])
        return {
            "claim_us": claim_us,
            "pop_us": pop_us,
            "pop_redis_us": (after[1] - before[1]) / calls_seen,
        }

    return asyncio.run(run())


async def _script_stats(pool: RedisPool) -> tuple[int, int]:
    """(calls, microseconds) Redis has spent in EVALSHA since its start."""
    stats = (await pool.client.info("commandstats")).get("cmdstat_evalsha", {})
    return int(stats.get("calls", 0)), int(stats.get("usec", 0))


def run_all(quick: bool) -> dict[str, dict[str, float]]:
    scale = 4 if quick else 1
    return {
        "steady": steady_take(calls=2_000_000 // scale),
        "switching": switching_take(ids=2_000_000 // scale),
        "histogram": histogram_observe(calls=1_000_000 // scale),
    }
