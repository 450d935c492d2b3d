from __future__ import annotations

import asyncio
from collections.abc import Sequence
from pathlib import Path

import pymysql
import pytest
import redis

from idpool.pool.claims import Claim, LedgerClaims
from idpool.pool.errors import StoreUnavailable, TagDisabled, TagExhausted
from idpool.pool.ledger import TABLE, Ledger
from idpool.pool.ranges import IdRange
from idpool.pool.redis_pool import RedisPool
from idpool.pool.settings import Settings
from idpool.pool.sqlite_ledger import SqliteLedger
from idpool.pool.strict import RedisStrict, SqliteStrict, StrictCounter, StrictEvents
from idpool.pool.waste import Reason, WasteRecorder
from idpool.service.kinds import rules_of
from ops.toolkit import RedisServer

from .conftest import TEST_DATABASE

pytestmark = pytest.mark.anyio


class Recorded(StrictEvents):
    """The claims a sequence reports, and (as its waste recorder) every ID it gives
    up: (reason, IDs, the range or None when it is not known)."""

    def __init__(self) -> None:
        self.claims: list[tuple[IdRange, str]] = []
        self.waste: list[tuple[str, int, IdRange | None]] = []
        self.recorder = RecordedWaste(self.waste)

    def claimed(self, tag: str, claim: Claim, how: str) -> None:
        self.claims.append((claim.range, how))


class RecordedWaste(WasteRecorder):
    def __init__(self, into: list[tuple[str, int, IdRange | None]]) -> None:
        super().__init__()
        self.into = into

    def record(
        self,
        tag: str,
        ranges: Sequence[IdRange],
        reason: Reason,
        detail: str | None = None,
        raised_to: int | None = None,
    ) -> None:
        self.into.extend((reason.value, len(r), r) for r in ranges)
        super().record(tag, ranges, reason, detail, raised_to)

    def lost(self, tag: str, ids: int, reason: Reason) -> None:
        self.into.append((reason.value, ids, None))
        super().lost(tag, ids, reason)


def sequence(
    pool: RedisPool, ledger: Ledger, events: Recorded | None = None, step: int = 10
) -> StrictCounter:
    """A node's strict counter: its own claims (in-memory mark), the shared Redis."""
    return StrictCounter(
        RedisStrict(pool),
        LedgerClaims(ledger, pool),
        kind="strict", step_of=lambda tag: step,
        events=events,
        waste=None if events is None else events.recorder,
    )


def rewind_ledger(tag: str, max_id: int) -> None:
    conn = pymysql.connect(host="127.0.0.1", user="root", database=TEST_DATABASE, autocommit=True)
    conn.cursor().execute(f"UPDATE {TABLE} SET max_id = %s WHERE tag = %s", (max_id, tag))
    conn.close()


async def test_take_needs_a_state_of_this_incarnation(redis_pool: RedisPool, tag: str) -> None:
    strict = RedisStrict(redis_pool)
    empty = await strict.take(tag, 1)
    assert empty.first is None and empty.next is None and empty.left == 0
    info = await redis_pool.client.info("server")
    assert empty.incarnation.startswith(str(info["run_id"]) + ":")
    ext = await strict.extend(tag, empty.incarnation, IdRange(100, 110), 3)
    assert ext.how == "replaced" and ext.lost is None
    assert ext.answer.first == 100 and ext.answer.left == 7  # the take rode along
    assert (await strict.take(tag, 7)).first == 103
    short = await strict.take(tag, 1)
    assert short.first is None and short.next == short.limit == 110  # nothing taken
    state = await strict.state(tag)
    assert (state["next"], state["limit"], state["inc"]) == ("110", "110", empty.incarnation)


async def test_extension_rules(redis_pool: RedisPool, tag: str) -> None:
    strict = RedisStrict(redis_pool)
    inc = (await strict.take(tag, 1)).incarnation
    await strict.extend(tag, inc, IdRange(100, 110), 0)
    adjacent = await strict.extend(tag, inc, IdRange(110, 120), 0)
    assert adjacent.how == "extended" and adjacent.answer.limit == 120
    # another node extended first: a range below the limit would repeat IDs
    below = await strict.extend(tag, inc, IdRange(105, 115), 1)
    assert below.how == "refused" and below.answer.limit == 120
    assert below.answer.first == 100  # the take still happens, from the state as it is
    above = await strict.extend(tag, inc, IdRange(200, 210), 0)
    assert above.how == "jumped" and above.lost == IdRange(101, 120)
    assert (await strict.take(tag, 1)).first == 200
    # a claim made before a restart or failover never enters the new state
    moved = await strict.extend(tag, "0000:1111", IdRange(300, 310), 1)
    assert moved.how == "moved" and moved.answer.limit == 210 and moved.answer.first == 201


async def test_a_fenced_state_is_dropped_and_refuses_claims_below_its_floor(
    redis_pool: RedisPool, tag: str
) -> None:
    """A strict tag made again under a name (RedisPool.fence_state, before its row):
    the earlier tag's state is never taken from, and a refill an earlier tag's node
    claimed before the removal, landing only now, does not enter the new state."""
    strict = RedisStrict(redis_pool)
    inc = (await strict.take(tag, 1)).incarnation
    await strict.extend(tag, inc, IdRange(6, 1001), 0)  # the earlier life's state
    assert await redis_pool.fence_state(tag, 5000) == 5000
    assert await redis_pool.fence_state(tag, 10) == 5000  # never lowered
    assert (await strict.take(tag, 1)).first is None  # nothing served from the old state
    late = await strict.extend(tag, inc, IdRange(1001, 2001), 1)
    assert late.how == "fenced" and late.answer.first is None
    fresh = await strict.extend(tag, inc, IdRange(5000, 5010), 1)
    assert fresh.how == "replaced" and fresh.answer.first == 5000 and fresh.lost is None


async def test_a_state_of_an_older_incarnation_is_never_served(
    redis_pool: RedisPool, tag: str
) -> None:
    """What a snapshot or a lagging replica brings back: a state set under another
    run_id. Its IDs may have been handed out since; it is replaced, never taken from."""
    strict = RedisStrict(redis_pool)
    key = redis_pool.keys.strict(tag)
    await redis_pool.client.hset(key, mapping={"next": "5", "limit": "1000", "inc": "old:old"})
    answer = await strict.take(tag, 1)
    assert answer.first is None and answer.next is None
    ext = await strict.extend(tag, answer.incarnation, IdRange(2000, 2010), 1)
    assert ext.how == "replaced" and ext.lost == IdRange(5, 1000)
    assert ext.answer.first == 2000


async def test_numbers_past_2_pow_53_are_exact(redis_pool: RedisPool, tag: str) -> None:
    strict = RedisStrict(redis_pool)
    inc = (await strict.take(tag, 1)).incarnation
    base = 2**62 + 1  # a double cannot tell base from base + 1
    await strict.extend(tag, inc, IdRange(base, base + 1000), 0)
    firsts = [(await strict.take(tag, n)).first for n in (1, 9, 1, 989)]
    assert firsts == [base, base + 1, base + 10, base + 11]
    assert (await strict.take(tag, 1)).first is None
    assert (await strict.extend(tag, inc, IdRange(base + 999, base + 2000), 0)).how == "refused"
    top = 2**63 - 1  # the last ID; the end is one past it
    await strict.extend(tag, inc, IdRange(top - 5, top + 1), 0)
    assert (await strict.take(tag, 6)).first == top - 5


async def test_sequence_refills_from_the_ledger_and_increases(
    ledger: Ledger, redis_pool: RedisPool, tag: str
) -> None:
    await ledger.add_tag(tag, step=10, start=1, rules=rules_of("strict"))
    events = Recorded()
    seq = sequence(redis_pool, ledger, events)
    got = [await seq.take(tag, n) for n in (1, 3, 25, 1, 1)]
    assert got == sorted(got) and len(set(got)) == 5
    assert got[:3] == [1, 2, 5]
    assert events.claims[0] == (IdRange(1, 11), "replaced")
    assert await redis_pool.high_water(tag) >= 30  # every refill raised the mark first
    await seq.close()


async def test_two_nodes_concurrent_takes_never_repeat_and_follow_real_time(
    ledger: Ledger, redis_pool: RedisPool, tag: str
) -> None:
    await ledger.add_tag(tag, step=7, start=1, rules=rules_of("strict"))
    a, b = sequence(redis_pool, ledger, step=7), sequence(redis_pool, ledger, step=7)
    seen: list[int] = []
    # one caller at a time alternating between the nodes: real-time order across them
    for i in range(60):
        first = await (a if i % 2 else b).take(tag, 1 + i % 3)
        assert not seen or first > max(seen)
        seen.extend(range(first, first + 1 + i % 3))
    # concurrent callers on both nodes: no ID twice
    many: list[int] = []

    async def burst(seq: StrictCounter, n: int) -> None:
        for _ in range(30):
            first = await seq.take(tag, n)
            many.extend(range(first, first + n))

    await asyncio.gather(*(burst(s, n) for s in (a, b) for n in (1, 2, 5)))
    assert len(many) == len(set(many)) and min(many) > max(seen)
    await a.close()
    await b.close()


async def test_a_lost_take_is_waste_and_never_retried(
    ledger: Ledger, redis_pool: RedisPool, tag: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    await ledger.add_tag(tag, step=10, start=1, rules=rules_of("strict"))
    events = Recorded()
    seq = sequence(redis_pool, ledger, events)
    assert await seq.take(tag, 1) == 1
    calls = []

    async def lost(tag: str, n: int, *args: object) -> None:
        calls.append(n)
        raise StoreUnavailable("redis", "Timeout reading from socket")

    monkeypatch.setattr(seq.store, "take", lost)
    with pytest.raises(StoreUnavailable):
        await seq.take(tag, 4)
    assert calls == [4]  # one call: the IDs it may have taken are given up
    assert events.waste == [("strict_take_outcome_unknown", 4, None)]


async def test_a_lost_extension_wastes_its_claim(
    ledger: Ledger, redis_pool: RedisPool, tag: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    await ledger.add_tag(tag, step=10, start=1, rules=rules_of("strict"))
    events = Recorded()
    seq = sequence(redis_pool, ledger, events)

    async def lost(*args: object) -> None:
        raise StoreUnavailable("redis", "Connection reset by peer")

    monkeypatch.setattr(seq.store, "extend", lost)
    with pytest.raises(StoreUnavailable):
        await seq.take(tag, 2)
    assert ("strict_extend_outcome_unknown", 10, IdRange(1, 11)) in events.waste
    monkeypatch.undo()
    assert await seq.take(tag, 1) == 11  # the next refill claims above it


async def test_a_redis_restart_that_lost_everything_starts_above_all_issued(
    redis_server: RedisServer, ledger: Ledger, settings: Settings, tag: str
) -> None:
    await ledger.add_tag(tag, step=10, start=1, rules=rules_of("strict"))
    s = settings.with_changes(redis_url=redis_server.url)
    pool = RedisPool.from_settings(s)
    seq = sequence(pool, ledger)
    issued = [await seq.take(tag, 3) for _ in range(5)]
    redis_server.kill9()
    for path in redis_server.dir.glob("appendonly*"):  # came back empty
        if path.is_dir():
            for f in path.iterdir():
                f.unlink()
    redis_server.start()
    await pool.close()
    pool = RedisPool.from_settings(s)
    after = await sequence(pool, ledger).take(tag, 1)  # a fresh node too
    assert after > max(issued) + 2
    await pool.close()


async def test_a_restored_snapshot_never_takes_again(
    tmp_path: Path, ledger: Ledger, settings: Settings, tag: str
) -> None:
    """The snapshot's state still reads [next, limit) of IDs handed out since."""
    server = RedisServer(tmp_path / "rdb", "--save", "", "--appendonly", "no").start()
    try:
        await ledger.add_tag(tag, step=100, start=1, rules=rules_of("strict"))
        s = settings.with_changes(redis_url=server.url)
        pool = RedisPool.from_settings(s)
        seq = sequence(pool, ledger, step=100)
        assert await seq.take(tag, 1) == 1
        redis.Redis.from_url(server.url).save()  # the snapshot: next=2, limit=101
        handed = [await seq.take(tag, 1) for _ in range(5)]
        server.kill9()
        server.start()
        await pool.close()
        pool = RedisPool.from_settings(s)
        assert (await pool.client.hget(pool.keys.strict(tag), "next")) == "2"  # the hazard
        events = Recorded()
        first = await sequence(pool, ledger, events, step=100).take(tag, 1)
        assert first > max(handed)
        assert events.claims[0][1] == "replaced"
        await pool.close()
    finally:
        server.kill9()


async def test_mysql_gone_back_is_refused_by_the_mark(
    ledger: Ledger, redis_pool: RedisPool, tag: str
) -> None:
    await ledger.add_tag(tag, step=10, start=1, rules=rules_of("strict"))
    events = Recorded()
    seq = sequence(redis_pool, ledger, events)
    handed = [await seq.take(tag, 10) for _ in range(3)]
    rewind_ledger(tag, 1)  # a failover to a lagging replica
    fresh = sequence(redis_pool, ledger, events)  # a node with no memory of it
    await redis_pool.client.delete(redis_pool.keys.strict(tag))  # and a state to refill
    first = await fresh.take(tag, 1)
    assert first > max(handed) + 9


async def test_a_node_that_only_took_remembers_the_state_limit_as_its_mark(
    ledger: Ledger, redis_pool: RedisPool, tag: str
) -> None:
    """Two faults at once (Redis lost the state and the mark, MySQL went back): the
    only fence left is the mark in the nodes' memory. A node that never refilled
    but took from the state has seen its limit, and must refuse what it covers."""
    await ledger.add_tag(tag, step=10, start=1, rules=rules_of("strict"))
    a, b = sequence(redis_pool, ledger), sequence(redis_pool, ledger)
    handed = [await a.take(tag, 1), await b.take(tag, 1)]  # a claimed [1, 11); b only took
    assert handed == [1, 2]
    await redis_pool.client.delete(redis_pool.keys.strict(tag), redis_pool.keys.hwm(tag))
    rewind_ledger(tag, 1)
    assert await b.take(tag, 1) > max(handed)  # b refills: [1, 11) must be refused
    await a.close()
    await b.close()


async def test_refills_are_prefetched_before_the_state_runs_out(
    ledger: Ledger, redis_pool: RedisPool, tag: str
) -> None:
    await ledger.add_tag(tag, step=10, start=1, rules=rules_of("strict"))
    events = Recorded()
    seq = sequence(redis_pool, ledger, events)
    await seq.take(tag, 6)  # the first refill: one step
    await seq.take(tag, 1)  # 3 left of 10: under half
    await asyncio.wait(list(seq._refills.values()))
    assert [how for _, how in events.claims] == ["replaced", "extended"]
    assert (await RedisStrict(redis_pool).take(tag, 0)).left > 3
    await seq.close()


async def test_embedded_strict_takes_are_one_transaction_each(sqlite_settings: Settings) -> None:
    ledger = await SqliteLedger.connect(sqlite_settings)
    try:
        await ledger.add_tag("s", step=1000, start=5, end_id=40, rules=rules_of("strict"))
        await ledger.add_tag("off", step=10, start=1, rules=rules_of("strict"))
        await ledger.set_disabled("off", True)
        strict = SqliteStrict(ledger.file, "strict")
        sizes = (1, 2, 3, 4)
        got = await asyncio.gather(*(strict.take("s", n) for n in sizes))
        ids = [i for first, n in zip(got, sizes, strict=True) for i in range(first, first + n)]
        assert sorted(ids) == list(range(5, 15))  # disjoint, consecutive per take
        assert (await ledger.get_tag("s")).max_id == 15
        with pytest.raises(TagExhausted):
            await strict.take("s", 30)  # 25 left: all or nothing
        assert await strict.take("s", 25) == 15
        with pytest.raises(TagDisabled):
            await strict.take("off", 1)
    finally:
        await ledger.close()


async def test_one_refill_at_a_time_for_the_cluster(redis_pool: RedisPool, tag: str) -> None:
    strict = RedisStrict(redis_pool)
    first = await strict.take(tag, 1, grant_ms=60_000)
    assert first.first is None and first.granted
    other = await strict.take(tag, 1, grant_ms=60_000)
    assert other.first is None and not other.granted  # another node refills: wait
    ext = await strict.extend(tag, first.incarnation, IdRange(1, 101), 0)
    assert ext.how == "replaced"
    low = await strict.take(tag, 10, low=95)  # 90 left, under the low-water mark
    assert low.first == 1 and low.granted
    assert not (await strict.take(tag, 10, low=95)).granted  # granted once
    assert not (await strict.take(tag, 10, low=10)).granted  # plenty left


async def test_a_refill_claims_what_the_tag_uses_in_hold_seconds(
    ledger: Ledger, redis_pool: RedisPool, tag: str
) -> None:
    await ledger.add_tag(tag, step=10, start=1, rules=rules_of("strict"))
    events = Recorded()
    seq = StrictCounter(
        RedisStrict(redis_pool),
        LedgerClaims(ledger, redis_pool),
        kind="strict", step_of=lambda t: 10,
        hold_seconds=1.0,
        events=events,
        waste=events.recorder,
    )
    for _ in range(300):
        await seq.take(tag, 20)
        await asyncio.sleep(0.005)
    await seq.close()
    sizes = [len(r) for r, _ in events.claims]
    # the batch first (two steps); the next ones sized by the rate measured over a second at
    # least (no burst read as a rate); then about a second of it (hold_seconds)
    assert sizes[0] == 20 and max(sizes[:2]) <= 1000 and max(sizes) > 500, str(sizes)
    assert [how for _, how in events.claims[1:]] == ["extended"] * (len(sizes) - 1)
    assert not events.waste


async def test_ids_from_a_server_the_sentinels_left_are_never_answered(
    ledger: Ledger, redis_pool: RedisPool, tag: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    await ledger.add_tag(tag, step=10, start=1, rules=rules_of("strict"))
    events = Recorded()
    seq = sequence(redis_pool, ledger, events)
    assert await seq.take(tag, 1) == 1

    async def not_the_master(incarnation: str) -> bool:
        return False

    monkeypatch.setattr(seq.store, "from_master", not_the_master)
    with pytest.raises(StoreUnavailable, match="not the master most Sentinels name"):
        await seq.take(tag, 3)
    assert ("strict_not_master", 3, None) in events.waste
    monkeypatch.undo()
    assert await seq.take(tag, 1) == 5  # 2-4 were taken there: given up, never served
    await seq.close()


async def test_a_promoted_replica_serves_only_claims_made_after_the_sentinels_named_it(
    tmp_path: Path, ledger: Ledger, redis_pool: RedisPool, settings: Settings, tag: str
) -> None:
    """During a failover two masters take writes: the old one (most Sentinels still
    name it) and the promoted replica (the leader Sentinel already names it, so a
    node can reach it). A refill on the replica then must not claim: the old master
    may still claim above that claim and answer its IDs, and once the Sentinels
    switch, the replica's state would answer IDs below them."""
    await ledger.add_tag(tag, step=10, start=1, rules=rules_of("strict"))
    server = RedisServer(tmp_path / "promoted", "--save", "", "--appendonly", "no").start()
    promoted = RedisPool.from_settings(settings.with_changes(redis_url=server.url))
    try:
        named = {"master": "old"}
        on_old, on_promoted = sequence(redis_pool, ledger), sequence(promoted, ledger)

        def majority(which: str) -> object:
            async def from_master(incarnation: str) -> bool:
                return named["master"] == which

            return from_master

        monkeypatch = pytest.MonkeyPatch()
        monkeypatch.setattr(on_old.store, "from_master", majority("old"))
        monkeypatch.setattr(on_promoted.store, "from_master", majority("promoted"))
        assert await on_old.take(tag, 1) == 1  # the old master's state: [1, 11)
        with pytest.raises(StoreUnavailable):  # not named yet: refused (maybe after a claim)
            await on_promoted.take(tag, 1)
        answered = await on_old.take(tag, 10)  # the old master refills, still named
        answered_last = answered + 9
        named["master"] = "promoted"  # the Sentinels switch; the old master is left
        after = await on_promoted.take(tag, 1)  # a request sent after `answered` arrived
        assert after > answered_last
        monkeypatch.undo()
        await on_old.close()
        await on_promoted.close()
    finally:
        await promoted.close()
        server.kill9()


async def test_a_refill_covers_the_batch_whatever_others_took_meanwhile(
    ledger: Ledger, redis_pool: RedisPool, tag: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The refill sized its claim by what the state held when it looked; other
    nodes taking before the extension landed left it short of the batch, again
    and again under load, until the take gave up (503) with IDs in plenty."""
    await ledger.add_tag(tag, step=10, start=1, rules=rules_of("strict"))
    a, b = sequence(redis_pool, ledger), sequence(redis_pool, ledger)
    assert await a.take(tag, 1) == 1  # the state: [2, 11)
    extend = a.store.extend

    async def others_take_first(tag_: str, seen: str, claimed: IdRange, n: int) -> object:
        state = await a.store.state(tag)
        if int(state["limit"]) > int(state["next"]):  # another node empties the state
            await b.take(tag, int(state["limit"]) - int(state["next"]))
        return await extend(tag_, seen, claimed, n)

    monkeypatch.setattr(a.store, "extend", others_take_first)
    first = await a.take(tag, 99)  # a batch larger than a refill claims unasked
    assert first >= 11
    await a.close()
    await b.close()


async def test_a_refill_that_fails_gives_its_grant_back(
    ledger: Ledger, redis_pool: RedisPool, tag: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A master restarted within Sentinel's down-after (no failover): its run_id is
    new and the Sentinels name the old one until they re-read its INFO. The node
    granted the refill was refused (nothing claimed) but kept the grant: every
    other node then waited for it to expire (4 s) on top. Now it gives it back."""
    await ledger.add_tag(tag, step=10, start=1, rules=rules_of("strict"))
    a = StrictCounter(
        RedisStrict(redis_pool), LedgerClaims(ledger, redis_pool), kind="strict",
        step_of=lambda t: 10, grant_seconds=600.0,
    )  # fmt: skip
    b = StrictCounter(
        RedisStrict(redis_pool), LedgerClaims(ledger, redis_pool), kind="strict",
        step_of=lambda t: 10, grant_seconds=600.0,
    )  # fmt: skip

    async def not_yet_named(incarnation: str) -> bool:
        return False

    monkeypatch.setattr(a.store, "from_master", not_yet_named)
    with pytest.raises(StoreUnavailable, match="nothing claimed"):
        await a.take(tag, 1)  # granted the refill, refused before claiming
    state = await b.store.state(tag)
    assert "refill_by" not in state  # given back: not held for its 600 s
    assert await b.take(tag, 1) == 1  # another node refills at once
    await a.close()
    await b.close()
