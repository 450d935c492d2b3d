"""service/source.py: where a node's ranges come from (pool pop, then a claim)."""

from __future__ import annotations

from typing import Any

import pytest

from idpool.pool.claims import REDIS_SKIP_SECONDS, LedgerClaims
from idpool.pool.errors import NoRangeAvailable, StoreUnavailable
from idpool.pool.ranges import IdRange
from idpool.service.source import RangeSource

pytestmark = pytest.mark.anyio


class DownRedis:
    """A pool whose every call fails, counting the calls that reached it."""

    name = "redis"

    def __init__(self) -> None:
        self.calls = 0

    async def _fail(self, *args: Any, **kwargs: Any) -> Any:
        self.calls += 1
        raise StoreUnavailable("redis", "connection refused")

    pop = high_water = check = _fail


class Ledger:
    name = "mysql"
    claims = 0

    async def claim(self, tag: str, ranges: int = 1, kind: str = "segment") -> IdRange:
        self.claims += 1
        return IdRange(1, 11)

    async def ping(self) -> None:
        pass


async def test_pops_and_claims_share_one_redis_skip() -> None:
    now = [100.0]
    redis, ledger = DownRedis(), Ledger()
    claims = LedgerClaims(ledger, redis, clock=lambda: now[0])  # type: ignore[arg-type]
    source = RangeSource(claims, redis)  # type: ignore[arg-type]
    with pytest.raises(NoRangeAvailable):
        await source.fetch("t")
    tried = redis.calls
    assert tried >= 1 and ledger.claims == 0  # no mark read: no claim
    # A claim's failed mark read started the skip: the next fetch neither pops
    # nor reads the mark (one Redis timeout per skip, not one per call) ...
    claims.redis_failed(StoreUnavailable("redis", "mark read timed out"))
    with pytest.raises(NoRangeAvailable, match="mark read timed out"):
        await source.fetch("t")
    assert redis.calls == tried
    # ... and once the skip is over both try Redis again.
    now[0] += REDIS_SKIP_SECONDS
    with pytest.raises(NoRangeAvailable):
        await source.fetch("t")
    assert redis.calls > tried
