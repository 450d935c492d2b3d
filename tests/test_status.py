"""/status.json, /status (checked in a real browser) and /metrics."""

from __future__ import annotations

import asyncio
import html
import json
import os
import re
import shutil
import subprocess
import sys
import time
import typing
from collections.abc import Iterator
from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families
from starlette.testclient import TestClient

from idpool.pool.clock import FakeClock
from idpool.pool.ranges import IdRange
from idpool.pool.redis_pool import RedisPool
from idpool.pool.settings import Settings
from idpool.service.app import create_app
from idpool.service.status import STORE_READS_SECONDS, StoreReadsCache, StoreView
from idpool.service.status_page import render
from ops.toolkit import NodeProcess, env_with

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
    assert entry["kind"] == "segment"
    assert entry["pool"] == {  # no preloader runs here (preload is off in these tests)
        "depth": 0,
        "ids": 0,
        "head": None,
        "target_depth": None,
        "minutes_of_supply": None,
    }


def test_every_kinds_holding_has_the_keys_the_status_reads(client: TestClient) -> None:
    """The ``Held`` contract (kinds/interface.py): ``kind`` in every answer a kind's
    ``holding`` may give, ``issued`` (read as counters.ids_issued) an int where present."""
    node = client.app.node  # type: ignore[attr-defined]
    for name, kind in node.kinds.items():
        answer = typing.get_type_hints(type(kind).holding)["return"]
        shapes = [t for t in typing.get_args(answer) if t is not type(None)] or [answer]
        for shape in shapes:
            keys = typing.get_type_hints(shape)
            assert keys.get("kind") is str, (name, shape)
            assert keys.get("issued", int) is int, (name, shape)


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
    assert fields[f"tags.{i}.kind"] == "segment"
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
async def test_concurrent_scrapes_share_one_round_of_store_reads(clock: FakeClock) -> None:
    reads = 0
    answer = asyncio.Event()  # the stores answer when the test says

    async def read() -> StoreView:
        nonlocal reads
        reads += 1
        await answer.wait()
        return StoreView(errors={"redis": f"read {reads}"})

    cache = StoreReadsCache(read, clock)
    scrapes = asyncio.gather(*(cache.get() for _ in range(20)))
    await clock.advance(0)  # turns of the loop, no time: every scrape waits on one round
    answer.set()
    answers = await scrapes
    assert reads == 1 and all(a.errors == {"redis": "read 1"} for a in answers)
    assert (await cache.get()).errors == {"redis": "read 1"}  # within a second: shared
    await clock.advance(STORE_READS_SECONDS)
    assert (await cache.get()).errors == {"redis": "read 2"}  # a second on: read again


def test_runway_is_ids_left_below_the_max_over_the_cluster_rate(
    settings: Settings, tag: str
) -> None:
    add_tag(settings, tag, step=100, start=1, end_id=1_000_001)  # max 1,000,000

    async def publish_rate() -> None:
        pool = RedisPool.from_settings(settings)
        await pool.write_stats(tag, {"step": "100", "rate": "50.0"})
        await pool.close()

    asyncio.run(publish_rate())
    with TestClient(create_app(settings)) as c:
        assert c.get(f"/id/{tag}").text == "1"  # the ledger is at 101: 999,900 left to claim
        entry = next(t for t in c.get("/status.json").json()["tags"] if t["tag"] == tag)
        assert entry["max"] == 1_000_000
        assert entry["runway_s"] == 999_900 / 50.0
        assert f'idpool_tag_runway_seconds{{tag="{tag}"}} 19998.0' in c.get("/metrics").text
        assert "5.6 h" in c.get("/status").text


def test_an_idle_or_unbounded_tags_runway_reads_sensibly(settings: Settings, tag: str) -> None:
    from idpool.service.status import runway_text

    assert runway_text(1303124892032.8 * 86400) == "> 1000 y"  # was "1303124892032.8 d"
    assert runway_text(3 * 365 * 86400) == "3.0 y"
    assert runway_text(20 * 3600, sep="") == "20.0h"
    assert runway_text(None) == "-" and runway_text(None, bounded=False) == "unbounded"
    idle = tag + "i"
    add_tag(settings, idle, step=100, start=1, end_id=2**53)  # JavaScript's max, barely used
    add_tag(settings, tag, step=100)  # no max at all

    async def publish_rate() -> None:
        pool = RedisPool.from_settings(settings)
        await pool.write_stats(idle, {"step": "100", "rate": "0.08"})
        await pool.close()

    asyncio.run(publish_rate())
    with TestClient(create_app(settings)) as c:
        assert c.get(f"/id/{idle}").text == "1" and c.get(f"/id/{tag}").text == "1"
        page = c.get("/status").text
    runways = re.findall(r'data-field="tags\.\d+\.runway_s">([^<]*)<', page)
    names = re.findall(r'data-field="tags\.\d+\.tag">([^<]*)<', page)
    shown = dict(zip(names, runways, strict=True))
    assert shown[idle] == "&gt; 1000 y" and shown[tag] == "unbounded", shown


def test_the_page_title_names_the_node_and_its_cluster(settings: Settings) -> None:
    with TestClient(create_app(settings.with_changes(advertise="10.0.0.5:8000"))) as c:
        page = c.get("/status").text
    title = re.search(r"<title>([^<]*)</title>", page)
    assert title is not None and title.group(1).startswith("idpool 10.0.0.5:8000 · cluster of ")
    assert str(os.getpid()) not in title.group(1)


def test_runway_is_none_without_a_bound_or_a_rate() -> None:
    from datetime import datetime

    from idpool.pool.values import TagRow
    from idpool.service.status import runway_seconds

    row = TagRow("t", 101, 100, 1, "", datetime.now(), 100, 100, 1001, False)
    assert runway_seconds(row, 200, 10.0) == 110.0  # 900 in the ledger + 200 in the pool
    assert runway_seconds(row, 0, None) is None  # no rate yet
    spent = TagRow("t", 1001, 100, 1, "", datetime.now(), 100, 100, 1001)
    assert runway_seconds(spent, 0, 0.0) == 0.0
    assert runway_seconds(TagRow("t", 1, 1, 1, "", datetime.now(), 1, 1), 0, 5.0) is None


def test_metrics_count_requests_by_route_and_code_with_build_and_process_info(
    client: TestClient, settings: Settings, tag: str
) -> None:
    add_tag(settings, tag, step=100)
    for _ in range(5):
        assert client.get(f"/id/{tag}").status_code == 200  # the first routed, then the fast path
    assert client.get(f"/ids/{tag}", params={"count": 3}).status_code == 200
    assert client.get(f"/id/{tag}-nope").status_code == 404
    assert client.get(f"/ids/{tag}", params={"count": 0}).status_code == 400
    assert client.get("/no/such/path").status_code == 404
    assert client.get("/healthz").status_code == 200
    text = client.get("/metrics").text
    samples = {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
    }

    def requests(route: str, code: int) -> float:
        return samples[("idpool_http_requests_total", (("code", str(code)), ("route", route)))]

    assert requests("id", 200) == 5 and requests("id", 404) == 1
    assert requests("ids", 200) == 1 and requests("ids", 400) == 1
    assert requests("other", 404) == 1 and requests("healthz", 200) == 1
    build = [k for k in samples if k[0] == "idpool_build_info"]
    assert len(build) == 1 and ("version", "0.1.0") in build[0][1]
    assert samples[("process_resident_memory_bytes", ())] > 0
    assert ("process_cpu_seconds_total", ()) in samples


def test_cluster_view_shows_every_live_node_and_a_draining_one(
    settings: Settings, tag: str, tmp_path: Path
) -> None:
    """Three real nodes, one drained: each /status shows all three and the
    drained one in colour; `idpool status` prints the same; Chromium renders it."""
    import json
    import urllib.request

    assert CHROMIUM, "chromium is not installed (the Makefile's test target installs it)"
    add_tag(settings, tag, step=100)
    env = env_with(
        IDPOOL_MYSQL_URL=settings.mysql_url,
        IDPOOL_REDIS_URL=settings.redis_url,
        IDPOOL_REDIS_PREFIX=settings.redis_prefix,
        IDPOOL_PRELOAD="0",
        IDPOOL_REPORT_SECONDS="0.3",
        IDPOOL_ADMIN_TOKEN="cluster-token",
    )
    nodes = [NodeProcess(env, tmp_path / f"node{i}").start() for i in range(3)]
    try:
        for node in nodes:
            urllib.request.urlopen(f"{node.base_url}/ids/{tag}?count=5").read()
        drain = urllib.request.Request(
            f"{nodes[2].base_url}/admin/drain",
            method="POST",
            headers={"Authorization": "Bearer cluster-token"},
        )
        urllib.request.urlopen(drain).read()
        time.sleep(1.0)  # a few heartbeats and reports

        def snap() -> dict:  # type: ignore[type-arg]
            return json.loads(urllib.request.urlopen(f"{nodes[0].base_url}/status.json").read())

        view = snap()["cluster"]
        assert sorted(n["addr"] for n in view["nodes"]) == sorted(
            f"127.0.0.1:{node.port}" for node in nodes
        )
        draining = [n for n in view["nodes"] if n["draining"]]
        assert [n["addr"] for n in draining] == [f"127.0.0.1:{nodes[2].port}"]
        assert draining[0]["problems"] == ["draining"]
        assert sum(n["this"] for n in view["nodes"]) == 1
        entry = next(t for t in view["tags"] if t["tag"] == tag)
        assert entry["max_id"] == 301 and entry["returned"] == 95  # the drained node's rest
        printed = subprocess.run(
            [sys.executable, "-m", "idpool.service.cli", "status"],
            env=env, capture_output=True, text=True, timeout=60,
        )  # fmt: skip
        assert printed.returncode == 0, printed.stderr
        assert "3 live nodes" in printed.stdout
        assert f"127.0.0.1:{nodes[2].port}" in printed.stdout and "draining" in printed.stdout
        flags = ["--headless", "--no-sandbox", "--disable-gpu", "--no-first-run",
                 "--disable-background-networking", "--disable-component-update",
                 "--disable-sync", f"--user-data-dir={tmp_path / 'profile'}"]  # fmt: skip
        page = urllib.request.urlopen(f"{nodes[0].base_url}/status").read()
        assert len(page) < 16_000  # a few KB
        dom = subprocess.run(
            [CHROMIUM, *flags, "--dump-dom", f"{nodes[0].base_url}/status"],
            capture_output=True, text=True, timeout=60, check=True,
        ).stdout  # fmt: skip
        shot = tmp_path / "cluster.png"
        subprocess.run(
            [CHROMIUM, *flags, "--window-size=1400,900", f"--screenshot={shot}",
             f"{nodes[0].base_url}/status"],
            capture_output=True, timeout=60, check=True,
        )  # fmt: skip
        assert shot.stat().st_size > 5000
    finally:
        for node in nodes:
            if node.proc is not None:
                node.stop(timeout=60)  # uvicorn may wait out 30 s of open connections
    fields = dict(re.findall(r'data-field="([^"]+)">([^<]*)<', dom))
    states = [v for k, v in fields.items() if re.fullmatch(r"cluster\.nodes\.\d+\.problems", k)]
    assert sorted(states) == ["draining", "ok", "ok"]
    assert re.search(r'class="l down" data-field="cluster\.nodes\.\d+\.problems">draining', dom)
    assert "Updated" in dom


def _busy_tag(name: str, fmt: str | None) -> dict[str, object]:
    """A /status.json tag entry with the widest values a tag can show."""
    now = time.time()
    history = [{"t": now - 600 + i * 10, "ids_per_s": 1000.0 + (i % 7) * 300} for i in range(60)]
    return {
        "tag": name, "kind": "segment", "format": fmt, "step": 100_000,
        "max_id": 9_223_372_036_854_000_000, "start_id": 1, "max": 9_007_199_254_740_991,
        "disabled": False, "state": "enabled", "runway_s": 123_456_789.0,
        "buffer": {"current": "9223372036853000000-9223372036853099999", "used": 12_345,
                   "remaining": 87_654, "next": "9223372036853100000-9223372036853199999"},
        "pool": {"depth": 10, "ids": 1_000_000, "head": "x", "target_depth": 10,
                 "minutes_of_supply": 12.5},
        "rate": {"node_ids_per_s": 1234.5, "cluster_ids_per_s": 2345.6}, "history": history,
        "counters": {"ids_issued": 123_456_789_012, "ranges_from_pool": 1,
                     "ranges_from_ledger": 1, "ids_returned": 0, "ids_wasted": {}},
    }  # fmt: skip


MEASURE = """<script>
const charts = [...document.querySelectorAll("svg")].map(s => s.getBoundingClientRect().right);
document.body.setAttribute("data-measured", JSON.stringify(
  {page: document.documentElement.scrollWidth, view: window.innerWidth, charts}));
</script>"""


def test_the_tag_table_fits_a_1400_px_window_with_its_chart(tmp_path: Path) -> None:
    """Issue 29: the per-node table was wider than 1,400 px and cut the IDs/s chart."""
    assert CHROMIUM, "chromium is not installed (the Makefile's test target installs it)"
    snap = {
        "updated_at": time.time(),
        "node": {"addr": "127.0.0.1:8001", "pid": 1, "uptime_s": 1.0, "draining": False},
        "stores": {"mysql": {"up": True, "error": None}},
        "cluster": {"nodes": [], "tags": []},
        "tags": [_busy_tag("orders_eu_west_production", "INV-{date:%Y%m%d}-{id:06d}"),
                 _busy_tag("users", None)],
    }  # fmt: skip
    page = tmp_path / "status.html"
    page.write_text(render(snap).replace("</body>", MEASURE + "</body>"))
    flags = ["--headless", "--no-sandbox", "--disable-gpu", "--no-first-run",
             "--window-size=1400,900", f"--user-data-dir={tmp_path / 'profile'}"]  # fmt: skip
    dom = subprocess.run(
        [CHROMIUM, *flags, "--dump-dom", page.as_uri()],
        capture_output=True, text=True, timeout=60, check=True,
    ).stdout  # fmt: skip
    found = re.search(r'data-measured="([^"]+)"', dom)
    assert found, dom[-500:]
    measured = json.loads(html.unescape(found.group(1)))
    assert measured["page"] <= measured["view"], measured  # no sideways scroll of the page
    assert len(measured["charts"]) == 2
    assert all(right <= measured["view"] for right in measured["charts"]), measured
