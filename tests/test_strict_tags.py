from __future__ import annotations

import asyncio

import pytest

from idpool.pool.claims import LedgerClaims, RedisSkip
from idpool.pool.errors import StoreSkipped, StoreUnavailable
from idpool.pool.ledger import Ledger
from idpool.pool.redis_pool import RedisPool
from idpool.pool.strict import RedisStrict, StrictCounter
from idpool.service.kinds import rules_of
from idpool.service.kinds.strict import GroupCommit, NodeStrictEvents, StrictTags
from idpool.service.stats import NodeStats

pytestmark = pytest.mark.anyio


class SlowCounter:
    """A sequence whose every call takes a while: calls made and their sizes."""

    def __init__(self) -> None:
        self.next = 1
        self.calls: list[int] = []
        self.fail: StoreUnavailable | None = None

    async def take(self, tag: str, n: int) -> int:
        self.calls.append(n)
        await asyncio.sleep(0.01)
        if self.fail is not None:
            raise self.fail
        first, self.next = self.next, self.next + n
        return first


async def test_concurrent_requests_share_one_call_in_queue_order() -> None:
    counter = SlowCounter()
    queue = GroupCommit("t", counter.take)
    sizes = [1 + i % 4 for i in range(50)]
    alone = asyncio.ensure_future(queue.take(sizes[0]))
    await asyncio.sleep(0.001)  # the drain task starts its call
    assert counter.calls == [1]
    # the first request's call is in flight: the 49 that arrive meanwhile go together
    firsts = [await alone, *await asyncio.gather(*(queue.take(n) for n in sizes[1:]))]
    assert counter.calls == [1, sum(sizes) - 1]
    expected, at = [], 1
    for n in sizes:
        expected.append(at)
        at += n
    assert firsts == expected  # queue order: consecutive, no gap, no overlap


async def test_a_request_sent_after_an_answer_goes_in_a_later_call() -> None:
    counter = SlowCounter()
    queue = GroupCommit("t", counter.take)
    first = await queue.take(1)
    second = await queue.take(1)
    assert second > first and counter.calls == [1, 1]


async def test_a_failed_call_fails_its_batch_only() -> None:
    counter = SlowCounter()
    queue = GroupCommit("t", counter.take)
    counter.fail = StoreUnavailable("redis", "down")
    results = await asyncio.gather(*(queue.take(1) for _ in range(3)), return_exceptions=True)
    assert all(isinstance(r, StoreUnavailable) for r in results)
    counter.fail = None
    assert await queue.take(2) == 1  # nothing was taken by the failed calls


async def test_a_cancelled_request_does_not_disturb_its_batch() -> None:
    counter = SlowCounter()
    queue = GroupCommit("t", counter.take)
    first = asyncio.ensure_future(queue.take(1))
    await asyncio.sleep(0)
    waiting = [asyncio.ensure_future(queue.take(1)) for _ in range(3)]
    await asyncio.sleep(0)
    waiting[1].cancel()
    await first
    done = [await waiting[0], await waiting[2]]
    assert done == [2, 4]  # the cancelled request's ID is skipped, never handed out


async def test_fails_fast_after_a_store_error_and_comes_back() -> None:
    counter = SlowCounter()
    now = [100.0]
    tags = StrictTags(counter.take, "redis", clock=lambda: now[0])
    counter.fail = StoreUnavailable("redis", "Connection refused")
    with pytest.raises(StoreUnavailable, match="strict tags need redis"):
        await tags.take("t", 1)
    counter.fail = None
    with pytest.raises(StoreUnavailable, match="redis"):
        await tags.take("t", 1)  # within the second: not sent
    assert counter.calls == [1]
    now[0] += 1.5
    assert await tags.take("t", 1) == 1  # back by itself



async def test_one_redis_skip_for_strict_takes_pops_and_claims() -> None:
    """The process's one Redis skip: a failed pop or claim skips strict takes
    for a second, and a failed strict take skips pops and claims."""
    counter = SlowCounter()
    now = [100.0]
    skip = RedisSkip(lambda: now[0])
    tags = StrictTags(counter.take, "redis", skip=skip)
    skip.failed(StoreUnavailable("redis", "a pop timed out"))
    with pytest.raises(StoreSkipped, match="strict tags need redis.*a pop timed out"):
        await tags.take("t", 1)
    assert counter.calls == []  # not sent
    now[0] += 1.5
    counter.fail = StoreUnavailable("redis", "Connection refused")
    with pytest.raises(StoreUnavailable, match="strict tags need redis"):
        await tags.take("t", 1)
    skipped = skip.skipping()  # pops and claims see it
    assert skipped is not None and "Connection refused" in skipped.detail
    # in the store's own words: a segment tag's 503 quotes it, and is no strict tag
    assert "strict" not in skipped.detail, skipped.detail
    assert counter.calls == [1]

async def test_group_commit_on_real_redis_batches_and_never_repeats(
    ledger: Ledger, redis_pool: RedisPool, tag: str
) -> None:
    await ledger.add_tag(tag, step=50, start=1, rules=rules_of("strict"))
    stats = NodeStats()
    seq = StrictCounter(
        RedisStrict(redis_pool),
        LedgerClaims(ledger, redis_pool),
        kind="strict", step_of=lambda t: 50,
        events=NodeStrictEvents(stats),
    )
    tags = StrictTags(seq.take, "redis")
    sizes = [1 + i % 7 for i in range(300)]
    firsts = await asyncio.gather(*(tags.take(tag, n) for n in sizes))
    ids = [i for f, n in zip(firsts, sizes, strict=True) for i in range(f, f + n)]
    assert len(ids) == len(set(ids)) == sum(sizes)
    assert firsts == sorted(firsts)  # queue order is arrival order here
    assert tags.queues[tag].calls <= 3
    await seq.close()


async def test_a_ledger_error_does_not_hold_back_the_other_tags() -> None:
    calls: list[str] = []
    failing = {"a"}

    async def take(tag: str, n: int) -> int:
        calls.append(tag)
        if tag in failing:
            raise StoreUnavailable("mysql", "Lost connection")  # a refill's claim failed
        return 1

    seen: list[StoreUnavailable] = []
    tags = StrictTags(take, "redis", on_error=seen.append)
    with pytest.raises(StoreUnavailable, match="strict tags need mysql"):
        await tags.take("a", 1)
    assert await tags.take("b", 1) == 1  # tag b's state holds IDs: served
    failing.clear()
    assert await tags.take("a", 1) == 1  # and a is asked again at once
    assert calls == ["a", "b", "a"] and [e.store for e in seen] == ["mysql"]


async def test_the_503_names_every_store_the_probe_finds_down() -> None:
    async def take(tag: str, n: int) -> int:
        raise StoreUnavailable("redis", "Connection refused")

    async def also_down(failed: str) -> str:
        return "; mysql down too: gone"

    tags = StrictTags(take, "redis", also_down=also_down)
    with pytest.raises(StoreUnavailable) as failed:
        await tags.take("t", 1)
    assert "redis" in str(failed.value) and "mysql down too" in str(failed.value)
