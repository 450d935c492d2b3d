"""Snowflake tags across real processes: three nodes and two client processes
drawing at once while nodes and clients are killed with -9 and started again at
once (nodes on the same port), and while Redis restarts empty. Every ID is
checked for duplicates and for time order at the scale of a second."""

from __future__ import annotations

import array
import asyncio
import bisect
import http.client
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from idpool.pool.ledger import Ledger
from idpool.pool.redis_pool import RedisPool
from idpool.pool.settings import Settings
from idpool.pool.snowflake import check_layout, wall_ms
from idpool.service.kinds import rules_of
from idpool.service.kinds.snowflake import prepare_tag
from ops.toolkit import NodeProcess, RedisServer, env_with

pytestmark = pytest.mark.slow
ROOT = Path(__file__).resolve().parent.parent
LEASE_SECONDS = 3.0


def add_snowflake(settings: Settings, tag: str, lease_ms: int = 0) -> None:
    """As ``idpool tag add --snowflake`` (the row, then the worker hash, so the first
    grants need no quarantine), with the epoch a minute back and ``lease_ms``
    recorded in the row (0: none, as a tag made before it was: the nodes grant with
    their own IDPOOL_WORKER_LEASE_SECONDS, and quarantine at least 60 s)."""

    async def go() -> None:
        ledger = await Ledger.connect(settings)
        layout = check_layout({}, wall_ms() - 60_000).to_text()
        layout += f".l{lease_ms}" if lease_ms else ""
        row = await ledger.add_tag(tag, step=1, start=1, rules=rules_of("snowflake"), layout=layout)
        pool = RedisPool.from_settings(settings)
        await prepare_tag(ledger, pool, row)
        await pool.close()
        await ledger.close()

    asyncio.run(go())


class Callers:
    """HTTP callers: each records (sent, received, ID) by this process's clock."""

    def __init__(self, nodes: list[NodeProcess], tag: str, threads: int = 3) -> None:
        self.nodes, self.tag = nodes, tag
        self.seen: list[tuple[float, float, int]] = []
        self.failed = 0
        self.lock = threading.Lock()
        self.stop = threading.Event()
        self.threads = [threading.Thread(target=self.run, args=(i,)) for i in range(threads)]
        for t in self.threads:
            t.start()

    def run(self, i: int) -> None:
        k = i
        while not self.stop.is_set():
            node = self.nodes[k % len(self.nodes)]
            k += 1
            conn = http.client.HTTPConnection("127.0.0.1", node.port, timeout=5)
            try:
                sent = time.time()
                conn.request("GET", f"/id/{self.tag}")
                resp = conn.getresponse()
                body = resp.read()
                got = time.time()
                if resp.status == 200:
                    with self.lock:
                        self.seen.append((sent, got, int(body)))
                else:
                    self.failed += 1
            except (OSError, http.client.HTTPException):
                self.failed += 1  # killed node: try the next
                time.sleep(0.01)
            finally:
                conn.close()

    def finish(self) -> None:
        self.stop.set()
        for t in self.threads:
            t.join()


class Client:
    def __init__(self, urls: list[str], tag: str, out: Path) -> None:
        self.out = out
        command = [sys.executable, "-m", "tests.snowflake_worker", ",".join(urls), tag, str(out)]
        self.proc = subprocess.Popen(command, cwd=ROOT)

    def kill9(self) -> None:
        self.proc.send_signal(signal.SIGKILL)
        self.proc.wait()

    def stop(self) -> None:
        self.proc.send_signal(signal.SIGTERM)
        assert self.proc.wait(30) == 0


def read_ids(paths: list[Path]) -> list[int]:
    found: array.array[int] = array.array("q")
    for path in paths:
        if path.exists():
            raw = path.read_bytes()
            found.frombytes(raw[: len(raw) - len(raw) % 8])  # a kill may cut the last one
    return list(found)


def check_time_order(seen: list[tuple[float, float, int]]) -> int:
    """Every ID asked for more than a second after another was received is larger.
    Answers how many pairs that covered (by their prefix maximum)."""
    by_received = sorted(seen, key=lambda s: s[1])
    received = [s[1] for s in by_received]
    top, highest = [], 0
    for _, _, value in by_received:
        highest = max(highest, value)
        top.append(highest)
    checked = 0
    for sent, _, value in seen:
        before = bisect.bisect_left(received, sent - 1.0)
        if before:
            assert top[before - 1] < value, "an ID asked for a second later is not larger"
            checked += before
    return checked


def start_nodes(settings: Settings, tmp_path: Path, redis_url: str) -> list[NodeProcess]:
    env = env_with(
        IDPOOL_MYSQL_URL=settings.mysql_url,
        IDPOOL_REDIS_URL=redis_url,
        IDPOOL_REDIS_PREFIX=settings.redis_prefix,
        IDPOOL_PRELOAD="0",
        IDPOOL_WORKER_LEASE_SECONDS=str(LEASE_SECONDS),
        IDPOOL_WORKER_MARGIN_SECONDS="1",
    )
    return [NodeProcess(env, tmp_path / f"node{i}").start() for i in range(3)]


def run_cluster(
    settings: Settings, tag: str, tmp_path: Path, redis_url: str, disrupt: object
) -> tuple[list[int], Callers]:
    # Recorded, as a tag added now: an old tag's quarantine (60 s) would outlast the test
    add_snowflake(settings, tag, int(LEASE_SECONDS * 1000))
    nodes = start_nodes(settings, tmp_path, redis_url)
    urls = [n.base_url for n in nodes]
    outs = [tmp_path / f"client{i}.ids" for i in range(6)]
    clients = [Client(urls, tag, outs[0]), Client(urls, tag, outs[1])]
    callers = Callers(nodes, tag)
    try:
        assert callable(disrupt)
        disrupt(nodes, clients, urls, outs)
        time.sleep(1.0)
    finally:
        callers.finish()
        for c in clients:
            if c.proc.poll() is None:
                c.stop()
        for n in nodes:
            if n.proc is not None:
                n.stop()
    return read_ids(outs) + [v for _, _, v in callers.seen], callers


def test_nodes_and_clients_killed_and_started_again_never_repeat_an_id(
    settings: Settings, tag: str, tmp_path: Path
) -> None:
    def disrupt(
        nodes: list[NodeProcess], clients: list[Client], urls: list[str], outs: list[Path]
    ) -> None:
        time.sleep(1.5)
        for round_ in range(4):
            victim = nodes[round_ % 3]
            victim.kill9()
            victim.start(wait=False)  # at once, on the same port
            clients[round_ % 2].kill9()
            clients[round_ % 2] = Client(urls, tag, outs[2 + round_])
            time.sleep(1.5)
        for n in nodes:
            n.wait_ready()

    ids, callers = run_cluster(settings, tag, tmp_path, settings.redis_url, disrupt)
    assert len(ids) > 10_000
    assert len(set(ids)) == len(ids), f"{len(ids) - len(set(ids))} duplicate IDs"
    assert check_time_order(callers.seen) > 0


def test_a_redis_restarted_empty_never_lets_two_holders_share_a_worker_id(
    settings: Settings, tag: str, tmp_path: Path
) -> None:
    server = RedisServer(tmp_path / "redis", "--save", "", "--appendonly", "no").start()
    try:

        def disrupt(
            nodes: list[NodeProcess], clients: list[Client], urls: list[str], outs: list[Path]
        ) -> None:
            time.sleep(1.5)
            server.kill9()
            server.start()  # empty: every worker ID's record is gone
            time.sleep(0.5)
            # New holders come and go meanwhile: none may get a live worker ID.
            nodes[0].kill9()
            nodes[0].start(wait=False)
            clients[0].kill9()
            clients[0] = Client(urls, tag, outs[2])
            time.sleep(LEASE_SECONDS * 2 + 1)
            nodes[0].wait_ready()

        ids, callers = run_cluster(settings, tag, tmp_path, server.url, disrupt)
        assert len(set(ids)) == len(ids), f"{len(ids) - len(set(ids))} duplicate IDs"
        # served again once the quarantine ended
        late = [v for sent, _, v in callers.seen if sent > callers.seen[-1][0] - 1.0]
        assert late, "no ID served after the quarantine"
        assert check_time_order(callers.seen) > 0
    finally:
        server.kill9()
