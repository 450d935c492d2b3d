"""The node with its supply: riding out a MySQL outage on the pool, refilling
a list that runs low without waiting for a tick, reporting range lifetimes."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterator

import pytest
from starlette.testclient import TestClient

from idpool.pool.claims import LedgerClaims
from idpool.pool.clock import FakeClock
from idpool.pool.ledger import Ledger
from idpool.pool.ranges import IdRange
from idpool.pool.redis_pool import RedisPool
from idpool.pool.settings import Settings
from idpool.service.app import create_app
from idpool.service.node import Node
from idpool.service.source import RangeSource
from idpool.service.stats import SAMPLE_EVERY
from ops.toolkit import TcpProxy

from .conftest import TEST_DATABASE
from .test_app import add_tag, pool_ranges


def snapshot_of(client: TestClient, tag: str) -> dict:  # type: ignore[type-arg]
    return next(t for t in client.get("/status.json").json()["tags"] if t["tag"] == tag)


@pytest.fixture
def mysql_proxy() -> Iterator[TcpProxy]:
    proxy = TcpProxy(3306)
    yield proxy
    proxy.cut()


# A 10-minute MySQL outage, compressed 240 times: 2.5 s. The pool is sized for
# 16 minutes of consumption (IDPOOL_POOL_SECONDS=960 at full scale; 4 s here):
# the rate it is sized from is an estimate and the list is topped up once a tick.
TIME_SCALE = 240
OUTAGE_SECONDS = 600 / TIME_SCALE
POOL_SECONDS = 960 / TIME_SCALE
REQUESTS_PER_SECOND = 150
WARM_UP_SECONDS = 4.0  # a few rate windows: the estimate and the list have settled


def test_mysql_outage_is_ridden_out_on_the_pool(
    settings: Settings, tag: str, mysql_proxy: TcpProxy
) -> None:
    """The pool holds IDPOOL_POOL_SECONDS of recent consumption, sized in time by
    the preloader (the fixed minimum depth is 2 ranges), so an outage shorter
    than that fails no request under the same steady load."""
    step = 20
    s = settings.with_changes(
        mysql_url=f"mysql://root@127.0.0.1:{mysql_proxy.port}/{TEST_DATABASE}",
        preload=True,
        preload_interval=0.1,
        pool_depth=2,
        pool_seconds=POOL_SECONDS,
        rate_window=1.0,
        report_seconds=0.05,  # nodes report what they hand out, on the same compressed clock
        step_seconds=0,
        store_timeout=0.5,
        reserve_seconds=0,  # the pool alone rides it out, not the node's own reserve
    )
    add_tag(s, tag, step=step)
    statuses: list[int] = []
    ids: list[int] = []

    def draw(seconds: float) -> int:
        """Steady load: one request every 1/REQUESTS_PER_SECOND s, on a fixed schedule."""
        drawn = len(ids)
        start = time.monotonic()
        for n in range(int(seconds * REQUESTS_PER_SECOND)):
            wait = start + n / REQUESTS_PER_SECOND - time.monotonic()
            if wait > 0:
                time.sleep(wait)
            r = client.get(f"/id/{tag}")
            statuses.append(r.status_code)
            if r.status_code == 200:
                ids.append(int(r.text))
        return len(ids) - drawn

    with TestClient(create_app(s)) as client:
        # steady load: the preloader learns the rate and sizes the list
        settled = draw(WARM_UP_SECONDS - 2.5)
        drawn_before = draw(2.5)
        rate = drawn_before / 2.5
        before = snapshot_of(client, tag)
        depth = before["pool"]["depth"]
        assert depth * 20 >= rate * 2.5, f"pool of {depth} ranges for {rate:.0f} IDs/s"
        # sized in time (the target follows the rate) and filled to that size, no more
        assert before["pool"]["target_depth"] * step >= 0.8 * rate * POOL_SECONDS, before
        assert depth <= 2 * before["pool"]["target_depth"], before
        mysql_proxy.cut()
        during = draw(OUTAGE_SECONDS)
        cut = snapshot_of(client, tag)
        stores = client.get("/status.json").json()["stores"]
        mysql_proxy.restore()
        draw(0.5)
    assert statuses.count(200) == len(statuses), {c: statuses.count(c) for c in set(statuses)}
    assert len(ids) - settled > drawn_before * 1.5  # the outage was under load
    assert len(set(ids)) == len(ids)
    # MySQL really was out, and the pool alone carried the load through it ...
    assert stores["mysql"]["up"] is False
    assert cut["counters"]["ranges_from_ledger"] == before["counters"]["ranges_from_ledger"]
    assert during == int(OUTAGE_SECONDS * REQUESTS_PER_SECOND)
    # ... using a good part of what it held: the minimum depth alone would have run dry.
    assert during > 0.4 * before["pool"]["ids"] > 2 * 2 * step


def test_a_list_running_low_is_refilled_without_a_tick(settings: Settings, tag: str) -> None:
    s = settings.with_changes(
        preload=True, preload_interval=3600, pool_depth=4, step_seconds=0, reserve_seconds=0
    )  # no reserve: it would take the whole surge in one fetch, and this is about the pool
    add_tag(s, tag, step=50)
    with TestClient(create_app(s)) as client:
        for _ in range(100):  # the one tick that runs at start fills the list
            if len(pool_ranges(s, tag)) == 4:
                break
            time.sleep(0.02)
        assert len(pool_ranges(s, tag)) == 4
        ids = []
        for _ in range(30):  # 30 ranges' worth, in a surge
            r = client.get(f"/ids/{tag}", params={"count": 50})
            assert r.status_code == 200
            ids += r.json()["ids"]
        for _ in range(100):  # on a loaded machine the refills may land after the surge
            counters = snapshot_of(client, tag)["counters"]
            if counters["ranges_from_pool"] > 4:
                break
            r = client.get(f"/ids/{tag}", params={"count": 50})
            assert r.status_code == 200
            ids += r.json()["ids"]
            time.sleep(0.05)
    assert len(set(ids)) == len(ids) >= 1500
    # The start tick pushed 4 ranges; more than 4 came from the pool, so the
    # nodes' low-water refills filled it with no second tick.
    assert counters["ranges_from_pool"] > 4


async def _stats(settings: Settings, tag: str) -> dict[str, str]:
    pool = RedisPool.from_settings(settings)
    try:
        return await pool.read_stats(tag)
    finally:
        await pool.close()


def test_nodes_report_consumption_and_range_lifetimes(settings: Settings, tag: str) -> None:
    add_tag(settings, tag, step=10)
    with TestClient(create_app(settings)) as client:
        for _ in range(3):
            assert client.get(f"/ids/{tag}", params={"count": 10}).status_code == 200
        time.sleep(0.2)  # the reports are written off the request path
        lifetimes = asyncio.run(_stats(settings, tag))
    assert lifetimes["lifetime_ids"] == "10" and float(lifetimes["lifetime_s"]) >= 0
    stats = asyncio.run(_stats(settings, tag))  # a stopping node reports what it handed out
    assert stats["issued"] == "30"  # IDs handed out, not ranges taken


@pytest.mark.anyio
async def test_an_idle_tag_goes_back_to_the_pool_and_is_dropped(
    settings: Settings, tag: str
) -> None:
    # Issue 11: a node's memory and scrape cost follow the tags it serves now.
    ledger = await Ledger.connect(settings)
    pool = RedisPool.from_settings(settings)
    try:
        await ledger.add_tag(tag, step=100, start=1)
        source = RangeSource(LedgerClaims(ledger, pool), pool)
        node = Node(source, prefetch_at=0.5, idle_seconds=60)
        assert await node.next_id(tag) == 1
        node.sample(mono=1000.0)
        node.sample(mono=1059.0)  # 59 s without a request: kept
        assert tag in node.buffers
        node.sample(mono=1061.0)
        assert tag not in node.buffers
        await source.close()  # the remainder's push
        assert await pool.ranges(tag) == [IdRange(2, 101)]
        assert await node.next_id(tag) == 2  # a new buffer, from the returned remainder
        await node.shutdown()
        await node.cluster.report()
        assert (await pool.read_stats(tag))["issued"] == "2"  # both buffers' IDs reported
    finally:
        await pool.close()
        await ledger.close()


@pytest.mark.anyio
async def test_housekeeping_samples_reports_and_lets_idle_tags_go_on_the_nodes_clock(
    settings: Settings, tag: str, clock: FakeClock
) -> None:
    """The node's loop (the consumption chart, idle release, reports) sleeps on the
    clock the runtime gives it: a minute of idleness passes in no time."""
    ledger = await Ledger.connect(settings)
    pool = RedisPool.from_settings(settings)
    try:
        await ledger.add_tag(tag, step=100, start=1)
        source = RangeSource(LedgerClaims(ledger, pool, clock.monotonic), pool)
        node = Node(
            source, prefetch_at=0.5, idle_seconds=60, report_seconds=SAMPLE_EVERY, clock=clock
        )
        assert await node.next_id(tag) == 1
        housekeeping = asyncio.ensure_future(node.run_housekeeping())
        try:
            await clock.until_sleeping()  # its first round: sampled, reported
            assert list(node.stats.tags[tag].history) == [(clock.now(), 1)]
            assert (await pool.read_stats(tag))["issued"] == "1"
            for _ in range(5):  # 50 s without a request: kept
                await clock.advance(SAMPLE_EVERY)
                await clock.until_sleeping()
            assert tag in node.buffers and len(node.stats.tags[tag].history) == 6
            await clock.advance(SAMPLE_EVERY)  # 60 s: returned to the pool, dropped
            await clock.until_sleeping()
            assert tag not in node.buffers
        finally:
            housekeeping.cancel()
            await asyncio.gather(housekeeping, return_exceptions=True)
        await source.close()  # the remainder's push
        assert await pool.ranges(tag) == [IdRange(2, 101)]
    finally:
        await pool.close()
        await ledger.close()


def test_a_tag_found_by_name_comes_with_its_tokens(settings: Settings, tag: str) -> None:
    from idpool.pool.tokens import hash_token

    async def add_guarded() -> None:
        ledger = await Ledger.connect(settings)
        await ledger.add_tag(tag, step=100, start=1)
        await ledger.add_token(tag, "t1", hash_token("the-token"))
        await ledger.close()

    with TestClient(create_app(settings.with_changes(unknown_tag_ttl=30))) as c:
        assert c.get(f"/id/{tag}-other").status_code == 404  # the list was just read
        asyncio.run(add_guarded())  # found next by one primary-key lookup, not a reload
        assert c.get(f"/id/{tag}").status_code == 401
        assert c.get(f"/id/{tag}", params={"token": "the-token"}).text == "1"
