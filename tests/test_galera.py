"""The MySQL ledger on a real 3-member MariaDB Galera cluster (ops/galera.py),
started once for the module on free ports and stopped by PID at the end.

Claimers on different members race for one row: Galera lets each member take
the row lock locally and settles the race at COMMIT by certification, so the
losers get error 1213 and nothing of theirs is applied. They must claim again
(counted in ``Ledger.retries``), never overlap, and leave no gap. Reads wait
for the cluster's latest commit (``wsrep_sync_wait``), and a member killed with
``-9`` under load and rejoined repeats nothing.
"""

from __future__ import annotations

import asyncio
import contextlib
import random
import threading
import time
from collections.abc import AsyncIterator, Iterator

import pytest
from prometheus_client.parser import text_string_to_metric_families
from starlette.testclient import TestClient

from idpool.pool.errors import StoreUnavailable
from idpool.pool.ledger import Ledger
from idpool.pool.ranges import IdRange
from idpool.pool.settings import Settings
from idpool.service.app import create_app
from ops.toolkit import GaleraCluster

from .conftest import REDIS_URL, new_name
from .test_app import add_tag

pytestmark = pytest.mark.anyio
DATABASE = "idpool_galera"


@pytest.fixture(scope="module")
def galera() -> Iterator[GaleraCluster]:
    cluster = GaleraCluster(3)
    try:
        cluster.start()
        yield cluster
    finally:
        cluster.stop()


def member_settings(galera: GaleraCluster, index: int) -> Settings:
    return Settings(
        mysql_url=galera.members[index].url(DATABASE),
        redis_url=REDIS_URL,
        preload=False,
        store_timeout=10.0,
        create_database=True,
    )


@pytest.fixture
async def ledgers(galera: GaleraCluster) -> AsyncIterator[list[Ledger]]:
    """A ledger on each member (the first one creates the database and tables)."""
    opened = [await Ledger.connect(member_settings(galera, 0))]
    opened += [await Ledger.connect(member_settings(galera, i)) for i in (1, 2)]
    yield opened
    for ledger in opened:
        await ledger.close()


def overlaps(ranges: list[IdRange]) -> list[tuple[IdRange, IdRange]]:
    ordered = sorted(ranges, key=lambda r: r.start)
    return [(a, b) for a, b in zip(ordered, ordered[1:], strict=False) if b.start < a.end]


async def test_every_member_is_seen_as_galera(ledgers: list[Ledger]) -> None:
    assert [ledger.galera for ledger in ledgers] == [True, True, True]


async def test_claims_on_different_members_never_overlap_and_conflicts_are_retried(
    ledgers: list[Ledger],
) -> None:
    tag = new_name("gal")
    await ledgers[0].add_tag(tag, step=10, start=1)

    async def claimer(ledger: Ledger, claims: int) -> tuple[list[IdRange], int]:
        await ledger.get_tag(tag)  # waits until this member has the new row
        got, gave_up = [], 0
        for _ in range(claims):
            try:
                got.append(await ledger.claim(tag))
            except StoreUnavailable as e:  # lost every try: rolled back, nothing applied
                assert "conflicts in a row (nothing applied)" in str(e)
                gave_up += 1
        return got, gave_up

    # four claimers per member, all on one row: the members' COMMITs collide
    results = await asyncio.gather(*(claimer(lg, 40) for lg in ledgers for _ in range(4)))
    ranges = [r for got, _ in results for r in got]
    gave_up = sum(n for _, n in results)
    assert len(ranges) + gave_up == 3 * 4 * 40 and gave_up < len(ranges) / 10
    assert overlaps(ranges) == []
    # every claim that returned was applied once, every refused one not at all:
    # the ranges tile [1, max_id) with no gap
    max_id = (await ledgers[1].get_tag(tag)).max_id
    assert sorted(r.start for r in ranges) == list(range(1, max_id, 10))
    assert max_id == 1 + 10 * len(ranges)
    retried = sum(ledger.retries["claim", "certification"] for ledger in ledgers)
    assert retried > 0, "no claim lost certification: the retry path was not exercised"


async def test_reads_see_a_tag_created_on_another_member_at_once(
    galera: GaleraCluster, ledgers: list[Ledger]
) -> None:
    """Member 2 holds back its applier (FLUSH TABLES WITH READ LOCK) while member 0
    creates a tag: a read on member 2 waits for the write set instead of
    answering "no such tag" from its own, older state."""
    tag = new_name("gal")
    locker = await asyncio.create_subprocess_exec(
        *galera.members[2].client(),
        "-e",
        "FLUSH TABLES WITH READ LOCK; SELECT SLEEP(2)",
        stdout=asyncio.subprocess.DEVNULL,
    )
    try:
        await asyncio.sleep(0.5)  # the lock is taken
        await ledgers[0].add_tag(tag, step=10, start=1, description="made on member 0")
        started = time.monotonic()
        row = await ledgers[2].get_tag(tag)
        waited = time.monotonic() - started
    finally:
        await asyncio.wait_for(locker.wait(), 30)
    assert row.description == "made on member 0"
    assert waited > 0.5, "the read did not wait for the applier: not a causal read"
    assert tag in [r.tag for r in await ledgers[2].list_tags()]


async def test_member_killed_and_rejoined_under_load_repeats_nothing(
    galera: GaleraCluster, ledgers: list[Ledger]
) -> None:
    tag = new_name("gal")
    await ledgers[0].add_tag(tag, step=10, start=1)
    for ledger in ledgers:
        await ledger.get_tag(tag)
    claimed: list[IdRange] = []
    failed: list[int] = [0, 0, 0]
    after_rejoin = [0, 0, 0]
    rejoined = threading.Event()
    enough = asyncio.Event()  # every member served 20 claims since the rejoin
    stop = asyncio.Event()

    async def claimer(index: int) -> None:
        while not stop.is_set():
            try:
                claimed.append(await ledgers[index].claim(tag))
                if rejoined.is_set():
                    after_rejoin[index] += 1
                    if min(after_rejoin) >= 20:
                        enough.set()
            except StoreUnavailable:  # the member is gone: the outcome may be unknown
                failed[index] += 1
                await asyncio.sleep(0.05)

    workers = [asyncio.create_task(claimer(i)) for i in range(3) for _ in range(2)]
    try:
        await asyncio.sleep(1.0)
        galera.kill9(2)
        await asyncio.to_thread(galera.wait_size, 2, 30.0)
        await asyncio.sleep(1.0)  # members 0 and 1 go on alone
        await asyncio.to_thread(galera.rejoin, 2)
        rejoined.set()
        with contextlib.suppress(TimeoutError):  # returns as soon as all three did
            await asyncio.wait_for(enough.wait(), 60)
    finally:
        stop.set()
        await asyncio.gather(*workers)
    assert failed[2] > 0, "the kill did not reach member 2's claimers"
    states = [m.status("wsrep_local_state_comment") for m in galera.members]
    assert min(after_rejoin) >= 20, (
        f"claims after the rejoin per member: {after_rejoin}, failed: {failed}, states: {states}"
    )
    assert overlaps(claimed) == []
    max_id = (await ledgers[2].get_tag(tag)).max_id
    assert all(r.end <= max_id for r in claimed)


def test_metrics_count_a_node_s_claims_retried_after_certification(
    galera: GaleraCluster, settings: Settings
) -> None:
    """A node on member 0 serving while claimers on members 1 and 2 race it for the
    tag's row: /metrics (and /status.json) count its claims that lost
    certification and were claimed again."""
    on_member = settings.with_changes(mysql_url=galera.members[0].url(DATABASE), store_timeout=10.0)
    tag = new_name("gal")
    add_tag(on_member, tag, step=1)
    stop = threading.Event()

    async def race(index: int) -> None:
        ledger = await Ledger.connect(member_settings(galera, index))
        try:
            await ledger.get_tag(tag)
            while not stop.is_set():
                with contextlib.suppress(StoreUnavailable):  # lost 8 races in a row
                    await ledger.claim(tag)
                await asyncio.sleep(random.uniform(0, 0.004))
        finally:
            await ledger.close()

    racers = [threading.Thread(target=asyncio.run, args=(race(i),)) for i in (1, 2)]
    with TestClient(create_app(on_member)) as client:
        for racer in racers:
            racer.start()
        try:
            retried = 0.0
            deadline = time.monotonic() + 30
            while retried == 0 and time.monotonic() < deadline:
                for _ in range(20):  # step 1: each batch is claimed from the ledger
                    got = client.get(f"/ids/{tag}", params={"count": 5})
                    # 503 only for a claim that lost every try (nothing applied)
                    assert got.status_code == 200 or "conflicts in a row" in got.text
                samples = {
                    (s.name, tuple(sorted(s.labels.items()))): s.value
                    for family in text_string_to_metric_families(client.get("/metrics").text)
                    for s in family.samples
                }
                key = (("op", "claim"), ("reason", "certification"))
                retried = samples.get(("idpool_ledger_retries_total", key), 0.0)
            shown = client.get("/status.json").json()["node"]["ledger_retries"]
        finally:
            stop.set()
            for racer in racers:
                racer.join(30)
    assert retried > 0, "no claim of the node lost certification in 30 s of racing"
    assert [r for r in shown if (r["op"], r["reason"]) == ("claim", "certification")]
