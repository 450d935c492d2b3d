"""Closed-loop HTTP load on loopback: wrk (Debian's package, as ``ops/bench``
uses it) when installed, else a small asyncio client. Both stop by themselves
after the given seconds; the asyncio client also after ``max_requests``.
"""

from __future__ import annotations

import asyncio
import shutil
import time
from dataclasses import asdict, dataclass
from typing import Any
from urllib.parse import urlsplit

from ops.benchmark.load import Load, run_wrk


@dataclass(frozen=True)
class LoadResult:
    tool: str
    requests: int
    errors: int
    seconds: float
    p50_ms: float
    p99_ms: float
    max_ms: float

    @property
    def req_per_s(self) -> float:
        return self.requests / self.seconds if self.seconds > 0 else 0.0

    def as_dict(self) -> dict[str, Any]:
        return {**asdict(self), "req_per_s": self.req_per_s}


def drive(url: str, seconds: float, connections: int = 64) -> LoadResult:
    """Load ``url`` (loopback only) with ``connections`` closed-loop clients."""
    if urlsplit(url).hostname != "127.0.0.1":
        raise ValueError(f"load goes to 127.0.0.1 only, not {url}")
    if shutil.which("wrk"):
        r = run_wrk(url, seconds, Load(threads=1, connections=connections))
        return LoadResult("wrk", r.requests, r.errors, r.seconds, r.p50_ms, r.p99_ms, r.max_ms)
    return asyncio.run(_drive(url, seconds, connections, max_requests=5_000_000))


async def _drive(url: str, seconds: float, connections: int, max_requests: int) -> LoadResult:
    parts = urlsplit(url)
    host, port = parts.hostname or "127.0.0.1", parts.port or 80
    request = (
        f"GET {parts.path}{'?' + parts.query if parts.query else ''} HTTP/1.1\r\n"
        f"Host: {host}:{port}\r\n\r\n"
    ).encode()
    latencies: list[float] = []
    errors = 0
    started = time.monotonic()
    deadline = started + seconds

    async def client() -> None:
        nonlocal errors
        reader: asyncio.StreamReader | None = None
        writer: asyncio.StreamWriter | None = None
        while time.monotonic() < deadline and len(latencies) + errors < max_requests:
            t0 = time.monotonic()
            try:
                if writer is None or reader is None:
                    reader, writer = await asyncio.open_connection(host, port)
                writer.write(request)
                head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 2.0)
                length = 0
                for line in head.split(b"\r\n")[1:]:
                    name, _, value = line.partition(b":")
                    if name.strip().lower() == b"content-length":
                        length = int(value)
                await asyncio.wait_for(reader.readexactly(length), 2.0)
                if head.split(b" ", 2)[1] != b"200":
                    errors += 1
                    continue
                latencies.append(time.monotonic() - t0)
            except (OSError, asyncio.IncompleteReadError, TimeoutError, ValueError):
                errors += 1
                if writer is not None:
                    writer.close()
                reader = writer = None
                await asyncio.sleep(0.01)
        if writer is not None:
            writer.close()

    await asyncio.gather(*(client() for _ in range(connections)))
    elapsed = time.monotonic() - started
    latencies.sort()

    def q(p: float) -> float:
        return latencies[min(len(latencies) - 1, int(p * len(latencies)))] * 1000

    if not latencies:
        return LoadResult("asyncio", errors, errors, elapsed, 0.0, 0.0, 0.0)
    return LoadResult(
        "asyncio", len(latencies) + errors, errors, elapsed, q(0.5), q(0.99), latencies[-1] * 1000
    )
