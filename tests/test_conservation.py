"""ID conservation across real `idpool serve` processes.

Every ID in [start, max_id) of the tag must be handed out exactly once or lie in
a range still in the Redis list: no duplicate, and (graceful stops) no gap.
"""

from __future__ import annotations

import asyncio
import http.client
import json
import threading
from collections.abc import Callable
from pathlib import Path

import pytest

from idpool.pool.ledger import Ledger
from idpool.pool.redis_pool import RedisPool
from idpool.pool.settings import HTTP_SERVERS, Settings
from ops.toolkit import NodeProcess, env_with

from .crash_waste import assert_only_the_killed_run_wasted

TOTAL = 100_000
pytestmark = pytest.mark.slow


class Drawer:
    """Client threads drawing IDs from all nodes; a failed request moves on to the next node."""

    def __init__(self, nodes: list[NodeProcess], tag: str, threads: int = 6) -> None:
        self.nodes = nodes
        self.tag = tag
        self.ids: list[int] = []
        self.failures: dict[str, int] = {}
        self.lock = threading.Lock()
        self.threads = [threading.Thread(target=self._run, args=(i,)) for i in range(threads)]

    def start(self) -> None:
        for t in self.threads:
            t.start()

    def join(self) -> None:
        for t in self.threads:
            t.join(120)

    def count(self) -> int:
        with self.lock:
            return len(self.ids)

    def _run(self, n: int) -> None:
        i = n
        conn: http.client.HTTPConnection | None = None
        port = 0
        while self.count() < TOTAL:
            node = self.nodes[i % len(self.nodes)]
            if conn is None or port != node.port:
                conn, port = (
                    http.client.HTTPConnection("127.0.0.1", node.port, timeout=10),
                    node.port,
                )
            single = i % 10 == 0
            path = f"/id/{self.tag}" if single else f"/ids/{self.tag}?count=37"
            try:
                conn.request("GET", path)
                resp = conn.getresponse()
                body = resp.read()
            except (OSError, http.client.HTTPException) as e:  # e.g. IncompleteRead on kill -9
                self._fail(type(e).__name__)
                conn = None
                i += 1
                continue
            if resp.status != 200:
                self._fail(str(resp.status))
                i += 1
                continue
            got = [int(body)] if single else json.loads(body)["ids"]
            with self.lock:
                self.ids.extend(got)
            i += 1

    def _fail(self, why: str) -> None:
        with self.lock:
            self.failures[why] = self.failures.get(why, 0) + 1


def ledger_and_pool(settings: Settings, tag: str) -> tuple[int, int, list[tuple[int, int]]]:
    async def go() -> tuple[int, int, list[tuple[int, int]]]:
        ledger = await Ledger.connect(settings)
        pool = RedisPool.from_settings(settings)
        try:
            row = await ledger.get_tag(tag)
            ranges = [(r.start, r.end) for r in await pool.ranges(tag)]
            return row.start_id, row.max_id, ranges
        finally:
            await pool.close()
            await ledger.close()

    return asyncio.run(go())


def run_cluster(
    settings: Settings,
    tag: str,
    tmp_path: Path,
    disrupt: Callable[[list[NodeProcess]], None],
    server: str = "granian",
) -> tuple[list[int], int, int, list[tuple[int, int]], list[NodeProcess], Drawer]:
    async def add() -> None:
        ledger = await Ledger.connect(settings)
        await ledger.add_tag(tag, step=500, start=1000)
        await ledger.close()

    asyncio.run(add())
    env = env_with(
        IDPOOL_MYSQL_URL=settings.mysql_url,
        IDPOOL_REDIS_URL=settings.redis_url,
        IDPOOL_REDIS_PREFIX=settings.redis_prefix,
        IDPOOL_POOL_DEPTH="3",
        IDPOOL_PRELOAD_INTERVAL="0.2",
        IDPOOL_HTTP=server,
    )
    nodes = [NodeProcess(env, tmp_path / f"node{i}").start() for i in range(3)]
    drawer = Drawer(nodes, tag)
    try:
        drawer.start()
        while drawer.count() < TOTAL // 2:
            threading.Event().wait(0.05)
        disrupt(nodes)
        drawer.join()
    finally:
        clean = [node.stop() for node in nodes if node.proc is not None]
    assert all(clean), "a node did not stop cleanly"
    start, max_id, pooled = ledger_and_pool(settings, tag)
    return drawer.ids, start, max_id, pooled, nodes, drawer


def check_no_duplicates(ids: list[int], pooled: list[tuple[int, int]]) -> set[int]:
    issued = set(ids)
    assert len(issued) == len(ids), f"{len(ids) - len(issued)} duplicate IDs handed out"
    in_pool: set[int] = set()
    for s, e in pooled:
        block = set(range(s, e))
        assert not block & in_pool, "a range is in the pool twice"
        assert not block & issued, f"range {s}-{e - 1} is in the pool and was handed out"
        in_pool |= block
    return issued | in_pool


@pytest.mark.parametrize("server", HTTP_SERVERS)
def test_graceful_restart_loses_nothing(
    settings: Settings, tag: str, tmp_path: Path, server: str
) -> None:
    def restart_one(nodes: list[NodeProcess]) -> None:
        assert nodes[1].stop()
        nodes[1].start()

    ids, start, max_id, pooled, _, drawer = run_cluster(
        settings, tag, tmp_path, restart_one, server
    )
    assert len(ids) >= TOTAL
    accounted = check_no_duplicates(ids, pooled)
    missing = set(range(start, max_id)) - accounted
    assert not missing, f"{len(missing)} IDs wasted, e.g. {sorted(missing)[:5]}"
    assert accounted == set(range(start, max_id))


@pytest.mark.parametrize("server", HTTP_SERVERS)
def test_kill_9_wastes_only_what_the_killed_node_held(
    settings: Settings, tag: str, tmp_path: Path, server: str
) -> None:
    killed: list[NodeProcess] = []

    def kill_one(nodes: list[NodeProcess]) -> None:
        nodes[2].kill9()
        killed.append(nodes[2])
        nodes[2].start()  # same port, new process: restarts after a crash

    ids, start, max_id, pooled, nodes, drawer = run_cluster(
        settings, tag, tmp_path, kill_one, server
    )
    assert len(ids) >= TOTAL
    accounted = check_no_duplicates(ids, pooled)
    missing = set(range(start, max_id)) - accounted
    runs = [(node, i) for node in nodes for i in range(len(node.logs))]
    assert_only_the_killed_run_wasted(missing, runs, (killed[0], 0))
