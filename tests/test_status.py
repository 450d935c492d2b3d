"""/status.json, /status (checked in a real browser) and /metrics."""

from __future__ import annotations

import asyncio
import re
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families
from starlette.testclient import TestClient

from ops.processes import NodeProcess, env_with
from pool.ranges import IdRange
from pool.redis_pool import RedisPool
from pool.settings import Settings
from service.app import create_app
from service.status import StoreReadsCache, StoreView

from .test_app import add_tag


@pytest.fixture
def client(settings: Settings) -> Iterator[TestClient]:
    with TestClient(create_app(settings)) as c:
        yield c


def test_status_json_shows_buffers_pool_and_stores(
    client: TestClient, settings: Settings, tag: str
) -> None:
    add_tag(settings, tag, step=100)
    assert client.get(f"/ids/{tag}", params={"count": 5}).status_code == 200
    snap = client.get("/status.json").json()
    assert snap["stores"]["mysql"]["up"] and snap["stores"]["redis"]["up"]
    entry = next(t for t in snap["tags"] if t["tag"] == tag)
    assert entry["step"] == 100
    assert entry["buffer"]["current"] == "1-100"
    assert entry["buffer"]["used"] == 5 and entry["buffer"]["remaining"] == 95
    assert entry["counters"]["ids_issued"] == 5
    assert entry["counters"]["ranges_from_ledger"] == 1
    assert entry["pool"] == {  # no preloader runs here (preload is off in these tests)
        "depth": 0,
        "ids": 0,
        "head": None,
        "target_depth": None,
        "minutes_of_supply": None,
    }


def test_metrics_parse_with_prometheus_parser(
    client: TestClient, settings: Settings, tag: str
) -> None:
    add_tag(settings, tag, step=10)
    for _ in range(25):
        assert client.get(f"/id/{tag}").status_code == 200
    r = client.get("/metrics")
    assert r.status_code == 200 and r.headers["content-type"].startswith("text/plain")
    samples = {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in text_string_to_metric_families(r.text)
        for s in family.samples
    }
    assert samples[("idpool_ids_issued_total", (("tag", tag),))] == 25
    from_ledger = samples[("idpool_ranges_taken_total", (("source", "ledger"), ("tag", tag)))]
    from_pool = samples[("idpool_ranges_taken_total", (("source", "pool"), ("tag", tag)))]
    assert from_ledger >= 1 and from_ledger + from_pool >= 3  # 25 IDs from ranges of 10
    assert samples[("idpool_step", (("tag", tag),))] == 10
    assert samples[("idpool_store_up", (("store", "mysql"),))] == 1
    assert samples[("idpool_request_seconds_count", (("route", "id"),))] == 25
    assert samples[("idpool_request_seconds_bucket", (("le", "+Inf"), ("route", "id")))] == 25


CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")


def test_status_page_in_a_real_browser(settings: Settings, tag: str, tmp_path: Path) -> None:
    """Headless Chromium renders /status; its numbers equal /status.json's."""
    assert CHROMIUM, "chromium is not installed (the Makefile's test target installs it)"
    add_tag(settings, tag, step=100)
    env = env_with(
        IDPOOL_MYSQL_URL=settings.mysql_url,
        IDPOOL_REDIS_URL=settings.redis_url,
        IDPOOL_REDIS_PREFIX=settings.redis_prefix,
        IDPOOL_PRELOAD="0",
    )
    node = NodeProcess(env, tmp_path / "node").start()
    try:
        import json
        import urllib.request

        urllib.request.urlopen(f"{node.base_url}/ids/{tag}?count=7").read()
        flags = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic",
                 "--no-first-run", "--disable-background-networking",
                 "--disable-component-update", "--disable-sync",
                 f"--user-data-dir={tmp_path / 'profile'}"]  # fmt: skip
        dom = subprocess.run(
            [CHROMIUM, *flags, "--dump-dom", f"{node.base_url}/status"],
            capture_output=True, text=True, timeout=60, check=True,
        ).stdout  # fmt: skip
        snap = json.loads(urllib.request.urlopen(f"{node.base_url}/status.json").read())
        shot = tmp_path / "status.png"
        subprocess.run(
            [CHROMIUM, *flags, "--window-size=1400,600", f"--screenshot={shot}",
             f"{node.base_url}/status"],
            capture_output=True, timeout=60, check=True,
        )  # fmt: skip
        assert shot.stat().st_size > 5000  # a real rendered page, not an empty image
    finally:
        node.stop()
    fields = dict(re.findall(r'data-field="([^"]+)">([^<]*)<', dom))
    i = next(n for n, t in enumerate(snap["tags"]) if t["tag"] == tag)
    assert fields[f"tags.{i}.tag"] == tag
    for path in ("buffer.current", "buffer.used", "buffer.remaining", "step",
                 "counters.ids_issued", "pool.depth", "pool.ids"):  # fmt: skip
        value: object = snap["tags"][i]
        for part in path.split("."):
            value = value[part]  # type: ignore[index]
        assert fields[f"tags.{i}.{path}"] == ("-" if value is None else str(value)), path
    assert fields[f"tags.{i}.counters.ids_issued"] == "7"
    assert fields["stores.mysql.up"] == "up" and fields["stores.redis.up"] == "up"


def test_a_scrape_reads_each_list_in_constant_time(
    settings: Settings, tag: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Issue 10, defect 5: /status and /metrics read whole lists (LRANGE 0 -1) and
    # parsed them on the event loop; 10,000 ranges a tag stalled /id for 200 ms.
    add_tag(settings, tag, step=100)

    async def fill() -> None:
        pool = RedisPool.from_settings(settings)
        ranges = [IdRange(1_000_001 + 100 * i, 1_000_101 + 100 * i) for i in range(10_000)]
        await pool.push(tag, ranges, head=False)
        await pool.write_stats(tag, {"step": "100", "rate": "100.0", "target_depth": "4"})
        await pool.close()

    asyncio.run(fill())

    async def whole_list(self: RedisPool, tag: str) -> list[IdRange]:
        raise AssertionError("a scrape read a whole list")

    monkeypatch.setattr(RedisPool, "ranges", whole_list)
    with TestClient(create_app(settings)) as c:
        assert c.get(f"/id/{tag}").text == "1000001"  # from the pool's head
        entry = next(t for t in c.get("/status.json").json()["tags"] if t["tag"] == tag)
        depth = entry["pool"]["depth"]
        assert 9_990 <= depth < 10_000  # the node took what its reserve wanted
        assert entry["pool"]["ids"] == depth * 100
        assert entry["pool"]["minutes_of_supply"] == round(depth * 100 / 100.0 / 60, 2)
        assert "idpool_pool_depth" in c.get("/metrics").text


@pytest.mark.anyio
async def test_concurrent_scrapes_share_one_round_of_store_reads() -> None:
    reads = 0

    async def read() -> StoreView:
        nonlocal reads
        reads += 1
        await asyncio.sleep(0.05)
        return StoreView(errors={"redis": f"read {reads}"})

    cache = StoreReadsCache(read)
    answers = await asyncio.gather(*(cache.get() for _ in range(20)))
    assert reads == 1 and all(a.errors == {"redis": "read 1"} for a in answers)
    assert (await cache.get()).errors == {"redis": "read 1"}  # within a second: shared
