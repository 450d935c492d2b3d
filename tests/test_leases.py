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
from idpool.pool.redis_pool import Lua
from idpool.pool.settings import Settings
from idpool.service.app import create_app
from ops.toolkit import RedisServer

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


def give_back(
    client: TestClient,
    held: dict[str, Any],
    tag: str,
    start: int,
    headers: dict[str, str] | None = None,
) -> Any:
    """The leaseholder's return: its lease's id and secret, and the tag."""
    body = {"lease": held["lease"], "secret": held["secret"], "tag": tag, "from": start}
    return client.post("/lease/return", json=body, headers=headers)


def snapshot(settings: Settings, tag: str) -> tuple[list[str], dict[str, str]]:
    """The tag's list and every lease record: what a refused return must not change."""
    plain = redis.Redis.from_url(settings.redis_url, decode_responses=True)
    pattern = Keys(settings.redis_prefix).leased_prefix("*") + "*"
    records = {k: str(plain.get(k)) for k in plain.scan_iter(pattern)}
    assert all(":{" in k for k in records)
    return pool_ranges(settings, tag), records


def test_lease_then_return_once(client: TestClient, settings: Settings, tag: str) -> None:
    add_tag(settings, tag, step=100, start=1)
    body = lease(client, tag)
    assert body["tag"] == tag and body["count"] == 100
    [held] = body["leases"]
    assert (held["first"], held["last"]) == (1, 100)
    r = give_back(client, held, tag, 41)
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
    assert give_back(client, held, tag, 50).status_code == 200
    before = snapshot(settings, tag)
    again = give_back(client, held, tag, 50)
    assert again.status_code == 409 and again.json()["error"] == "already_returned"
    other = give_back(client, held, tag, 10)  # an overlapping second return
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
    mine = {"lease": held["lease"], "secret": held["secret"], "tag": tag}
    cases = [
        ({**mine, "lease": "forged0123456789", "from": 5}, 409, "unknown_lease"),
        ({**mine, "from": 0}, 400, "bad_from"),
        ({**mine, "from": 102}, 400, "outside_lease"),
        ({**mine, "from": 1000}, 400, "outside_lease"),
        ({**mine, "from": 50, "tag": tag + "x"}, 400, "wrong_tag"),
        ({**mine, "from": True}, 400, "bad_from"),
        ({**mine, "lease": "a:b", "from": 5}, 400, "bad_lease"),
        ({"secret": held["secret"], "tag": tag, "from": 5}, 400, "bad_lease"),
        ({**mine, "secret": "a:b", "from": 5}, 400, "bad_secret"),
        ({**mine, "tag": "", "from": 5}, 400, "bad_tag"),
        ({"lease": held["lease"], "secret": held["secret"], "from": 5}, 400, "bad_tag"),
    ]
    for body, status, code in cases:
        r = client.post("/lease/return", json=body)
        assert (r.status_code, r.json()["error"]) == (status, code), (body, r.text)
        assert r.json()["message"]
    assert client.post("/lease/return", content=b"[1]").json()["error"] == "bad_body"
    assert snapshot(settings, tag) == before
    # the genuine lease is still returnable after all that; from = last + 1 returns nothing
    r = give_back(client, held, tag, 101)
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
        before = pool_ranges(settings, tag)
        # "00" and "0000" are zero too: refused, not a 200 with no lease (and no pop)
        for bad in ("0", "00", "0000", "-1", "x", "1.5"):
            r = client.post(f"/lease/{tag}?count={bad}")
            assert (r.status_code, r.json()["error"]) == (400, "bad_count")
        assert pool_ranges(settings, tag) == before
        assert client.post("/lease/no%20such").json()["error"] == "bad_tag"
        r = client.post(f"/lease/{tag}zz")
        assert (r.status_code, r.json()["error"]) == (404, "unknown_tag")


def test_unrecorded_lease_is_not_handed_out(settings: Settings, tag: str) -> None:
    add_tag(settings, tag, step=100)
    with TestClient(create_app(settings)) as client:
        client.get(f"/id/{tag}")
        run_pool = client.app.node.source.pool  # type: ignore[attr-defined]

        async def broken(*args: Any, **kwargs: Any) -> Any:
            raise redis.ConnectionError("cut")

        # every script of the lease store fails; the node's pop still works
        original = run_pool.client.evalsha
        shas = {Lua.of(lease_store._RECORD).sha, Lua.of(lease_store._RETURN).sha}

        def failing(sha: str, *args: Any) -> Any:
            return broken() if sha in shas else original(sha, *args)

        run_pool.client.evalsha = failing
        r = client.post(f"/lease/{tag}")
        assert r.status_code == 503 and r.json()["error"] == "unavailable"
        wasted = client.app.node.waste.of(tag)  # type: ignore[attr-defined]
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
        r = give_back(client, held, tag, 10)
        if r.status_code == 503:  # the node's pooled connection died with the server
            r = give_back(client, held, tag, 10)
        assert (r.status_code, r.json()["error"]) == (409, "unknown_lease"), r.text
        assert pool_ranges(s, tag) == []


def test_the_embedded_mode_has_no_leases(sqlite_settings: Settings, tag: str) -> None:
    with TestClient(create_app(sqlite_settings)) as client:
        r = client.post(f"/lease/{tag}")
        assert (r.status_code, r.json()["error"]) == (503, "leases_unavailable")
        r = give_back(client, {"lease": "abc", "secret": "def"}, tag, 5)
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


def test_a_return_needs_the_leases_secret_and_the_tags_token(
    settings: Settings, tag: str, caplog: pytest.LogCaptureFixture
) -> None:
    """Issue 19 item 1: a return built from what a log, a page or the metrics show is
    refused and changes nothing; only the leaseholder's return is taken, once."""
    caplog.set_level(logging.DEBUG)
    add_tag(settings, tag, step=1000, start=1)
    admin = {"Authorization": "Bearer lease-admin-token"}
    with TestClient(create_app(settings.with_changes(admin_token="lease-admin-token"))) as c:
        token = c.post(f"/admin/tags/{tag}/tokens", headers=admin).json()["token"]
        bearer = {"Authorization": f"Bearer {token}"}
        r = c.post(f"/lease/{tag}", headers=bearer)
        assert r.status_code == 200, r.text
        [held] = r.json()["leases"]
        assert (held["first"], held["last"]) == (1, 1000)
        # Nothing a node shows names the lease's id or secret; its log names a fingerprint.
        shown = [c.get(path).text for path in ("/status", "/status.json", "/metrics")]
        logged = "\n".join(rec.getMessage() for rec in caplog.records)
        for secret in (held["lease"], held["secret"]):
            assert not any(secret in text for text in [logged, *shown])
        fingerprint = lease_store.fingerprint(held["lease"])
        assert f"lease={fingerprint}" in logged
        before = snapshot(settings, tag)
        hijacks = [
            ({"lease": held["lease"], "tag": tag, "from": 1}, bearer, 400, "bad_secret"),
            ({"lease": held["lease"], "secret": "x" * 22, "tag": tag, "from": 1}, bearer, 403,
             "wrong_secret"),
            ({**held, "tag": tag, "from": 1}, {}, 401, "unauthorized"),
            ({**held, "tag": tag, "from": 1}, {"Authorization": "Bearer wrong"}, 401,
             "unauthorized"),
            ({"lease": fingerprint, "secret": fingerprint, "tag": tag, "from": 1}, bearer, 409,
             "unknown_lease"),
            ({"lease": held["lease"], "secret": fingerprint, "tag": tag, "from": 1}, bearer, 403,
             "wrong_secret"),
        ]  # fmt: skip
        for body, headers, status, code in hijacks:
            r = c.post("/lease/return", json=body, headers=headers)
            assert (r.status_code, r.json()["error"]) == (status, code), (body, r.text)
            assert held["secret"] not in r.text and held["lease"] not in r.json()["message"]
        assert snapshot(settings, tag) == before
        # /ids hands out none of the IDs the leaseholder still uses
        assert min(c.get(f"/ids/{tag}?count=10", headers=bearer).json()["ids"]) > 1000
        counters = c.app.node.stats.tags[tag]  # type: ignore[attr-defined]
        assert counters.ids_returned == 0
        # the leaseholder's own return works, and counts once
        r = give_back(c, held, tag, 601, headers=bearer)
        assert r.status_code == 200 and r.json()["count"] == 400, r.text
        again = give_back(c, held, tag, 601, headers=bearer)
        assert (again.status_code, again.json()["error"]) == (409, "already_returned")
        assert counters.ids_returned == 400
        assert pool_ranges(settings, tag).count("601-1000") == 1
        logged = "\n".join(rec.getMessage() for rec in caplog.records)
        assert held["lease"] not in logged and held["secret"] not in logged


def test_a_lease_holds_at_most_its_count_and_the_rest_stays_in_the_pool(
    client: TestClient, settings: Settings, tag: str
) -> None:
    """Issue 23: a client's holdings are bounded by what it asks for. The node cuts a
    longer range and pushes the rest to the head of the list with the lease's record."""
    add_tag(settings, tag, step=1000, start=1)
    [first] = lease(client, tag, 300)["leases"]
    assert (first["first"], first["last"]) == (1, 300)
    assert pool_ranges(settings, tag)[0] == "301-1000"  # served next, once
    body = lease(client, tag, 300)
    assert body["count"] == 300 and [(x["first"], x["last"]) for x in body["leases"]] == [
        (301, 600)
    ]
    assert pool_ranges(settings, tag)[0] == "601-1000"
    # a wish across ranges: what the pool has, then a claim, cut to the wish
    body = lease(client, tag, 1200)
    assert body["count"] == 1200
    assert [(x["first"], x["last"]) for x in body["leases"]] == [(601, 1800)]
    assert pool_ranges(settings, tag)[0] == "1801-2000"
    # the same once-only return as a whole range's
    r = give_back(client, first, tag, 101)
    assert r.status_code == 200 and r.json()["returned"] == {"first": 101, "last": 300}
    assert pool_ranges(settings, tag)[:2] == ["101-300", "1801-2000"]
    assert give_back(client, first, tag, 101).json()["error"] == "already_returned"
    # and the node serves them once: no ID of a lease still out comes from /ids
    ids = client.get(f"/ids/{tag}?count=400").json()["ids"]
    assert ids == list(range(101, 301)) + list(range(1801, 2001))


def test_the_rest_of_an_unrecorded_lease_is_counted_as_waste(settings: Settings, tag: str) -> None:
    add_tag(settings, tag, step=1000)
    with TestClient(create_app(settings)) as client:
        run_pool = client.app.node.source.pool  # type: ignore[attr-defined]

        async def broken(*args: Any, **kwargs: Any) -> Any:
            raise redis.TimeoutError("no answer")

        original = run_pool.client.evalsha
        record = Lua.of(lease_store._RECORD).sha

        def failing(sha: str, *args: Any) -> Any:
            return broken() if sha == record else original(sha, *args)

        run_pool.client.evalsha = failing
        r = client.post(f"/lease/{tag}?count=100")
        assert r.status_code == 503 and r.json()["error"] == "unavailable"
        wasted = client.app.node.waste.of(tag)  # type: ignore[attr-defined]
        assert wasted["lease_not_recorded"] == 100
        assert wasted["push_outcome_unknown"] == 900


def test_one_lease_call_hands_out_at_most_a_million_ids_by_default(
    client: TestClient, settings: Settings, tag: str
) -> None:
    """Issue 28: an anonymous caller leased 10,000,000 IDs of an open tag per call
    (1,000 times what /ids allows). The default cap is now a busy client's minute."""
    assert settings.client_max_count == Settings().client_max_count  # the default
    add_tag(settings, tag, step=100, start=1)
    body = lease(client, tag, 10**9)
    assert body["count"] == 1_000_000
    assert [(x["first"], x["last"]) for x in body["leases"]] == [(1, 1_000_000)]
    r = client.post(f"/lease/{tag}?count=0")
    assert r.status_code == 400 and "IDPOOL_CLIENT_MAX_COUNT, 1000000," in r.json()["message"]


def test_a_lease_without_a_count_is_cut_at_the_cap_too(settings: Settings, tag: str) -> None:
    """One range, whatever its size, was handed out whole: a tag's step may be above
    the cap (a dynamic step grows it). The rest stays in the pool."""
    add_tag(settings, tag, step=5000, start=1)
    with TestClient(create_app(settings.with_changes(client_max_count=2500))) as client:
        body = lease(client, tag)
        assert body["count"] == 2500
        assert pool_ranges(settings, tag)[0] == "2501-5000"
