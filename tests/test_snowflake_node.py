"""Snowflake tags on a node: the admin API and CLI make them, /id, /ids and
Leaf's path serve them from memory, /decode reads them, clients lease worker IDs."""

from __future__ import annotations

import asyncio
import hashlib
import logging
import time
from collections.abc import Iterator

import pytest
import redis
from starlette.testclient import TestClient

from idpool.pool.clock import FakeClock
from idpool.pool.keys import Keys
from idpool.pool.ledger import Ledger
from idpool.pool.redis_pool import RedisPool
from idpool.pool.settings import Settings
from idpool.pool.snowflake import check_layout, wall_ms
from idpool.pool.stores import open_stores
from idpool.pool.values import TagRow
from idpool.pool.worker_store import WorkerRefused, WorkerStore
from idpool.service.app import create_app
from idpool.service.kinds import rules_of
from idpool.service.kinds.snowflake import prepare_tag
from idpool.service.kinds.snowflake_leases import SnowflakeKind
from idpool.service.runtime import open_runtime
from ops.toolkit import TcpProxy

TOKEN = "admin-secret"
AUTH = {"Authorization": f"Bearer {TOKEN}"}


@pytest.fixture
def node(settings: Settings) -> Iterator[TestClient]:
    with TestClient(create_app(settings.with_changes(admin_token=TOKEN))) as c:
        yield c


def add(node: TestClient, tag: str, **fields: object) -> dict[str, object]:
    made = node.post("/admin/tags", json={"tag": tag, "kind": "snowflake", **fields}, headers=AUTH)
    assert made.status_code == 201, made.text
    body: dict[str, object] = made.json()
    return body


def test_a_snowflake_tag_serves_time_ordered_ids_on_every_path(node: TestClient, tag: str) -> None:
    made = add(node, tag)
    assert made["kind"] == "snowflake" and made["bits"] == 63
    first = int(node.get(f"/id/{tag}").text)  # the route: grants the worker ID
    assert node.app.node.snowflakes[tag] is not None  # type: ignore[attr-defined]
    leaf = int(node.get(f"/api/segment/get/{tag}").text)  # the fast path from here on
    batch = node.get(f"/ids/{tag}?count=500").json()["ids"]
    assert first < leaf < batch[0] and batch == sorted(set(batch))
    time.sleep(1.0)
    later = int(node.get(f"/id/{tag}").text)
    assert later > batch[-1]
    parts = node.get(f"/decode/{tag}/{later}").json()
    assert parts["kind"] == "snowflake" and abs(parts["time_ms"] - time.time() * 1000) < 5000
    assert parts["worker"] == node.get(f"/decode/{tag}/{first}").json()["worker"]
    status = node.get("/status.json").json()
    shown = [t for t in status["tags"] if t["tag"] == tag][0]
    assert shown["kind"] == "snowflake" and shown["buffer"]["worker"] == parts["worker"]
    assert shown["counters"]["ids_issued"] == 503
    assert f'idpool_snowflake_worker{{tag="{tag}"}}' in node.get("/metrics").text


def test_a_snowflake_tag_cannot_be_removed_and_serves_on(node: TestClient, tag: str) -> None:
    # Added again, its epoch (the creation time) would restart and repeat its old IDs.
    first = int(node.get(f"/id/{add(node, tag)['tag']}").text)
    refused = node.delete(f"/admin/tags/{tag}", headers=AUTH)
    assert refused.status_code == 400 and refused.json()["error"] == "wrong_kind"
    assert "idpool tag disable" in refused.json()["message"]
    assert any(t["tag"] == tag for t in node.get("/admin/tags", headers=AUTH).json()["tags"])
    assert int(node.get(f"/id/{tag}").text) > first


def test_a_snowflake_tag_gone_from_the_ledger_stops_at_once(
    node: TestClient, settings: Settings, tag: str
) -> None:
    async def remove_row() -> None:  # by hand, or by an idpool that allowed it
        ledger = await Ledger.connect(settings)
        try:
            await ledger.remove_tag(tag)
        finally:
            await ledger.close()

    add(node, tag)
    node.get(f"/id/{tag}")  # the route: grants the worker ID; the fast path from here on
    assert node.app.node.snowflakes[tag] is not None  # type: ignore[attr-defined]
    asyncio.run(remove_row())
    node.portal.call(node.app.node.refresh_tags, tag)  # type: ignore[attr-defined,union-attr]
    for path in (f"/id/{tag}", f"/ids/{tag}?count=3", f"/api/segment/get/{tag}"):
        gone = node.get(path)  # no generator left serving it from memory
        assert gone.status_code == 404 and gone.json()["error"] == "unknown_tag", path


def test_the_js53_layout_stays_below_2_pow_53(node: TestClient, tag: str) -> None:
    add(node, tag, layout="js53")
    answer = node.get(f"/ids/{tag}?count=300")
    assert answer.status_code == 200, answer.text
    ids = answer.json()["ids"]
    assert len(set(ids)) == 300 and max(ids) < 2**53


def test_a_bad_layout_is_refused_with_what_to_fix(node: TestClient, tag: str) -> None:
    bad = node.post(
        "/admin/tags",
        json={"tag": tag, "kind": "snowflake", "time_bits": 50, "worker_bits": 10},
        headers=AUTH,
    )
    assert bad.status_code == 400 and bad.json()["error"] == "bad_layout"
    assert "add up to 72" in bad.json()["message"]
    future = node.post(
        "/admin/tags",
        json={"tag": tag, "kind": "snowflake", "epoch_ms": int(time.time() * 1000) + 10**7},
        headers=AUTH,
    )
    assert future.status_code == 400 and "future" in future.json()["message"]
    segment = node.post("/admin/tags", json={"tag": tag, "unit_ms": 10}, headers=AUTH)
    assert segment.status_code == 400 and "snowflake tags only" in segment.json()["message"]


def test_a_snowflake_tag_is_never_leased_as_ranges(node: TestClient, tag: str) -> None:
    add(node, tag)
    refused = node.post(f"/lease/{tag}?count=10")
    assert refused.status_code == 400 and refused.json()["error"] == "wrong_kind"


def test_a_segment_id_is_not_decodable(node: TestClient, tag: str) -> None:
    assert node.post("/admin/tags", json={"tag": tag}, headers=AUTH).status_code == 201
    answer = node.get(f"/decode/{tag}/5")
    assert answer.status_code == 400 and answer.json()["error"] == "not_decodable"


def test_a_kind_without_a_decoder_says_its_ids_cannot_be_decoded(
    node: TestClient, tag: str
) -> None:
    # strict has no decoder: the operator's calls refuse its IDs too, so /decode
    # says so plainly instead of sending the caller to them.
    made = node.post("/admin/tags", json={"tag": tag, "kind": "strict"}, headers=AUTH)
    assert made.status_code == 201, made.text
    value = node.get(f"/id/{tag}").text
    answer = node.get(f"/decode/{tag}/{value}")
    assert answer.status_code == 400 and answer.json()["error"] == "not_decodable"
    assert "cannot be decoded" in answer.json()["message"]
    assert "idpool tag decode" not in answer.json()["message"]
    admin = node.get(f"/admin/tags/{tag}/decode", params={"value": value}, headers=AUTH)
    assert admin.status_code == 400 and "cannot be decoded" in admin.json()["message"]
    segment = node.post("/admin/tags", json={"tag": tag + "s"}, headers=AUTH)
    assert segment.status_code == 201
    kept = node.get(f"/decode/{tag}s/5").json()["message"]  # decoded for an operator
    assert "idpool tag decode" in kept and "cannot be decoded" not in kept


def test_one_decoders_table_serves_snowflake_and_obfuscated_tags(
    node: TestClient, tag: str
) -> None:
    add(node, tag)
    value = node.get(f"/id/{tag}").text
    public = node.get(f"/decode/{tag}/{value}").json()
    admin = node.get(f"/admin/tags/{tag}/decode", params={"value": value}, headers=AUTH)
    assert admin.status_code == 200 and admin.json()["worker"] == public["worker"]
    assert admin.json()["time_ms"] == public["time_ms"] and admin.json()["value"] == value
    hidden = tag + "h"
    made = node.post("/admin/tags", json={"tag": hidden, "obfuscate": True}, headers=AUTH)
    assert made.status_code == 201, made.text
    secret = node.get(f"/id/{hidden}").text
    # An operator decodes it; the public route does not give away what the key hides.
    by_admin = node.get(f"/admin/tags/{hidden}/decode", params={"value": secret}, headers=AUTH)
    assert by_admin.status_code == 200 and by_admin.json()["sequence"] == 1
    refused = node.get(f"/decode/{hidden}/{secret}")
    assert refused.status_code == 400 and refused.json()["error"] == "not_decodable"
    assert "idpool tag decode" in refused.json()["message"]
    flake = node.post(
        "/admin/tags", json={"tag": tag + "f", "kind": "snowflake", "obfuscate": True}, headers=AUTH
    )
    assert flake.status_code == 400 and flake.json()["error"] == "bad_format"


def test_decode_refuses_what_the_tags_layout_cannot_have_made(node: TestClient, tag: str) -> None:
    old = tag + "o"
    add(node, old, epoch_ms=int(time.time() * 1000) - 30 * 86_400_000)  # a month older
    add(node, tag)
    older = node.get(f"/id/{old}").text
    mine = node.get(f"/id/{tag}").text
    assert node.get(f"/decode/{tag}/{mine}").status_code == 200
    cases = {
        older: "in the future",  # another tag's: a month ahead on this tag's epoch
        "12345": "epoch",  # made up: time unit 0
        str(2**63 - 1): "in the future",
        str(2**63): "63-bit",  # past the layout's bits
    }
    for value, why in cases.items():
        for path, headers in ((f"/decode/{tag}/{value}", {}), (f"/admin/tags/{tag}/decode", AUTH)):
            params = {"value": value} if "admin" in path else None
            refused = node.get(path, params=params, headers=headers)
            assert refused.status_code == 400, (value, refused.text)
            assert refused.json()["error"] == "bad_id" and why in refused.json()["message"]
            assert "not an ID of this tag" in refused.json()["message"]
    # Not to be told apart: the older tag decodes this tag's ID (same layout, its
    # time looks a month later on the older epoch, and is in its past).
    assert node.get(f"/decode/{old}/{mine}").status_code == 200


def test_a_client_worker_id_is_granted_renewed_and_released(node: TestClient, tag: str) -> None:
    add(node, tag)
    own = int(node.get(f"/id/{tag}").text)
    got = node.post(f"/worker/{tag}?holder=test").json()
    node_worker = node.get(f"/decode/{tag}/{own}").json()["worker"]
    assert got["worker"] != node_worker and got["ttl_ms"] == 10_000
    body = {"worker": got["worker"], "generation": got["generation"], "last_ms": 1}
    body["secret"] = got["secret"]
    assert node.post(f"/worker/{tag}/renew", json=body).json()["renewed"] is True
    assert node.post(f"/worker/{tag}/release", json=body).json()["released"] is True
    again = node.post(f"/worker/{tag}/renew", json=body)
    assert again.status_code == 409 and again.json()["error"] == "worker_lost"


def test_only_the_holder_can_renew_or_release_a_worker_lease(
    node: TestClient, tag: str, settings: Settings, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO)
    add(node, tag, worker_bits=1)  # two worker IDs: the node's and the client's
    node.get(f"/id/{tag}")
    got = node.post(f"/worker/{tag}?holder=victim").json()
    # What anyone can know or guess: the worker ID, the generation (the ledger's max_id).
    guessed = {"worker": got["worker"], "generation": got["generation"], "last_ms": 1}
    for op in ("release", "renew"):
        bare = node.post(f"/worker/{tag}/{op}", json=guessed)
        assert bare.status_code == 400 and bare.json()["error"] == "bad_secret", bare.text
        wrong = node.post(f"/worker/{tag}/{op}", json={**guessed, "secret": "A" * 22})
        assert wrong.status_code == 403 and wrong.json()["error"] == "wrong_secret", wrong.text
        assert "nothing was changed" in wrong.json()["message"]
    secret = got["secret"]
    # Still held: the worker ID is not granted to a second holder.
    second = node.post(f"/worker/{tag}?holder=thief")
    assert second.status_code == 503 and second.json()["error"] == "worker_unavailable"
    field = redis.Redis.from_url(settings.redis_url).hget(
        Keys(settings.redis_prefix).workers(tag), f"w:{got['worker']}"
    )
    assert field is not None and b" client:victim " in field and secret.encode() not in field
    assert node.post(f"/worker/{tag}/renew", json={**guessed, "secret": secret}).status_code == 200
    # The secret is the holder's alone: not in a log, the status page or the metrics.
    for page in ("/status", "/metrics", "/openapi.json"):
        assert secret not in node.get(page).text
    assert secret not in caplog.text
    assert f"lease={hashlib.sha256(secret.encode()).hexdigest()[:12]}" in caplog.text


def test_a_renewal_with_a_last_time_past_what_the_script_keeps_exactly_is_refused(
    node: TestClient, tag: str, settings: Settings
) -> None:
    add(node, tag, worker_bits=1)
    got = node.post(f"/worker/{tag}?holder=test").json()
    body = {"worker": got["worker"], "generation": got["generation"], "last_ms": 2**63 - 1}
    body["secret"] = got["secret"]
    bad = node.post(f"/worker/{tag}/renew", json=body)
    # Lua keeps it as 9.2233720368548e+18: the field's numbers no longer parse,
    # and the next grant of the worker ID read its last time as 9
    assert bad.status_code == 400 and bad.json()["error"] == "bad_body", bad.text
    assert "last_ms" in bad.json()["message"]
    field = redis.Redis.from_url(settings.redis_url).hget(
        Keys(settings.redis_prefix).workers(tag), f"w:{got['worker']}"
    )
    assert field is not None and b"e+" not in field


def test_a_large_step_back_stops_the_tag_and_readiness_says_why(node: TestClient, tag: str) -> None:
    add(node, tag)
    node.get(f"/id/{tag}")
    gen = node.app.node.snowflakes[tag]  # type: ignore[attr-defined]
    gen.last += 60_000  # as if the clock had just stepped back a minute
    gen.sequence = gen.layout.max_sequence
    answer = node.get(f"/id/{tag}")
    assert answer.status_code == 503 and answer.json()["error"] == "clock_behind"
    ready = node.get("/readyz")
    assert ready.status_code == 503 and "clock stepped back" in ready.json()["message"]
    assert (
        f'idpool_snowflake_clock_behind_events_total{{tag="{tag}"}} 1.0'
        in node.get("/metrics").text
    )


def test_a_node_that_cannot_renew_stops_before_the_lease_could_expire_then_recovers(
    settings: Settings, tag: str
) -> None:
    redis = TcpProxy(6379)
    s = settings.with_changes(
        redis_url=f"redis://127.0.0.1:{redis.port}/0",
        store_timeout=0.3,
        worker_lease_seconds=2.0,
        worker_margin_seconds=0.5,
        admin_token=TOKEN,
    )
    try:
        with TestClient(create_app(s)) as c:
            add(c, tag)
            granted = time.monotonic()
            before = int(c.get(f"/id/{tag}").text)
            redis.cut()
            cut = time.monotonic()
            while time.monotonic() < granted + 1.4:  # lease 2 s less the 0.5 s margin
                assert c.get(f"/id/{tag}").status_code == 200
                time.sleep(0.02)
            time.sleep(max(0.0, cut + 1.6 - time.monotonic()))
            stopped = c.get(f"/id/{tag}")
            assert stopped.status_code == 503 and stopped.json()["error"] == "worker_unavailable"
            assert "renewed in time" in stopped.json()["message"]
            redis.restore()
            deadline = time.monotonic() + 8
            while (answer := c.get(f"/id/{tag}")).status_code != 200:
                assert time.monotonic() < deadline, answer.text
                time.sleep(0.1)
            assert int(answer.text) > before
    finally:
        redis.cut()


def test_a_new_redis_incarnation_stops_the_holder_and_grants_wait_without_claiming(
    settings: Settings, tag: str
) -> None:
    s = settings.with_changes(worker_lease_seconds=2.0, worker_margin_seconds=0.5)
    with TestClient(create_app(s.with_changes(admin_token=TOKEN))) as c:
        add(c, tag)
        before = int(c.get(f"/id/{tag}").text)
        plain = redis.Redis.from_url(s.redis_url)
        plain.hset(Keys(s.redis_prefix).workers(tag), "inc", "0:0")  # as after a failover
        time.sleep(0.8)  # a renewal (every 0.5 s) finds the lease gone
        refused = c.get(f"/id/{tag}")
        assert refused.status_code == 503 and refused.json()["error"] == "worker_unavailable"
        grants = c.get("/admin/tags", headers=AUTH).json()["tags"]
        claimed = next(t["max_id"] for t in grants if t["tag"] == tag)
        for _ in range(30):
            assert c.get(f"/id/{tag}").status_code == 503
        grants = c.get("/admin/tags", headers=AUTH).json()["tags"]
        assert next(t["max_id"] for t in grants if t["tag"] == tag) <= claimed + 1
        deadline = time.monotonic() + 6
        while (answer := c.get(f"/id/{tag}")).status_code != 200:
            assert time.monotonic() < deadline, answer.text
            time.sleep(0.1)
        assert int(answer.text) > before


def test_the_embedded_mode_refuses_snowflake_tags_saying_they_need_redis(
    sqlite_settings: Settings, tag: str
) -> None:
    """Made, then refused on every request (naming the tag '-'): now refused at add."""
    with TestClient(create_app(sqlite_settings.with_changes(admin_token=TOKEN))) as c:
        made = c.post(
            "/admin/tags", json={"tag": tag, "kind": "snowflake", "layout": "js53"}, headers=AUTH
        )
        assert made.status_code == 400 and made.json()["error"] == "bad_kind", made.text
        assert "snowflake tags need Redis" in made.json()["message"]
        assert c.get(f"/id/{tag}").status_code == 404


def test_start_and_step_are_refused_on_a_snowflake_tag(node: TestClient, tag: str) -> None:
    add(node, tag)
    for change in ({"start": 10**6}, {"step": 5}):
        answer = node.patch(f"/admin/tags/{tag}", json=change, headers=AUTH)
        assert answer.status_code == 400, answer.text
        assert answer.json()["error"] == "wrong_kind" and "snowflake" in answer.json()["message"]
    row = [t for t in node.get("/admin/tags", headers=AUTH).json()["tags"] if t["tag"] == tag][0]
    assert row["start_id"] == 1 and row["step"] == 1  # nothing changed


def test_start_and_step_are_refused_when_a_snowflake_tag_is_added(
    node: TestClient, tag: str
) -> None:
    for given in ({"start": 2**63 - 3}, {"step": 5}):
        answer = node.post(
            "/admin/tags", json={"tag": tag, "kind": "snowflake", **given}, headers=AUTH
        )
        assert answer.status_code == 400 and answer.json()["error"] == "wrong_kind", answer.text
        assert f"takes no {next(iter(given))}" in answer.json()["message"]


def test_a_name_that_issued_ids_is_never_a_snowflake_tag_nor_another_kind(
    node: TestClient, settings: Settings, tag: str
) -> None:
    assert node.post("/admin/tags", json={"tag": tag}, headers=AUTH).status_code == 201
    issued = node.get(f"/ids/{tag}?count=100").json()["ids"]
    assert node.delete(f"/admin/tags/{tag}", headers=AUTH).status_code == 200
    refused = node.post("/admin/tags", json={"tag": tag, "kind": "snowflake"}, headers=AUTH)
    assert refused.status_code == 409 and refused.json()["error"] == "name_used", refused.text
    assert "tombstone" in refused.json()["message"] and "new name" in refused.json()["message"]
    # Nor strict (issue 28: a name keeps its kind; a node holding the old buffer would
    # serve it below the strict IDs); as the segment tag it was, it goes on above.
    strict = node.post("/admin/tags", json={"tag": tag, "strict": True}, headers=AUTH)
    assert strict.status_code == 409 and strict.json()["error"] == "name_used", strict.text
    again_segment = node.post("/admin/tags", json={"tag": tag}, headers=AUTH)
    assert again_segment.status_code == 201, again_segment.text
    assert int(node.get(f"/id/{tag}").text) > max(issued)
    # A live tag's name: it exists (not "used before")
    again = node.post("/admin/tags", json={"tag": tag, "kind": "snowflake"}, headers=AUTH)
    assert again.status_code == 409 and again.json()["error"] == "tag_exists", again.text
    # A row deleted by hand leaves no tombstone, only its mark in Redis
    other = tag + "-hand"
    redis.Redis.from_url(settings.redis_url).set(Keys(settings.redis_prefix).hwm(other), 101)
    by_mark = node.post("/admin/tags", json={"tag": other, "kind": "snowflake"}, headers=AUTH)
    assert by_mark.status_code == 409 and "mark in Redis is 101" in by_mark.text, by_mark.text


def test_a_batch_over_a_snowflake_tags_cap_names_it_before_any_grant(
    node: TestClient, settings: Settings, tag: str
) -> None:
    add(node, tag, worker_bits=1, sequence_bits=1, unit_ms=1000)  # 2 IDs per 500 ms
    # Redis lost the worker hash: the first grant waits a quarantine (503 meanwhile)
    redis.Redis.from_url(settings.redis_url).delete(Keys(settings.redis_prefix).workers(tag))
    for count in (3, settings.max_count + 1):
        answer = node.get(f"/ids/{tag}?count={count}")
        assert answer.status_code == 400 and answer.json()["error"] == "bad_count", answer.text
        assert "at most 2 per batch" in answer.json()["message"]
    assert node.get(f"/ids/{tag}?count=2").status_code == 503  # in quarantine


def test_a_count_over_the_node_cap_names_the_node_cap_when_the_tags_is_higher(
    node: TestClient, settings: Settings, tag: str
) -> None:
    """The default layout makes 2,048,000 IDs in 500 ms, above IDPOOL_MAX_COUNT:
    a count over the node's cap named the tag's "at most 2048000", which the node
    refuses from its own cap on. The node's message says the limit that holds."""
    add(node, tag)
    for count in (settings.max_count + 1, 3_000_000):
        answer = node.get(f"/ids/{tag}?count={count}")
        assert answer.status_code == 400 and answer.json()["error"] == "bad_count", answer.text
        assert f"from 1 to {settings.max_count}" in answer.json()["message"], answer.text


def test_a_tags_lease_is_fixed_at_creation_and_used_by_every_node(
    settings: Settings, tag: str
) -> None:
    long_ms = 20_000
    adder = settings.with_changes(admin_token=TOKEN, worker_lease_seconds=long_ms / 1000)
    with TestClient(create_app(adder)) as a:
        add(a, tag)
    short = settings.with_changes(worker_lease_seconds=4.0, worker_margin_seconds=1.0)
    with TestClient(create_app(short)) as b:
        got = b.post(f"/worker/{tag}?holder=c").json()
        assert got["ttl_ms"] == long_ms  # the tag's, not this node's 4 s
        body = {k: got[k] for k in ("worker", "generation", "secret")}
        renewed = b.post(f"/worker/{tag}/renew", json={**body, "last_ms": got["server_ms"]})
        assert renewed.status_code == 200 and renewed.json()["ttl_ms"] == long_ms
        key = Keys(settings.redis_prefix).workers(tag)
        field = redis.Redis.from_url(settings.redis_url).hget(key, f"w:{got['worker']}")
        assert field is not None and field.decode().endswith(f" {long_ms}")
        released = b.post(f"/worker/{tag}/release", json={**body, "last_ms": got["server_ms"]})
        assert released.status_code == 200
        again = b.post(f"/worker/{tag}/renew", json={**body, "last_ms": got["server_ms"]})
        assert again.status_code == 409 and "released" in again.json()["message"]


def test_a_batch_longer_than_the_layout_makes_in_half_a_second_is_refused(
    node: TestClient, tag: str
) -> None:
    add(node, tag, sequence_bits=2, unit_ms=100)  # 4 IDs per 100 ms: 20 in 500 ms
    refused = node.get(f"/ids/{tag}?count=21")
    assert refused.status_code == 400 and refused.json()["error"] == "bad_count"
    assert "at most 20" in refused.json()["message"]
    ids = node.get(f"/ids/{tag}?count=20").json()["ids"]
    assert ids == sorted(set(ids)) and ((ids[-1] >> 12) - (ids[0] >> 12)) * 100 <= 600


async def added(ledger: Ledger, pool: RedisPool, tag: str, *, claim_first: bool) -> TagRow:
    """``tag add --snowflake`` as tag_fields.NewTag.create runs it: the row, then
    prepare_tag; with ``claim_first``, a node claims a generation in between (the
    add stalled after its row) and Redis loses the hash its grant made."""
    layout = check_layout({}, wall_ms() - 60_000).to_text() + ".l400"
    row = await ledger.add_tag(tag, step=1, start=1, rules=rules_of("snowflake"), layout=layout)
    if claim_first:
        await ledger.claim(tag, 1, "snowflake")  # node B's generation; its grant ran, B serves
        await pool.client.delete(pool.keys.workers(tag))
    await prepare_tag(ledger, pool, row)
    return row


async def grant_now(pool: RedisPool, tag: str, generation: int) -> int:
    store = WorkerStore(pool.client, pool.keys, pool.send)
    got = await store.grant(
        tag, generation=generation, workers=1, holder="c", ttl_ms=400, quarantine_ms=400
    )
    return got.worker


@pytest.mark.anyio
async def test_a_snowflake_tag_just_added_serves_at_once(
    ledger: Ledger, redis_pool: RedisPool, tag: str
) -> None:
    await added(ledger, redis_pool, tag, claim_first=False)
    assert await grant_now(redis_pool, tag, 1) == 0  # no quarantine


@pytest.mark.anyio
async def test_a_late_tag_add_keeps_the_quarantine_once_a_generation_was_claimed(
    ledger: Ledger, redis_pool: RedisPool, tag: str
) -> None:
    await added(ledger, redis_pool, tag, claim_first=True)
    with pytest.raises(WorkerRefused) as q:
        await grant_now(redis_pool, tag, 2)  # B may still hold worker 0
    assert q.value.why == "quarantine"


@pytest.mark.anyio
async def test_renewals_run_on_the_nodes_clock_and_the_first_to_find_the_lease_gone_stops(
    settings: Settings, ledger: Ledger, redis_pool: RedisPool, tag: str, clock: FakeClock
) -> None:
    """A snowflake tag's renewals wait a quarter of the lease on the node's clock
    (KindContext.clock), not the lease clock: moved by hand, one renews the lease,
    and the next, after a new Redis incarnation, stops the holder at once."""
    lease_ms = int(settings.worker_lease_seconds * 1000)
    layout = check_layout({}, wall_ms() - 60_000).to_text() + f".l{lease_ms}"
    row = await ledger.add_tag(tag, step=1, start=1, rules=rules_of("snowflake"), layout=layout)
    await prepare_tag(ledger, redis_pool, row)
    run = await open_runtime(settings, open_stores, clock)
    try:
        kind = run.node.kinds["snowflake"]
        assert isinstance(kind, SnowflakeKind)
        gen = await kind.generator(tag)  # granted: its renewer waits on the clock
        await clock.until_sleeping()
        assert clock.next_due() == pytest.approx(lease_ms / 4000)
        deadline = gen.stop_at
        await clock.advance(lease_ms / 4000)  # a renewal: the deadline moves on
        await clock.until_sleeping()
        assert gen.lost is None and gen.stop_at > deadline
        hash_key = redis_pool.keys.workers(tag)
        await redis_pool.client.hset(hash_key, "inc", "0:0")  # as after a failover
        await clock.advance(lease_ms / 4000)
        renewer = kind.held[tag].renewer
        assert renewer is not None
        await asyncio.wait_for(renewer, 10.0)  # it ended: the lease is lost
        assert gen.lost is not None and "lease was lost" in gen.lost
        assert tag not in kind.generators  # the next request asks for a new worker ID
    finally:
        await run.stop()
        await run.close()


def test_a_clock_leaped_past_the_lease_makes_no_id_a_later_holder_makes_again(
    settings: Settings, tag: str
) -> None:
    """Issue 28: a node whose wall clock leaps forward by more than the lease's
    TTL and a second made IDs at the leaped time; its renewal carried that time,
    was refused (bad_last) and recorded nothing, so its worker IDs came back with
    floors at real time and a later holder made the same IDs when real time got
    there (45,602 duplicates). The node now stops (503) at the lease's expiry as
    the script recorded it; the later holder starts above that."""
    s = settings.with_changes(
        admin_token=TOKEN, worker_lease_seconds=1.0, worker_margin_seconds=0.2
    )
    leap = [0]
    leaped: list[int] = []
    refusals: list[str] = []
    with TestClient(create_app(s)) as a:
        add(a, tag, worker_bits=1, unit_ms=100)  # two worker IDs, 100 ms units
        kind = a.app.node.kinds["snowflake"]  # type: ignore[attr-defined]
        kind._clock_ms = lambda: wall_ms() + leap[0]  # this node's wall clock
        before = int(a.get(f"/id/{tag}").text)  # granted with a good clock
        leap[0] = 3_000  # NTP, an operator, a VM resumed: 3 s ahead (lease 1 s)
        leaped_at = wall_ms()
        while wall_ms() < leaped_at + 1_200:  # past several renewals
            answer = a.get(f"/id/{tag}")
            if answer.status_code == 200:
                leaped.append(int(answer.text))
            else:
                refusals.append(answer.json()["message"])
            time.sleep(0.01)
        ready = a.get("/readyz")
    seen = {before, *leaped}
    later: list[int] = []
    with TestClient(create_app(s)) as b:  # a node with a good clock, once A's leases expired
        while wall_ms() < leaped_at + 1_200 + 3_000 + 300:  # real time past A's leaped times
            answer = b.get(f"/id/{tag}")
            if answer.status_code == 200:
                later.append(int(answer.text))
            time.sleep(0.01)
    again = seen.intersection(later)
    assert not again, f"{len(again)} IDs made again by a later holder of the leaped worker IDs"
    assert later and not leaped, f"{len(leaped)} IDs made at the leaped time"
    assert refusals and "past the worker lease's expiry" in refusals[-1]
    assert ready.status_code == 503 and "leaped forward" in ready.json()["message"]


def test_decode_of_a_guarded_tag_needs_its_token_as_every_route_does(
    node: TestClient, tag: str
) -> None:
    """Issue 28: GET /decode/{tag}/{id} decoded a guarded snowflake tag's IDs and
    named a guarded tag's kind (not_decodable) without a token, where /id, /ids
    and /worker answer 401."""
    add(node, tag)
    value = node.get(f"/id/{tag}").text
    token = node.post(f"/admin/tags/{tag}/tokens", headers=AUTH).json()["token"]
    refused = node.get(f"/decode/{tag}/{value}")
    assert refused.status_code == 401 and refused.json()["error"] == "unauthorized"
    assert "snowflake" not in refused.text and "worker" not in refused.json()
    assert refused.headers["www-authenticate"] == "Bearer"
    mine = {"Authorization": f"Bearer {token}"}
    assert node.get(f"/decode/{tag}/{value}", headers=mine).json()["kind"] == "snowflake"
    assert node.get(f"/decode/{tag}/{value}?token={token}").status_code == 200
    segment = f"{tag}s"
    assert node.post("/admin/tags", json={"tag": segment}, headers=AUTH).status_code == 201
    node.post(f"/admin/tags/{segment}/tokens", headers=AUTH)
    hidden = node.get(f"/decode/{segment}/1")
    assert hidden.status_code == 401 and "segment" not in hidden.text  # its kind unsaid


def test_an_oversized_batch_on_the_fast_path_uses_none_of_the_units_sequence(
    node: TestClient, tag: str
) -> None:
    """Issue 28: /ids with a count over the tag's batch cap (but under the node's)
    went to take_many on the fast path first, which used up the rest of the
    unit's sequence before the route's 400 bad_count."""
    add(node, tag, sequence_bits=2, unit_ms=1000)  # 4 IDs per 1 s unit: at most 4 a batch
    frozen = wall_ms() + 2_000  # unit 2 (unit 0, the epoch, is never used)
    node.app.node.kinds["snowflake"]._clock_ms = lambda: frozen  # type: ignore[attr-defined]
    node.get(f"/id/{tag}")  # granted (sequence 0 of the unit): the fast path from here
    gen = node.app.node.snowflakes[tag]  # type: ignore[attr-defined]
    refused = node.get(f"/ids/{tag}?count=5")
    assert refused.status_code == 400 and refused.json()["error"] == "bad_count"
    assert (gen.issued, gen.sequence) == (1, 0)  # nothing taken for it
    rest = node.get(f"/ids/{tag}?count=3")  # the unit's other three are still there
    assert rest.status_code == 200 and [i & 3 for i in rest.json()["ids"]] == [1, 2, 3]


def max_id(node: TestClient, tag: str) -> int:
    rows = node.get("/admin/tags", headers=AUTH).json()["tags"]
    return int([t for t in rows if t["tag"] == tag][0]["max_id"])


def test_clients_cannot_take_every_worker_id_of_a_tag_and_nodes_keep_serving(
    settings: Settings, tag: str
) -> None:
    """Issue 28: one caller took 1,023 of a tag's 1,024 worker IDs in ~7 s through
    POST /worker (no token on an open tag), a ledger row per grant, and nodes
    then answered 503 to every /id. Clients now hold at most
    IDPOOL_WORKER_CLIENT_SHARE of them (here half of 8), one holder name at most
    IDPOOL_WORKER_HOLDER_MAX; a refused grant claims no generation, and the
    refusals show in /status and /metrics."""
    s = settings.with_changes(admin_token=TOKEN, worker_holder_max=2)
    with TestClient(create_app(s)) as node:
        add(node, tag, worker_bits=3)  # 8 worker IDs
        mine = [node.post(f"/worker/{tag}?holder=greedy") for _ in range(3)]
        assert [r.status_code for r in mine] == [200, 200, 503]
        assert "IDPOOL_WORKER_HOLDER_MAX" in mine[2].json()["message"]
        others = [node.post(f"/worker/{tag}?holder=greedy{i}") for i in range(4)]
        assert [r.status_code for r in others] == [200, 200, 503, 503]
        refused = others[-1].json()
        assert refused["error"] == "worker_unavailable"
        assert "IDPOOL_WORKER_CLIENT_SHARE" in refused["message"]
        claimed = max_id(node, tag)
        assert node.post(f"/worker/{tag}?holder=more").status_code == 503
        assert max_id(node, tag) == claimed  # no generation claimed: no ledger write
        assert node.get(f"/id/{tag}").status_code == 200  # the node's own worker ID
        status = node.get("/status.json").json()
        shown = [t for t in status["tags"] if t["tag"] == tag][0]["buffer"]
        assert shown["refusals"] == {"capped": 4}
        metrics = node.get("/metrics").text
        assert f'idpool_snowflake_worker_refusals_total{{tag="{tag}",why="capped"}} 4.0' in metrics
        body = {k: mine[0].json()[k] for k in ("worker", "generation", "secret")}
        node.post(f"/worker/{tag}/release", json={**body, "last_ms": mine[0].json()["server_ms"]})
        assert node.post(f"/worker/{tag}?holder=greedy").status_code == 200  # room again
