"""The embedded mode end to end: real `idpool serve --embedded` processes on a
SQLite file, restarted gracefully and with kill -9; and proof that nothing but an
explicit choice ever puts a node on SQLite."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
import threading
import time
import urllib.request
from pathlib import Path

import pytest
from starlette.testclient import TestClient

from idpool.pool.errors import StoreUnavailable
from idpool.pool.settings import Settings
from idpool.pool.sqlite_ledger import SqliteLedger
from idpool.pool.sqlite_pool import SqlitePool
from idpool.service.app import create_app
from ops.toolkit import NodeProcess, env_with, free_port

from .crash_waste import assert_only_the_killed_run_wasted

TAG = "orders"


def _env(**values: str) -> dict[str, str]:
    # Redis on a port where nothing listens: the embedded mode must not need it.
    env = env_with(
        IDPOOL_REDIS_URL=f"redis://127.0.0.1:{free_port()}/0",
        IDPOOL_PRELOAD_INTERVAL="0.2",
        **values,
    )
    if "IDPOOL_MYSQL_URL" not in values:
        env.pop("IDPOOL_MYSQL_URL", None)
    return env


def idpool(cwd: Path, *args: str, **env: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "idpool.service.cli", *args],
        cwd=cwd, env=_env(**env), capture_output=True, text=True, timeout=60,
    )  # fmt: skip


def draw(node: NodeProcess, requests: int) -> list[int]:
    ids: list[int] = []
    for i in range(requests):
        if i % 5 == 0:
            with urllib.request.urlopen(f"{node.base_url}/id/{TAG}", timeout=5) as r:
                ids.append(int(r.read()))
        else:
            with urllib.request.urlopen(f"{node.base_url}/ids/{TAG}?count=17", timeout=5) as r:
                ids += json.loads(r.read())["ids"]
    return ids


def ledger_and_pool(path: Path) -> tuple[int, int, set[int]]:
    """(start_id, max_id, IDs in the pool) as the file holds them."""

    async def read() -> tuple[int, int, set[int]]:
        settings = Settings(mysql_url=f"sqlite://{path}", create_database=False)
        ledger = await SqliteLedger.connect(settings)
        pool = await SqlitePool.open(settings)
        try:
            row = await ledger.get_tag(TAG)
            pooled = {i for r in await pool.ranges(TAG) for i in range(r.start, r.end)}
            return row.start_id, row.max_id, pooled
        finally:
            await pool.close()
            await ledger.close()

    return asyncio.run(read())


def test_restarts_gracefully_without_waste_and_after_kill9_without_duplicates(
    tmp_path: Path,
) -> None:
    added = idpool(tmp_path, "tag", "add", TAG, "--step", "50", "--embedded")
    assert added.returncode == 0, added.stderr
    node = NodeProcess(_env(), tmp_path / "node", args=("--embedded",), cwd=tmp_path)
    db = tmp_path / "idpool.db"
    issued: list[int] = []

    for run in range(2):  # two graceful restarts: every claimed ID is issued or in the pool
        node.start()
        issued += draw(node, 40)
        assert node.stop()
        start, max_id, pooled = ledger_and_pool(db)
        assert len(issued) == len(set(issued)), "an ID was handed out twice"
        assert not pooled & set(issued), "an issued ID is back in the pool"
        assert set(issued) | pooled == set(range(start, max_id)), f"waste after run {run}"
    log_text = node.logs[0].read_text()
    assert f"event=embedded_mode file={db}" in log_text
    assert "range_abandoned" not in log_text

    # kill -9 while a client is drawing IDs: what it got must never come back
    node.start()
    killed_run = len(node.logs) - 1
    received: list[int] = []
    stop = threading.Event()

    def client() -> None:
        deadline = time.monotonic() + 10
        while not stop.is_set() and time.monotonic() < deadline:
            try:
                received.extend(draw(node, 1))
            except OSError:
                return

    thread = threading.Thread(target=client)
    thread.start()
    deadline = time.monotonic() + 10
    while len(received) < 200 and thread.is_alive() and time.monotonic() < deadline:
        time.sleep(0.02)
    node.kill9()
    stop.set()
    thread.join(15)
    assert len(received) >= 200  # the client really was drawing when the node died
    issued += received

    node.start()
    issued += draw(node, 40)
    assert node.stop()
    start, max_id, pooled = ledger_and_pool(db)
    assert len(issued) == len(set(issued)), "an ID was handed out twice"
    assert not pooled & set(issued)
    missing = set(range(start, max_id)) - set(issued) - pooled
    runs = [(node, i) for i in range(len(node.logs))]
    assert_only_the_killed_run_wasted(missing, runs, (node, killed_run))


def test_a_node_with_a_mysql_url_never_starts_on_sqlite(tmp_path: Path) -> None:
    """MySQL down at boot: the node stops with the MySQL error; it does not fall back
    to the embedded ledger (which would hand out IDs MySQL also hands out)."""
    down = f"mysql://root@127.0.0.1:{free_port()}/idpool"
    port = free_port()
    r = idpool(tmp_path, "serve", "--port", str(port), IDPOOL_MYSQL_URL=down)
    assert r.returncode == 3
    assert "mysql unavailable" in r.stderr and "IDPOOL_MYSQL_URL" in r.stderr
    assert "embedded" not in r.stderr and "sqlite" not in r.stderr
    # --embedded does not override a MySQL URL either: two ledgers named, none chosen
    r = idpool(tmp_path, "serve", "--port", str(port), "--embedded", IDPOOL_MYSQL_URL=down)
    assert r.returncode == 2 and "two different ledgers" in r.stderr
    assert list(tmp_path.iterdir()) == []  # no SQLite file was made


def test_the_app_itself_never_falls_back(
    settings: Settings, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Uvicorn workers build the app from the environment without the CLI's check."""
    monkeypatch.chdir(tmp_path)
    down = settings.with_changes(mysql_url=f"mysql://root@127.0.0.1:{free_port()}/idpool")
    with pytest.raises(StoreUnavailable) as info, TestClient(create_app(down)):
        pass
    assert info.value.store == "mysql"
    assert list(tmp_path.iterdir()) == []


def test_embedded_refuses_several_workers(tmp_path: Path) -> None:
    r = idpool(tmp_path, "serve", "--embedded", "--workers", "2", "--port", str(free_port()))
    assert r.returncode == 2
    assert "--workers 2" in r.stderr and "one node" in r.stderr
    assert list(tmp_path.iterdir()) == []


def test_tag_commands_and_pool_show_on_the_embedded_ledger(tmp_path: Path) -> None:
    assert idpool(tmp_path, "tag", "add", TAG, "--step", "250", "--embedded").returncode == 0
    again = idpool(tmp_path, "tag", "add", TAG, "--embedded")
    assert again.returncode == 2 and "already exists" in again.stderr
    assert idpool(tmp_path, "tag", "step", TAG, "500", "--embedded").returncode == 0
    listed = idpool(tmp_path, "tag", "list", "--embedded")
    # tag, max_id, step, start (then max, runway, state, description)
    assert [TAG, "1", "500", "1"] in [line.split()[:4] for line in listed.stdout.splitlines()]
    # a sqlite: URL alone selects the same file
    shown = idpool(tmp_path, "pool", "show", IDPOOL_MYSQL_URL=f"sqlite://{tmp_path}/idpool.db")
    assert shown.returncode == 0, shown.stderr
    row = next(line.split() for line in shown.stdout.splitlines() if line.startswith(TAG))
    assert row[1:4] == ["500", "1", "0"]  # step, max_id, depth


def test_status_and_metrics_name_the_embedded_stores(sqlite_settings: Settings) -> None:
    down_redis = sqlite_settings.with_changes(redis_url=f"redis://127.0.0.1:{free_port()}/0")
    with TestClient(create_app(down_redis)) as client:
        asyncio.run(_add_tag(down_redis))
        assert client.get(f"/ids/{TAG}", params={"count": 3}).json()["ids"] == [1, 2, 3]
        assert client.get("/readyz").text == "ready"
        stores = client.get("/status.json").json()["stores"]
        assert {name: s["up"] for name, s in stores.items()} == {
            "sqlite": True,
            "sqlite_pool": True,
        }
        metrics = client.get("/metrics").text
        assert 'idpool_store_up{store="sqlite"} 1.0' in metrics
        assert 'idpool_store_up{store="sqlite_pool"} 1.0' in metrics


async def _add_tag(settings: Settings) -> None:
    ledger = await SqliteLedger.connect(settings)
    try:
        await ledger.add_tag(TAG, step=10, start=1)
    finally:
        await ledger.close()
