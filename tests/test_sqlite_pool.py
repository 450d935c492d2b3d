from __future__ import annotations

import asyncio
import multiprocessing
from collections.abc import AsyncIterator

import pytest

from idpool.pool.ranges import IdRange
from idpool.pool.settings import Settings
from idpool.pool.sqlite_pool import SqlitePool
from idpool.pool.stores import PoolStore, open_pool

pytestmark = pytest.mark.anyio


def R(text: str) -> IdRange:
    return IdRange.from_text(text)


# The tests taking `pool` hold the embedded pool to the Redis pool's behaviour.
@pytest.fixture(params=["redis", "sqlite"])
async def pool(
    request: pytest.FixtureRequest, settings: Settings, sqlite_settings: Settings
) -> AsyncIterator[PoolStore]:
    opened = await open_pool(settings if request.param == "redis" else sqlite_settings)
    yield opened
    await opened.close()


@pytest.fixture
async def sqlite_pool(sqlite_settings: Settings) -> AsyncIterator[SqlitePool]:
    opened = await SqlitePool.open(sqlite_settings)
    yield opened
    await opened.close()


async def test_fresh_ranges_at_tail_remainders_at_head(pool: PoolStore, tag: str) -> None:
    await pool.push(tag, [R("1-10"), R("11-20")], head=False)
    await pool.push(tag, [R("31-40")], head=False)
    result = await pool.push(tag, [R("5-10"), R("15-20")], head=True)
    assert (result.depth, result.dropped) == (5, [])
    assert [r.to_text() for r in await pool.ranges(tag)] == [
        "5-10",
        "15-20",
        "1-10",
        "11-20",
        "31-40",
    ]
    assert (await pool.pop(tag)).range == R("5-10")
    assert await pool.depth(tag) == 4
    assert tag in await pool.tags()


async def test_pop_of_empty_pool(pool: PoolStore, tag: str) -> None:
    result = await pool.pop(tag)
    assert (result.range, result.dropped, result.depth, result.target_depth) == (None, [], 0, 0)


async def test_pop_tells_depth_and_target(pool: PoolStore, tag: str) -> None:
    await pool.write_stats(tag, {"target_depth": "6", "rate": "1.5"})
    await pool.push(tag, [R("1-10"), R("11-20"), R("21-30")], head=False)
    result = await pool.pop(tag)
    assert (result.range, result.depth, result.target_depth) == (R("1-10"), 2, 6)


async def test_high_water_mark_only_rises(pool: PoolStore, tag: str) -> None:
    assert await pool.high_water(tag) == 0
    assert await pool.raise_high_water(tag, 2**62) == 2**62
    assert await pool.raise_high_water(tag, 999) == 2**62
    assert await pool.high_water(tag) == 2**62


async def test_consumption_and_lifetime_figures(pool: PoolStore, tag: str) -> None:
    await pool.report_issued({tag: 100})
    await pool.report_issued({tag: 250})
    await pool.report_lifetime(tag, 1000, 12.5)
    stats = await pool.read_stats(tag)
    figures = (stats["issued"], stats["lifetime_ids"], stats["lifetime_s"])
    assert figures == ("350", "1000", "12.500")
    assert await pool.take_lifetime(tag) == (1000, 12.5)
    assert await pool.take_lifetime(tag) is None  # one observation, one decision
    assert (await pool.read_stats(tag))["issued"] == "350"


async def test_moved_tags_are_read_once(pool: PoolStore, tag: str) -> None:
    await pool.report_issued({tag + "a": 1})
    await pool.push(tag + "b", [IdRange(1, 11)], head=False)
    await pool.pop(tag + "b")
    assert (await pool.take_moved()).tags == [tag + "a", tag + "b"]
    assert (await pool.take_moved()).tags == []


async def test_one_active_preloader_until_it_resigns_or_expires(pool: PoolStore) -> None:
    assert await pool.lead("a", 10)
    assert not await pool.lead("b", 10)
    assert await pool.lead("a", 10)  # renewed by its holder
    await pool.resign("b")  # not b's: stays
    assert not await pool.lead("b", 10)
    await pool.resign("a")
    assert await pool.lead("b", 0.1)
    await asyncio.sleep(0.2)
    assert await pool.lead("c", 10)


async def test_concurrent_pops_never_share_a_range(pool: PoolStore, tag: str) -> None:
    ranges = IdRange(1, 2001).split(10)
    await pool.push(tag, ranges, head=False)
    results = []
    for _ in range(10):  # 25 at a time: the Redis client keeps at most 32 connections
        results += await asyncio.gather(*(pool.pop(tag) for _ in range(25)))
    taken = [r.range for r in results if r.range is not None]
    assert sorted(taken, key=lambda r: r.start) == ranges
    assert await pool.depth(tag) == 0


def _pop_all(url: str, tag: str, out: multiprocessing.Queue) -> None:  # type: ignore[type-arg]
    async def go() -> list[tuple[int, int]]:
        opened = await SqlitePool.open(Settings(mysql_url=url))
        got = []
        try:
            while (result := await opened.pop(tag)).range is not None:
                got.append((result.range.start, result.range.end))
        finally:
            await opened.close()
        return got

    out.put(asyncio.run(go()))


async def test_pops_from_many_processes_never_share_a_range(
    sqlite_pool: SqlitePool, sqlite_settings: Settings, tag: str
) -> None:
    ranges = IdRange(1, 3001).split(10)
    await sqlite_pool.push(tag, ranges, head=False)
    ctx = multiprocessing.get_context("spawn")
    out = ctx.Queue()
    args = (sqlite_settings.mysql_url, tag, out)
    procs = [ctx.Process(target=_pop_all, args=args) for _ in range(3)]
    for p in procs:
        p.start()
    results = [out.get(timeout=60) for _ in procs]
    for p in procs:
        p.join(10)
    taken = sorted(r for got in results for r in got)
    assert taken == [(r.start, r.end) for r in ranges]


async def test_the_pool_outlives_the_process(sqlite_settings: Settings, tag: str) -> None:
    first = await SqlitePool.open(sqlite_settings)
    await first.push(tag, [R("1-10"), R("11-20")], head=False)
    await first.pop(tag)
    await first.push(tag, [R("5-10")], head=True)
    await first.close()
    again = await SqlitePool.open(sqlite_settings)
    try:
        assert await again.ranges(tag) == [R("5-10"), R("11-20")]
    finally:
        await again.close()


async def test_drain_takes_every_ready_range_once(pool: PoolStore, tag: str) -> None:
    await pool.push(tag, [R("1-10"), R("11-20")], head=False)
    await pool.push(tag, [R("91-95")], head=True)
    assert await pool.take_all(tag) == [R("91-95"), R("1-10"), R("11-20")]  # serving order
    assert await pool.take_all(tag) == []
    assert await pool.depth(tag) == 0
    await pool.push(tag, [R("21-30")], head=False)  # the list works as before afterwards
    assert (await pool.pop(tag)).ranges == [R("21-30")]


async def test_heartbeats_list_live_nodes_until_they_leave(pool: PoolStore, tag: str) -> None:
    await pool.heartbeat(f"{tag}-a", {"addr": "h:1", "draining": "0"}, ttl=10)
    await pool.heartbeat(f"{tag}-b", {"addr": "h:2", "draining": "1"}, ttl=10)
    live = {n["id"]: n for n in await pool.live_nodes(10) if n["id"].startswith(tag)}
    assert set(live) == {f"{tag}-a", f"{tag}-b"} and live[f"{tag}-b"]["draining"] == "1"
    await pool.leave(f"{tag}-a")
    assert [n["id"] for n in await pool.live_nodes(10) if n["id"].startswith(tag)] == [f"{tag}-b"]
    await pool.add_stats({tag: {"returned": 5, "wasted:tag_disabled": 7}})
    await pool.add_stats({tag: {"returned": 1}})
    stats = await pool.read_stats(tag)
    assert (stats["returned"], stats["wasted:tag_disabled"]) == ("6", "7")


async def test_a_preloaders_push_lands_only_while_it_holds_the_lease(
    pool: PoolStore, tag: str
) -> None:
    assert await pool.lead("a", 10)
    assert not (await pool.push(tag, [R("1-10")], head=False, leader="a")).lease_lost
    await pool.resign("a")
    assert await pool.lead("b", 10)  # "a" froze past its lease; "b" took over
    refused = await pool.push(tag, [R("11-20")], head=False, leader="a")
    assert refused.lease_lost
    assert await pool.ranges(tag) == [R("1-10")]  # nothing of the stale push
    assert not (await pool.push(tag, [R("5-10")], head=True)).lease_lost  # a node's return
    await pool.resign("b")
    assert (await pool.push(tag, [R("21-30")], head=False, leader="a")).lease_lost  # nobody's
    assert await pool.ranges(tag) == [R("5-10"), R("1-10")]
