from __future__ import annotations

import asyncio
import contextlib
import socket
import threading
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import orjson
import pytest
from starlette.testclient import TestClient
from starlette.types import Message, Receive, Scope, Send

from idpool.pool.errors import InvalidInput
from idpool.pool.kind_rules import KindRules
from idpool.pool.ledger import Ledger
from idpool.pool.ranges import MAX_ID, IdRange
from idpool.pool.redis_pool import RedisPool
from idpool.pool.settings import Settings
from idpool.pool.stores import open_stores
from idpool.service.app import NodeApp, create_app
from idpool.service.errors import ANSWERS
from idpool.service.health import PROBE_EVERY
from idpool.service.kinds import KINDS, SPECS, IdKind, KindContext, KindSpec, rules_of
from idpool.service.routes import unlisted
from ops.toolkit import NodeProcess, RedisServer, TcpProxy, env_with

from .conftest import TEST_DATABASE


async def _add(settings: Settings, tag: str, step: int, start: int, end_id: int) -> None:
    ledger = await Ledger.connect(settings)
    await ledger.add_tag(tag, step=step, start=start, end_id=end_id)
    await ledger.close()


def add_tag(
    settings: Settings, tag: str, step: int = 100, start: int = 1, end_id: int = MAX_ID
) -> None:
    asyncio.run(_add(settings, tag, step, start, end_id))


def pool_ranges(settings: Settings, tag: str) -> list[str]:
    async def go() -> list[str]:
        pool = RedisPool.from_settings(settings)
        try:
            return [r.to_text() for r in await pool.ranges(tag)]
        finally:
            await pool.close()

    return asyncio.run(go())


def ledger_max_id(settings: Settings, tag: str) -> int:
    async def go() -> int:
        ledger = await Ledger.connect(settings)
        try:
            return (await ledger.get_tag(tag)).max_id
        finally:
            await ledger.close()

    return asyncio.run(go())


@pytest.fixture
def client(settings: Settings) -> Iterator[TestClient]:
    with TestClient(create_app(settings)) as c:
        yield c


def test_one_id_as_text_and_leaf_path(client: TestClient, settings: Settings, tag: str) -> None:
    add_tag(settings, tag, start=500)
    r = client.get(f"/id/{tag}")
    assert r.status_code == 200 and r.headers["content-type"].startswith("text/plain")
    assert r.text == "500"
    assert client.get(f"/api/segment/get/{tag}").text == "501"


def test_fast_path_answers_as_the_routes_do(
    client: TestClient, settings: Settings, tag: str
) -> None:
    # One range of 1000 from 10: the IDs up to 36 stay under the prefetch
    # trigger (110), so no fetch runs and every fast answer is certain.
    add_tag(settings, tag, step=1000, start=10)
    routed = client.get(f"/id/{tag}")  # the first request makes the buffer: routed
    assert routed.text == "10"
    app = client.app
    assert isinstance(app, NodeApp)
    starlette_calls = []
    starlette_stack = app.middleware_stack

    async def counted(scope: Scope, receive: Receive, send: Send) -> None:
        starlette_calls.append(scope["path"])
        assert starlette_stack is not None
        await starlette_stack(scope, receive, send)

    app.middleware_stack = counted
    fast = [client.get(f"/id/{tag}"), client.get(f"/api/segment/get/{tag}")]
    fast += [client.get(f"/id/{tag}") for _ in range(20)]
    fast_batch = client.get(f"/ids/{tag}?count=2")  # exactly "count=N", N in memory
    assert starlette_calls == []  # all answered before Starlette's routing
    assert [int(r.text) for r in fast] == list(range(11, 33))
    assert all(r.headers == routed.headers for r in fast)  # same length: 2-digit IDs
    assert fast_batch.json() == {"tag": tag, "ids": [33, 34]}

    # everything else goes through the routes, and answers the same way
    routed_batch = client.get(f"/ids/{tag}?count=2&pretty=1")
    assert routed_batch.json() == {"tag": tag, "ids": [35, 36]}
    assert routed_batch.headers == fast_batch.headers
    more_than_in_memory = client.get(f"/ids/{tag}?count=1500").json()["ids"]
    assert more_than_in_memory == list(range(37, 1537))  # waits for the next range
    assert client.get(f"/ids/{tag}?count=0").status_code == 400
    assert client.get(f"/ids/{tag}?count={settings.max_count + 1}").status_code == 400
    assert client.get(f"/id/{tag}/", follow_redirects=False).status_code == 307
    assert client.get(f"/id/x/{tag}").status_code == 404
    assert client.get("/id/NOT valid").status_code == 400
    assert starlette_calls == [
        *[f"/ids/{tag}"] * 4,
        f"/id/{tag}/",
        f"/id/x/{tag}",
        "/id/NOT valid",
    ]

    # Behind a root path "/api", Starlette routes on the path without it:
    # /api/segment/get/{tag} is then /segment/get/{tag}, not Leaf's path, so
    # the fast path must not answer it either.
    async def status_of(path: str) -> int:
        scope: Scope = {"type": "http", "method": "GET", "path": path, "root_path": "/api"}
        scope.update(query_string=b"", headers=[], http_version="1.1", scheme="http")
        scope["state"] = client.app_state.copy()  # the lifespan state, as a server passes it
        sent: list[Message] = []

        async def receive() -> Message:
            return {"type": "http.request", "body": b"", "more_body": False}

        async def send(message: Message) -> None:
            sent.append(message)

        await app(scope, receive, send)
        return int(sent[0]["status"])

    assert client.portal is not None
    assert client.portal.call(status_of, f"/api/segment/get/{tag}") == 404
    assert client.portal.call(status_of, f"/api/id/{tag}") == 200  # routed: /id/{tag}


def test_batch_spans_ranges_in_increasing_order(
    client: TestClient, settings: Settings, tag: str
) -> None:
    add_tag(settings, tag, step=7)
    r = client.get(f"/ids/{tag}", params={"count": 100})
    assert r.status_code == 200
    body = r.json()
    assert body["tag"] == tag and body["ids"] == list(range(1, 101))


def test_tag_created_after_start_is_served(
    client: TestClient, settings: Settings, tag: str
) -> None:
    assert client.get(f"/id/{tag}").status_code == 404
    add_tag(settings, tag)
    import time

    time.sleep(settings.unknown_tag_ttl)
    assert client.get(f"/id/{tag}").text == "1"


def test_unknown_tag_is_404_with_a_hint(client: TestClient, settings: Settings) -> None:
    r = client.get("/id/no_such_tag_here")
    assert r.status_code == 404
    # Issue 29: the ledger named, so a tag added to another database is found out
    database = settings.mysql_params().database
    assert r.json() == {
        "error": "unknown_tag",
        "message": "tag 'no_such_tag_here' does not exist in this node's ledger, MySQL "
        f"database {database!r} at 127.0.0.1:3306; create it there with "
        "`idpool tag add no_such_tag_here` (same IDPOOL_MYSQL_URL as this node)",
    }


@pytest.mark.parametrize("path", ["/id/bad%20tag", "/id/-x", "/ids/a:b?count=1", "/id/" + "x" * 65])
def test_malformed_tag_is_400(client: TestClient, path: str) -> None:
    r = client.get(path)
    assert r.status_code == 400
    assert r.json()["error"] == "bad_tag" and "A-Z a-z 0-9" in r.json()["message"]


@pytest.mark.parametrize(
    "query",
    [
        "",
        "?count=",
        "?count=0",
        "?count=-1",
        "?count=10001",
        "?count=abc",
        "?count=1.5",
        "?count=1e3",
        "?count=%205",
        "?count=1&count=2",
        "?count=99999999999999999999",
    ],
)
def test_bad_count_is_400(client: TestClient, settings: Settings, tag: str, query: str) -> None:
    add_tag(settings, tag)
    r = client.get(f"/ids/{tag}{query}")
    assert r.status_code == 400
    assert r.json()["error"] == "bad_count" and "1 to 10000" in r.json()["message"]


def test_shutdown_returns_the_remainder_to_the_head(settings: Settings, tag: str) -> None:
    add_tag(settings, tag, step=100)
    with TestClient(create_app(settings)) as c:
        assert c.get(f"/ids/{tag}", params={"count": 5}).json()["ids"] == [1, 2, 3, 4, 5]
    assert pool_ranges(settings, tag)[0] == "6-100"
    with TestClient(create_app(settings)) as c:
        assert c.get(f"/id/{tag}").text == "6"  # the next node goes on where it stopped


@pytest.fixture
def proxied(settings: Settings) -> Iterator[tuple[Settings, TcpProxy, TcpProxy]]:
    mysql, redis = TcpProxy(3306), TcpProxy(6379)
    s = settings.with_changes(
        mysql_url=f"mysql://root@127.0.0.1:{mysql.port}/{TEST_DATABASE}",
        redis_url=f"redis://127.0.0.1:{redis.port}/0",
        store_timeout=0.5,
    )
    yield s, mysql, redis
    mysql.cut()
    redis.cut()


def test_redis_down_serves_the_buffers_and_never_claims_unfenced(
    proxied: tuple[Settings, TcpProxy, TcpProxy], tag: str
) -> None:
    # A claim needs the high-water mark in Redis (issue 10, defect 1): while Redis
    # is down a node serves what its buffers hold, then answers 503 naming Redis;
    # it never serves a range MySQL could repeat after a rewind.
    s, _, redis = proxied
    add_tag(s, tag, step=10)
    with TestClient(create_app(s)) as c:
        assert [c.get(f"/id/{tag}").text for _ in range(2)] == ["1", "2"]
        asyncio.run(asyncio.sleep(0.3))  # let the prefetch (started at ID 2) land
        claimed = ledger_max_id(s, tag)
        redis.cut()
        responses = [c.get(f"/id/{tag}") for _ in range(25)]
        served = [int(r.text) for r in responses if r.status_code == 200]
        assert served == list(range(3, 21))  # both buffers, to the last ID
        failed = [r for r in responses if r.status_code != 200]
        assert {r.status_code for r in failed} == {503}
        assert "redis" in failed[-1].json()["message"]
        assert ledger_max_id(s, tag) == claimed  # nothing claimed without the mark
        redis.restore()
        asyncio.run(asyncio.sleep(1.1))  # the skip window after the last Redis error
        assert int(c.get(f"/id/{tag}").text) > 20


def test_mysql_down_serves_from_the_pool(
    proxied: tuple[Settings, TcpProxy, TcpProxy], tag: str
) -> None:
    s, mysql, _ = proxied
    add_tag(s, tag, step=10)
    with TestClient(create_app(s.with_changes(preload=True, pool_depth=8))) as c:
        assert c.get(f"/id/{tag}").status_code == 200
        for _ in range(100):
            if len(pool_ranges(s, tag)) >= 7:
                break
            asyncio.run(asyncio.sleep(0.05))
        mysql.cut()
        responses = [c.get(f"/id/{tag}") for _ in range(60)]
        assert [r.status_code for r in responses] == [200] * 60
        values = [int(r.text) for r in responses]
        assert len(set(values)) == 60


def test_both_down_is_503_naming_them_then_recovers(
    proxied: tuple[Settings, TcpProxy, TcpProxy], tag: str
) -> None:
    s, mysql, redis = proxied
    add_tag(s, tag, step=5)
    with TestClient(create_app(s)) as c:
        assert c.get(f"/id/{tag}").text == "1"
        asyncio.run(asyncio.sleep(0.3))  # let the prefetch of the second range land
        mysql.cut()
        redis.cut()
        asyncio.run(asyncio.sleep(PROBE_EVERY + 0.5))  # the health probe sees both go
        served = []
        for _ in range(20):
            r = c.get(f"/id/{tag}")
            if r.status_code != 200:
                break
            served.append(int(r.text))
        # the buffers lasted this long: the rest of the first range, then the next one
        assert served == list(range(2, 11))
        assert r.status_code == 503
        body = r.json()
        assert body["error"] == "unavailable"
        assert "redis" in body["message"] and "mysql" in body["message"]
        assert c.get("/readyz").status_code == 503  # no range can be had
        mysql.restore()
        redis.restore()
        for _ in range(50):
            r = c.get(f"/id/{tag}")
            if r.status_code == 200:
                break
            asyncio.run(asyncio.sleep(0.1))
        assert r.status_code == 200
        assert int(r.text) > max(served)
        assert c.get("/readyz").status_code == 200


def wait_for_status(c: TestClient, path: str, status_code: int, seconds: float) -> float:
    """Poll ``path`` until it answers ``status_code``; return how long that took."""
    started = time.monotonic()
    while c.get(path).status_code != status_code:
        assert time.monotonic() - started < seconds, f"{path} not {status_code} in {seconds}s"
        time.sleep(0.1)
    return time.monotonic() - started


def test_readiness_comes_back_by_itself_when_the_stores_do(
    proxied: tuple[Settings, TcpProxy, TcpProxy], tag: str
) -> None:
    # Issue 10, defect 2: one request for an unknown tag during a store blip left
    # /readyz at 503 for good; a load balancer then sent the node no request that
    # could have cleared it.
    s, mysql, redis = proxied
    with TestClient(create_app(s)) as c:
        assert c.get("/readyz").status_code == 200
        mysql.cut()
        redis.cut()
        assert c.get(f"/id/{tag}").status_code == 503
        wait_for_status(c, "/readyz", 503, 5)  # no IDs in memory, no store: out
        mysql.restore()
        redis.restore()
        # No ID request from here on, as behind HAProxy: the node must come back alone.
        assert wait_for_status(c, "/readyz", 200, 5) < 5


def test_too_few_replicas_stop_claims_while_the_node_serves_the_pool(
    settings: Settings, redis_server: RedisServer, tag: str
) -> None:
    """IDPOOL_REDIS_MARK_REPLICAS=1 on a Redis with no replica: no high-water raise
    can count, so nothing is claimed. The node still serves what the pool holds
    (no Redis skip: Redis answers), stays ready (every node shares the cause) and
    says why in /readyz, /status.json and /metrics."""
    s = settings.with_changes(redis_url=redis_server.url, redis_mark_replicas=1)
    add_tag(s, tag, step=10, start=1001)

    async def fill() -> None:
        pool = RedisPool.from_settings(s)
        try:
            await pool.push(tag, [IdRange(1, 11), IdRange(11, 21)], head=False)
        finally:
            await pool.close()

    asyncio.run(fill())
    with TestClient(create_app(s)) as c:
        started = time.monotonic()
        while "claims stopped" not in (ready := c.get("/readyz")).text:
            assert time.monotonic() - started < 5, ready.text
            time.sleep(0.1)
        assert ready.status_code == 200 and "IDPOOL_REDIS_MARK_REPLICAS" in ready.text
        served = [c.get(f"/id/{tag}") for _ in range(20)]
        assert [int(r.text) for r in served] == list(range(1, 21))  # the pool, whole
        refused = c.get(f"/id/{tag}")
        assert (
            refused.status_code == 503
            and "claims stopped, too few Redis replicas" in refused.json()["message"]
        )
        assert c.get("/readyz").status_code == 200
        redis_status = c.get("/status.json").json()["stores"]["redis"]
        assert redis_status["up"] is True
        assert redis_status["mark_replicas"]["wanted"] == 1
        assert redis_status["mark_replicas"]["fewest_online"] == 0
        assert "0 of 1 replicas" in redis_status["last_mark_refused"]["detail"]
        assert "idpool_mark_replicas_short 1.0" in c.get("/metrics").text
    assert asyncio.run(_max_id(s, tag)) == 1001  # nothing claimed, so nothing wasted


async def _max_id(settings: Settings, tag: str) -> int:
    ledger = await Ledger.connect(settings)
    try:
        return (await ledger.get_tag(tag)).max_id
    finally:
        await ledger.close()


def test_one_exhausted_tag_fails_alone(settings: Settings, tag: str) -> None:
    add_tag(settings, tag, step=10, start=MAX_ID - 14)  # 15 IDs left below 2^63
    other = tag + "-other"
    add_tag(settings, other, step=10)
    with TestClient(create_app(settings)) as c:
        answers = [c.get(f"/id/{tag}") for _ in range(25)]
        served = [int(r.text) for r in answers if r.status_code == 200]
        assert served == list(range(MAX_ID - 14, MAX_ID))  # the last range cut short; none past
        refused = answers[-1]
        assert refused.status_code == 503 and refused.json()["error"] == "tag_exhausted"
        assert c.get("/readyz").status_code == 200  # the node serves every other tag
        assert c.get(f"/id/{other}").text == "1"


def test_a_bounded_tag_stops_at_its_max_with_503_for_itself_only(
    settings: Settings, tag: str
) -> None:
    js_max = 2**53 - 1
    add_tag(settings, tag, step=40, start=js_max - 99, end_id=js_max + 1)  # 100 IDs left
    other = tag + "-other"
    add_tag(settings, other, step=10)
    with TestClient(create_app(settings)) as c:
        ids: list[int] = []
        for _ in range(20):  # batches that straddle ranges, and the cut-short last one
            r = c.get(f"/ids/{tag}", params={"count": 7})
            if r.status_code != 200:
                break
            ids += r.json()["ids"]
        ids += [int(r.text) for r in (c.get(f"/id/{tag}") for _ in range(10)) if r.is_success]
        assert sorted(ids) == list(range(js_max - 99, js_max + 1))  # every one, none past
        refused = c.get(f"/id/{tag}")
        assert refused.status_code == 503 and refused.json()["error"] == "tag_exhausted"
        assert str(js_max) in refused.json()["message"]
        assert c.get("/readyz").status_code == 200
        assert c.get(f"/id/{other}").text == "1"
        entry = next(t for t in c.get("/status.json").json()["tags"] if t["tag"] == tag)
        assert entry["max"] == js_max and entry["runway_s"] == 0.0
        assert f'idpool_tag_runway_seconds{{tag="{tag}"}} 0.0' in c.get("/metrics").text


def test_a_batch_over_what_a_bounded_tag_has_left_says_how_many_are_left(
    settings: Settings, tag: str
) -> None:
    """Issue 29: a batch bigger than the rest answered 503 tag_exhausted ("has run
    out") while IDs remained. A batch is all or nothing: 400 naming what is left."""
    add_tag(settings, tag, step=10, end_id=21)  # IDs 1..20
    with TestClient(create_app(settings)) as c:
        assert c.get(f"/ids/{tag}", params={"count": 15}).json()["ids"] == list(range(1, 16))
        over = c.get(f"/ids/{tag}", params={"count": 10})
        assert over.status_code == 400 and over.json()["error"] == "bad_count", over.text
        message = over.json()["message"]
        assert "only 5 IDs" in message and "5 or fewer" in message
        assert "run out" not in message
        assert c.get(f"/ids/{tag}", params={"count": 5}).json()["ids"] == list(range(16, 21))
        refused = c.get(f"/ids/{tag}", params={"count": 2})
        assert refused.status_code == 503 and refused.json()["error"] == "tag_exhausted"


def test_head_takes_no_id(client: TestClient, settings: Settings, tag: str) -> None:
    add_tag(settings, tag)
    for path in (f"/id/{tag}", f"/ids/{tag}?count=5", f"/api/segment/get/{tag}"):
        r = client.head(path)
        assert r.status_code == 405 and r.headers["allow"] == "GET"
    assert client.get(f"/id/{tag}").text == "1"  # nothing was used up
    for _ in range(3):
        assert client.head(f"/id/{tag}").status_code == 405  # the fast path too
    assert client.get(f"/id/{tag}").text == "2"


class CountingLedger:
    """The real ledger, counting list_tags calls and every claim."""

    def __init__(self, ledger: Ledger) -> None:
        self.ledger = ledger
        self.listed = 0
        self.claims: list[int] = []  # steps claimed, per claim

    async def list_tags(self, names: object = None) -> object:
        self.listed += names is None
        return await self.ledger.list_tags(names)  # type: ignore[arg-type]

    async def claim(self, tag: str, ranges: int = 1, kind: str = "segment") -> object:
        self.claims.append(ranges)
        return await self.ledger.claim(tag, ranges, kind)

    def __getattr__(self, name: str) -> object:
        return getattr(self.ledger, name)


def counted_stores(counted: list[CountingLedger]) -> object:
    async def opener(settings: Settings) -> object:
        ledger, pool = await open_stores(settings)
        counted.append(CountingLedger(ledger))  # type: ignore[arg-type]
        return counted[-1], pool

    return opener


def test_a_flood_of_made_up_tags_costs_nothing_per_name(settings: Settings, tag: str) -> None:
    # Issue 10, defect 4: every unknown name got a buffer (kept on a store error),
    # a history, a range pop and a MySQL lookup.
    add_tag(settings, tag, step=1000)
    counted: list[CountingLedger] = []
    app = create_app(settings.with_changes(unknown_tag_ttl=1.0), stores=counted_stores(counted))
    with TestClient(app) as c:
        assert c.get(f"/id/{tag}").text == "1"
        listed_before = counted[0].listed
        started = time.monotonic()
        names = [f"nosuch{i}-{tag}" for i in range(400)]
        answers = [c.get(f"/id/{name}") for name in names]
        assert {r.status_code for r in answers} == {404}
        assert answers[0].json()["error"] == "unknown_tag"
        seconds = time.monotonic() - started
        # at most one reload of the tag list a second, however many names
        assert counted[0].listed - listed_before <= seconds / 1.0 + 1
        node = app.node
        assert node is not None and set(node.buffers) == {tag} and set(node.stats.tags) == {tag}
        assert len(counted[0].claims) == 1  # the real tag's only; no pop or claim per name
        assert c.get(f"/id/{tag}").text == "2"


def test_made_up_tags_during_a_mysql_cut_leave_nothing_behind(
    proxied: tuple[Settings, TcpProxy, TcpProxy], tag: str
) -> None:
    s, mysql, _ = proxied
    add_tag(s, tag, step=1000)
    app = create_app(s)
    with TestClient(app) as c:
        assert c.get(f"/id/{tag}").text == "1"
        mysql.cut()
        time.sleep(1.1)  # past the tag list's reload interval: names make it reload (and fail)
        answers = [c.get(f"/id/cut{i}-{tag}") for i in range(200)]
        assert {r.status_code for r in answers} == {503}
        assert "mysql" in answers[-1].json()["message"]
        node = app.node
        assert node is not None and set(node.buffers) == {tag} and set(node.stats.tags) == {tag}
        assert [c.get(f"/id/{tag}").status_code for _ in range(50)] == [200] * 50


def test_a_batch_larger_than_a_range_is_one_claim(settings: Settings, tag: str) -> None:
    # Issue 10, defect 8: count=10000 at step 10 made a thousand sequential claims.
    add_tag(settings, tag, step=10)
    counted: list[CountingLedger] = []
    with TestClient(create_app(settings, stores=counted_stores(counted))) as c:
        ids = c.get(f"/ids/{tag}?count=10000").json()["ids"]
        assert ids == list(range(1, 10001))
        assert counted[0].claims[0] == 1000  # one claim of 1,000 steps (later: the reserve's)
        assert c.get(f"/id/{tag}").text == "10001"


def test_a_tag_created_a_moment_ago_is_served_at_once(settings: Settings, tag: str) -> None:
    add_tag(settings, tag)
    with TestClient(create_app(settings.with_changes(unknown_tag_ttl=30.0))) as c:
        assert c.get(f"/id/{tag}").text == "1"  # the node read the tag list just now
        assert c.get(f"/id/nosuch-{tag}").status_code == 404
        add_tag(settings, tag + "-new")
        assert c.get(f"/id/{tag}-new").text == "1"  # one lookup by name, not a 30 s wait


def test_a_remainder_push_that_could_not_connect_is_not_sent_not_unknown(
    proxied: tuple[Settings, TcpProxy, TcpProxy], tag: str
) -> None:
    # Issue 10: a push refused at connect was logged push_outcome_unknown, as if it
    # might have landed; it never left the process.
    s, _, redis = proxied
    add_tag(s, tag, step=100)
    app = create_app(s)
    with TestClient(app) as c:
        assert c.get(f"/id/{tag}").text == "1"
        node = app.node
        assert node is not None
        redis.cut()  # connections dropped, new ones refused
        time.sleep(PROBE_EVERY + 0.5)  # its health probe failed: the node knows Redis is gone
    wasted = node.waste.of(tag)
    assert wasted["push_not_sent"] > 0 and wasted["push_outcome_unknown"] == 0, dict(wasted)


def add_tag_of_kind(settings: Settings, tag: str, kind: str) -> None:
    """A ledger row of ``kind``, written as a newer idpool (or a new kind) would."""

    async def go() -> None:
        ledger = await Ledger.connect(settings)
        try:
            await ledger.add_tag(tag, step=10, start=1, rules=rules_of(kind))
        finally:
            await ledger.close()

    asyncio.run(go())


def test_a_tag_of_a_kind_this_node_does_not_serve_is_503(
    client: TestClient, settings: Settings, tag: str
) -> None:
    add_tag_of_kind(settings, tag, "newer_kind")
    for path in (f"/id/{tag}", f"/ids/{tag}?count=2"):
        r = client.get(path)
        assert r.status_code == 503 and r.json()["error"] == "unavailable", r.text
        assert "'newer_kind'" in r.json()["message"]
    assert ledger_max_id(settings, tag) == 1  # nothing was claimed for it


def test_a_tag_is_served_by_the_object_of_its_kind(
    client: TestClient, settings: Settings, tag: str
) -> None:
    class Counting:  # the smallest IdKind: IDs from a counter in memory
        name = "counting"
        from_memory = False
        last = 0

        async def next_id(self, tag: str) -> int:
            self.last += 1
            return self.last

        async def next_ids(self, tag: str, count: int) -> list[int]:
            return [await self.next_id(tag) for _ in range(count)]

        def holding(self, tag: str) -> dict[str, int]:
            return {"last": self.last}

        def not_ready(self) -> None:
            return None

        async def close(self) -> None:
            return None

    add_tag_of_kind(settings, tag, "counting")
    node = client.app.node  # type: ignore[attr-defined]
    node.kinds["counting"] = Counting()
    assert client.get(f"/id/{tag}").text == "1"
    assert client.get(f"/ids/{tag}?count=2").json() == {"tag": tag, "ids": [2, 3]}
    assert tag not in node.buffers  # not a segment tag: no buffer, no fast path
    assert ledger_max_id(settings, tag) == 1  # and no range claimed


class Toy(KindSpec):
    """A new kind that declares itself ``direct`` (no memory to answer from)."""

    name = "toy"
    rules = KindRules("toy")
    direct = True

    def make(self, ctx: KindContext) -> IdKind:
        return ToyKind()


class ToyKind:
    last = 0

    def __init__(self) -> None:
        self.tags: set[str] = set()

    async def next_id(self, tag: str) -> int:
        self.tags.add(tag)
        self.last += 1
        return self.last

    def served(self) -> set[str]:  # KeepsTags: shown in /status
        return self.tags

    async def next_ids(self, tag: str, count: int) -> list[int]:
        return [await self.next_id(tag) for _ in range(count)]

    def holding(self, tag: str) -> dict[str, object]:
        return {"kind": "toy", "issued": self.last}

    def not_ready(self) -> None:
        return None

    async def close(self) -> None:
        return None


def test_the_direct_path_serves_every_kind_whose_spec_says_direct(
    settings: Settings, tag: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setitem(SPECS, "toy", Toy())
    monkeypatch.setitem(KINDS, "toy", Toy().make)
    add_tag_of_kind(settings, tag, "toy")
    with TestClient(create_app(settings)) as c:
        app = c.app
        assert isinstance(app, NodeApp) and app.node is not None
        # found from the registry's flags: the toy beside strict, never a segment tag's kind
        assert sorted(app.node.direct) == ["strict", "toy"]
        assert app.node.direct["toy"] is app.node.kinds["toy"]
        assert c.get(f"/id/{tag}").text == "1"
        assert c.get(f"/ids/{tag}?count=2").json() == {"tag": tag, "ids": [2, 3]}
        entry = next(t for t in c.get("/status.json").json()["tags"] if t["tag"] == tag)
        assert entry["counters"]["ids_issued"] == 3  # its holding's "issued" (Held)
    assert app.node is None  # stopped: every request left to the routes


def test_an_error_of_the_direct_path_is_checked_against_the_route_table(
    settings: Settings, tag: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    add_tag_of_kind(settings, tag, "strict")

    async def refuse(tag: str) -> int:
        raise InvalidInput("wrong_secret", "a code no /id row lists")

    with TestClient(create_app(settings)) as c:
        app = c.app
        assert isinstance(app, NodeApp) and app.node is not None
        monkeypatch.setattr(app.node.direct["strict"], "next_id", refuse)
        answer = c.get(f"/id/{tag}")
        assert answer.json()["error"] == "wrong_secret", answer.text
    # recorded as the routes' errors are: the conftest check would have failed the test
    assert unlisted(ANSWERS.seen) == ["GET /id/{tag}: wrong_secret"]
    ANSWERS.seen.clear()


def test_a_wrong_method_on_an_id_route_names_only_get(client: TestClient, tag: str) -> None:
    # It said "use HEAD, GET" while HEAD is refused.
    for path in (f"/id/{tag}", f"/ids/{tag}", f"/api/segment/get/{tag}"):
        r = client.post(path)
        assert r.status_code == 405 and r.headers["allow"] == "GET", path
        assert r.json()["message"] == "use GET here, not POST"


@pytest.mark.parametrize("path", ["/lease/return", "/lease/x", "/admin/tags", "/admin/tags/x"])
def test_a_body_over_the_limit_is_refused_with_413(settings: Settings, path: str) -> None:
    def chunked() -> Iterator[bytes]:
        yield from [b"x" * 400] * 5  # no Content-Length: counted while read

    small = settings.with_changes(max_body_bytes=1000, admin_token="t")
    with TestClient(create_app(small)) as c:
        method = c.patch if path == "/admin/tags/x" else c.post
        headers = {"Authorization": "Bearer t"}
        # POST /lease/{tag} reads no body: a chunked one is never held, and not refused.
        for body in (b"x" * 1001, *([] if path == "/lease/x" else [chunked()])):
            r = method(path, content=body, headers=headers)  # type: ignore[operator]
            assert r.status_code == 413, (path, r.text)
            assert r.json()["error"] == "body_too_large" and "1000 bytes" in r.json()["message"]
        r = method(path, content=b"{}" + b" " * 998, headers=headers)  # type: ignore[operator]
        assert r.status_code != 413  # at the limit: read, and answered as usual


def _start_node(settings: Settings, tmp_path: Path, **extra: str) -> NodeProcess:
    """A real node on the test's stores, its preloader off."""
    env = env_with(
        IDPOOL_MYSQL_URL=settings.mysql_url,
        IDPOOL_REDIS_URL=settings.redis_url,
        IDPOOL_REDIS_PREFIX=settings.redis_prefix,
        IDPOOL_PRELOAD="0",
        **extra,
    )
    return NodeProcess(env, tmp_path / "node").start()


def _vm(pid: int, field: str) -> int:
    """A /proc/PID/status figure in bytes (VmHWM: the peak resident memory so far)."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1]) * 1024
    raise LookupError(field)


def _send_big(port: int, head: bytes, chunks: Iterator[bytes]) -> bytes:
    """Send a request whose body the node may refuse early; read its answer meanwhile."""
    sock = socket.create_connection(("127.0.0.1", port), timeout=20)
    answer = bytearray()

    def read() -> None:
        with contextlib.suppress(OSError):
            while data := sock.recv(65536):
                answer.extend(data)

    reader = threading.Thread(target=read)
    reader.start()
    with contextlib.suppress(OSError):  # the node hangs up on a body it refused
        sock.sendall(head)
        for chunk in chunks:
            sock.sendall(chunk)
    reader.join(20)
    sock.close()
    return bytes(answer)


def test_a_large_body_is_refused_unread_and_id_keeps_answering(
    settings: Settings, tag: str, tmp_path: Path
) -> None:
    # Two 256 MiB bodies took a node from 47 MiB to 1,071 MiB before.
    add_tag(settings, tag)
    node = _start_node(settings, tmp_path)
    try:
        assert node.proc is not None
        url = f"{node.base_url}/id/{tag}"
        assert urllib.request.urlopen(url, timeout=5).read() == b"1"
        peak = _vm(node.proc.pid, "VmHWM")
        size, mib = 64 * 2**20, b"x" * 2**20
        start = b"POST /lease/return HTTP/1.1\r\nHost: n\r\nConnection: close\r\n"
        declared = _send_big(
            node.port, start + b"Content-Length: %d\r\n\r\n" % size, iter([mib] * 64)
        )
        chunk = b"100000\r\n" + mib + b"\r\n"  # 1 MiB chunks, no Content-Length
        chunked = _send_big(
            node.port, start + b"Transfer-Encoding: chunked\r\n\r\n", iter([chunk] * 64)
        )
        for answer in (declared, chunked):
            assert answer.startswith(b"HTTP/1.1 413 "), answer[:200]
            assert b'"body_too_large"' in answer and b"65536 bytes" in answer
        assert _vm(node.proc.pid, "VmHWM") - peak < size // 4  # never held the body
        assert urllib.request.urlopen(url, timeout=5).read() == b"2"
    finally:
        node.stop()


def test_a_body_that_trickles_in_is_refused_at_its_deadline(
    settings: Settings, tag: str, tmp_path: Path
) -> None:
    # 800 connections each sending a body a byte a second held 80 KiB apiece for
    # as long as they liked: a body now has IDPOOL_BODY_SECONDS to arrive whole.
    add_tag(settings, tag)
    node = _start_node(settings, tmp_path, IDPOOL_BODY_SECONDS="1")
    try:
        sock = socket.create_connection(("127.0.0.1", node.port), timeout=10)
        started = time.monotonic()
        sock.sendall(b"POST /lease/return HTTP/1.1\r\nHost: n\r\nContent-Length: 100\r\n\r\n{")
        answer = bytearray()
        sock.settimeout(0.3)
        while b"\r\n\r\n{" not in answer and time.monotonic() - started < 8:
            try:
                sock.sendall(b" ")  # a byte now and then, never the whole body
                answer += sock.recv(4096)
            except TimeoutError:
                continue
            except OSError:
                break
        waited = time.monotonic() - started
        sock.close()
        assert answer.startswith(b"HTTP/1.1 408 "), bytes(answer[:200])
        assert b'"body_too_slow"' in answer and b"IDPOOL_BODY_SECONDS" in answer
        assert waited < 6, waited  # refused at its deadline, not when the client gave up
        url = f"{node.base_url}/id/{tag}"
        assert urllib.request.urlopen(url, timeout=5).read() == b"1"
    finally:
        node.stop()


def _waste(c: TestClient, tag: str) -> dict[str, int]:
    entry = next(t for t in c.get("/status.json").json()["tags"] if t["tag"] == tag)
    return dict(entry["counters"]["ids_wasted"])


def test_ids_of_an_answer_the_client_never_got_are_counted_as_waste(
    client: TestClient, settings: Settings, tag: str
) -> None:
    add_tag(settings, tag, step=1000)
    app = client.app
    assert isinstance(app, NodeApp) and client.portal is not None

    async def hung_up(path: str, query: bytes = b"") -> list[Message]:
        """A request whose client the server reports gone before the answer is sent."""
        scope: Scope = {"type": "http", "method": "GET", "path": path, "root_path": ""}
        scope.update(query_string=query, headers=[], http_version="1.1", scheme="http")
        scope["state"] = client.app_state.copy()  # the lifespan state, as a server passes it
        sent: list[Message] = []

        async def receive() -> Message:
            return {"type": "http.disconnect"}

        async def send(message: Message) -> None:
            sent.append(message)

        await app(scope, receive, send)
        return sent

    client.portal.call(hung_up, f"/id/{tag}")  # the routes: the first request makes the buffer
    assert _waste(client, tag) == {"answer_undelivered": 1}
    assert client.get(f"/id/{tag}").text == "2"  # ID 1 was not served, and not lost unseen
    assert client.portal.call(hung_up, f"/id/{tag}") == []  # the fast path sends nothing
    client.portal.call(hung_up, f"/ids/{tag}", b"count=5")
    client.portal.call(hung_up, f"/ids/{tag}", b"count=5&pretty=1")  # the routes
    assert _waste(client, tag) == {"answer_undelivered": 12}
    assert client.get(f"/id/{tag}").text == "14"

    async def send_fails(path: str) -> None:
        """A server that raises on a send to a client that is gone (ASGI 2.4)."""
        scope: Scope = {"type": "http", "method": "GET", "path": path, "root_path": ""}
        scope.update(query_string=b"", headers=[], http_version="1.1", scheme="http")
        scope["state"] = client.app_state.copy()

        async def receive() -> Message:
            return {"type": "http.request", "body": b"", "more_body": False}

        async def send(message: Message) -> None:
            raise OSError("the client is gone")

        with pytest.raises(OSError):
            await app(scope, receive, send)

    client.portal.call(send_fails, f"/id/{tag}")  # the fast path
    assert _waste(client, tag) == {"answer_undelivered": 13}
    assert client.get(f"/id/{tag}").text == "16"
    metrics = client.get("/metrics").text
    assert f'idpool_ids_wasted_total{{reason="answer_undelivered",tag="{tag}"}} 13.0' in metrics


def test_a_client_that_hangs_up_while_its_id_is_fetched_wastes_it_counted(
    settings: Settings, tag: str, tmp_path: Path
) -> None:
    """On uvicorn, as before granian was the default (which sees a hang-up 1-5 ms
    after the client's FIN: an answer ready sooner goes uncounted; docs/design/node.md,
    "Answers that cannot be delivered")."""
    add_tag(settings, tag)
    node = _start_node(settings, tmp_path, IDPOOL_HTTP="uvicorn")
    try:
        # The first request for the tag waits for the ledger (a lookup, a claim):
        # the client is gone by then.
        with socket.create_connection(("127.0.0.1", node.port), timeout=5) as sock:
            sock.sendall(f"GET /id/{tag} HTTP/1.1\r\nHost: n\r\n\r\n".encode())
        deadline = time.monotonic() + 10
        wasted: dict[str, int] = {}
        while time.monotonic() < deadline and not wasted:
            with urllib.request.urlopen(f"{node.base_url}/status.json", timeout=5) as r:
                tags = orjson.loads(r.read())["tags"]
            entry = next((t for t in tags if t["tag"] == tag), None)
            wasted = {} if entry is None else entry["counters"]["ids_wasted"]
            time.sleep(0.05)
        assert wasted == {"answer_undelivered": 1}
        with urllib.request.urlopen(f"{node.base_url}/id/{tag}", timeout=5) as r:
            assert r.read() == b"2"
    finally:
        node.stop()
    assert "reason=answer_undelivered" in node.logs[-1].read_text()
