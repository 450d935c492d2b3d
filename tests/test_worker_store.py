"""The worker-ID script on the real Redis (pool/worker_store.py): one holder per
worker ID, floors that travel with the lease, the quarantine after a new Redis
incarnation."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

import pytest
import redis

from idpool.pool.keys import Keys
from idpool.pool.redis_pool import RedisPool
from idpool.pool.settings import Settings
from idpool.pool.worker_store import ClientCaps, Grant, LastTooLate, WorkerRefused, WorkerStore
from ops.toolkit import RedisServer

pytestmark = pytest.mark.anyio
TTL = 400  # ms


def store_of(pool: RedisPool) -> WorkerStore:
    return WorkerStore(pool.client, pool.keys, pool.send)


async def grant(
    store: WorkerStore, tag: str, gen: int, *, first: bool = False, workers: int = 4
) -> Grant:
    """``first``: the tag was just made (``init``, as ``idpool tag add`` runs it):
    the only way a grant needs no quarantine on a hash that did not exist."""
    if first:
        await store.lift(tag, await store.init(tag))  # the ledger shows no claim: lifted
    return await store.grant(
        tag,
        generation=gen,
        workers=workers,
        holder=f"h{gen}",
        ttl_ms=TTL,
        quarantine_ms=TTL,
    )


async def test_each_worker_id_has_one_holder_until_every_one_is_held(
    redis_pool: RedisPool, tag: str
) -> None:
    store = store_of(redis_pool)
    got = [await grant(store, tag, g, first=g == 1) for g in range(1, 5)]
    assert sorted(g.worker for g in got) == [0, 1, 2, 3]
    assert all(g.floor_ms == 0 for g in got)  # a new tag: nothing used before
    with pytest.raises(WorkerRefused) as e:
        await grant(store, tag, 5)
    assert e.value.why == "full"


async def test_a_worker_id_comes_back_only_after_expiry_above_its_last_time(
    redis_pool: RedisPool, tag: str
) -> None:
    store = store_of(redis_pool)
    first = await grant(store, tag, 1, first=True, workers=1)
    last_used = first.server_ms + 50
    await store.renew(tag, first, last_used, TTL, TTL)  # renewals carry the last time
    with pytest.raises(WorkerRefused):
        await grant(store, tag, 2, workers=1)  # still held
    await asyncio.sleep(TTL / 1000 + 0.1)  # expired, not renewed (its holder was killed)
    second = await grant(store, tag, 3, workers=1)
    assert second.worker == 0
    assert second.floor_ms >= max(last_used, first.expires_ms)
    # the old holder may not renew it any more
    with pytest.raises(WorkerRefused) as e:
        await store.renew(tag, first, last_used, TTL, TTL)
    assert e.value.why == "lost"


async def test_a_renewal_or_release_needs_the_lease_secret_and_changes_nothing_without_it(
    redis_pool: RedisPool, tag: str, settings: Settings
) -> None:
    store = store_of(redis_pool)
    held = await grant(store, tag, 1, first=True, workers=1)
    assert held.secret and held.secret not in repr(held)
    key = Keys(settings.redis_prefix).workers(tag)
    r = redis.Redis.from_url(settings.redis_url)
    before = r.hget(key, "w:0")
    assert before is not None and held.secret.encode() not in before
    # The generation is the tag's ledger max_id: anyone may guess it.
    forged = Grant(held.worker, held.generation, 0, 0, 0, "guessed")
    for op in (store.release, store.renew):
        with pytest.raises(WorkerRefused) as e:
            if op == store.release:
                await store.release(tag, forged, 10**13, TTL)
            else:
                await store.renew(tag, forged, 10**13, TTL, TTL)
        assert e.value.why == "wrong_secret"
    assert r.hget(key, "w:0") == before  # not even the floor raised
    with pytest.raises(WorkerRefused):
        await grant(store, tag, 2, workers=1)  # still held: no second holder
    await store.renew(tag, held, held.server_ms, TTL, TTL)
    await store.release(tag, held, held.server_ms, TTL)


async def test_a_lease_written_before_secrets_is_never_renewed_and_waits_out_its_expiry(
    redis_pool: RedisPool, tag: str, settings: Settings
) -> None:
    # Upgrade: a field the old script wrote ("gen expires last holder", no hash). Its
    # holder cannot show a secret, and whoever shows one is not provably its holder.
    store = store_of(redis_pool)
    held = await grant(store, tag, 1, first=True, workers=1)
    key = Keys(settings.redis_prefix).workers(tag)
    r = redis.Redis.from_url(settings.redis_url)
    gen, expires, last, holder, *_ = r.hget(key, "w:0").decode().split(" ")  # type: ignore[union-attr]
    r.hset(key, "w:0", f"{gen} {expires} {last} {holder}")
    for secret in (held.secret, ""):
        with pytest.raises(WorkerRefused) as e:
            await store.renew(tag, Grant(0, held.generation, 0, 0, 0, secret), 1, TTL, TTL)
        assert e.value.why == "lost" and "before worker secrets" in str(e.value)
    with pytest.raises(WorkerRefused) as e:
        await store.release(tag, Grant(0, held.generation, 0, 0, 0, secret), 1, TTL)
    with pytest.raises(WorkerRefused):
        await grant(store, tag, 2, workers=1)  # its old holder may still be making IDs
    await asyncio.sleep(TTL / 1000 + 0.1)
    again = await grant(store, tag, 3, workers=1)  # expired: granted above its expiry
    assert again.worker == 0 and again.floor_ms >= int(expires)


async def test_a_released_worker_id_is_granted_again_above_its_last_time(
    redis_pool: RedisPool, tag: str
) -> None:
    store = store_of(redis_pool)
    first = await grant(store, tag, 1, first=True, workers=1)
    ahead = int(time.time() * 1000) - 5  # the holder's last time, just past
    await store.release(tag, first, ahead, TTL)
    await asyncio.sleep(0.01)
    again = await grant(store, tag, 2, workers=1)
    assert again.worker == 0 and again.floor_ms >= ahead
    # a worker ID whose last time is still ahead of the server's clock is not reused
    # (ahead by less than the lease's TTL and a unit: further is refused, LastTooLate)
    await store.release(tag, again, int(time.time() * 1000) + 900, TTL)
    with pytest.raises(WorkerRefused):
        await grant(store, tag, 3, workers=1)


async def test_a_new_incarnation_drops_every_holder_and_grants_nothing_for_a_ttl(
    redis_pool: RedisPool, tag: str, settings: Settings
) -> None:
    store = store_of(redis_pool)
    held = await grant(store, tag, 1, first=True)
    plain = redis.Redis.from_url(settings.redis_url)
    # As a snapshot of an older incarnation (restart, failover) would hold it:
    plain.hset(Keys(settings.redis_prefix).workers(tag), "inc", "0:0")
    with pytest.raises(WorkerRefused) as lost:
        await store.renew(tag, held, held.server_ms, TTL, TTL)
    assert lost.value.why == "lost"  # the old holder stops: it cannot renew here
    with pytest.raises(WorkerRefused) as q:
        await grant(store, tag, 2)
    assert q.value.why == "quarantine" and 0 < q.value.retry_ms <= TTL
    await asyncio.sleep(TTL / 1000 + 0.05)
    after = await grant(store, tag, 3)
    # the floor kept from the old hash: above everything the old holder may have used
    assert after.floor_ms >= held.expires_ms


async def test_a_snapshot_older_than_the_holders_renewals_floors_at_the_quarantine(
    redis_pool: RedisPool, tag: str, settings: Settings
) -> None:
    store = store_of(redis_pool)
    held = await grant(store, tag, 1, first=True, workers=1)
    await asyncio.sleep(0.1)
    renewed = await store.renew(tag, held, held.server_ms + 100, TTL, TTL)
    # A snapshot taken before that renewal (restored, or a lagging replica): its
    # field shows the grant's expiry, below what the live holder may still use.
    plain = redis.Redis.from_url(settings.redis_url)
    stale = f"1 {held.expires_ms} {held.floor_ms} h1"
    plain.hset(Keys(settings.redis_prefix).workers(tag), mapping={"inc": "0:0", "w:0": stale})
    with pytest.raises(WorkerRefused):
        await store.renew(tag, held, held.server_ms + 100, TTL, TTL)
    await asyncio.sleep(TTL / 1000 + 0.05)
    after = await grant(store, tag, 2, workers=1)
    # the holder stopped before its renewed expiry: the new one starts above it
    # (above the quarantine's end), not above the snapshot's older floor
    assert after.floor_ms >= renewed.expires_ms


async def test_an_empty_redis_quarantines_every_tag_but_one_just_made(
    redis_pool: RedisPool, tag: str, settings: Settings
) -> None:
    store = store_of(redis_pool)
    fresh = await grant(store, tag, 1, first=True)  # a tag just made (init): no wait
    assert fresh.worker == 0
    redis.Redis.from_url(settings.redis_url).delete(Keys(settings.redis_prefix).workers(tag))
    # Redis lost the hash; the ledger's generation says grants happened before
    with pytest.raises(WorkerRefused) as q:
        await grant(store, tag, 2)
    assert q.value.why == "quarantine"
    await asyncio.sleep(TTL / 1000 + 0.05)
    later = await grant(store, tag, 3)
    assert later.floor_ms >= fresh.server_ms + TTL  # the quarantine's end is the floor


async def test_a_redis_restarted_empty_fences_live_holders(
    tmp_path: Path, settings: Settings, tag: str
) -> None:
    server = RedisServer(tmp_path / "r", "--save", "", "--appendonly", "no").start()
    try:
        s = settings.with_changes(redis_url=server.url)
        pool = RedisPool.from_settings(s)
        store = store_of(pool)
        held = await grant(store, tag, 1, first=True, workers=1)
        server.kill9()
        server.start()  # empty
        await pool.close()
        pool = RedisPool.from_settings(s)
        store = store_of(pool)
        with pytest.raises(WorkerRefused) as q:
            await grant(store, tag, 2, workers=1)  # not the first generation: quarantined
        assert q.value.why == "quarantine"
        with pytest.raises(WorkerRefused):
            await store.renew(tag, held, held.server_ms, TTL, TTL)
        await asyncio.sleep(TTL / 1000 + 0.05)
        again = await grant(store, tag, 3, workers=1)
        assert again.floor_ms > held.server_ms
        await pool.close()
    finally:
        server.kill9()


async def test_a_tag_just_made_needs_no_quarantine_whichever_grant_comes_first(
    redis_pool: RedisPool, tag: str
) -> None:
    store = store_of(redis_pool)
    await store.lift(tag, await store.init(tag))  # idpool tag add: no generation claimed yet
    second = await grant(store, tag, 2)  # generation 2's script ran before generation 1's
    first = await grant(store, tag, 1)
    assert {second.worker, first.worker} == {0, 1}


async def test_a_grant_that_finds_no_hash_waits_a_quarantine_whatever_its_generation(
    redis_pool: RedisPool, tag: str
) -> None:
    store = store_of(redis_pool)
    # No init: the tag was made while Redis was down, or Redis lost the hash. The
    # generation's value (even the row's start_id) cannot tell whether a grant ran.
    with pytest.raises(WorkerRefused) as q:
        await store.grant(
            tag, generation=1, first=True, workers=1, holder="h", ttl_ms=TTL, quarantine_ms=TTL
        )
    assert q.value.why == "quarantine"


async def test_a_late_init_after_a_grant_and_a_redis_restarted_empty_keeps_the_quarantine(
    tmp_path: Path, settings: Settings, tag: str
) -> None:
    """``tag add`` stalls after its row; node B claims a generation and is granted
    worker 0; Redis restarts empty; only then does the add's ``init`` arrive. It
    made the hash with no quarantine, and a third grant got worker 0 while B still
    served (duplicate IDs). Now the row read again after init shows B's claim:
    no lift, and the third grant waits."""
    server = RedisServer(tmp_path / "r", "--save", "", "--appendonly", "no").start()
    try:
        s = settings.with_changes(redis_url=server.url)
        pool = RedisPool.from_settings(s)
        store = store_of(pool)
        claimed = 0  # generations claimed since the row (its max_id less its start_id)
        claimed += 1  # B claims generation 1: its grant finds no hash (quarantine)
        with pytest.raises(WorkerRefused):
            await grant(store, tag, 1, workers=1)
        await asyncio.sleep(TTL / 1000 + 0.05)
        claimed += 1
        held = await grant(store, tag, 2, workers=1)  # B serves worker 0
        assert held.worker == 0
        server.kill9()
        server.start()  # empty
        await pool.close()
        pool = RedisPool.from_settings(s)
        store = store_of(pool)
        made = await store.init(tag, TTL)  # the stalled tag add's init, at last
        if claimed == 0:  # as prepare_tag: the row read again after init
            await store.lift(tag, made)
        with pytest.raises(WorkerRefused) as q:
            await grant(store, tag, 3, workers=1)
        assert q.value.why == "quarantine", "worker 0 granted again while B still serves"
        await pool.close()
    finally:
        server.kill9()


async def test_lift_keeps_the_quarantine_of_a_hash_changed_since_init(
    redis_pool: RedisPool, tag: str, settings: Settings
) -> None:
    store = store_of(redis_pool)
    made = await store.init(tag, TTL)
    assert made is not None
    key = Keys(settings.redis_prefix).workers(tag)
    redis.Redis.from_url(settings.redis_url).hset(key, "w:0", "1 0 0 h")  # granted since
    assert not await store.lift(tag, made)
    assert not await store.lift(tag, await store.init(tag, TTL))  # found a hash: None
    with pytest.raises(WorkerRefused) as q:
        await grant(store, tag, 2)
    assert q.value.why == "quarantine"


async def test_renewing_a_released_lease_says_it_was_released(
    redis_pool: RedisPool, tag: str
) -> None:
    store = store_of(redis_pool)
    held = await grant(store, tag, 1, first=True, workers=1)
    await store.release(tag, held, held.server_ms, TTL)
    with pytest.raises(WorkerRefused) as e:
        await store.renew(tag, held, held.server_ms, TTL, TTL)
    assert e.value.why == "released"
    assert "released" in str(e.value)


async def test_a_last_time_far_past_the_servers_clock_is_refused_and_changes_nothing(
    redis_pool: RedisPool, tag: str
) -> None:
    store = store_of(redis_pool)
    held = await grant(store, tag, 1, first=True, workers=1)
    with pytest.raises(LastTooLate) as e:
        await store.renew(tag, held, 10**14 - 1, TTL, TTL)
    assert held.server_ms < e.value.bound_ms <= held.server_ms + TTL + 1000 + 1000
    with pytest.raises(LastTooLate):
        await store.release(tag, held, 10**14 - 1, TTL)
    renewed = await store.renew(tag, held, held.server_ms + 10, TTL, TTL)  # still held
    await store.release(tag, held, held.server_ms + 10, TTL)
    await asyncio.sleep(0.05)  # the last time past
    again = await grant(store, tag, 2, workers=1)
    assert again.floor_ms < renewed.server_ms + TTL  # the refused last times were not kept


async def test_a_renewal_extends_by_the_leases_recorded_ttl_and_answers_it(
    redis_pool: RedisPool, tag: str
) -> None:
    store = store_of(redis_pool)
    held = await grant(store, tag, 1, first=True, workers=1)
    assert held.ttl_ms == TTL
    renewed = await store.renew(tag, held, held.server_ms, 60_000, 60_000)  # a longer node's
    assert renewed.ttl_ms == TTL
    assert renewed.expires_ms == renewed.server_ms + TTL


async def test_a_renewal_never_moves_a_leases_expiry_earlier(
    redis_pool: RedisPool, tag: str, settings: Settings
) -> None:
    # Upgrade: a field written before TTLs were recorded ("gen expires last holder
    # hash"), granted for 3 s by an older node, renewed through a node of 0.4 s.
    store = store_of(redis_pool)
    held = await grant(store, tag, 1, first=True, workers=1)
    key = Keys(settings.redis_prefix).workers(tag)
    r = redis.Redis.from_url(settings.redis_url)
    gen, _, last, holder, hashed, _ttl = r.hget(key, "w:0").decode().split(" ")  # type: ignore[union-attr]
    long_expiry = held.server_ms + 3000
    r.hset(key, "w:0", f"{gen} {long_expiry} {last} {holder} {hashed}")
    renewed = await store.renew(tag, held, held.server_ms, TTL, TTL)
    assert renewed.ttl_ms == TTL and renewed.expires_ms == long_expiry
    with pytest.raises(WorkerRefused) as e:
        await grant(store, tag, 2, workers=1)
    assert e.value.why == "full"


async def test_concurrent_client_grants_never_pass_the_tags_client_cap(
    redis_pool: RedisPool, tag: str
) -> None:
    """Issue 28: clients may hold at most a share of a tag's worker IDs (the rest
    stay for nodes). Counted in the grant's script: 16 grants at once on 8
    worker IDs with half for clients give 4, and a node's grant still gets one."""
    store = store_of(redis_pool)
    await store.lift(tag, await store.init(tag))
    caps = ClientCaps(0.5, 0)

    async def client(n: int) -> Grant | WorkerRefused:
        try:
            return await store.grant(
                tag, generation=n, workers=8, holder=f"c{n}", ttl_ms=TTL,
                quarantine_ms=TTL, caps=caps,
            )  # fmt: skip
        except WorkerRefused as e:
            return e

    got = await asyncio.gather(*(client(n) for n in range(1, 17)))
    granted = [g for g in got if isinstance(g, Grant)]
    assert len(granted) == 4 and {e.why for e in got if isinstance(e, WorkerRefused)} == {
        "capped"
    }
    node = await grant(store, tag, 99, workers=8)  # a node's grant: no cap
    assert node.worker not in {g.worker for g in granted}


async def test_the_cap_check_after_a_lost_hash_leaves_the_quarantine_in_place(
    redis_pool: RedisPool, tag: str, settings: Settings
) -> None:
    """The read-only cap check (``room``, before a client's grant claims its
    generation) ran the new-incarnation block with a quarantine of 0: after a Redis
    that lost the hash, the grant that followed found no quarantine and gave a
    worker ID a live node held (an adversarial run: 135 duplicate IDs)."""
    store = store_of(redis_pool)
    await grant(store, tag, 1, first=True, workers=1)  # a node holds worker 0
    keys = Keys(settings.redis_prefix)
    # a Redis restarted empty: the hash and the tag's largest TTL both gone
    redis.Redis.from_url(settings.redis_url).delete(keys.workers(tag), keys.worker_lease(tag))
    caps = ClientCaps(1.0, 0)
    await store.room(tag, workers=1, holder="c", caps=caps)  # nothing held here: room
    with pytest.raises(WorkerRefused) as q:
        await store.grant(
            tag, generation=2, workers=1, holder="c", ttl_ms=TTL, quarantine_ms=TTL, caps=caps
        )
    assert q.value.why == "quarantine"


async def test_a_release_with_a_late_last_time_still_counts_against_the_caps(
    redis_pool: RedisPool, tag: str
) -> None:
    """A released worker ID whose last time is not past is kept from everyone until
    then: it counts against its holder's and the clients' caps. Not counted, a
    grant-and-release loop with a late last time blocked every worker ID of a tag
    (an adversarial run: a js53 tag's 256 in 14 s; SnowflakeClients and new nodes
    then got 503)."""
    store = store_of(redis_pool)
    await store.lift(tag, await store.init(tag))
    caps = ClientCaps(0.5, 1)

    async def client(gen: int, holder: str) -> Grant:
        return await store.grant(
            tag, generation=gen, workers=8, holder=holder, ttl_ms=TTL, quarantine_ms=TTL,
            caps=caps,
        )  # fmt: skip

    first = await client(1, "x")
    await store.release(tag, first, first.server_ms + TTL + 900, TTL)  # under the bound
    with pytest.raises(WorkerRefused) as e:
        await client(2, "x")
    assert e.value.why == "capped"  # before: granted, the released one not counted
    for n, holder in enumerate("abc", start=3):  # the tag's 4 client places: 3 more
        await client(n, holder)
    with pytest.raises(WorkerRefused) as e:
        await client(9, "d")
    assert e.value.why == "capped"
    node = await grant(store, tag, 99, workers=8)  # nodes still get theirs
    assert node.worker not in {first.worker}


async def test_a_late_renewal_of_an_expired_lease_raises_its_last_time_only_to_the_ceiling(
    redis_pool: RedisPool, tag: str, settings: Settings
) -> None:
    """An expired lease's holder made no ID past its expiry (its ceiling) and its last
    unit ended a unit (1 s) on at most: a late renewal (refused, 'lost') raised the
    last time to whatever it said, up to now + TTL + 1 s, and one such call a TTL
    kept every expired worker ID from everyone, counted against no cap (an
    adversarial run starved a tag: nodes and clients got 503)."""
    store = store_of(redis_pool)
    held = await grant(store, tag, 1, first=True, workers=1)
    await asyncio.sleep(TTL / 1000 + 0.05)  # expired
    with pytest.raises(WorkerRefused) as e:
        await store.renew(tag, held, held.expires_ms + TTL + 900, TTL, TTL)
    assert e.value.why == "lost"
    raw = redis.Redis.from_url(settings.redis_url).hget(
        Keys(settings.redis_prefix).workers(tag), f"w:{held.worker}"
    )
    assert raw is not None
    _, exp, last = raw.decode().split()[:3]
    assert int(last) <= int(exp) + 1000, raw
