"""The node with its supply: riding out a MySQL outage on the pool, refilling
a list that runs low without waiting for a tick, reporting range lifetimes."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterator

import pytest
from starlette.testclient import TestClient

from ops.servers import TcpProxy
from pool.redis_pool import RedisPool
from pool.settings import Settings
from service.app import create_app

from .conftest import TEST_DATABASE
from .test_app import add_tag, pool_ranges


def snapshot_of(client: TestClient, tag: str) -> dict:  # type: ignore[type-arg]
    return next(t for t in client.get("/status.json").json()["tags"] if t["tag"] == tag)


@pytest.fixture
def mysql_proxy() -> Iterator[TcpProxy]:
    proxy = TcpProxy(3306)
    yield proxy
    proxy.cut()


def test_mysql_outage_is_ridden_out_on_the_pool(
    settings: Settings, tag: str, mysql_proxy: TcpProxy
) -> None:
    """Leaf's 10-minute outage, compressed: the pool holds IDPOOL_POOL_SECONDS of
    recent consumption, so an outage shorter than that fails no request."""
    s = settings.with_changes(
        mysql_url=f"mysql://root@127.0.0.1:{mysql_proxy.port}/{TEST_DATABASE}",
        preload=True,
        preload_interval=0.1,
        pool_depth=2,
        pool_seconds=4.0,
        rate_window=1.0,
        step_seconds=0,
        store_timeout=0.5,
    )
    add_tag(s, tag, step=20)
    statuses: list[int] = []
    ids: list[int] = []

    def draw(seconds: float) -> None:
        end = time.monotonic() + seconds
        while time.monotonic() < end:
            r = client.get(f"/id/{tag}")
            statuses.append(r.status_code)
            if r.status_code == 200:
                ids.append(int(r.text))
            time.sleep(0.002)

    with TestClient(create_app(s)) as client:
        draw(2.5)  # steady load: the preloader learns the rate and sizes the list
        drawn_before = len(ids)
        rate = drawn_before / 2.5
        depth = snapshot_of(client, tag)["pool"]["depth"]
        assert depth * 20 >= rate * 2.5, f"pool of {depth} ranges for {rate:.0f} IDs/s"
        mysql_proxy.cut()
        draw(2.5)  # outage shorter than the 4 s of supply
        mysql_proxy.restore()
        draw(0.5)
    assert statuses.count(200) == len(statuses), {c: statuses.count(c) for c in set(statuses)}
    assert len(ids) > drawn_before * 1.5  # the outage was under load
    assert len(set(ids)) == len(ids)


def test_a_list_running_low_is_refilled_without_a_tick(settings: Settings, tag: str) -> None:
    s = settings.with_changes(preload=True, preload_interval=3600, pool_depth=4, step_seconds=0)
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
        counters = snapshot_of(client, tag)["counters"]
    assert len(set(ids)) == 1500
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
        stats = asyncio.run(_stats(settings, tag))
    assert int(stats["taken"]) >= 30  # every range the node took, pool or ledger
    assert stats["lifetime_ids"] == "10" and float(stats["lifetime_s"]) >= 0
