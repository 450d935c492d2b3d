"""Strict tags through a node's HTTP API (service/kinds/strict.py's StrictKind):
real-time order across nodes, one Redis call per batch of requests, leases
refused, the mode shown, honest 503s while Redis is away, the embedded mode."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Iterator

import pytest
from starlette.testclient import TestClient
from starlette.types import Message, Scope

from idpool.pool.claims import LedgerClaims
from idpool.pool.ledger import Ledger
from idpool.pool.preloader import Preloader
from idpool.pool.redis_pool import RedisPool
from idpool.pool.settings import Settings
from idpool.service.app import NodeApp, create_app
from idpool.service.kinds import rules_of
from idpool.service.kinds.strict import StrictKind
from ops.toolkit import TcpProxy

TOKEN = "t" * 32
AUTH = {"Authorization": f"Bearer {TOKEN}"}


def add_strict(settings: Settings, tag: str, step: int = 10, kind: str = "strict") -> None:
    async def go() -> None:
        ledger = await Ledger.connect(settings)
        try:
            await ledger.add_tag(tag, step=step, start=1, rules=rules_of(kind))
        finally:
            await ledger.close()

    asyncio.run(go())


def strict_kind(client: TestClient) -> StrictKind:
    kind = client.app.node.kinds["strict"]  # type: ignore[attr-defined]
    assert isinstance(kind, StrictKind)
    return kind


def test_ids_increase_in_real_time_across_two_nodes(settings: Settings, tag: str) -> None:
    add_strict(settings, tag, step=7)
    with TestClient(create_app(settings)) as a, TestClient(create_app(settings)) as b:
        top = 0
        for i in range(60):
            node = a if i % 2 else b
            if i % 3:
                got = [int(node.get(f"/id/{tag}").text)]
            else:
                got = node.get(f"/ids/{tag}?count={1 + i % 11}").json()["ids"]
            # answered before the next request is sent: the next is above all of it
            assert got[0] > top and got == list(range(got[0], got[0] + len(got))), (i, got)
            top = got[-1]
        assert a.get(f"/api/segment/get/{tag}").text == str(top + 1)  # Leaf's path too


def test_concurrent_requests_share_redis_calls(settings: Settings, tag: str) -> None:
    add_strict(settings, tag, step=1000)
    with TestClient(create_app(settings)) as c:
        got: list[int] = []
        lock = threading.Lock()

        def draw() -> None:
            for _ in range(25):
                value = int(c.get(f"/id/{tag}").text)
                with lock:
                    got.append(value)

        threads = [threading.Thread(target=draw) for _ in range(16)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert len(got) == len(set(got)) == 400
        queue = strict_kind(c).tags.queues[tag]
        assert queue.issued == 400 and queue.calls < 400  # batched: fewer calls than requests


def test_a_lease_of_a_strict_tag_is_refused(settings: Settings, tag: str) -> None:
    add_strict(settings, tag)
    with TestClient(create_app(settings)) as c:
        r = c.post(f"/lease/{tag}?count=100")
        assert r.status_code == 409
        assert r.json()["error"] == "strict_tag"
        assert "strict" in r.json()["message"] and f"/id/{tag}" in r.json()["message"]
        assert c.get(f"/id/{tag}").text == "1"  # nothing was taken for the lease


def test_the_mode_is_shown_and_chosen_by_strict_true(settings: Settings, tag: str) -> None:
    with TestClient(create_app(settings.with_changes(admin_token=TOKEN))) as c:
        made = c.post("/admin/tags", json={"tag": tag, "strict": True}, headers=AUTH)
        assert made.status_code == 201 and made.json()["kind"] == "strict"
        both = c.post("/admin/tags", json={"tag": tag + "b", "strict": True, "kind": "segment"})
        assert both.status_code in (400, 401)
        clash = c.post(
            "/admin/tags", json={"tag": tag + "b", "strict": True, "kind": "segment"}, headers=AUTH
        )
        assert clash.status_code == 400 and clash.json()["error"] == "bad_kind"
        bad = c.post("/admin/tags", json={"tag": tag + "c", "strict": "yes"}, headers=AUTH)
        assert bad.status_code == 400 and bad.json()["error"] == "bad_kind"
        listed = c.get("/admin/tags", headers=AUTH).json()["tags"]
        assert [t["kind"] for t in listed if t["tag"] == tag] == ["strict"]
        assert c.get(f"/id/{tag}").status_code == 200
        shown = c.get("/status.json").json()
        mine = [t for t in shown["tags"] if t["tag"] == tag]
        assert mine and mine[0]["kind"] == "strict" and mine[0]["buffer"]["mode"] == "strict"
        assert mine[0]["counters"]["ids_issued"] == 1
        assert "strict" in c.get("/status").text
        api = c.get("/openapi.json").json()
        new_tag = api["paths"]["/admin/tags"]["post"]["requestBody"]["content"][
            "application/json"
        ]["schema"]["properties"]
        assert "strict" in new_tag["kind"]["enum"] and new_tag["strict"]["type"] == "boolean"
        assert "409" in api["paths"]["/lease/{tag}"]["post"]["responses"]


@pytest.fixture
def proxied_redis(settings: Settings) -> Iterator[tuple[Settings, TcpProxy]]:
    redis = TcpProxy(6379)
    url = f"redis://127.0.0.1:{redis.port}/0"
    yield settings.with_changes(redis_url=url, store_timeout=0.5), redis
    redis.cut()


def test_without_redis_a_strict_tag_is_503_naming_redis_then_comes_back(
    proxied_redis: tuple[Settings, TcpProxy], tag: str
) -> None:
    s, redis = proxied_redis
    add_strict(s, tag, step=1000)
    with TestClient(create_app(s)) as c:
        before = int(c.get(f"/id/{tag}").text)
        redis.cut()
        r = c.get(f"/id/{tag}")  # a node cannot be strict from memory
        assert r.status_code == 503 and r.json()["error"] == "unavailable"
        assert "redis" in r.json()["message"]
        # counted by its code, as the routes' errors are (the strict path answers it itself)
        errors = 'idpool_http_errors_total{error="unavailable",route="id"} 1.0'
        assert errors in c.get("/metrics").text
        redis.restore()
        for _ in range(50):
            r = c.get(f"/id/{tag}")
            if r.status_code == 200:
                break
            asyncio.run(asyncio.sleep(0.1))
        assert r.status_code == 200 and int(r.text) > before  # by itself, within seconds


@pytest.mark.anyio
async def test_the_preloader_never_fills_a_strict_tag(
    settings: Settings, ledger: Ledger, redis_pool: RedisPool, tag: str
) -> None:
    await ledger.add_tag(tag, step=10, start=1, rules=rules_of("strict"))
    preloader = Preloader(settings, ledger, redis_pool, LedgerClaims(ledger, redis_pool))
    report = await preloader.refill_tag(await ledger.get_tag(tag))
    assert report.skipped == "kind strict" and report.pushed == []
    assert await redis_pool.depth(tag) == 0
    assert (await ledger.get_tag(tag)).max_id == 1  # nothing claimed


def test_the_embedded_mode_serves_strict_tags(sqlite_settings: Settings, tag: str) -> None:
    with TestClient(create_app(sqlite_settings.with_changes(admin_token=TOKEN))) as c:
        made = c.post("/admin/tags", json={"tag": tag, "strict": True, "step": 100}, headers=AUTH)
        assert made.status_code == 201
        got = [int(c.get(f"/id/{tag}").text) for _ in range(3)]
        batch = c.get(f"/ids/{tag}?count=5").json()["ids"]
        assert got + batch == list(range(1, 9))  # one transaction on the file each, in order
    with TestClient(create_app(sqlite_settings)) as c:  # a restart goes on above
        assert c.get(f"/id/{tag}").text == "9"


def test_ids_of_a_strict_answer_the_client_never_got_are_counted_as_waste(
    settings: Settings, tag: str
) -> None:
    """The strict path waits for the shared sequence: a client that hung up
    meanwhile (or whose send fails) never gets its IDs, which are waste, counted
    as on the fast path, and never handed out again."""
    add_strict(settings, tag, step=1000)
    with TestClient(create_app(settings)) as c:
        app = c.app
        assert isinstance(app, NodeApp) and c.portal is not None
        assert c.get(f"/id/{tag}").text == "1"

        async def request(path: str, query: bytes, gone: bool) -> list[Message]:
            scope: Scope = {"type": "http", "method": "GET", "path": path, "root_path": ""}
            scope.update(query_string=query, headers=[], http_version="1.1", scheme="http")
            scope["state"] = c.app_state.copy()  # the lifespan state, as a server passes it
            sent: list[Message] = []

            async def receive() -> Message:
                if gone:
                    return {"type": "http.disconnect"}
                return {"type": "http.request", "body": b"", "more_body": False}

            async def send(message: Message) -> None:
                if not gone:
                    raise OSError("the client is gone")
                sent.append(message)

            await app(scope, receive, send)
            return sent

        assert c.portal.call(request, f"/id/{tag}", b"", True) == []  # nothing sent
        assert c.portal.call(request, f"/ids/{tag}", b"count=5", True) == []
        with pytest.raises(OSError):
            c.portal.call(request, f"/id/{tag}", b"", False)
        entry = next(t for t in c.get("/status.json").json()["tags"] if t["tag"] == tag)
        assert entry["counters"]["ids_wasted"] == {"answer_undelivered": 7}
        assert c.get(f"/id/{tag}").text == "9"  # 2-8 were never served, and never will be
        metrics = c.get("/metrics").text
        assert f'idpool_ids_wasted_total{{reason="answer_undelivered",tag="{tag}"}} 7.0' in metrics


def test_tokens_and_disable_hold_for_strict_tags(settings: Settings, tag: str) -> None:
    """The strict fast path (NodeApp) takes only what the routes would hand
    straight to the kind: a tag with tokens or disabled goes to the routes."""
    add_strict(settings, tag)
    with TestClient(create_app(settings.with_changes(admin_token=TOKEN))) as c:
        assert c.get(f"/id/{tag}").text == "1"  # known here now: the fast path serves it
        token = c.post(f"/admin/tags/{tag}/tokens", headers=AUTH).json()["token"]
        assert c.get(f"/id/{tag}").status_code == 401
        mine = {"Authorization": f"Bearer {token}"}
        assert c.get(f"/ids/{tag}?count=2", headers=mine).json()["ids"] == [2, 3]
        off = c.patch(f"/admin/tags/{tag}", json={"disabled": True}, headers=AUTH)
        assert off.status_code == 200
        r = c.get(f"/id/{tag}", headers=mine)
        assert r.status_code == 410 and r.json()["error"] == "tag_disabled"


def test_both_stores_down_the_503_names_both(settings: Settings, tag: str) -> None:
    mysql, redis = TcpProxy(3306), TcpProxy(6379)
    s = settings.with_changes(
        mysql_url=settings.mysql_url.replace(":3306/", f":{mysql.port}/"),
        redis_url=f"redis://127.0.0.1:{redis.port}/0",
        store_timeout=0.5,
    )
    add_strict(s, tag)
    try:
        with TestClient(create_app(s)) as c:
            assert c.get(f"/id/{tag}").status_code == 200
            mysql.cut()
            redis.cut()
            r = c.get(f"/id/{tag}")
            assert r.status_code == 503
            assert "redis" in r.json()["message"] and "mysql" in r.json()["message"]
    finally:
        mysql.cut()
        redis.cut()


def test_metrics_show_a_strict_tag(settings: Settings, tag: str) -> None:
    add_strict(settings, tag)
    with TestClient(create_app(settings)) as c:
        assert c.get(f"/ids/{tag}?count=3").status_code == 200
        text = c.get("/metrics").text
        assert f'idpool_ids_issued_total{{tag="{tag}"}} 3.0' in text


def test_a_strict_name_added_again_starts_above_its_start_and_all_it_issued(
    settings: Settings, tag: str
) -> None:
    """The strict state in Redis outlived `tag remove`: a name strict (1-5), removed,
    added as a segment tag (1001-1004), removed, added strict with --start 5000000
    answered 6, 7, 8 from the first life's state: below its start and below IDs the
    name had issued. (A name now keeps its kind: the segment add is refused, and
    the strict one without it answered 6, 7, 8 just the same.)"""
    issued: list[int] = []
    with TestClient(create_app(settings.with_changes(admin_token=TOKEN))) as c:

        def add(**fields: object) -> None:
            r = c.post("/admin/tags", json={"tag": tag, **fields}, headers=AUTH)
            assert r.status_code == 201, r.text

        def take(count: int) -> list[int]:
            got = [int(c.get(f"/id/{tag}").text) for _ in range(count)]
            issued.extend(got)
            return got

        def remove() -> None:
            assert c.delete(f"/admin/tags/{tag}", headers=AUTH).status_code == 200

        add(strict=True, step=1000)
        assert take(5) == [1, 2, 3, 4, 5]
        remove()
        refused = c.post("/admin/tags", json={"tag": tag, "step": 1000}, headers=AUTH)
        assert refused.status_code == 409 and refused.json()["error"] == "name_used"
        add(strict=True, step=1000)
        assert take(4) == [1001, 1002, 1003, 1004]  # above the tombstone (1-1000 claimed)
        remove()
        add(strict=True, start=5_000_000)
        top = max(issued)
        again = take(3)
        assert again[0] >= 5_000_000 and again[0] > top, again
        assert again == sorted(again) and len(set(issued)) == len(issued)


def test_an_unknown_tag_on_the_direct_path_names_the_ledger(
    settings: Settings, tag: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A strict tag removed in the reload window (its row still read here) answers
    404 from NodeApp's direct path with the message the routes give: it names the
    ledger, so an operator knows which database lacks the tag (it did not)."""
    from idpool.pool.errors import UnknownTag

    add_strict(settings, tag)
    with TestClient(create_app(settings)) as c:
        assert c.get(f"/id/{tag}").status_code == 200
        kind = strict_kind(c)

        async def gone(tag: str, n: int = 1) -> int:
            raise UnknownTag(tag)

        monkeypatch.setattr(kind, "next_id", gone)
        monkeypatch.setattr(kind, "next_ids", gone)
        for path in (f"/id/{tag}", f"/ids/{tag}?count=2"):
            r = c.get(path)
            assert r.status_code == 404 and r.json()["error"] == "unknown_tag", r.text
            assert settings.ledger_shown() in r.json()["message"], r.text
