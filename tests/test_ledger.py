from __future__ import annotations

import asyncio
import multiprocessing
from collections.abc import AsyncIterator

import pytest

from pool.errors import StoreUnavailable, TagExhausted, TagExists, UnknownTag
from pool.ledger import Ledger
from pool.ranges import MAX_ID, IdRange
from pool.settings import Settings
from pool.stores import LedgerStore, open_ledger

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
    with pytest.raises(TagExhausted, match="run out of 64-bit IDs"):
        await ledger.claim(tag)
    assert (await ledger.get_tag(tag)).max_id == MAX_ID - 5


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


async def test_missing_database_without_permission_to_create(settings: Settings) -> None:
    url = f"{MYSQL_SERVER}/{new_name('idpool_absent_')}"
    with pytest.raises(StoreUnavailable, match="IDPOOL_MYSQL_URL"):
        await Ledger.connect(settings.with_changes(mysql_url=url, create_database=False))


async def test_unreachable_mysql_names_the_variable(settings: Settings) -> None:
    from ops.processes import free_port

    url = f"mysql://root@127.0.0.1:{free_port()}/idpool"
    with pytest.raises(StoreUnavailable, match="IDPOOL_MYSQL_URL") as info:
        await Ledger.connect(settings.with_changes(mysql_url=url))
    assert info.value.store == "mysql"


async def test_reconnects_when_the_server_behind_the_address_changes(
    settings: Settings, tag: str
) -> None:
    """A virtual IP or proxy moved to a promoted replica drops every connection;
    the next claim opens a new one instead of failing on an old one, forever."""
    from ops.servers import TcpProxy

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
