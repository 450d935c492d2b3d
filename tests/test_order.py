"""The real-time order check of ops/faults (ops/faultsuite/order.py): on made-up
histories, and on real nodes (a plain tag served by two nodes is not in
real-time order; a strict tag is)."""

from __future__ import annotations

import asyncio
import random
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import redis

from idpool.pool.ledger import Ledger
from idpool.pool.settings import Settings
from idpool.service.kinds import rules_of
from ops.faultsuite.order import OrderLog
from ops.faultsuite.recorder import Clients, IdBitmap
from ops.toolkit import NodeProcess, RedisServer, env_with

from .conftest import MYSQL_URL, REDIS_URL, new_name


def test_sequential_increasing_answers_pass() -> None:
    log = OrderLog()
    for i in range(100):
        log.add(i, i + 0.5, [10 * i, 10 * i + 1])
    assert log.check().ok


def test_an_answer_before_a_send_with_a_smaller_id_fails() -> None:
    log = OrderLog()
    log.add(0.0, 1.0, [500])
    log.add(2.0, 3.0, [400])  # sent after 500 was answered: must be above it
    report = log.check()
    assert report.violations == 1 and not report.ok
    assert "500..500 answered at 1.000000" in report.examples[0]


def test_overlapping_requests_may_come_in_any_order() -> None:
    log = OrderLog()
    log.add(0.0, 3.0, [500])
    log.add(1.0, 2.0, [400])  # in flight together: no order owed
    log.add(2.5, 4.0, [450])  # sent after 400 was answered, not after 500
    assert log.check().ok
    log.add(3.5, 5.0, [460])  # sent after 500 was answered
    assert log.check().violations == 1


def test_duplicates_and_unordered_batches_fail() -> None:
    log = OrderLog()
    log.add(0.0, 1.0, [1, 2, 3, 10, 11])
    log.add(0.0, 1.0, [11, 12])  # repeats 11 (concurrent: no order owed, still a duplicate)
    log.add(5.0, 6.0, [30, 20])
    report = log.check()
    assert report.duplicates == 1 and report.unordered_batches == 1 and report.violations == 0
    assert not report.ok


def test_a_violation_hidden_among_many_requests_is_found() -> None:
    rng = random.Random(7)
    log = OrderLog()
    t, next_id = 0.0, 1
    for _ in range(200_000):
        t += rng.random()
        n = rng.randint(1, 5)
        log.add(t, t + 0.5 * rng.random(), list(range(next_id, next_id + n)))
        next_id += n
    assert log.check().ok
    log.add(t + 10, t + 11, [next_id // 2])  # sent after everything: below all of it
    assert log.check().violations == 1


@pytest.fixture
def two_nodes(tmp_path: Path) -> Iterator[tuple[Settings, list[NodeProcess]]]:
    settings = Settings(mysql_url=MYSQL_URL, redis_url=REDIS_URL, redis_prefix=new_name("idpo"))
    env = env_with(
        IDPOOL_MYSQL_URL=settings.mysql_url,
        IDPOOL_REDIS_URL=settings.redis_url,
        IDPOOL_REDIS_PREFIX=settings.redis_prefix,
        IDPOOL_PRELOAD="0",
    )
    nodes = [NodeProcess(env, tmp_path / f"node{i}").start() for i in range(2)]
    try:
        yield settings, nodes
    finally:
        for node in nodes:
            if node.proc is not None:
                node.stop()
        client = redis.Redis.from_url(REDIS_URL)
        keys = list(client.scan_iter(f"{settings.redis_prefix}:*"))
        if keys:
            client.delete(*keys)


def add_tag(settings: Settings, tag: str, kind: str = "segment") -> int:
    async def go() -> int:
        ledger = await Ledger.connect(settings)
        try:
            return (await ledger.add_tag(tag, step=100, start=1, rules=rules_of(kind))).start_id
        finally:
            await ledger.close()

    return asyncio.run(go())


def draw(nodes: list[NodeProcess], tag: str, start_id: int, seconds: float = 2.0) -> OrderLog:
    """Clients that spread their requests over both nodes, recording real time."""
    order = OrderLog()
    clients = Clients(
        [n.port for n in nodes], tag, IdBitmap(start_id), threads=4, rate=400, seed=1, order=order
    )
    clients.start()
    time.sleep(seconds)
    clients.stop()
    assert clients.tally.requests > 100 and clients.bitmap.duplicates == 0
    return order


def test_a_plain_tag_on_two_nodes_is_not_in_real_time_order(
    two_nodes: tuple[Settings, list[NodeProcess]],
) -> None:
    settings, nodes = two_nodes
    tag = new_name("plain")
    start_id = add_tag(settings, tag)
    report = draw(nodes, tag, start_id).check()
    # each node serves its own range: one answers 101.., the other then 2..
    assert report.violations > 0, report.summary()
    assert report.duplicates == 0


def test_a_strict_tag_on_two_nodes_is_in_real_time_order(
    two_nodes: tuple[Settings, list[NodeProcess]],
) -> None:
    settings, nodes = two_nodes
    tag = new_name("strict")
    start_id = add_tag(settings, tag, kind="strict")
    order = draw(nodes, tag, start_id)
    report = order.check()
    assert report.ok, f"{report.summary()}: {report.examples}"
    assert report.requests == len(order) > 100


def test_a_strict_tag_keeps_order_when_redis_comes_back_empty(tmp_path: Path) -> None:
    """Two nodes serve one strict tag to 32 concurrent callers; Redis is killed
    and comes back empty (no persistence) while they draw. Every pair of
    requests is checked for real-time order; no ID twice."""
    server = RedisServer(tmp_path / "redis", "--save", "", "--appendonly", "no").start()
    settings = Settings(mysql_url=MYSQL_URL, redis_url=server.url, redis_prefix="idpool")
    env = env_with(IDPOOL_MYSQL_URL=MYSQL_URL, IDPOOL_REDIS_URL=server.url, IDPOOL_PRELOAD="0")
    tag = new_name("strict")
    start_id = add_tag(settings, tag, kind="strict")
    nodes = [NodeProcess(env, tmp_path / f"node{i}").start() for i in range(2)]
    order = OrderLog()
    clients = Clients(
        [n.port for n in nodes], tag, IdBitmap(start_id), threads=32, rate=2000, seed=7,
        order=order,
    )  # fmt: skip
    try:
        clients.start()
        time.sleep(1.5)
        server.kill9()
        time.sleep(0.5)
        server.start()  # empty: the state, the high-water mark, everything gone
        time.sleep(2.0)
        clients.stop()
    finally:
        for node in nodes:
            if node.proc is not None:
                node.stop()
        server.kill9()
    report = order.check()
    assert report.ok, f"{report.summary()}: {report.examples}"
    assert clients.bitmap.duplicates == 0
    assert clients.tally.failed_attempts, "Redis was down: some attempt must have failed"
    assert clients.tally.requests_since_failure > 100, "served again after Redis came back"
