from __future__ import annotations

import asyncio
import logging
from collections.abc import Iterator
from typing import Any

import pytest
import redis
from starlette.testclient import TestClient

from idpool.pool import lease_store
from idpool.pool.errors import StoreUnavailable
from idpool.pool.keys import Keys
from idpool.pool.settings import Settings
from idpool.service.app import create_app
from ops.servers import RedisServer

from .test_app import add_tag, pool_ranges


@pytest.fixture
def client(settings: Settings) -> Iterator[TestClient]:
    with TestClient(create_app(settings)) as c:
        yield c


def lease(client: TestClient, tag: str, count: int | None = None) -> dict[str, Any]:
    query = "" if count is None else f"?count={count}"
    r = client.post(f"/lease/{tag}{query}")
    assert r.status_code == 200, r.text
    body: dict[str, Any] = r.json()
    return body


def give_back(client: TestClient, lease_id: str, start: int, **extra: Any) -> Any:
    return client.post("/lease/return", json={"lease": lease_id, "from": start, **extra})


def snapshot(settings: Settings, tag: str) -> tuple[list[str], dict[str, str]]:
    """The tag's list and every lease record: what a refused return must not change."""
    plain = redis.Redis.from_url(settings.redis_url, decode_responses=True)
    prefix = Keys(settings.redis_prefix).leased_prefix
    records = {k: str(plain.get(k)) for k in plain.scan_iter(prefix + "*")}
    return pool_ranges(settings, tag), records


def test_lease_then_return_once(client: TestClient, settings: Settings, tag: str) -> None:
    add_tag(settings, tag, step=100, start=1)
    body = lease(client, tag)
    assert body["tag"] == tag and body["count"] == 100
    [held] = body["leases"]
    assert (held["first"], held["last"]) == (1, 100)
    r = give_back(client, held["lease"], 41, tag=tag)
    assert r.status_code == 200, r.text
    assert r.json() == {
        "lease": held["lease"],
        "tag": tag,
        "returned": {"first": 41, "last": 100},
        "count": 60,
    }
    assert pool_ranges(settings, tag) == ["41-100"]  # at the head: served first
    assert client.get(f"/ids/{tag}?count=60").json()["ids"] == list(range(41, 101))
    # and the part the client kept is never served by the node
    ids = client.get(f"/ids/{tag}?count=150").json()["ids"]
    assert min(ids) > 100


def test_retried_return_is_refused_as_already_returned_and_changes_nothing(
    client: TestClient, settings: Settings, tag: str
) -> None:
    add_tag(settings, tag, step=100)
    [held] = lease(client, tag)["leases"]
    assert give_back(client, held["lease"], 50).status_code == 200
    before = snapshot(settings, tag)
    again = give_back(client, held["lease"], 50)
    assert again.status_code == 409 and again.json()["error"] == "already_returned"
    other = give_back(client, held["lease"], 10)  # an overlapping second return
    assert other.status_code == 409 and other.json()["error"] == "already_returned"
    assert snapshot(settings, tag) == before
    assert pool_ranges(settings, tag).count("50-100") == 1


def test_forged_outside_and_wrong_tag_returns_change_nothing(
    client: TestClient, settings: Settings, tag: str
) -> None:
    add_tag(settings, tag, step=100, start=1)
    add_tag(settings, tag + "x", step=100, start=1)
    [held] = lease(client, tag)["leases"]
    before = snapshot(settings, tag)
    cases = [
        ({"lease": "forged0123456789", "from": 5}, 409, "unknown_lease"),
        ({"lease": held["lease"], "from": 0}, 400, "bad_from"),
        ({"lease": held["lease"], "from": 102}, 400, "outside_lease"),
        ({"lease": held["lease"], "from": 1000}, 400, "outside_lease"),
        ({"lease": held["lease"], "from": 50, "tag": tag + "x"}, 400, "wrong_tag"),
        ({"lease": held["lease"], "from": True}, 400, "bad_from"),
        ({"lease": "a:b", "from": 5}, 400, "bad_lease"),
        ({"from": 5}, 400, "bad_lease"),
    ]
    for body, status, code in cases:
        r = client.post("/lease/return", json=body)
        assert (r.status_code, r.json()["error"]) == (status, code), (body, r.text)
        assert r.json()["message"]
    assert client.post("/lease/return", content=b"[1]").json()["error"] == "bad_body"
    assert snapshot(settings, tag) == before
    # the genuine lease is still returnable after all that; from = last + 1 returns nothing
    r = give_back(client, held["lease"], 101)
    assert r.status_code == 200 and r.json()["returned"] is None
    assert snapshot(settings, tag)[0] == before[0]


def test_count_is_clamped_and_a_large_wish_claims_contiguously(
    settings: Settings, tag: str
) -> None:
    add_tag(settings, tag, step=100, start=1)
    with TestClient(create_app(settings.with_changes(client_max_count=2500))) as client:
        body = lease(client, tag, 1_000_000)
        assert 2500 <= body["count"] <= 2600
        assert sum(x["last"] - x["first"] + 1 for x in body["leases"]) == body["count"]
        assert len(body["leases"]) == 1  # pool range + the claim right after it, merged
        for bad in ("0", "-1", "x", "1.5"):
            r = client.post(f"/lease/{tag}?count={bad}")
            assert (r.status_code, r.json()["error"]) == (400, "bad_count")
        assert client.post("/lease/no%20such").json()["error"] == "bad_tag"
        r = client.post(f"/lease/{tag}zz")
        assert (r.status_code, r.json()["error"]) == (404, "unknown_tag")


def test_unrecorded_lease_is_not_handed_out(settings: Settings, tag: str) -> None:
    add_tag(settings, tag, step=100)
    with TestClient(create_app(settings)) as client:
        client.get(f"/id/{tag}")
        run_pool = client.app.node.source.redis_pool  # type: ignore[attr-defined]

        async def broken(*args: Any, **kwargs: Any) -> Any:
            raise redis.ConnectionError("cut")

        # every script the lease store registers fails; the node's pop still works
        original = run_pool.client.register_script

        def failing(script: str) -> Any:
            registered = original(script)
            return broken if script in (lease_store._RECORD, lease_store._RETURN) else registered

        run_pool.client.register_script = failing
        r = client.post(f"/lease/{tag}")
        assert r.status_code == 503 and r.json()["error"] == "unavailable"
        wasted = client.app.node.stats.tags[tag].wasted  # type: ignore[attr-defined]
        assert wasted["lease_not_recorded"] == 100


def test_return_after_a_redis_restart_is_refused(
    redis_server: RedisServer, settings: Settings, tag: str
) -> None:
    s = settings.with_changes(redis_url=redis_server.url)
    add_tag(s, tag, step=100)
    with TestClient(create_app(s)) as client:
        [held] = lease(client, tag)["leases"]
        # AOF everysec keeps the record across the restart, but the restarted
        # server is a new incarnation: the record is not its own.
        asyncio.run(asyncio.sleep(1.2))
        redis_server.kill9()
        redis_server.start()
        r = give_back(client, held["lease"], 10)
        if r.status_code == 503:  # the node's pooled connection died with the server
            r = give_back(client, held["lease"], 10)
        assert (r.status_code, r.json()["error"]) == (409, "unknown_lease"), r.text
        assert pool_ranges(s, tag) == []


def test_the_embedded_mode_has_no_leases(sqlite_settings: Settings, tag: str) -> None:
    with TestClient(create_app(sqlite_settings)) as client:
        r = client.post(f"/lease/{tag}")
        assert (r.status_code, r.json()["error"]) == (503, "leases_unavailable")
        r = give_back(client, "abc", 5)
        assert (r.status_code, r.json()["error"]) == (503, "leases_unavailable")


def test_a_lease_needs_the_tags_token_and_a_disabled_tag_leases_nothing(
    settings: Settings, tag: str
) -> None:
    add_tag(settings, tag, step=100)
    admin_token = "lease-admin-token"
    auth = {"Authorization": f"Bearer {admin_token}"}
    with TestClient(create_app(settings.with_changes(admin_token=admin_token))) as c:
        token = c.post(f"/admin/tags/{tag}/tokens", headers=auth).json()["token"]
        refused = c.post(f"/lease/{tag}")
        assert refused.status_code == 401 and refused.json()["error"] == "unauthorized"
        leased = c.post(f"/lease/{tag}", headers={"Authorization": f"Bearer {token}"})
        assert leased.status_code == 200 and leased.json()["leases"][0]["first"] == 1
        assert c.post(f"/lease/{tag}", params={"token": token}).status_code == 200
        assert c.patch(f"/admin/tags/{tag}", json={"disabled": True}, headers=auth).is_success
        gone = c.post(f"/lease/{tag}", params={"token": token})
        assert gone.status_code == 410 and gone.json()["error"] == "tag_disabled"


def test_lease_failures_share_the_once_a_second_failure_log(
    client: TestClient, settings: Settings, tag: str, caplog: pytest.LogCaptureFixture
) -> None:
    add_tag(settings, tag, step=100)
    node = client.app.node  # type: ignore[attr-defined]

    async def down(tag: str, ids: int = 1) -> Any:
        raise StoreUnavailable("redis", "cut")

    node.source.fetch = down
    with caplog.at_level(logging.WARNING):
        answers = [client.post(f"/lease/{tag}") for _ in range(3)]
    assert [(r.status_code, r.json()["error"]) for r in answers] == [(503, "unavailable")] * 3
    assert caplog.text.count("event=request_failed") == 1
