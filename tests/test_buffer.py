from __future__ import annotations

import asyncio

import pytest

from idpool.pool.errors import StoreUnavailable
from idpool.pool.ranges import IdRange
from idpool.service.buffer import Draining, SegmentBuffer

pytestmark = pytest.mark.anyio


class FakeSupply:
    """Hands out consecutive ranges of `step`; can be made slow or failing."""

    def __init__(self, step: int = 10, start: int = 1) -> None:
        self.step = step
        self.next_start = start
        self.calls = 0
        self.delay = 0.0
        self.fail: BaseException | None = None
        self.gate: asyncio.Event | None = None

    async def __call__(self, tag: str, ids: int = 1) -> list[IdRange]:
        """Whole ranges of `step` holding at least `ids` IDs, as a pool pop gives."""
        self.calls += 1
        if self.gate is not None:
            await self.gate.wait()
        if self.delay:
            await asyncio.sleep(self.delay)
        if self.fail is not None:
            raise self.fail
        ranges = []
        while not ranges or sum(map(len, ranges)) < ids:
            ranges.append(IdRange(self.next_start, self.next_start + self.step))
            self.next_start = ranges[-1].end
        return ranges


async def test_switch_has_no_gap_and_no_repeat() -> None:
    supply = FakeSupply(step=10)
    buf = SegmentBuffer("t", supply, prefetch_at=0.1)
    ids = [await buf.take_waiting() for _ in range(95)]
    assert ids == list(range(1, 96))


async def test_prefetch_starts_at_the_threshold_and_runs_in_background() -> None:
    supply = FakeSupply(step=100)
    buf = SegmentBuffer("t", supply, prefetch_at=0.1)
    assert await buf.take_waiting() == 1
    assert supply.calls == 1
    for _ in range(9):
        buf.take()  # IDs 2..10: 10% not yet passed
    assert not buf.fetching and supply.calls == 1
    assert buf.take() == 11  # the 11th ID crosses 10%
    assert buf.fetching
    await asyncio.sleep(0)
    await asyncio.sleep(0)
    assert buf.next == IdRange(101, 201) and not buf.fetching


async def test_requests_never_wait_while_the_next_range_is_ready() -> None:
    supply = FakeSupply(step=20)
    buf = SegmentBuffer("t", supply, prefetch_at=0.5)
    await buf.take_waiting()
    for _ in range(15):
        buf.take()
    await asyncio.sleep(0.01)  # prefetch done
    supply.gate = asyncio.Event()  # from now on the store hangs
    taken = [buf.take() for _ in range(24)]  # finish range 1, all of range 2
    assert None not in taken
    assert taken == list(range(17, 41))


async def test_every_range_prefetches_its_successor() -> None:
    supply = FakeSupply(step=10)
    buf = SegmentBuffer("t", supply, prefetch_at=0.5)
    assert await buf.take_waiting() == 1
    taken = []
    for _ in range(49):
        taken.append(buf.take())
        await asyncio.sleep(0)  # a prefetch started by this take can land
    assert taken == list(range(2, 51))  # no None: never had to wait on the store
    assert supply.calls == 6


async def test_prefetch_at_one_is_a_single_buffer_refilled_when_empty() -> None:
    supply = FakeSupply(step=10)
    buf = SegmentBuffer("t", supply, prefetch_at=1.0)
    ids = [await buf.take_waiting() for _ in range(10)]
    await asyncio.sleep(0.01)
    assert supply.calls == 1 and not buf.fetching and buf.next is None
    assert buf.take() is None  # empty: the next request waits on the store
    assert buf.take_many(5) == []
    assert await buf.take_waiting() == 11
    assert supply.calls == 2
    assert ids == list(range(1, 11))


async def test_take_many_spans_ranges_in_order() -> None:
    supply = FakeSupply(step=7)
    buf = SegmentBuffer("t", supply, prefetch_at=0.1)
    ids = await buf.take_many_waiting(50)
    assert ids == list(range(1, 51))
    ids = await buf.take_many_waiting(3)
    assert ids == [51, 52, 53]


async def test_concurrent_waiters_share_one_fetch_and_get_distinct_ids() -> None:
    supply = FakeSupply(step=1000)
    buf = SegmentBuffer("t", supply, prefetch_at=0.1)
    ids = await asyncio.gather(*(buf.take_waiting() for _ in range(500)))
    assert sorted(ids) == list(range(1, 501))
    assert supply.calls <= 2


async def test_failed_fetch_fails_fast_then_recovers() -> None:
    supply = FakeSupply(step=5)
    supply.fail = StoreUnavailable("redis", "down")
    now = [100.0]
    buf = SegmentBuffer("t", supply, prefetch_at=0.1, clock=lambda: now[0])
    with pytest.raises(StoreUnavailable):
        await buf.take_waiting()
    calls = supply.calls
    with pytest.raises(StoreUnavailable):  # within the backoff: no new store call
        await buf.take_waiting()
    assert supply.calls == calls
    supply.fail = None
    now[0] += 0.25
    assert await buf.take_waiting() == 1


async def test_drain_returns_the_exact_remainder_once_and_stops_serving() -> None:
    supply = FakeSupply(step=10)
    buf = SegmentBuffer("t", supply, prefetch_at=0.1)
    for _ in range(3):
        await buf.take_waiting()  # 1,2,3; prefetch of 11-20 started
    await asyncio.sleep(0.01)
    remainder = await buf.drain()
    assert remainder == [IdRange(4, 11), IdRange(11, 21)]
    assert buf.take() is None
    with pytest.raises(Draining):
        await buf.take_waiting()
    assert await buf.drain() == []


async def test_drain_waits_for_a_fetch_under_way() -> None:
    supply = FakeSupply(step=10)
    buf = SegmentBuffer("t", supply, prefetch_at=0.0)
    await buf.take_waiting()  # 1; prefetch begins at once
    supply.gate = asyncio.Event()
    for _ in range(3):
        buf.take()
    supply.next_start = 11
    draining = asyncio.ensure_future(buf.drain())
    await asyncio.sleep(0.01)
    assert not draining.done()
    supply.gate.set()
    assert await draining == [IdRange(5, 11), IdRange(11, 21)]


async def test_a_batch_caught_by_a_drain_hands_out_nothing_and_loses_nothing() -> None:
    # Issue 10, defect 6: the batch took 1-10, waited for more, got 503 from the
    # drain, and 1-10 were neither served nor returned.
    supply = FakeSupply(step=10)
    buf = SegmentBuffer("t", supply, prefetch_at=1.0)  # no prefetch: the batch must wait
    assert await buf.take_waiting() == 1
    supply.gate = asyncio.Event()
    batch = asyncio.ensure_future(buf.take_many_waiting(15))  # 9 in memory, 6 missing
    await asyncio.sleep(0.01)
    draining = asyncio.ensure_future(buf.drain())
    await asyncio.sleep(0.01)
    supply.gate.set()
    remainder = await draining
    outcome = await asyncio.gather(batch, return_exceptions=True)
    served = outcome[0] if isinstance(outcome[0], list) else []
    returned = {i for r in remainder for i in range(r.start, r.end)}
    assert not served or len(served) == 15  # a batch is served whole or not at all
    assert returned.isdisjoint(served)
    assert returned | set(served) == set(range(2, 21))  # every ID after 1: served or returned


async def test_a_failed_batch_takes_nothing() -> None:
    supply = FakeSupply(step=10)
    buf = SegmentBuffer("t", supply, prefetch_at=1.0)
    assert await buf.take_waiting() == 1
    supply.fail = StoreUnavailable("redis", "down")
    with pytest.raises(StoreUnavailable):
        await buf.take_many_waiting(15)
    assert buf.in_memory == 9 and await buf.take_waiting() == 2  # 2-10 are still there


async def test_a_batch_larger_than_the_buffer_is_one_fetch() -> None:
    supply = FakeSupply(step=10)
    buf = SegmentBuffer("t", supply, prefetch_at=1.0)
    assert await buf.take_waiting() == 1
    calls = supply.calls
    ids = await buf.take_many_waiting(10_000)
    assert ids == list(range(2, 10_002))
    assert supply.calls == calls + 1  # not a thousand fetches of 10


async def test_the_reserve_holds_seconds_of_this_buffers_consumption() -> None:
    # A new range needs Redis: the reserve is what a node serves while Redis is out.
    supply = FakeSupply(step=10)
    now = [100.0]
    clock = lambda: now[0]  # noqa: E731
    # rate_span 0.05 s: the default 5 s, on this test's compressed clock
    buf = SegmentBuffer(
        "t", supply, prefetch_at=0.1, reserve_seconds=2.0, rate_span=0.05, clock=clock
    )
    plain = SegmentBuffer("p", FakeSupply(step=10), prefetch_at=0.1, clock=clock)
    for _ in range(40):
        await buf.take_waiting()
        await plain.take_waiting()
        now[0] += 0.005  # some hundred IDs/s
        await asyncio.sleep(0)
    for _ in range(10):
        await asyncio.sleep(0)  # the last fetch lands
    assert buf.rate > 20
    assert buf.in_memory >= buf.rate * 2.0 - 10  # two seconds' worth, give or take a range
    assert plain.in_memory <= 20  # Leaf's double buffer alone: two ranges at most
    ids = [await buf.take_waiting() for _ in range(200)]
    assert len(set(ids)) == 200 and ids == sorted(ids)


async def test_one_large_batch_does_not_read_as_a_huge_rate() -> None:
    # One /ids?count=10000 measured over 50 ms read as 200,000 IDs/s: the node then
    # held a reserve of millions.
    supply = FakeSupply(step=10)
    buf = SegmentBuffer("t", supply, prefetch_at=0.1, reserve_seconds=30.0)
    await buf.take_waiting()
    for _ in range(3):
        await buf.take_many_waiting(10_000)
    await asyncio.sleep(0.05)
    assert buf.rate == 0.0  # not measured over less than MIN_RATE_SPAN
    assert buf.in_memory < 20_000
