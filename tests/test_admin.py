from __future__ import annotations

import asyncio
from collections.abc import Iterator
from datetime import UTC, datetime

import pytest
from starlette.testclient import TestClient

from idpool.pool.claims import LedgerClaims
from idpool.pool.ledger import Ledger
from idpool.pool.redis_pool import RedisPool
from idpool.pool.settings import Settings
from idpool.service.app import create_app

from .test_app import add_tag, pool_ranges

TOKEN = "s3cret-admin-token"
AUTH = {"Authorization": f"Bearer {TOKEN}"}


@pytest.fixture
def admin(settings: Settings) -> Iterator[TestClient]:
    with TestClient(create_app(settings.with_changes(admin_token=TOKEN))) as c:
        yield c


def test_admin_api_is_off_without_a_token(settings: Settings) -> None:
    with TestClient(create_app(settings)) as c:
        r = c.post("/admin/tags", json={"tag": "x"}, headers=AUTH)
        assert r.status_code == 404
        assert "IDPOOL_ADMIN_TOKEN" in r.json()["message"]


@pytest.mark.parametrize(
    "headers",
    [{}, {"Authorization": "Bearer wrong"}, {"Authorization": TOKEN}, {"Authorization": "Basic x"}],
)
def test_wrong_or_missing_token_is_401(admin: TestClient, headers: dict[str, str]) -> None:
    r = admin.post("/admin/tags", json={"tag": "x"}, headers=headers)
    assert r.status_code == 401
    assert r.headers["www-authenticate"] == "Bearer"
    assert TOKEN not in r.text


def test_create_tag_then_serve_it(admin: TestClient, tag: str) -> None:
    r = admin.post(
        "/admin/tags",
        json={"tag": tag, "step": 50, "start": 1000, "description": "d"},
        headers=AUTH,
    )
    assert r.status_code == 201
    assert r.json()["step"] == 50 and r.json()["max_id"] == 1000
    assert admin.get(f"/id/{tag}").text == "1000"
    again = admin.post("/admin/tags", json={"tag": tag}, headers=AUTH)
    assert again.status_code == 409 and again.json()["error"] == "tag_exists"
    listed = admin.get("/admin/tags", headers=AUTH).json()["tags"]
    assert any(t["tag"] == tag for t in listed)


BAD_BODIES = [
    b"not json",
    b"[1]",
    b'{"tag": "a b"}',
    b'{"tag": "ok", "step": 0}',
    b'{"tag": "ok", "step": "5"}',
    b'{"tag": "ok", "start": -1}',
    b'{"tag": "ok", "step": true}',
    b'{"tag": "ok", "step": 4294967296}',
]


def test_an_unknown_field_is_refused_not_ignored(admin: TestClient, tag: str) -> None:
    # "steps" for "step": silently created with the default step before.
    r = admin.post("/admin/tags", json={"tag": tag, "steps": 5000}, headers=AUTH)
    assert r.status_code == 400
    assert r.json()["error"] == "bad_body" and "'steps'" in r.json()["message"]
    listed = admin.get("/admin/tags", headers=AUTH).json()["tags"]
    assert all(t["tag"] != tag for t in listed)  # nothing was created


@pytest.mark.parametrize("body", BAD_BODIES)
def test_bad_create_bodies_are_400(admin: TestClient, body: bytes) -> None:
    r = admin.post("/admin/tags", content=body, headers=AUTH)
    assert r.status_code == 400 and r.json()["message"]


def test_change_step(admin: TestClient, settings: Settings, tag: str) -> None:
    add_tag(settings, tag, step=10)
    r = admin.patch(f"/admin/tags/{tag}", json={"step": 25}, headers=AUTH)
    assert r.status_code == 200 and r.json()["step"] == 25 and r.json()["min_step"] == 25
    assert admin.get(f"/ids/{tag}", params={"count": 30}).json()["ids"] == list(range(1, 31))
    assert admin.patch("/admin/tags/nosuchtag1", json={"step": 5}, headers=AUTH).status_code == 404
    bad = admin.patch(f"/admin/tags/{tag}", json={"step": 5, "max_id": 1}, headers=AUTH)
    assert bad.status_code == 400


def test_start_moves_forward_never_back(admin: TestClient, settings: Settings, tag: str) -> None:
    add_tag(settings, tag, step=10)
    assert admin.get(f"/id/{tag}").text == "1"  # this node holds 1-10 (and maybe 11-20)
    r = admin.patch(f"/admin/tags/{tag}", json={"start": 1}, headers=AUTH)
    assert r.status_code == 409 and r.json()["error"] == "start_below_issued"
    assert "can only move forward" in r.json()["message"]
    r = admin.patch(f"/admin/tags/{tag}", json={"start": 5000, "step": 20}, headers=AUTH)
    assert r.status_code == 200 and r.json()["max_id"] == 5000 and r.json()["step"] == 20
    ids = admin.get(f"/ids/{tag}", params={"count": 40}).json()["ids"]
    held = [i for i in ids if i < 5000]
    assert held == list(range(2, 2 + len(held)))  # ranges claimed before are served first
    assert ids[len(held) :] == list(range(5000, 5000 + 40 - len(held)))
    assert admin.patch(f"/admin/tags/{tag}", json={}, headers=AUTH).status_code == 400
    bad = admin.patch(f"/admin/tags/{tag}", json={"start": 0}, headers=AUTH)
    assert bad.status_code == 400 and bad.json()["error"] == "bad_start"


def test_a_start_above_the_max_is_refused_not_exhausting_the_tag(
    admin: TestClient, tag: str
) -> None:
    r = admin.post("/admin/tags", json={"tag": tag, "step": 10, "max": 100}, headers=AUTH)
    assert r.status_code == 201
    for start in (101, 2**63 - 1):
        r = admin.patch(f"/admin/tags/{tag}", json={"start": start}, headers=AUTH)
        assert r.status_code == 409 and r.json()["error"] == "start_above_max"
        assert "max 100" in r.json()["message"]
    assert admin.get(f"/id/{tag}").text == "1"  # nothing moved: still served
    r = admin.patch(f"/admin/tags/{tag}", json={"start": 100}, headers=AUTH)
    assert r.status_code == 200 and r.json()["ids_left"] == 1  # the max itself is left
    unbounded = tag + "u"
    assert admin.post("/admin/tags", json={"tag": unbounded}, headers=AUTH).status_code == 201
    r = admin.patch(f"/admin/tags/{unbounded}", json={"start": 2**63 - 1}, headers=AUTH)
    assert r.status_code == 409 and r.json()["error"] == "start_above_max"


def test_options_and_wrong_methods_list_every_method_of_the_path(admin: TestClient) -> None:
    # OPTIONS /admin/tags said "GET, HEAD": the first route's methods, not POST.
    expected = {
        "/admin/tags": "GET, HEAD, POST",
        "/admin/tags/x": "DELETE, PATCH",  # DELETE: tag remove
        "/admin/tags/x/tokens": "GET, HEAD, POST",
        "/admin/tags/x/tokens/y": "DELETE",
        "/admin/drain": "POST",
    }
    for path, allowed in expected.items():
        for method in ("OPTIONS", "PUT"):
            r = admin.request(method, path, headers=AUTH)
            assert r.status_code == 405 and r.headers["allow"] == allowed, (path, method)
            assert r.json()["message"] == f"use {allowed} here, not {method}"


def test_drain_returns_remainders_and_stops_serving(
    admin: TestClient, settings: Settings, tag: str
) -> None:
    add_tag(settings, tag, step=100)
    assert admin.get(f"/id/{tag}").text == "1"
    r = admin.post("/admin/drain", headers=AUTH)
    assert r.status_code == 200
    assert f"{tag}=2-100" in r.json()["returned"]
    assert pool_ranges(settings, tag)[0] == "2-100"
    assert admin.get(f"/id/{tag}").status_code == 503
    assert admin.get("/readyz").status_code == 503


def test_drain_then_stop_pushes_the_remainder_once(settings: Settings, tag: str) -> None:
    """Shutdown runs twice here (the admin drain, then the lifespan): one push."""
    add_tag(settings, tag, step=100)
    with TestClient(create_app(settings.with_changes(admin_token=TOKEN))) as c:
        assert c.get(f"/id/{tag}").text == "1"
        assert c.post("/admin/drain", headers=AUTH).status_code == 200
    ranges = pool_ranges(settings, tag)
    assert ranges.count("2-100") == 1


def test_a_bounded_tag_is_created_with_max(admin: TestClient, tag: str) -> None:
    r = admin.post("/admin/tags", json={"tag": tag, "step": 10, "max": 25}, headers=AUTH)
    assert r.status_code == 201 and (r.json()["max"], r.json()["ids_left"]) == (25, 25)
    ids = [int(admin.get(f"/id/{tag}").text) for _ in range(25)]
    assert ids == list(range(1, 26))
    assert admin.get(f"/id/{tag}").json()["error"] == "tag_exhausted"
    low = admin.post("/admin/tags", json={"tag": tag + "x", "start": 10, "max": 9}, headers=AUTH)
    assert low.status_code == 400 and low.json()["error"] == "bad_max"


def test_disable_drains_the_pool_answers_410_and_enable_serves_above(
    settings: Settings, tag: str
) -> None:
    async def fill() -> None:
        ledger = await Ledger.connect(settings)
        pool = RedisPool.from_settings(settings)
        claims = LedgerClaims(ledger, pool)
        for _ in range(3):
            await pool.push(tag, [(await claims.claim(tag)).range], head=False)
        await pool.close()
        await ledger.close()

    add_tag(settings, tag, step=10)
    with TestClient(create_app(settings.with_changes(admin_token=TOKEN))) as admin:
        assert admin.get(f"/id/{tag}").text == "1"  # buffer 1-10 here, ledger to 11
        asyncio.run(fill())  # the pool: 11-20, 21-30, 31-40
        r = admin.patch(f"/admin/tags/{tag}", json={"disabled": True}, headers=AUTH)
        assert r.status_code == 200 and r.json()["disabled"] is True
        assert r.json()["max_id"] == 41  # the high-water mark stays
        assert pool_ranges(settings, tag) == []
        gone = admin.get(f"/id/{tag}")
        assert gone.status_code == 410 and gone.json()["error"] == "tag_disabled"
        assert admin.get(f"/ids/{tag}", params={"count": 2}).status_code == 410
        assert admin.get("/readyz").status_code == 200
        listed = admin.get("/admin/tags", headers=AUTH).json()["tags"]
        assert next(t for t in listed if t["tag"] == tag)["disabled"] is True
        metrics = admin.get("/metrics").text
        # 30 from the pool, 9 from this node's buffer
        assert f'idpool_ids_wasted_total{{reason="tag_disabled",tag="{tag}"}} 39.0' in metrics
        r = admin.patch(f"/admin/tags/{tag}", json={"disabled": False}, headers=AUTH)
        assert r.status_code == 200 and r.json()["disabled"] is False
        assert admin.get(f"/id/{tag}").text == "41"  # above everything issued
        bad = admin.patch(f"/admin/tags/{tag}", json={"disabled": "yes"}, headers=AUTH)
        assert bad.status_code == 400 and bad.json()["error"] == "bad_disabled"


def test_a_tag_with_tokens_serves_only_requests_that_show_one(
    admin: TestClient, settings: Settings, tag: str
) -> None:
    add_tag(settings, tag, step=100)
    open_tag = tag + "-open"
    add_tag(settings, open_tag, step=100)
    assert admin.get(f"/id/{tag}").text == "1"  # no tokens yet: as before (a buffer now)
    made = admin.post(f"/admin/tags/{tag}/tokens", headers=AUTH)
    assert made.status_code == 201
    token, token_id = made.json()["token"], made.json()["id"]
    assert len(token) >= 40
    # The buffer holds IDs: the fast path must not answer without the token.
    for path in (f"/id/{tag}", f"/api/segment/get/{tag}", f"/ids/{tag}?count=2"):
        refused = admin.get(path)
        assert refused.status_code == 401 and refused.json()["error"] == "unauthorized", path
        assert token not in refused.text
        wrong = admin.get(path, headers={"Authorization": "Bearer " + token[:-1] + "x"})
        assert wrong.status_code == 401, path
    assert admin.get(f"/id/{tag}", headers={"Authorization": f"Bearer {token}"}).text == "2"
    assert admin.get(f"/id/{tag}", params={"token": token}).text == "3"  # Leaf-style clients
    batch = admin.get(f"/ids/{tag}", params={"count": 2, "token": token})
    assert batch.json()["ids"] == [4, 5]
    assert admin.get(f"/id/{open_tag}").text == "1"  # other tags: no token needed
    listed = admin.get(f"/admin/tags/{tag}/tokens", headers=AUTH).json()
    assert [t["id"] for t in listed["tokens"]] == [token_id] and token not in str(listed)
    gone = admin.delete(f"/admin/tags/{tag}/tokens/{token_id}", headers=AUTH)
    assert gone.status_code == 200
    again = admin.delete(f"/admin/tags/{tag}/tokens/{token_id}", headers=AUTH)
    assert again.status_code == 404 and again.json()["error"] == "unknown_token"
    assert admin.get(f"/id/{tag}").text == "6"  # no tokens left: served to anyone again
    nosuch = admin.post(f"/admin/tags/{tag}-nope/tokens", headers=AUTH)
    assert nosuch.status_code == 404 and nosuch.json()["error"] == "unknown_tag"


def test_a_tag_has_a_kind_and_only_known_kinds_are_taken(admin: TestClient, tag: str) -> None:
    made = admin.post("/admin/tags", json={"tag": tag, "kind": "segment"}, headers=AUTH)
    assert made.status_code == 201 and made.json()["kind"] == "segment"
    listed = admin.get("/admin/tags", headers=AUTH).json()["tags"]
    assert [t["kind"] for t in listed if t["tag"] == tag] == ["segment"]
    bad = admin.post("/admin/tags", json={"tag": tag + "x", "kind": "uuid7"}, headers=AUTH)
    assert bad.status_code == 400 and bad.json()["error"] == "bad_kind"
    assert "'uuid7'" in bad.json()["message"] and "segment" in bad.json()["message"]


def test_remove_a_tag_for_good_and_add_it_again_above_all_it_issued(
    settings: Settings, tag: str
) -> None:
    import redis

    from idpool.pool.keys import Keys

    async def fill() -> None:
        ledger = await Ledger.connect(settings)
        pool = RedisPool.from_settings(settings)
        claims = LedgerClaims(ledger, pool)
        for _ in range(3):
            await pool.push(tag, [(await claims.claim(tag)).range], head=False)
        await pool.close()
        await ledger.close()

    add_tag(settings, tag, step=10)
    with TestClient(create_app(settings.with_changes(admin_token=TOKEN))) as admin:
        assert admin.get(f"/id/{tag}").text == "1"  # buffer 1-10 here, ledger to 11
        made = admin.post(f"/admin/tags/{tag}/tokens", headers=AUTH)
        token = made.json()["token"]
        asyncio.run(fill())  # the pool: 11-20, 21-30, 31-40
        r = admin.delete(f"/admin/tags/{tag}", headers=AUTH)
        assert r.status_code == 200, r.text
        assert r.json()["removed"]["max_id"] == 41 and r.json()["wasted"] == 30
        assert pool_ranges(settings, tag) == []
        for headers in ({}, {"Authorization": f"Bearer {token}"}):
            gone = admin.get(f"/id/{tag}", headers=headers)  # the buffer here is dropped too
            assert gone.status_code == 404 and gone.json()["error"] == "unknown_tag"
        assert all(t["tag"] != tag for t in admin.get("/admin/tags", headers=AUTH).json()["tags"])
        metrics = admin.get("/metrics").text
        # 30 from the pool, 9 from this node's buffer
        assert f'idpool_ids_wasted_total{{reason="tag_removed",tag="{tag}"}} 39.0' in metrics
        again = admin.delete(f"/admin/tags/{tag}", headers=AUTH)
        assert again.status_code == 404 and again.json()["error"] == "unknown_tag"
        # Redis loses the high-water mark: the ledger's tombstone still fences the name.
        redis.Redis.from_url(settings.redis_url).delete(Keys(settings.redis_prefix).hwm(tag))
        added = admin.post("/admin/tags", json={"tag": tag, "start": 1}, headers=AUTH)
        assert added.status_code == 201 and added.json()["max_id"] == 41
        assert admin.get(f"/admin/tags/{tag}/tokens", headers=AUTH).json()["tokens"] == []
    with TestClient(create_app(settings)) as node:  # (this one remembers the name as unknown)
        assert node.get(f"/id/{tag}").text == "41"  # open again: its tokens went with it


def test_a_tokens_created_at_is_the_instant_with_its_time_zone(
    admin: TestClient, settings: Settings, tag: str
) -> None:
    """Issue 29: created_at came back as the server's local time with no zone."""
    add_tag(settings, tag)
    before = datetime.now(UTC)
    made = admin.post(f"/admin/tags/{tag}/tokens", headers=AUTH).json()
    listed = admin.get(f"/admin/tags/{tag}/tokens", headers=AUTH).json()["tokens"]
    for shown in (made["created_at"], listed[0]["created_at"]):
        at = datetime.fromisoformat(shown)
        assert at.utcoffset() is not None, shown  # says its zone
        assert abs((at - before).total_seconds()) < 60, (shown, before)
