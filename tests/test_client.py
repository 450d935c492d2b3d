"""The Python client (client/idpool_client) against real `idpool serve` processes.

The nodes run without a preloader, so the ledger and the pool list change only
by the client's own leases and returns: every ID below the ledger's max_id must
then be handed out once or be back in the list.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from idpool_client import (
    AsyncIdPoolClient,
    IdPoolClient,
    IdPoolClosed,
    IdPoolRequestError,
    IdPoolStrictTag,
    IdPoolUnavailable,
    Lease,
)

from idpool.pool.ledger import Ledger
from idpool.pool.redis_pool import RedisPool
from idpool.pool.settings import Settings
from ops.processes import NodeProcess, env_with, free_port

from .conftest import MYSQL_URL, REDIS_URL, new_name


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Settings, list[str]]]:
    settings = Settings(mysql_url=MYSQL_URL, redis_url=REDIS_URL, redis_prefix=new_name("idpc"))
    env = env_with(
        IDPOOL_MYSQL_URL=settings.mysql_url,
        IDPOOL_REDIS_URL=settings.redis_url,
        IDPOOL_REDIS_PREFIX=settings.redis_prefix,
        IDPOOL_PRELOAD="0",
    )
    tmp = tmp_path_factory.mktemp("client")
    nodes = [NodeProcess(env, tmp / f"node{i}") for i in range(2)]
    for node in nodes:
        node.start()
    try:
        yield settings, [node.base_url for node in nodes]
    finally:
        for node in nodes:
            if node.proc is not None:
                node.stop()


def add_tag(settings: Settings, step: int) -> str:
    tag = new_name("ctag")

    async def go() -> None:
        ledger = await Ledger.connect(settings)
        await ledger.add_tag(tag, step=step, start=1)
        await ledger.close()

    asyncio.run(go())
    return tag


def ledger_and_pool(settings: Settings, tag: str) -> tuple[int, int, list[tuple[int, int]]]:
    async def go() -> tuple[int, int, list[tuple[int, int]]]:
        ledger = await Ledger.connect(settings)
        pool = RedisPool.from_settings(settings)
        try:
            row = await ledger.get_tag(tag)
            return row.start_id, row.max_id, [(r.start, r.end) for r in await pool.ranges(tag)]
        finally:
            await pool.close()
            await ledger.close()

    return asyncio.run(go())


def assert_conserved(settings: Settings, tag: str, ids: list[int]) -> None:
    """No duplicate, and every claimed ID handed out or back in the list (zero waste)."""
    issued = set(ids)
    assert len(issued) == len(ids), f"{len(ids) - len(issued)} duplicate IDs"
    start, max_id, pooled = ledger_and_pool(settings, tag)
    in_pool: set[int] = set()
    for s, e in pooled:
        block = set(range(s, e))
        assert not block & issued, f"returned range {s}-{e - 1} was also handed out"
        assert not block & in_pool, f"range {s}-{e - 1} is in the list twice"
        in_pool |= block
    missing = set(range(start, max_id)) - issued - in_pool
    assert not missing, f"{len(missing)} IDs wasted, e.g. {sorted(missing)[:5]}"
    assert max(issued | in_pool) < max_id


def test_threads_never_share_an_id_and_close_returns_the_rest(
    cluster: tuple[Settings, list[str]],
) -> None:
    settings, urls = cluster
    tag = add_tag(settings, step=100)
    # Small leases (at most 500 IDs): thousands of switches and prefetches in the run.
    client = IdPoolClient(urls, max_count=500, return_at_exit=False)
    got: list[list[int]] = [[] for _ in range(8)]

    def draw(n: int) -> None:
        mine = got[n]
        for k in range(12_000):
            if k % 1000 == 999:
                mine.extend(client.next_ids(tag, 1 + n * 37))
            else:
                mine.append(client.next_id(tag))

    threads = [threading.Thread(target=draw, args=(n,)) for n in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    report = client.close()
    assert report.lost == [] and report.returned > 0
    assert client.close() is report  # twice: nothing returned again
    with pytest.raises(IdPoolClosed):
        client.next_id(tag)
    ids = [i for mine in got for i in mine]
    assert len(ids) == 8 * (12_000 - 12) + 12 * sum(1 + n * 37 for n in range(8))
    assert_conserved(settings, tag, ids)


def test_failover_to_the_next_node(cluster: tuple[Settings, list[str]], tmp_path: Path) -> None:
    settings, urls = cluster
    tag = add_tag(settings, step=50)
    dead = f"http://127.0.0.1:{free_port()}"  # nothing listens there
    with IdPoolClient([dead, *urls], max_count=50, return_at_exit=False) as client:
        ids = [client.next_id(tag) for _ in range(1000)]
        assert client.lease_calls >= 20
    assert_conserved(settings, tag, ids)


def test_no_node_reachable_serves_from_memory_then_raises(
    cluster: tuple[Settings, list[str]], tmp_path: Path
) -> None:
    settings, _ = cluster
    tag = add_tag(settings, step=100)
    env = env_with(
        IDPOOL_MYSQL_URL=settings.mysql_url,
        IDPOOL_REDIS_URL=settings.redis_url,
        IDPOOL_REDIS_PREFIX=settings.redis_prefix,
        IDPOOL_PRELOAD="0",
    )
    node = NodeProcess(env, tmp_path / "lonely").start()
    client = IdPoolClient([node.base_url], max_count=100, return_at_exit=False)
    ids = [client.next_id(tag) for _ in range(20)]  # the 16th started the next lease
    for _ in range(200):
        if client._tags[tag].pending:
            break
        threading.Event().wait(0.02)
    assert node.stop()
    ids += [client.next_id(tag) for _ in range(180)]  # the rest of both leases, from memory
    assert sorted(ids) == list(range(1, 201))
    with pytest.raises(IdPoolUnavailable) as failed:
        client.next_id(tag)
    assert failed.value.failures[0][0] == node.base_url
    assert "ConnectionRefusedError" in failed.value.failures[0][1]
    node.start()  # the node is back: the client recovers (after its backoff)
    threading.Event().wait(0.6)
    assert client.next_id(tag) > 200
    client.close()


def test_unknown_tag_is_a_request_error(cluster: tuple[Settings, list[str]]) -> None:
    _, urls = cluster
    with IdPoolClient(urls, return_at_exit=False) as client:
        with pytest.raises(IdPoolRequestError) as refused:
            client.next_id(new_name("nosuch"))
        assert refused.value.code == "unknown_tag" and refused.value.status == 404


def test_a_strict_tag_is_refused_with_a_clear_error(cluster: tuple[Settings, list[str]]) -> None:
    settings, urls = cluster
    tag = new_name("strict")

    async def add() -> None:
        ledger = await Ledger.connect(settings)
        await ledger.add_tag(tag, step=100, start=1, kind="strict")
        await ledger.close()

    asyncio.run(add())
    with IdPoolClient(urls, return_at_exit=False) as client:
        with pytest.raises(IdPoolStrictTag) as refused:
            client.next_id(tag)
        assert refused.value.code == "strict_tag" and refused.value.status == 409
        assert "strict" in str(refused.value) and f"/id/{tag}" in str(refused.value)
        assert isinstance(refused.value, IdPoolRequestError)  # a 4xx: no other node is tried


def test_async_client_tasks_never_share_an_id(cluster: tuple[Settings, list[str]]) -> None:
    settings, urls = cluster
    tag = add_tag(settings, step=100)

    async def run() -> list[int]:
        got: list[int] = []
        async with AsyncIdPoolClient(urls, max_count=300, return_at_exit=False) as client:

            async def draw(n: int) -> None:
                for k in range(3000):
                    if k % 500 == 0:
                        got.extend(await client.next_ids(tag, 7 + n))
                    else:
                        got.append(await client.next_id(tag))

            await asyncio.gather(*(draw(n) for n in range(8)))
        assert client.report.lost == [] and client.report.returned > 0
        return got

    assert_conserved(settings, tag, asyncio.run(run()))


class FakeTransport:
    """Leases from a counter, in memory: for the interleavings no real run can force."""

    def __init__(self, size: int) -> None:
        self.size = size
        self.next_start = 1
        self.returned: list[tuple[int, int]] = []
        self.timeout = 1.0
        self.servers = ["fake"]
        self.calls = {"lease": 0, "return": 0}

    def lease(self, tag: str, count: int) -> list[Lease]:
        start, self.next_start = self.next_start, self.next_start + self.size
        return [Lease(new_name("l"), tag, start, start + self.size)]

    def give_back(self, lease: Lease, start: int) -> int:
        self.returned.append((start, lease.end))
        return lease.end - start


def draw_from(client: IdPoolClient, tag: str, run: Any) -> int:
    """next_id's body for a thread that read ``run`` and was preempted before its draw."""
    i = next(run.ids)
    if i < run.limit:
        return i
    return client._slow_id(tag, run, i)


def test_a_thread_preempted_across_a_batch_or_close_never_repeats_an_id() -> None:
    client = IdPoolClient(["http://unused"], return_at_exit=False)
    fake = FakeTransport(size=1000)
    client.transport = fake  # type: ignore[assignment]
    first = client.next_id("t")
    stale = client._runs["t"]  # what a preempted thread holds
    batch = client.next_ids("t", 10)  # cuts the run under that thread
    late = draw_from(client, "t", stale)
    assert late not in batch and late != first
    assert list(batch) == list(range(first + 1, first + 11))
    stale = client._runs["t"]
    report = client.close()  # retires the run under the stale thread
    with pytest.raises(IdPoolClosed):
        draw_from(client, "t", stale)
    [(returned_from, end)] = [r for r in fake.returned if r[1] == 1001]
    assert returned_from == late + 1 and end == 1001
    assert report.returned == 1001 - returned_from


def test_a_return_whose_answer_was_lost_is_retried_once_safely(
    cluster: tuple[Settings, list[str]],
) -> None:
    settings, urls = cluster
    tag = add_tag(settings, step=100)
    client = IdPoolClient([urls[0], urls[1]], max_count=100, return_at_exit=False)
    ids = [client.next_id(tag) for _ in range(10)]
    real = client.transport._request
    lost_answers: list[str] = []

    def answer_lost(server: Any, path: str, payload: Any, sent: Any) -> Any:
        result = real(server, path, payload, sent)  # the node acts on it...
        if path == "/lease/return" and not lost_answers:
            lost_answers.append(server.url)
            raise ConnectionResetError("answer lost")  # ...but the client never hears
        return result

    client.transport._request = answer_lost  # type: ignore[method-assign]
    report = client.close()
    assert lost_answers and report.lost == [] and report.returned >= 90
    assert_conserved(settings, tag, ids)  # the tail is in the list once
