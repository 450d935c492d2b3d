"""ops/rolling-restart: the accounting on its own, then the whole tool in local
mode, once as it is meant to run (SIGTERM: nothing lost) and once with SIGKILL,
to show that it catches the IDs a node did not push back."""

from __future__ import annotations

import asyncio
import re
import subprocess
from pathlib import Path

import pytest

from idpool.pool.ledger import Ledger
from idpool.pool.ranges import IdRange
from idpool.pool.redis_pool import RedisPool
from idpool.pool.settings import Settings
from ops.rolling_restart import account
from ops.toolkit import env_with

TOOL = Path(__file__).resolve().parent.parent / "ops" / "rolling-restart"


def test_every_id_is_handed_out_pooled_or_held() -> None:
    acc = account(1, 101, list(range(1, 41)), [IdRange(51, 101)], [IdRange(41, 51)])
    assert (acc.handed_out, acc.in_pool, acc.held) == (40, 50, 10)
    assert acc.duplicates == 0 and acc.wasted == []


def test_a_remainder_nobody_holds_is_waste() -> None:
    acc = account(1, 101, list(range(1, 41)), [IdRange(51, 101)], [])
    assert acc.wasted == [IdRange(41, 51)] and acc.wasted_ids == 10


def test_repeats_and_overlaps_are_duplicates() -> None:
    ids = [*range(1, 41), 7]  # 7 handed out twice
    acc = account(1, 101, ids, [IdRange(35, 101)], [])  # 35-40 handed out and pooled
    assert acc.duplicates == 1 + 6
    assert account(1, 11, [0, 11], [IdRange(1, 11)], []).duplicates == 2  # outside the ledger


def test_ranges_claimed_after_max_id_was_read_are_ignored() -> None:
    acc = account(1, 11, [], [IdRange(1, 11), IdRange(11, 21)], [])
    assert acc.in_pool == 10 and acc.wasted == [] and acc.duplicates == 0


def run_tool(settings: Settings, tmp_path: Path, *args: str) -> subprocess.CompletedProcess[str]:
    env = env_with(
        IDPOOL_MYSQL_URL=settings.mysql_url,
        IDPOOL_REDIS_URL=settings.redis_url,
        IDPOOL_REDIS_PREFIX=settings.redis_prefix,
        IDPOOL_PRELOAD_INTERVAL="0.2",
        IDPOOL_POOL_SECONDS="5",  # a small pool: the run lasts seconds
    )
    common = ["--step", "500", "--threads", "3", "--count", "20", "--pause", "0.5"]
    return subprocess.run(
        [str(TOOL), *common, "--log-dir", str(tmp_path / "logs"), *args],
        env=env,
        capture_output=True,
        text=True,
        timeout=50,
    )


def ledger_tags(settings: Settings) -> list[str]:
    async def go() -> list[str]:
        ledger = await Ledger.connect(settings)
        try:
            return [row.tag for row in await ledger.list_tags()]
        finally:
            await ledger.close()

    return asyncio.run(go())


def pool_ids(settings: Settings, tag: str) -> int:
    async def go() -> int:
        pool = RedisPool.from_settings(settings)
        try:
            return sum(map(len, await pool.ranges(tag)))
        finally:
            await pool.close()

    return asyncio.run(go())


def fields(out: str, prefix: str) -> list[dict[str, str]]:
    return [
        dict(re.findall(r"(\w+)=(\S+)", line))
        for line in out.splitlines()
        if line.startswith(prefix + " ")
    ]


@pytest.mark.slow
def test_rolling_restart_of_three_nodes_fails_nothing_and_wastes_nothing(
    settings: Settings, tmp_path: Path
) -> None:
    done = run_tool(settings, tmp_path, "--local", "3")
    out = done.stdout
    assert done.returncode == 0, out + done.stderr
    restarts = fields(out, "restarted")
    assert len(restarts) == 3, out
    for r in restarts:
        assert int(r["returned"]) >= 1 and r["abandoned"] == "0", out  # remainders pushed back
        assert int(r["ids_drawn_meanwhile"]) > 0, out  # the restart happened under load
    (client,) = fields(out, "client")
    assert client["failed"] == "0" and int(client["ids"]) > 0, out
    (acc,) = fields(out, "accounting")
    assert acc["wasted"] == "0" and acc["duplicates"] == "0", out
    assert int(acc["handed_out"]) == int(client["ids"]), out
    assert "result=ok" in out
    (removed,) = fields(out, "removed")  # the demo's tag does not outlive the demo
    assert removed["tag"] == client["tag"] and int(removed["pooled_ids_wasted"]) >= 0, out
    assert client["tag"] not in ledger_tags(settings) and pool_ids(settings, client["tag"]) == 0


@pytest.mark.slow
def test_nodes_killed_instead_of_stopped_show_up_as_waste(
    settings: Settings, tmp_path: Path
) -> None:
    done = run_tool(settings, tmp_path, "--local", "2", "--stop-signal", "KILL")
    out = done.stdout
    assert done.returncode == 1, out + done.stderr
    (acc,) = fields(out, "accounting")
    assert int(acc["wasted"]) > 0 and acc["duplicates"] == "0", out
    assert "result=FAILED" in out
