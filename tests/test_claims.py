from __future__ import annotations

import pymysql
import pytest

from idpool.pool.claims import REDIS_SKIP_SECONDS, LedgerClaims, move_start
from idpool.pool.errors import (
    MarkNotRaised,
    MarkNotReplicated,
    StaleLedger,
    StartBelowIssued,
    StoreSkipped,
    StoreUnavailable,
    TooFewReplicas,
    UnknownTag,
)
from idpool.pool.ledger import TABLE, Ledger
from idpool.pool.preloader import Preloader
from idpool.pool.ranges import IdRange
from idpool.pool.redis_pool import RedisPool
from idpool.pool.settings import Settings
from idpool.service.kinds import rules_of

from .conftest import MYSQL_SERVER, TEST_DATABASE, new_name

pytestmark = pytest.mark.anyio


def rewind_ledger(tag: str, max_id: int) -> None:
    """What a failover to a lagging MySQL replica, or a restore, looks like to idpool."""
    conn = pymysql.connect(host="127.0.0.1", user="root", database=TEST_DATABASE, autocommit=True)
    conn.cursor().execute(f"UPDATE {TABLE} SET max_id = %s WHERE tag = %s", (max_id, tag))
    conn.close()


async def test_rewound_ledger_is_refused_and_raised(
    ledger: Ledger, redis_pool: RedisPool, tag: str
) -> None:
    await ledger.add_tag(tag, step=100, start=1)
    claims = LedgerClaims(ledger, redis_pool)
    first = await claims.claim(tag, 3)
    assert first.range == IdRange(1, 301) and first.refused == []
    assert await redis_pool.high_water(tag) == 301
    rewind_ledger(tag, 101)
    second = await claims.claim(tag)
    assert second.refused == [IdRange(101, 201)]  # would have repeated IDs 101..200
    assert second.raised_to == 301
    assert second.range == IdRange(301, 401)
    assert (await ledger.get_tag(tag)).max_id == 401


async def test_mark_in_redis_guards_other_processes(
    ledger: Ledger, redis_pool: RedisPool, tag: str
) -> None:
    await ledger.add_tag(tag, step=10, start=1)
    await LedgerClaims(ledger, redis_pool).claim(tag, 5)
    rewind_ledger(tag, 1)
    fresh_process = LedgerClaims(ledger, redis_pool)  # knows nothing in memory
    claim = await fresh_process.claim(tag)
    assert claim.range.start >= 51 and claim.refused


async def test_mark_in_memory_guards_when_redis_lost_it(
    ledger: Ledger, redis_pool: RedisPool, tag: str
) -> None:
    await ledger.add_tag(tag, step=10, start=1)
    claims = LedgerClaims(ledger, redis_pool)
    await claims.claim(tag, 5)
    await redis_pool.client.delete(redis_pool.keys.hwm(tag))  # Redis restarted empty
    rewind_ledger(tag, 1)
    claim = await claims.claim(tag)
    assert claim.range.start >= 51 and claim.refused


async def test_pool_ranges_raise_the_mark(ledger: Ledger, tag: str) -> None:
    await ledger.add_tag(tag, step=10, start=1)
    claims = LedgerClaims(ledger, None)
    claims.observe(tag, IdRange(1, 1001))  # a range popped from the pool
    claim = await claims.claim(tag)
    assert claim.range.start >= 1001


async def test_gives_up_loudly_when_the_ledger_cannot_be_raised(
    ledger: Ledger, tag: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    await ledger.add_tag(tag, step=10, start=1)
    claims = LedgerClaims(ledger, None)
    claims.observe(tag, IdRange(1, 10_000))

    async def no_op(tag: str, floor: int) -> int:
        return 0

    monkeypatch.setattr(ledger, "raise_floor", no_op)
    with pytest.raises(StaleLedger, match="high-water mark"):
        await claims.claim(tag)


async def test_concurrent_claimers_are_never_refused(settings: Settings, tag: str) -> None:
    """A claim racing with faster claims elsewhere is fine, not stale.

    The 300 claims queue on one row lock through the ledger's 4 connections (and
    raise the mark through the pool's 32): the last waits for all the others, over
    the fixtures' 1 s store timeout on a loaded machine ("no answer in time"). Stores
    whose timeout that queue cannot reach keep the test about staleness, not speed."""
    import asyncio

    patient = settings.with_changes(store_timeout=60.0)
    ledger = await Ledger.connect(patient)
    redis_pool = RedisPool.from_settings(patient)
    try:
        await ledger.add_tag(tag, step=10, start=1)
        processes = [LedgerClaims(ledger, redis_pool) for _ in range(4)]
        claims = await asyncio.gather(*(processes[i % 4].claim(tag) for i in range(300)))
    finally:
        await redis_pool.close()
        await ledger.close()
    assert [c.refused for c in claims if c.refused] == []
    ids = sorted(i for c in claims for i in range(c.range.start, c.range.end))
    assert ids == list(range(1, 3001))


async def test_start_moves_forward_only(ledger: Ledger, redis_pool: RedisPool, tag: str) -> None:
    await ledger.add_tag(tag, step=10, start=1)
    claims = LedgerClaims(ledger, redis_pool)
    assert (await claims.claim(tag)).range == IdRange(1, 11)
    with pytest.raises(StartBelowIssued, match="to 11 or above"):
        await move_start(ledger, redis_pool, tag, 5)  # would hand out 5..10 again
    assert (await ledger.get_tag(tag)).max_id == 11
    row = await move_start(ledger, redis_pool, tag, 1000)
    assert row.max_id == 1000
    assert (await claims.claim(tag)).range == IdRange(1000, 1010)


async def test_start_is_refused_below_the_mark_a_rewound_ledger_forgot(
    ledger: Ledger, redis_pool: RedisPool, tag: str
) -> None:
    await ledger.add_tag(tag, step=100, start=1)
    await LedgerClaims(ledger, redis_pool).claim(tag, 3)  # mark 301 in Redis
    rewind_ledger(tag, 101)
    with pytest.raises(StartBelowIssued, match="to 301 or above"):
        await move_start(ledger, redis_pool, tag, 150)


class HungRedis:
    """A PoolStore whose high-water calls fail like a hung Redis, counting each call."""

    def __init__(self) -> None:
        self.calls: list[str] = []

    async def high_water(self, tag: str) -> int:
        self.calls.append("high_water")
        raise StoreUnavailable("redis", "TimeoutError: Timeout reading")

    high_water_to_claim = high_water

    async def raise_high_water(self, tag: str, value: int) -> int:
        self.calls.append("raise_high_water")
        raise StoreUnavailable("redis", "TimeoutError: Timeout reading")


async def test_no_claim_without_the_shared_mark(ledger: Ledger, tag: str) -> None:
    # A claim the mark does not fence could be repeated by a rewound MySQL to a
    # process that reads the old mark: with Redis unreadable nothing is claimed.
    await ledger.add_tag(tag, step=10, start=1)
    now = [100.0]
    redis = HungRedis()
    claims = LedgerClaims(ledger, redis, clock=lambda: now[0])  # type: ignore[arg-type]
    with pytest.raises(StoreUnavailable):
        await claims.claim(tag)
    assert redis.calls == ["high_water"]
    # Within the skip window it fails at once: a hung Redis costs one timeout, not one per fetch.
    with pytest.raises(StoreUnavailable, match="just failed"):
        await claims.claim(tag)
    assert redis.calls == ["high_water"]
    now[0] += REDIS_SKIP_SECONDS
    with pytest.raises(StoreUnavailable):
        await claims.claim(tag)
    assert redis.calls == ["high_water", "high_water"]  # then Redis is tried again
    assert (await ledger.get_tag(tag)).max_id == 1  # and MySQL was never claimed from


async def test_a_failed_pop_makes_the_next_claim_fail_fast(ledger: Ledger, tag: str) -> None:
    await ledger.add_tag(tag, step=10, start=1)
    redis = HungRedis()
    claims = LedgerClaims(ledger, redis)  # type: ignore[arg-type]
    claims.redis_failed()  # what RangeSource does when a pop fails
    with pytest.raises(StoreUnavailable):
        await claims.claim(tag)
    assert redis.calls == []
    assert (await ledger.get_tag(tag)).max_id == 1


class MarkLost:
    """Reads the real mark; every raise fails after it may have reached Redis."""

    def __init__(self, pool: RedisPool) -> None:
        self.pool = pool

    async def high_water(self, tag: str) -> int:
        return await self.pool.high_water(tag)

    high_water_to_claim = high_water

    async def raise_high_water(self, tag: str, value: int) -> int:
        raise StoreUnavailable("redis", "ConnectionError: reset by peer")


async def test_a_claim_whose_mark_was_not_raised_is_given_up(
    ledger: Ledger, redis_pool: RedisPool, tag: str
) -> None:
    await ledger.add_tag(tag, step=10, start=1)
    claims = LedgerClaims(ledger, MarkLost(redis_pool))  # type: ignore[arg-type]
    with pytest.raises(MarkNotRaised) as caught:
        await claims.claim(tag)
    assert caught.value.wasted == IdRange(1, 11)  # claimed, unfenced: never to be served


class ReplicaNotAcknowledging:
    """Reads the real mark (the replica is online); every raise lands on the
    primary, but the replica never acknowledges it (frozen)."""

    def __init__(self, pool: RedisPool) -> None:
        self.pool = pool
        self.raises = 0

    async def high_water(self, tag: str) -> int:
        return await self.pool.high_water(tag)

    high_water_to_claim = high_water

    async def raise_high_water(self, tag: str, value: int) -> int:
        self.raises += 1
        raise TooFewReplicas(0, 1, 1, "high-water mark reached 0 of 1 replicas in 500 ms")


async def test_a_raise_too_few_replicas_took_stops_claims_but_not_pops(
    ledger: Ledger, redis_pool: RedisPool, tag: str
) -> None:
    # IDPOOL_REDIS_MARK_REPLICAS: a raise no replica took is given up like any,
    # but Redis answers: the pops' skip stays off (nodes serve the pool), and
    # only claims wait a moment, so a replica online but not acknowledging
    # wastes at most one claim a second per process rather than one per fetch.
    await ledger.add_tag(tag, step=10, start=1)
    now = [100.0]
    marks = ReplicaNotAcknowledging(redis_pool)
    claims = LedgerClaims(ledger, marks, clock=lambda: now[0])  # type: ignore[arg-type]
    with pytest.raises(MarkNotReplicated, match="0 of 1 replicas") as caught:
        await claims.claim(tag)
    assert caught.value.wasted == IdRange(1, 11)  # claimed, unreplicated: never served
    assert claims.redis_skip.skipping() is None  # pops go on
    with pytest.raises(StoreSkipped, match="enough replicas"):
        await claims.claim(tag)  # not tried: nothing claimed, nothing wasted
    assert marks.raises == 1 and (await ledger.get_tag(tag)).max_id == 11
    now[0] += REDIS_SKIP_SECONDS
    with pytest.raises(MarkNotReplicated):
        await claims.claim(tag)  # tried again after the moment
    assert marks.raises == 2


class ReplicasGone(ReplicaNotAcknowledging):
    """No replica online: the mark read before a claim says a raise cannot count."""

    async def high_water_to_claim(self, tag: str) -> int:
        raise TooFewReplicas(0, 1, 0, "only 0 of 1 replicas online as the primary sees them")


async def test_no_claim_while_too_few_replicas_are_online(
    ledger: Ledger, redis_pool: RedisPool, tag: str
) -> None:
    # The replica gone (down, cut off): the mark's read before the claim says so,
    # and nothing is claimed, so nothing is wasted however long it lasts.
    await ledger.add_tag(tag, step=10, start=1)
    now = [100.0]
    marks = ReplicasGone(redis_pool)
    claims = LedgerClaims(ledger, marks, clock=lambda: now[0])  # type: ignore[arg-type]
    for _ in range(3):
        with pytest.raises(TooFewReplicas, match="0 of 1 replicas"):
            await claims.claim(tag)
        assert claims.redis_skip.skipping() is None  # pops go on
        with pytest.raises(StoreSkipped, match="enough replicas"):
            await claims.claim(tag)
        now[0] += REDIS_SKIP_SECONDS
    assert marks.raises == 0 and (await ledger.get_tag(tag)).max_id == 1


async def test_double_fault_redis_blip_then_mysql_rewind_repeats_nothing(
    ledger: Ledger, redis_pool: RedisPool, tag: str, settings: Settings
) -> None:
    # Issue 10, defect 1: a process whose Redis just failed went on claiming and
    # pushing into the shared list without raising the shared mark; MySQL then
    # went back in time and another process's claim passed the stale mark.
    await ledger.add_tag(tag, step=100, start=1)
    first = LedgerClaims(ledger, redis_pool)
    await first.claim(tag)  # [1, 101): the shared mark is 101
    preloader = Preloader(settings, ledger, redis_pool, first)
    first.redis_failed()  # a blip: this process skips Redis for a while
    await preloader.refill_tag(await ledger.get_tag(tag))
    served = [r for r in await redis_pool.ranges(tag)]  # what nodes will pop and serve
    rewind_ledger(tag, 101)  # failover to a replica that missed the refill's claim
    other = await LedgerClaims(ledger, redis_pool).claim(tag)
    for r in served:
        assert r.end <= other.range.start or other.range.end <= r.start, (r, other.range)


async def test_tag_names_compare_exactly_even_in_an_old_table(settings: Settings, tag: str) -> None:
    # With the database's case-insensitive collation, ORDERS found the row orders:
    # a node served it as a tag of its own, without orders's tokens or disabled flag.
    # A database of its own: the shared one may hold tags other tests made that
    # differ only in case, which the old collation's unique key would refuse.
    database = new_name("idpool_old_table_")
    ledger = await Ledger.connect(settings.with_changes(mysql_url=f"{MYSQL_SERVER}/{database}"))
    try:
        await _compare_exactly_in_an_old_table(ledger, database, tag)
    finally:
        await ledger.close()
        conn = pymysql.connect(host="127.0.0.1", user="root", autocommit=True)
        conn.cursor().execute(f"DROP DATABASE IF EXISTS `{database}`")
        conn.close()


async def _compare_exactly_in_an_old_table(ledger: Ledger, database: str, tag: str) -> None:
    conn = pymysql.connect(host="127.0.0.1", user="root", database=database, autocommit=True)
    conn.cursor().execute(
        f"ALTER TABLE {TABLE} MODIFY tag VARCHAR(64) "
        "CHARACTER SET utf8mb4 COLLATE utf8mb4_general_ci NOT NULL"
    )  # a table made before tag names compared exactly
    await ledger.ensure_schema()  # what every start does
    cursor = conn.cursor()
    cursor.execute(
        "SELECT COLLATION_NAME FROM information_schema.COLUMNS "
        "WHERE TABLE_SCHEMA = %s AND TABLE_NAME = %s AND COLUMN_NAME = 'tag'",
        (database, TABLE),
    )
    assert cursor.fetchone() == ("utf8mb4_bin",)
    conn.close()
    await ledger.add_tag(tag, step=10, start=1)
    with pytest.raises(UnknownTag):
        await ledger.get_tag(tag.upper())
    with pytest.raises(UnknownTag):
        await ledger.claim(tag.upper())
    await ledger.add_tag(tag.upper(), step=10, start=1)  # another tag, of its own


class MarksDown:
    """A pool whose Redis does not answer."""

    async def high_water(self, tag: str) -> int:
        raise StoreUnavailable("redis", "down")

    async def raise_high_water(self, tag: str, value: int) -> int:
        raise StoreUnavailable("redis", "down")

    async def fence_format(self, tag: str, fingerprint: str, *, serving: bool = False) -> str:
        raise StoreUnavailable("redis", "down")

    async def unfence_format(self, tag: str, fingerprint: str) -> None:
        raise StoreUnavailable("redis", "down")

    async def fence_state(self, tag: str, floor: int) -> int:
        raise StoreUnavailable("redis", "down")


async def test_a_formatted_tag_is_made_only_once_its_format_is_fenced(
    ledger: Ledger, redis_pool: RedisPool, tag: str
) -> None:
    from idpool.pool.claims import create_tag
    from idpool.pool.errors import FormatChanged, TagExists, UnknownTag

    options = '{"format": "F{id}", "reset": null, "obfuscate": true, "max": 1000}'
    with pytest.raises(StoreUnavailable, match="nothing was made"):
        await create_tag(
            ledger, MarksDown(), tag, step=10, start=1, options=options, secret="aa" * 16
        )
    with pytest.raises(UnknownTag):
        await ledger.get_tag(tag)
    plain = await create_tag(ledger, MarksDown(), tag + "p", step=10, start=1)  # as before
    assert plain.options == ""
    # A strict tag too: the state an earlier tag of the name left must be fenced first.
    with pytest.raises(StoreUnavailable, match="strict state is fenced.*nothing was made"):
        await create_tag(ledger, MarksDown(), tag + "s", step=10, start=1, rules=rules_of("strict"))
    with pytest.raises(UnknownTag):
        await ledger.get_tag(tag + "s")
    # A second add of a live name: tag_exists, and the first's fingerprint is kept.
    made = await create_tag(ledger, redis_pool, tag, step=10, start=1, options=options,
                            secret="aa" * 16)  # fmt: skip
    with pytest.raises(TagExists):
        await create_tag(ledger, redis_pool, tag, step=10, start=1, options=options,
                         secret="bb" * 16)  # fmt: skip
    with pytest.raises(TagExists):
        await create_tag(ledger, redis_pool, tag, step=10, start=1)
    assert await redis_pool.fence_format(tag, "") == "other"
    # A live plain name, never claimed, asked for with a format: tag_exists, and no
    # fingerprint is left behind to let the name come back formatted later.
    with pytest.raises(TagExists):
        await create_tag(ledger, redis_pool, tag + "p", step=10, start=1, options=options,
                         secret="cc" * 16)  # fmt: skip
    assert await redis_pool.fence_format(tag + "p", "") == "set"  # nothing was left: recorded now
    assert made.secret == "aa" * 16
    with pytest.raises(FormatChanged):  # plain numbers were claimed under the name
        await LedgerClaims(ledger, redis_pool).claim(tag + "p")
        await ledger.remove_tag(tag + "p")
        await create_tag(ledger, redis_pool, tag + "p", step=10, start=1, options=options,
                         secret="cc" * 16)  # fmt: skip


class ListsDown:
    """A pool whose lists do not answer."""

    async def take_all(self, tag: str) -> list[IdRange]:
        raise StoreUnavailable("redis", "down")


async def test_a_removal_whose_list_is_not_emptied_says_the_row_is_gone(
    ledger: Ledger, tag: str
) -> None:
    """remove_tag: the ledger first; a pool that then fails raises ListNotEmptied
    (the CLI says so and asks to run again), answered as the pool's own error."""
    from idpool.pool.claims import ListNotEmptied, remove_tag
    from idpool.pool.errors import UnknownTag

    await ledger.add_tag(tag, step=10, start=1)
    with pytest.raises(ListNotEmptied) as e:
        await remove_tag(ledger, ListsDown(), tag)  # type: ignore[arg-type]
    assert str(e.value) == str(e.value.error) == "redis unavailable: down"
    assert e.value.store == "redis" and e.value.row.tag == tag
    with pytest.raises(UnknownTag):  # removed all the same
        await ledger.get_tag(tag)
