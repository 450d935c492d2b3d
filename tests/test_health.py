"""The node's view of its stores (service/health.py): what marks a store down."""

from __future__ import annotations

import asyncio
from typing import Any, cast

import pytest

from idpool.pool.clock import FakeClock
from idpool.pool.errors import StoreUnavailable, StrictNotConfirmed
from idpool.pool.stores import LedgerStore
from idpool.service.health import PROBE_EVERY, StoreHealth


def test_a_strict_take_not_confirmed_is_not_redis_down() -> None:
    """A cluster shard's replica down makes its strict takes unconfirmed while Redis
    answers: counted as down, every strict request logged store_down, then
    store_up at the next answer (an adversarial run saw it flap)."""
    health = StoreHealth(cast(LedgerStore, cast(Any, object())), None)
    health.failed(StrictNotConfirmed("a replica of that shard is down"))
    assert health.is_up("redis")
    health.failed(StoreUnavailable("redis", "no answer"))
    assert not health.is_up("redis")


class CountingLedger:
    """A ledger that answers every ping, counting them."""

    def __init__(self) -> None:
        self.pings = 0

    async def ping(self) -> None:
        self.pings += 1


@pytest.mark.anyio
async def test_the_background_probe_runs_every_second_on_the_clock(clock: FakeClock) -> None:
    ledger = CountingLedger()
    health = StoreHealth(cast(LedgerStore, ledger), None, clock)
    probes = asyncio.ensure_future(health.run())
    await clock.until_sleeping()
    assert ledger.pings == 1  # at once
    await clock.advance(PROBE_EVERY - 0.1)
    assert ledger.pings == 1
    await clock.advance(0.1 + 3 * PROBE_EVERY)
    assert ledger.pings == 5
    probes.cancel()
    await asyncio.gather(probes, return_exceptions=True)


@pytest.mark.anyio
async def test_a_probe_on_demand_runs_at_most_once_in_max_age(clock: FakeClock) -> None:
    ledger = CountingLedger()
    health = StoreHealth(cast(LedgerStore, ledger), None, clock)
    await health.probe_soon(max_age=0.5)
    await health.probe_soon(max_age=0.5)  # within max_age: the last probe stands
    assert ledger.pings == 1
    await clock.advance(0.5)
    await health.probe_soon(max_age=0.5)
    assert ledger.pings == 2


def test_a_store_down_is_shown_with_the_time_it_failed(clock: FakeClock) -> None:
    health = StoreHealth(cast(LedgerStore, cast(Any, object())), None, clock)
    health.failed(StoreUnavailable("redis", "no answer"))
    assert health.last_error["redis"] == (clock.now(), "no answer")
