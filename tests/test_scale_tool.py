"""ops/scale: the measurement tool itself works. The idle scenario at a tiny size
(real nodes, a private redis-server, a database of its own); no assertion on
speed, only that it measured, reported and cleaned up."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pymysql

from ops.scalebench import cpu_percent, parse, thread_cpu_ns

ROOT = Path(__file__).resolve().parent.parent


def test_cpu_percent_counts_threads_that_came_and_went() -> None:
    before = {1: 100_000_000, 2: 50_000_000}
    after = {1: 150_000_000, 3: 50_000_000}  # 2 exited, 3 was born: 0.1 s in 2 s
    assert cpu_percent(before, after, 2.0) == 5.0


def test_thread_cpu_ns_sees_a_millisecond_of_work() -> None:
    before = thread_cpu_ns(os.getpid())
    end = time.thread_time_ns() + 2_000_000
    while time.thread_time_ns() < end:  # 2 ms on CPU, well under one clock tick
        pass
    assert cpu_percent(before, thread_cpu_ns(os.getpid()), 1.0) >= 0.2


def test_the_reproduce_line_spells_out_every_choice() -> None:
    plan = parse(["--scenario", "idle", "--tags", "20", "--nodes", "1,3"])
    assert plan.command() == (
        "ops/scale --scenario=idle --tags=20 --nodes=1,3 --window=30 --settle=5 --fill-limit=120"
    )
    assert parse(plan.command().split()[1:]) == plan


def test_idle_scenario_at_a_tiny_size(tmp_path: Path) -> None:
    out = tmp_path / "scale.json"
    command = [sys.executable, "-m", "ops.scalebench", "--scenario", "idle", "--tags", "20"]
    command += ["--nodes", "1", "--window", "3", "--settle", "0", "--json", str(out)]
    proc = subprocess.Popen(command, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    try:
        stdout = proc.communicate(timeout=90)[0].decode()
    finally:
        proc.kill()
    assert proc.returncode == 0, stdout
    assert "| tags | nodes | node CPU at idle |" in stdout
    assert "reproduce: ops/scale --scenario=idle --tags=20 --nodes=1 --window=3" in stdout
    (row,) = json.loads(out.read_text())["idle"]
    assert row["tags"] == 20 and row["nodes"] == 1
    assert row["fill_s"] is not None and row["short_lists_after_window"] == 0
    assert row["node_cpu_pct"] > 0 and row["redis_cmds_per_s"] > 0
    conn = pymysql.connect(host="127.0.0.1", user="root")
    try:
        with conn.cursor() as cur:
            cur.execute("SHOW DATABASES LIKE %s", (f"idpool_scale_{proc.pid}",))
            assert cur.fetchall() == ()  # dropped at the end
    finally:
        conn.close()
