"""Second adversarial review of snowflake tags (issue 25), after one TTL per tag.

Each test here fails on main at a6c4ed8.

1. ``SnowflakeClient.next_ids(tag, n)`` builds its list one ``next_id`` at a
   time, sleeping out each used-up unit, with no bound on ``n``: on a layout with
   few IDs per unit it hands out IDs made seconds before it returns, older than
   IDs other holders handed out meanwhile (time order at a second). A node's
   ``/ids`` was fixed for exactly this (batch bound and stale IDs dropped, 500 ms);
   the client's batch was not.
2. A snowflake tag made before the lease TTL was recorded (no ``.l`` in its
   layout) still grants with each node's own ``IDPOOL_WORKER_LEASE_SECONDS``, and
   a node's quarantine for it is its own setting: once Redis restarted empty
   (``idpool:{tag}:worker_lease`` lost with the hash), the node that sees it first
   sets the quarantine, and a longer lease granted by another node outlives it.
   End to end (old tag, node A 20 s, node B 3 s, Redis killed and restarted empty
   right after A's renewal, B asked first): 4,548 duplicate IDs in 8 s. docs/design/snowflake.md
   lists "the same setting on every node" as an assumption for such tags, but
   README's setting row does not warn, and such a tag has no way to get a
   recorded TTL: the hole stays open for its whole life.
3. A removed segment (or strict) tag's name can be added again as a snowflake
   tag: the tombstone raises the new row's ``max_id`` (which a snowflake tag
   only uses to count grants), but its IDs come from the clock since the new
   epoch, far below the old tag's numbers at first. Invariant 8 ("a removed
   tag's IDs are never issued again") breaks: segment IDs 1-1000 removed, the
   name added with 1 worker bit, 1 sequence bit and 1 s units handed out 44, 45
   and 48 again; with js53 (10 ms units, 16 low bits) a removed tag that had
   handed out 400 million IDs is repeated for a minute.
4. ``tag start`` is refused on a snowflake tag (``wrong_kind``), but ``start`` is
   taken when one is added: its ``max_id`` counts grants, so a start near 2^63
   leaves it two worker-ID grants for its whole life, then 503 "has run out of
   64-bit IDs" for ever (it cannot be removed, nor its start moved).
"""

from __future__ import annotations

import asyncio
import time
from datetime import datetime
from types import SimpleNamespace

import pytest
import redis
from idpool_client.errors import IdPoolError
from idpool_client.snowflake import SnowflakeClient
from starlette.testclient import TestClient

from idpool.pool.keys import Keys
from idpool.pool.redis_pool import RedisPool
from idpool.pool.settings import Settings
from idpool.pool.snowflake import check_layout, wall_ms
from idpool.pool.values import TagRow
from idpool.pool.worker_store import WorkerRefused, WorkerStore
from idpool.service.app import create_app
from idpool.service.snowflake import SnowflakeKind

UNIT_MS = 100
SEQUENCE_BITS = 2  # 4 IDs per 100 ms unit: a valid layout (the node's /ids limit is 20)


def test_a_client_batch_hands_out_no_id_made_a_second_before_it_returns() -> None:
    epoch = int(time.time() * 1000) - 1000
    layout = {
        "time_bits": 41,
        "worker_bits": 10,
        "sequence_bits": SEQUENCE_BITS,
        "unit_ms": UNIT_MS,
        "epoch_ms": epoch,
    }
    with SnowflakeClient("http://127.0.0.1:1") as ids:

        def post(kind: str, path: str, payload: object, what: str, tag: object = None) -> object:
            if "/renew" in path or "/release" in path:
                return {"ttl_ms": 60_000}
            return {
                "worker": 7,
                "generation": 1,
                "secret": "s",
                "floor_ms": 0,
                "ttl_ms": 60_000,
                "margin_ms": 2_000,
                "layout": layout,
            }

        ids.transport._post = post  # type: ignore[method-assign,assignment]
        try:
            got = ids.next_ids("t", 80)  # 4 per 100 ms: 2 s of IDs
        except (IdPoolError, ValueError):
            return  # refused up front, saying why (as a node's /ids): fine
        answered_ms = time.time_ns() // 1_000_000
    shift = 10 + SEQUENCE_BITS
    oldest_unit = min(got) >> shift
    # Another holder's ID handed out a second before this list was returned has a
    # time unit up to this one (and a larger worker ID may win within a unit).
    unit_a_second_before = (answered_ms - 1000 - epoch) // UNIT_MS
    assert oldest_unit > unit_a_second_before, (
        f"next_ids returned IDs of a unit {(answered_ms - epoch) // UNIT_MS - oldest_unit} "
        f"units ({UNIT_MS} ms each) before it returned: older than IDs handed out by "
        "others more than a second before"
    )


def node_with_lease(seconds: float) -> SnowflakeKind:
    """A node's snowflake kind with its own IDPOOL_WORKER_LEASE_SECONDS."""
    node = SimpleNamespace(
        snowflakes={}, worker_lease_seconds=seconds, worker_margin_seconds=seconds / 8
    )
    return SnowflakeKind(node)  # type: ignore[arg-type]


@pytest.mark.anyio
async def test_an_old_tag_after_redis_restarted_empty_waits_out_every_nodes_lease(
    redis_pool: RedisPool, tag: str, settings: Settings
) -> None:
    # A tag made before the TTL was recorded: its layout has no ".l".
    layout = check_layout({}, wall_ms() - 60_000).to_text()
    row = TagRow(tag, 2, 1, 1, "", datetime.now(), 1, 1, kind="snowflake", layout=layout)
    long_node, short_node = node_with_lease(3.0), node_with_lease(0.4)
    store = WorkerStore(redis_pool.client, redis_pool.keys, redis_pool.send)
    await store.init(tag)  # idpool tag add
    ttl_ms, quarantine_ms = long_node.lease_ms(row)
    # node A holds worker 0 for 3 s (less its margin) after its last renewal
    await store.grant(
        tag, generation=1, workers=1, holder="a", ttl_ms=ttl_ms, quarantine_ms=quarantine_ms
    )
    keys = Keys(settings.redis_prefix)
    # Redis restarted empty (A cannot reach it meanwhile: its renewals fail, it serves on)
    redis.Redis.from_url(settings.redis_url).delete(keys.workers(tag), keys.worker_lease(tag))
    ttl_ms, quarantine_ms = short_node.lease_ms(row)  # node B sees the new incarnation first

    async def grant_b(generation: int) -> object:
        return await store.grant(
            tag,
            generation=generation,
            workers=1,
            holder="b",
            ttl_ms=ttl_ms,
            quarantine_ms=quarantine_ms,
        )

    with pytest.raises(WorkerRefused):
        await grant_b(2)
    await asyncio.sleep(0.6)  # past B's quarantine, well within A's 3 s lease
    try:
        await grant_b(3)
    except WorkerRefused as e:
        assert e.why == "quarantine"
    else:
        pytest.fail("worker 0 granted to B 0.6 s after the restart while A's 3 s lease runs")


def test_a_removed_tags_name_added_as_a_snowflake_tag_repeats_none_of_its_ids(
    settings: Settings, tag: str
) -> None:
    auth = {"Authorization": "Bearer admin"}
    s = settings.with_changes(
        admin_token="admin", worker_lease_seconds=1.0, worker_margin_seconds=0.2
    )
    with TestClient(create_app(s)) as node:
        assert node.post("/admin/tags", json={"tag": tag}, headers=auth).status_code == 201
        issued = set(node.get(f"/ids/{tag}?count=1000").json()["ids"])  # 1 to 1000
        assert node.delete(f"/admin/tags/{tag}", headers=auth).status_code == 200
        small = {"worker_bits": 1, "sequence_bits": 1, "unit_ms": 1000}  # a valid layout
        added = node.post(
            "/admin/tags", json={"tag": tag, "kind": "snowflake", **small}, headers=auth
        )
        if added.status_code != 201:
            assert added.status_code in (400, 409), added.text  # refused, saying why: fine
            return
        deadline = time.monotonic() + 10  # the first grant waits one quarantine (1 s)
        while (answer := node.get(f"/id/{tag}")).status_code != 200:
            assert time.monotonic() < deadline, answer.text
            time.sleep(0.2)
        again = {int(answer.text)} | {int(node.get(f"/id/{tag}").text) for _ in range(5)}
    assert not again & issued, f"IDs {sorted(again & issued)} of the removed tag handed out again"


def test_a_snowflake_tag_added_with_a_start_keeps_granting_worker_ids(
    settings: Settings, tag: str
) -> None:
    auth = {"Authorization": "Bearer admin"}
    with TestClient(create_app(settings.with_changes(admin_token="admin"))) as node:
        fields = {"tag": tag, "kind": "snowflake", "start": 2**63 - 3}
        added = node.post("/admin/tags", json=fields, headers=auth)
        if added.status_code != 201:
            assert added.json()["error"] in ("bad_body", "wrong_kind"), added.text
            return  # refused up front, saying why: fine
        for holder in range(3):  # a node and two clients
            granted = node.post(f"/worker/{tag}?holder=h{holder}")
            assert granted.status_code == 200, f"grant {holder + 1}: {granted.text}"
