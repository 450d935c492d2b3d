"""Adversarial review of snowflake tags (issue 25): each test here failed on main
at af3aa50 and shows a way one worker ID gets two holders (duplicate IDs).

1. The first-grant exception (``first = generation == row.start_id``) trusts the
   generation's *value*, not the order in which grants ran: ``tag start`` moves a
   snowflake tag's ``start_id`` up to its ``max_id``, so the next generation
   claimed is "first" again; and a generation claimed first may be granted last.
   Either way, on a Redis that forgot the hash (restart empty, or the hash deleted
   by hand, which docs/design/snowflake.md calls safe), a grant skips the quarantine while an
   older holder of the same worker ID still makes IDs.
2. Generator.take checks the lease deadline, *then* reads the wall clock: a pause
   between the two (SIGSTOP, a thread holding the GIL in a C call) makes an ID
   with a time past the lease's expiry, where a new holder of the worker ID
   already makes IDs.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable

import pytest
import redis
from idpool_client.snowflake import Generator as ClientGenerator
from idpool_client.snowflake import Layout as ClientLayout
from idpool_client.snowflake import SnowflakeStopped
from starlette.testclient import TestClient

from idpool.pool.errors import IdPoolError
from idpool.pool.keys import Keys
from idpool.pool.redis_pool import RedisPool
from idpool.pool.settings import Settings
from idpool.pool.snowflake import Generator, Layout
from idpool.pool.worker_store import Grant, WorkerRefused, WorkerStore
from idpool.service.app import create_app

TOKEN = "admin-secret"
AUTH = {"Authorization": f"Bearer {TOKEN}"}
TTL = 400  # ms


def worker_of(value: int) -> int:
    return (value >> 12) & 1023  # the default layout


def test_tag_start_on_a_snowflake_tag_does_not_let_a_grant_skip_the_quarantine(
    settings: Settings, tag: str
) -> None:
    s = settings.with_changes(admin_token=TOKEN, worker_lease_seconds=30.0)
    with TestClient(create_app(s)) as a, TestClient(create_app(s)) as b:
        made = a.post("/admin/tags", json={"tag": tag, "kind": "snowflake"}, headers=AUTH)
        assert made.status_code == 201, made.text
        held = int(a.get(f"/id/{tag}").text)  # node A holds a worker ID (renewed every 7.5 s)
        # Redis forgets the hash (restarted empty; docs/design/snowflake.md: deleting it is safe)
        redis.Redis.from_url(s.redis_url).delete(Keys(s.redis_prefix).workers(tag))
        row = a.get("/admin/tags", headers=AUTH).json()["tags"]
        max_id = next(t["max_id"] for t in row if t["tag"] == tag)
        # an operator's `idpool tag start` (allowed on a snowflake tag, meaningless there)
        a.patch(f"/admin/tags/{tag}", json={"start": max_id}, headers=AUTH)
        answer = b.get(f"/id/{tag}")  # node B's first grant
        still = int(a.get(f"/id/{tag}").text)  # node A serves on until its next renewal
        if answer.status_code == 200:
            # Without the quarantine B may only get a worker ID nobody holds.
            assert worker_of(int(answer.text)) != worker_of(still), (
                f"nodes A and B both hold worker {worker_of(held)}: duplicate IDs"
            )
        else:
            assert answer.json()["error"] == "worker_unavailable", answer.text


@pytest.mark.anyio
async def test_a_first_generation_granted_after_a_later_one_does_not_skip_the_quarantine(
    redis_pool: RedisPool, tag: str, settings: Settings
) -> None:
    store = WorkerStore(redis_pool.client, redis_pool.keys, redis_pool.send)

    async def grant(gen: int, first: bool) -> object:
        return await store.grant(
            tag,
            generation=gen,
            first=first,
            workers=1,
            holder=f"h{gen}",
            ttl_ms=TTL,
            quarantine_ms=TTL,
        )

    await store.lift(tag, await store.init(tag))  # idpool tag add
    # Node A claimed generation 1 first, but node B's grant (generation 2) ran first.
    await grant(2, first=False)  # B holds worker 0 and makes IDs
    # Redis restarts empty before A's grant arrives (or the hash is deleted by hand).
    redis.Redis.from_url(settings.redis_url).delete(Keys(settings.redis_prefix).workers(tag))
    try:
        await grant(1, first=True)
    except WorkerRefused as e:
        assert e.why == "quarantine"
    else:
        pytest.fail("worker 0 granted again with floor 0 while generation 2 still holds it")


LAYOUT = (41, 10, 12, 1)
NOW = 1_764_000_000_000
PAUSE_MS = 30_000


def paused_after_the_read(wall: list[int], stop_at: float) -> Callable[[], float]:
    """A monotonic clock read just before the deadline, after which the process
    is paused for PAUSE_MS (SIGSTOP, or another thread holding the GIL)."""

    def read() -> float:
        now = stop_at - 0.001
        wall[0] += PAUSE_MS  # what the wall clock says once the process runs again
        return now

    return read


@pytest.mark.parametrize("side", ["server", "client"])
def test_a_pause_right_after_the_deadline_check_makes_no_id_past_the_lease(side: str) -> None:
    wall = [NOW]
    stop_at = 100.0  # the wall clock says NOW at that monotonic time; the lease ends ~2 s on
    monotonic = paused_after_the_read(wall, stop_at)
    gen: Generator | ClientGenerator
    if side == "server":
        layout = Layout(*LAYOUT, NOW - 10_000)
        gen = Generator("t", layout, 0, 0, stop_at, clock_ms=lambda: wall[0], monotonic=monotonic)
    else:
        mirror = ClientLayout(*LAYOUT, NOW - 10_000)
        gen = ClientGenerator(mirror, 0, 0, stop_at, clock_ms=lambda: wall[0], monotonic=monotonic)
    try:
        value = gen.take()
    except (IdPoolError, SnowflakeStopped):
        return  # refusing is right
    assert value is not None
    made_ms = NOW - 10_000 + (value >> 22)
    # The server's expiry is about NOW + margin; a new holder starts above it.
    assert made_ms < NOW + 2_000, f"an ID {made_ms - NOW} ms past the deadline check"


@pytest.mark.anyio
async def test_a_renewal_through_a_node_with_a_shorter_lease_does_not_shorten_the_holders(
    redis_pool: RedisPool, tag: str
) -> None:
    """Nodes whose IDPOOL_WORKER_LEASE_SECONDS differ (a rolling restart that lowers
    it, as docs/design/snowflake.md suggests): the client counts its deadline from the TTL of the
    node that granted it, the script takes the TTL of the node that renews it. An
    end-to-end run (grant by a 20 s node, renewals through a 4 s node every 5 s):
    the worker ID granted again between two renewals, 47,741 duplicate IDs in 15 s."""
    store = WorkerStore(redis_pool.client, redis_pool.keys, redis_pool.send)
    long_ttl, short_ttl = 3000, 400

    async def grant(gen: int) -> Grant:
        return await store.grant(
            tag,
            generation=gen,
            first=gen == 1,
            workers=1,
            holder=f"h{gen}",
            ttl_ms=long_ttl,
            quarantine_ms=long_ttl,
        )

    await store.lift(tag, await store.init(tag))  # idpool tag add (no claim yet: lifted)
    held = await grant(1)  # the holder stops at sent + 3 s - margin by its own clock
    await store.renew(tag, held, held.server_ms, short_ttl, short_ttl)  # via the 0.4 s node
    await asyncio.sleep(short_ttl / 1000 + 0.2)  # well within the holder's own 3 s
    try:
        await store.grant(
            tag,
            generation=2,
            first=False,
            workers=1,
            holder="h2",
            ttl_ms=short_ttl,
            quarantine_ms=short_ttl,
        )
    except WorkerRefused as e:
        assert e.why == "full"
    else:
        pytest.fail("worker 0 granted again while its holder still serves by its own deadline")


def test_a_batch_never_holds_ids_made_a_second_before_it_is_answered(
    settings: Settings, tag: str
) -> None:
    """A layout with few IDs per unit (valid: 4 per 100 ms) makes /ids?count=200 wait
    5 s, collecting IDs all along, and answer them at the end: an end-to-end run had
    80 of its 200 IDs below an ID node B handed out 3 s before the batch was answered
    (a count of 10,000 would hold the request for over 4 minutes)."""
    with TestClient(create_app(settings.with_changes(admin_token=TOKEN))) as node:
        fields = {"tag": tag, "kind": "snowflake", "sequence_bits": 2, "unit_ms": 100}
        made = node.post("/admin/tags", json=fields, headers=AUTH)
        assert made.status_code == 201, made.text
        answer = node.get(f"/ids/{tag}?count=200")
        if answer.status_code == 400:
            return  # refused up front, saying why: fine
        ids = answer.json()["ids"]
        unit_span = (max(ids) >> 12) - (min(ids) >> 12)  # 10 worker + 2 sequence bits
        assert unit_span * 100 < 1000, f"one batch spans {unit_span * 100} ms of IDs"


@pytest.mark.anyio
async def test_a_quarantine_set_by_a_node_with_a_shorter_lease_outlasts_longer_leases(
    redis_pool: RedisPool, tag: str, settings: Settings
) -> None:
    """The quarantine after a Redis restarted empty is the TTL of whichever node first
    saw it; holders granted by a node with a longer TTL may serve past its end (with
    no field left, only ``f = q`` fences them). A field that survived (a failover,
    an older snapshot) keeps its old expiry as its floor, which does fence them."""
    store = WorkerStore(redis_pool.client, redis_pool.keys, redis_pool.send)
    long_ttl, short_ttl = 3000, 400
    await store.lift(tag, await store.init(tag))  # idpool tag add (no claim yet: lifted)
    await store.grant(
        tag,
        generation=1,
        first=True,
        workers=1,
        holder="h1",
        ttl_ms=long_ttl,
        quarantine_ms=long_ttl,
    )  # serves up to 3 s (less its margin) after its last renewal
    key = Keys(settings.redis_prefix).workers(tag)
    redis.Redis.from_url(settings.redis_url).delete(key)  # as a Redis restarted empty

    async def grant_short(gen: int) -> Grant:
        return await store.grant(
            tag,
            generation=gen,
            first=False,
            workers=1,
            holder=f"h{gen}",
            ttl_ms=short_ttl,
            quarantine_ms=short_ttl,
        )

    with pytest.raises(WorkerRefused):
        await grant_short(2)  # the short node sees the new incarnation first
    await asyncio.sleep(short_ttl / 1000 + 0.2)
    try:
        await grant_short(3)
    except WorkerRefused as e:
        assert e.why == "quarantine"
    else:
        pytest.fail("granted 0.6 s after the restart; a holder of a 3 s lease may still serve")


def test_a_holder_cannot_keep_a_worker_id_from_everyone_for_ever(
    settings: Settings, tag: str
) -> None:
    """Any holder (POST /worker needs no token unless the tag has some) may renew
    with last_ms up to 10^14 - 1, the year 5138: released, the worker ID is never
    granted again. Two grants and two renewals took a 1-worker-bit tag down for
    good (503 worker_unavailable, every worker ID held)."""
    # Clients may take both worker IDs here (IDPOOL_WORKER_CLIENT_SHARE, whose default
    # keeps one for nodes, would refuse the second grant before the renewal is tried).
    s = settings.with_changes(
        admin_token=TOKEN,
        worker_lease_seconds=1.0,
        worker_margin_seconds=0.2,
        worker_client_share=1.0,
    )
    with TestClient(create_app(s)) as node:
        fields = {"tag": tag, "kind": "snowflake", "worker_bits": 1}
        assert node.post("/admin/tags", json=fields, headers=AUTH).status_code == 201
        for _ in range(2):
            got = node.post(f"/worker/{tag}?holder=burner").json()
            body = {k: got[k] for k in ("worker", "generation", "secret")}
            node.post(f"/worker/{tag}/renew", json={**body, "last_ms": 10**14 - 1})
            node.post(f"/worker/{tag}/release", json={**body, "last_ms": 10**14 - 1})
        deadline = time.monotonic() + 5  # far more than a lease
        while (answer := node.get(f"/id/{tag}")).status_code != 200:
            assert time.monotonic() < deadline, answer.text
            time.sleep(0.2)
