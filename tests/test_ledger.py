from __future__ import annotations

import asyncio
import multiprocessing
from collections.abc import AsyncIterator

import pymysql
import pytest

from idpool.pool.errors import (
    KindKept,
    StoreUnavailable,
    TagDisabled,
    TagExhausted,
    TagExists,
    UnknownTag,
)
from idpool.pool.ledger import Ledger
from idpool.pool.ranges import MAX_ID, IdRange
from idpool.pool.settings import Settings
from idpool.pool.stores import LedgerStore, open_ledger
from idpool.service.kinds import rules_of

from .conftest import MYSQL_SERVER, new_name

pytestmark = pytest.mark.anyio


# Every test taking `ledger` runs against both ledgers: the MySQL one (on the
# machine's MariaDB) and the embedded one (a SQLite file): same row semantics.
@pytest.fixture(params=["mariadb", "sqlite"])
def ledger_settings(
    request: pytest.FixtureRequest, settings: Settings, sqlite_settings: Settings
) -> Settings:
    return settings if request.param == "mariadb" else sqlite_settings


@pytest.fixture
async def ledger(ledger_settings: Settings) -> AsyncIterator[LedgerStore]:
    led = await open_ledger(ledger_settings)
    yield led
    await led.close()


async def test_claims_are_consecutive_and_read_back(ledger: LedgerStore, tag: str) -> None:
    row = await ledger.add_tag(tag, step=100, start=1000)
    assert (row.max_id, row.step, row.start_id) == (1000, 100, 1000)
    assert await ledger.claim(tag) == IdRange(1000, 1100)
    assert await ledger.claim(tag, 3) == IdRange(1100, 1400)
    assert (await ledger.get_tag(tag)).max_id == 1400


async def test_unknown_tag(ledger: LedgerStore) -> None:
    with pytest.raises(UnknownTag):
        await ledger.claim(new_name("nosuch"))
    with pytest.raises(UnknownTag):
        await ledger.get_tag(new_name("nosuch"))


async def test_concurrent_claims_in_one_process_never_overlap(
    ledger: LedgerStore, tag: str
) -> None:
    await ledger.add_tag(tag, step=10, start=1)
    ranges = await asyncio.gather(*(ledger.claim(tag) for _ in range(200)))
    ids = [i for r in ranges for i in range(r.start, r.end)]
    assert len(ids) == len(set(ids)) == 2000
    assert sorted(ids) == list(range(1, 2001))


def _claim_many(url: str, tag: str, n: int, out: multiprocessing.Queue) -> None:  # type: ignore[type-arg]
    async def go() -> list[tuple[int, int]]:
        led = await open_ledger(Settings(mysql_url=url))
        try:
            got = []
            for _ in range(n):
                r = await led.claim(tag)
                got.append((r.start, r.end))
            return got
        finally:
            await led.close()

    out.put(asyncio.run(go()))


async def test_claims_from_many_processes_never_overlap(
    ledger: LedgerStore, ledger_settings: Settings, tag: str
) -> None:
    await ledger.add_tag(tag, step=7, start=1)
    ctx = multiprocessing.get_context("spawn")
    out = ctx.Queue()
    url = ledger_settings.mysql_url
    procs = [ctx.Process(target=_claim_many, args=(url, tag, 150, out)) for _ in range(4)]
    for p in procs:
        p.start()
    results = [out.get(timeout=60) for _ in procs]
    for p in procs:
        p.join(10)
    ids = [i for got in results for (s, e) in got for i in range(s, e)]
    assert len(ids) == len(set(ids)) == 4 * 150 * 7
    assert sorted(ids) == list(range(1, 4 * 150 * 7 + 1))


async def test_max_id_never_decreases(ledger: LedgerStore, tag: str) -> None:
    await ledger.add_tag(tag, step=50, start=1)
    await ledger.claim(tag, 2)
    assert await ledger.raise_floor(tag, 10) == 101  # lower floor: unchanged
    assert await ledger.raise_floor(tag, 5000) == 5000
    with pytest.raises(TagExists):
        await ledger.add_tag(tag, step=50, start=1)  # re-creating cannot reset it
    assert (await ledger.get_tag(tag)).max_id == 5000
    await ledger.set_step(tag, 10)
    assert await ledger.claim(tag) == IdRange(5000, 5010)


async def test_add_tag_starts_above_a_known_high_water_mark(ledger: LedgerStore, tag: str) -> None:
    row = await ledger.add_tag(tag, step=10, start=1, floor=777)
    assert row.max_id == 777
    assert await ledger.claim(tag) == IdRange(777, 787)


async def test_adapt_step_stays_within_the_tags_bounds(ledger: LedgerStore, tag: str) -> None:
    await ledger.add_tag(tag, step=100, start=1, min_step=50, max_step=400)
    assert await ledger.adapt_step(tag, 200) == 200
    assert await ledger.adapt_step(tag, 10_000) == 400
    assert await ledger.adapt_step(tag, 1) == 50
    assert await ledger.claim(tag) == IdRange(1, 51)
    row = await ledger.set_step(tag, 1000)  # an operator's step moves both bounds up
    assert (row.step, row.min_step, row.max_step) == (1000, 1000, 1000)
    assert await ledger.adapt_step(tag, 10) == 1000


async def test_every_change_to_an_unknown_tag_is_refused(ledger: LedgerStore) -> None:
    name = new_name("nosuch")
    for change in (
        ledger.raise_floor(name, 10),
        ledger.adapt_step(name, 10),
        ledger.set_step(name, 10),
        ledger.claim(name, 3),
    ):
        with pytest.raises(UnknownTag):
            await change
    assert name not in [row.tag for row in await ledger.list_tags()]


async def test_a_tag_never_claims_past_64_bits(ledger: LedgerStore, tag: str) -> None:
    await ledger.add_tag(tag, step=10, start=MAX_ID - 25)
    assert await ledger.claim(tag) == IdRange(MAX_ID - 25, MAX_ID - 15)
    assert await ledger.claim(tag) == IdRange(MAX_ID - 15, MAX_ID - 5)
    assert await ledger.claim(tag) == IdRange(MAX_ID - 5, MAX_ID)  # cut short at 2^63 - 2
    with pytest.raises(TagExhausted, match="run out of 64-bit IDs"):
        await ledger.claim(tag)
    assert (await ledger.get_tag(tag)).max_id == MAX_ID


JS_MAX = 2**53 - 1  # Number.MAX_SAFE_INTEGER


async def test_a_bounded_tag_never_claims_past_its_max(ledger: LedgerStore, tag: str) -> None:
    row = await ledger.add_tag(tag, step=10, start=JS_MAX - 24, end_id=JS_MAX + 1)
    assert (row.max, row.left) == (JS_MAX, 25)
    assert await ledger.claim(tag) == IdRange(JS_MAX - 24, JS_MAX - 14)
    # the last claim is cut short at the bound, however many ranges were asked for
    assert await ledger.claim(tag, 3) == IdRange(JS_MAX - 14, JS_MAX + 1)
    for _ in range(2):
        with pytest.raises(TagExhausted, match=f"IDs up to its max {JS_MAX}"):
            await ledger.claim(tag)
    row = await ledger.get_tag(tag)
    assert (row.max_id, row.max, row.left) == (JS_MAX + 1, JS_MAX, 0)


async def test_concurrent_claims_stop_exactly_at_the_bound(ledger: LedgerStore, tag: str) -> None:
    await ledger.add_tag(tag, step=7, start=1, end_id=1001)

    at_once = asyncio.Semaphore(16)  # concurrent, yet each within the store timeout (fsyncs)

    async def claim() -> IdRange | None:
        async with at_once:
            try:
                return await ledger.claim(tag)
            except TagExhausted:
                return None

    got = [r for r in await asyncio.gather(*(claim() for _ in range(200))) if r is not None]
    ids = sorted(i for r in got for i in range(r.start, r.end))
    assert ids == list(range(1, 1001))  # every ID up to the max once, none above


async def test_a_bound_must_leave_the_first_id(ledger: LedgerStore, tag: str) -> None:
    with pytest.raises(ValueError, match="max must be"):
        await ledger.add_tag(tag, step=10, start=100, end_id=100)
    with pytest.raises(UnknownTag):
        await ledger.get_tag(tag)


async def test_a_disabled_tag_claims_nothing_and_keeps_its_mark(
    ledger: LedgerStore, tag: str
) -> None:
    await ledger.add_tag(tag, step=10, start=1)
    await ledger.claim(tag)
    row = await ledger.set_disabled(tag, True)
    assert (row.disabled, row.max_id) == (True, 11)
    with pytest.raises(TagDisabled, match="idpool tag enable"):
        await ledger.claim(tag)
    assert [r.disabled for r in await ledger.list_tags([tag])] == [True]
    row = await ledger.set_disabled(tag, False)
    assert (row.disabled, row.max_id) == (False, 11)
    assert await ledger.claim(tag) == IdRange(11, 21)  # above everything issued


async def test_rows_are_listed_in_tag_order(ledger: LedgerStore, tag: str) -> None:
    await ledger.add_tag(tag + "b", step=5, start=9, description="second")
    await ledger.add_tag(tag + "a", step=7, start=3)
    rows = [row for row in await ledger.list_tags() if row.tag.startswith(tag)]
    assert [(r.tag, r.max_id, r.step, r.start_id, r.description) for r in rows] == [
        (tag + "a", 3, 7, 3, ""),
        (tag + "b", 9, 5, 9, "second"),
    ]


async def test_creates_missing_database(settings: Settings) -> None:
    db = new_name("idpool_new_")
    url = f"{MYSQL_SERVER}/{db}"
    led = await Ledger.connect(settings.with_changes(mysql_url=url))
    try:
        await led.add_tag("x", step=1, start=1)
        assert await led.claim("x") == IdRange(1, 2)
    finally:
        await led.close()
        import pymysql

        conn = pymysql.connect(host="127.0.0.1", user="root", autocommit=True)
        conn.cursor().execute(f"DROP DATABASE `{db}`")
        conn.close()


async def test_a_database_from_before_removals_adds_tags_and_refuses_a_removal(
    settings: Settings, tag: str
) -> None:
    import pymysql

    db = new_name("idpool_old_")
    url = f"{MYSQL_SERVER}/{db}"
    conn = pymysql.connect(host="127.0.0.1", user="root", autocommit=True)
    try:
        await (await Ledger.connect(settings.with_changes(mysql_url=url))).close()  # makes it
        conn.cursor().execute(f"DROP TABLE `{db}`.idpool_removed_tags")  # as an old release made it
        led = await Ledger.connect(settings.with_changes(mysql_url=url, create_database=False))
        try:
            assert (await led.add_tag(tag, step=10, start=5)).max_id == 5
            with pytest.raises(StoreUnavailable, match="IDPOOL_CREATE_DATABASE=1"):
                await led.remove_tag(tag)
            assert await led.claim(tag) == IdRange(5, 15)  # nothing was removed
        finally:
            await led.close()
    finally:
        conn.cursor().execute(f"DROP DATABASE IF EXISTS `{db}`")
        conn.close()


async def test_missing_database_without_permission_to_create(settings: Settings) -> None:
    url = f"{MYSQL_SERVER}/{new_name('idpool_absent_')}"
    with pytest.raises(StoreUnavailable, match="IDPOOL_MYSQL_URL"):
        await Ledger.connect(settings.with_changes(mysql_url=url, create_database=False))


async def test_unreachable_mysql_names_the_variable(settings: Settings) -> None:
    from ops.toolkit import free_port

    url = f"mysql://root@127.0.0.1:{free_port()}/idpool"
    with pytest.raises(StoreUnavailable, match="IDPOOL_MYSQL_URL") as info:
        await Ledger.connect(settings.with_changes(mysql_url=url))
    assert info.value.store == "mysql"


_OLD_MYSQL_TABLE = """
CREATE TABLE idpool_tags (
    tag VARCHAR(64) NOT NULL PRIMARY KEY, max_id BIGINT NOT NULL, step INT NOT NULL,
    min_step INT NOT NULL, max_step INT NOT NULL, start_id BIGINT NOT NULL,
    description VARCHAR(255) NOT NULL DEFAULT '',
    created_at TIMESTAMP(3) NOT NULL DEFAULT CURRENT_TIMESTAMP(3),
    updated_at TIMESTAMP(3) NOT NULL DEFAULT CURRENT_TIMESTAMP(3)
)
"""


async def test_a_table_from_before_bounds_is_migrated_in_place(settings: Settings) -> None:
    import pymysql

    db = new_name("idpool_old_")
    conn = pymysql.connect(host="127.0.0.1", user="root", autocommit=True)
    cur = conn.cursor()
    cur.execute(f"CREATE DATABASE `{db}`")
    cur.execute(f"USE `{db}`")
    cur.execute(_OLD_MYSQL_TABLE)
    cur.execute("INSERT INTO idpool_tags VALUES ('old', 501, 100, 100, 1000, 1, 'x', NOW(), NOW())")
    try:
        for i in range(2):  # a second start finds the columns there
            led = await Ledger.connect(settings.with_changes(mysql_url=f"{MYSQL_SERVER}/{db}"))
            try:
                row = await led.get_tag("old")
                start = 501 + 100 * i
                assert (row.max_id, row.max, row.disabled, row.description) == (
                    start,
                    None,
                    False,
                    "x",
                )
                assert await led.claim("old") == IdRange(start, start + 100)
                assert row.kind == "segment"  # the kind column, added in place
            finally:
                await led.close()
    finally:
        cur.execute(f"DROP DATABASE `{db}`")
        conn.close()


async def test_a_sqlite_file_from_before_bounds_is_migrated_in_place(
    sqlite_settings: Settings,
) -> None:
    import sqlite3

    path = sqlite_settings.sqlite_path()
    assert path is not None
    conn = sqlite3.connect(path)
    conn.execute(
        "CREATE TABLE idpool_tags (tag TEXT NOT NULL PRIMARY KEY, max_id INTEGER NOT NULL, "
        "step INTEGER NOT NULL, min_step INTEGER NOT NULL, max_step INTEGER NOT NULL, "
        "start_id INTEGER NOT NULL, description TEXT NOT NULL DEFAULT '', "
        "created_at REAL NOT NULL, updated_at REAL NOT NULL)"
    )
    conn.execute("INSERT INTO idpool_tags VALUES ('old', 501, 100, 100, 1000, 1, 'x', 0, 0)")
    conn.commit()
    conn.close()
    for i in range(2):
        led = await open_ledger(sqlite_settings)
        try:
            row = await led.get_tag("old")
            start = 501 + 100 * i
            assert (row.max_id, row.max, row.disabled) == (start, None, False)
            assert await led.claim("old") == IdRange(start, start + 100)
            assert row.kind == "segment"  # the kind column, added in place
        finally:
            await led.close()


async def test_tokens_are_stored_hashed_listed_and_revoked(ledger: LedgerStore, tag: str) -> None:
    from idpool.pool.tokens import hash_token, matches, new_token

    await ledger.add_tag(tag, step=10, start=1)
    token_id, token = new_token()
    row = await ledger.add_token(tag, token_id, hash_token(token))
    assert (row.tag, row.token_id, row.token_hash) == (tag, token_id, hash_token(token))
    other_id, other = new_token()
    await ledger.add_token(tag, other_id, hash_token(other))
    mine = await ledger.list_tokens(tag)
    assert {t.token_id for t in mine} == {token_id, other_id}
    assert all(token not in repr(t) for t in mine)  # only the hash is kept
    assert matches(token, [t.token_hash for t in mine])
    assert not matches(token + "x", [t.token_hash for t in mine])
    assert {t.token_id for t in await ledger.list_tokens() if t.tag == tag} == {token_id, other_id}
    assert await ledger.revoke_token(tag, token_id) is True
    assert await ledger.revoke_token(tag, token_id) is False
    assert [t.token_id for t in await ledger.list_tokens(tag)] == [other_id]
    with pytest.raises(UnknownTag):
        await ledger.add_token(tag + "nope", "abcd", hash_token("x"))


async def test_reconnects_when_the_server_behind_the_address_changes(
    settings: Settings, tag: str
) -> None:
    """A virtual IP or proxy moved to a promoted replica drops every connection;
    the next claim opens a new one instead of failing on an old one, forever."""
    from ops.toolkit import TcpProxy

    from .conftest import TEST_DATABASE

    server_port = int(MYSQL_SERVER.rsplit(":", 1)[1])
    proxy = TcpProxy(server_port)
    url = f"mysql://root@127.0.0.1:{proxy.port}/{TEST_DATABASE}"
    led = await Ledger.connect(settings.with_changes(mysql_url=url))
    try:
        await led.add_tag(tag, step=10, start=1)
        await asyncio.gather(*(led.claim(tag) for _ in range(4)))  # several idle connections
        for _ in range(3):
            proxy.retarget(server_port)  # every connection cut, as by a failover
            await asyncio.sleep(0.1)
            before = (await led.get_tag(tag)).max_id
            assert await led.claim(tag) == IdRange(before, before + 10)
        proxy.cut()
        with pytest.raises(StoreUnavailable):
            await led.claim(tag)
        proxy.restore()
        assert (await led.claim(tag)).start > before
    finally:
        await led.close()
        proxy.close()


async def test_a_removed_tag_is_unknown_and_its_name_starts_above_all_it_issued(
    ledger: LedgerStore, tag: str
) -> None:
    await ledger.add_tag(tag, step=100, start=1)
    await ledger.claim(tag, 5)  # 1..500 issued
    await ledger.add_token(tag, "tok1", "0" * 64)
    removed = await ledger.remove_tag(tag)
    assert removed.max_id == 501
    for call in (ledger.get_tag(tag), ledger.claim(tag), ledger.remove_tag(tag)):
        with pytest.raises(UnknownTag):
            await call
    assert tag not in [row.tag for row in await ledger.list_tags()]
    assert await ledger.list_tokens(tag) == []  # tokens dropped with the row
    # Added again with no floor at all (Redis lost its high-water mark): the
    # tombstone still starts it above every ID the old tag issued.
    again = await ledger.add_tag(tag, step=10, start=1, floor=0)
    assert again.max_id == 501 and again.start_id == 1
    assert await ledger.claim(tag) == IdRange(501, 511)
    # Removed a second time, the tombstone only moves up.
    assert (await ledger.remove_tag(tag)).max_id == 511
    assert (await ledger.add_tag(tag, step=10, start=1)).max_id == 511


async def test_a_removed_name_keeps_its_kind(ledger: LedgerStore, tag: str) -> None:
    """The tombstone keeps the kind: a stale node may still serve the old tag's
    buffer, so the name may come back only as what it was (KindKept, nothing added)."""
    await ledger.add_tag(tag, step=10, start=1)
    await ledger.claim(tag)
    await ledger.remove_tag(tag)
    with pytest.raises(KindKept):
        await ledger.add_tag(tag, step=10, start=1, rules=rules_of("strict"))
    with pytest.raises(UnknownTag):
        await ledger.get_tag(tag)
    assert (await ledger.add_tag(tag, step=10, start=1)).max_id == 11


async def test_first_made_is_the_rows_creation_unless_the_name_lived_before(
    ledger: LedgerStore, tag: str
) -> None:
    import time

    before = time.time()
    await ledger.add_tag(tag, step=10, start=1)
    made = await ledger.first_made(tag)
    assert made is not None and before - 2 <= made <= time.time() + 2
    await ledger.remove_tag(tag)
    assert await ledger.first_made(tag) is None  # no row
    await ledger.add_tag(tag, step=10, start=1)
    assert await ledger.first_made(tag) is None  # its tombstone: older IDs exist


async def test_removing_one_tag_leaves_the_others(ledger: LedgerStore, tag: str) -> None:
    other = tag + "o"
    await ledger.add_tag(tag, step=10, start=1)
    await ledger.add_tag(other, step=10, start=1)
    await ledger.remove_tag(tag)
    assert await ledger.claim(other) == IdRange(1, 11)
    assert (await ledger.add_tag(tag + "x", step=10, start=1)).max_id == 1  # no prefix match


async def test_a_moved_start_is_the_rows_start(ledger: LedgerStore, tag: str) -> None:
    await ledger.add_tag(tag, step=10, start=1)
    assert await ledger.raise_floor(tag, 7000, start=True) == 7000
    assert (await ledger.get_tag(tag)).start_id == 7000
    await ledger.raise_floor(tag, 9000)  # a fence raise is not an operator's start
    assert (await ledger.get_tag(tag)).start_id == 7000
async def test_plain_mariadb_is_not_taken_for_galera(settings: Settings) -> None:
    """wsrep_sync_wait is set only on a Galera member (wsrep_on): the shared server
    is a plain MariaDB, whose sessions are left as they are."""
    ledger = await Ledger.connect(settings)
    try:
        assert ledger.galera is False
        assert not ledger.retries
    finally:
        await ledger.close()


class _Conflicting:
    """A pool whose connections lose certification (error 1213) ``losses`` times,
    then answer: a Galera member catching up after a freeze (issue 28, item 12)."""

    def __init__(self, losses: int) -> None:
        self.losses = losses
        self.tries = 0
        self.rollbacks = 0

    async def acquire(self) -> _Conflicting:
        return self

    def release(self, conn: object) -> None:
        pass

    async def begin(self) -> None:
        pass

    async def rollback(self) -> None:
        self.rollbacks += 1

    def close(self) -> None:
        raise AssertionError("a connection after a conflict is sound: never closed")

    def cursor(self) -> _Conflicting:
        return self

    async def __aenter__(self) -> _Conflicting:
        return self

    async def __aexit__(self, *exc: object) -> None:
        pass


async def _lose_then_answer(cur: _Conflicting) -> str:
    cur.tries += 1
    if cur.tries <= cur.losses:
        raise pymysql.err.OperationalError(1213, "Deadlock found when trying to get lock")
    return "claimed"


async def test_a_claim_losing_certification_many_times_is_retried_within_the_timeout() -> None:
    # 12 losses in a row: more than the 8 tries a claim had before (then a 503);
    # with backoffs of at most 0.1 s they fit well within the 3 s store timeout.
    conn = _Conflicting(losses=12)
    ledger = Ledger(conn, 3.0, galera=True)
    assert await ledger._run(_lose_then_answer, transaction=True, retry="claim") == "claimed"
    assert conn.tries == 13 and conn.rollbacks == 12
    assert ledger.retries == {("claim", "certification"): 12}
    assert not ledger.conflict_failures


async def test_a_claim_that_keeps_losing_gives_up_before_the_timeout_and_is_counted() -> None:
    conn = _Conflicting(losses=10**9)
    ledger = Ledger(conn, 1.0, galera=True)
    loop = asyncio.get_running_loop()
    started = loop.time()
    with pytest.raises(StoreUnavailable, match="conflicts in a row within the store timeout"):
        await ledger._run(_lose_then_answer, transaction=True, retry="claim")
    assert loop.time() - started < 1.0  # its own refusal, not the timeout's
    assert conn.tries > 8  # retried for as long as the budget allowed
    assert ledger.retries["claim", "certification"] == conn.tries - 1
    assert ledger.conflict_failures == {"claim": 1}
