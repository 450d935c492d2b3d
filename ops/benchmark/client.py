"""``ops/bench client``: the Python client's hot path against ``next(itertools.count())``.

Starts a private redis-server, a database ``idpool_bench_client`` on the local
MariaDB and one ``idpool serve`` node, then times in this process, best of
``--repeat`` loops each (the loop's own cost included, as for the baseline):

- ``next_id()`` in one thread, and ``next(itertools.count())`` beside it;
- ``next_id()`` from 4 threads at once, and 4 threads on one shared count;
- ``next_ids(1000)``, in IDs/s;
- HTTP lease calls per million IDs (the client fetches in the background);
- ``SnowflakeClient.next_id()`` on a snowflake tag, in 1 and 4 threads, against
  ``next_id()`` on the segment tag (target: within 2x). The tag has 16 sequence
  bits: the default layout's 12 cap a worker ID at 4,096 IDs per ms, which a
  client reaches (it then waits for the next millisecond).

Prints what it measured and the command that reproduces it. Not run by the tests.
"""

from __future__ import annotations

import argparse
import itertools
import shlex
import subprocess
import sys
import tempfile
import threading
import time
import timeit
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import pymysql
from idpool_client import IdPoolClient
from idpool_client.snowflake import SnowflakeClient

from ops.processes import NodeProcess, env_with
from ops.servers import RedisServer

DATABASE = "idpool_bench_client"  # created and dropped here; nothing else uses it
TAG = "bench"
SNOWFLAKE_TAG = "sf"


def _best_ns(statement: str, names: dict[str, Any], calls: int, repeat: int) -> float:
    return min(timeit.repeat(statement, globals=names, number=1, repeat=repeat)) / calls * 1e9


def _threads_ns(draw: Callable[[], object], threads: int, calls: int, repeat: int) -> float:
    """Wall ns per ID with ``threads`` threads each calling ``draw`` ``calls`` times."""

    def work(start: threading.Barrier) -> None:
        start.wait()
        for _ in range(calls):
            draw()

    best = float("inf")
    for _ in range(repeat):
        barrier = threading.Barrier(threads + 1)
        pool = [threading.Thread(target=work, args=(barrier,)) for _ in range(threads)]
        for t in pool:
            t.start()
        barrier.wait()
        started = time.perf_counter()
        for t in pool:
            t.join()
        best = min(best, time.perf_counter() - started)
    return best / (threads * calls) * 1e9


def measure(client: IdPoolClient, calls: int, repeat: int) -> dict[str, float]:
    # Warm up: the lease size doubles per lease until a lease lasts target_seconds.
    for _ in range(3):
        for _ in range(calls):
            client.next_id(TAG)
    counter = itertools.count()
    base = {"nxt": next, "c": counter, "r": range(calls)}
    results: dict[str, float] = {}
    leases_before = client.lease_calls
    results["count_ns"] = _best_ns("for _ in r: nxt(c)", base, calls, repeat)
    names = {"f": client.next_id, "t": TAG, "r": range(calls)}
    results["next_id_ns"] = _best_ns("for _ in r: f(t)", names, calls, repeat)
    results["count_4t_ns"] = _threads_ns(lambda: next(counter), 4, calls // 4, repeat)
    results["next_id_4t_ns"] = _threads_ns(lambda: client.next_id(TAG), 4, calls // 4, repeat)
    batches = max(1, calls // 1000)
    names = {"g": client.next_ids, "t": TAG, "r": range(batches)}
    results["next_ids_1000_ns_per_id"] = (
        _best_ns("for _ in r: g(t, 1000)", names, batches, repeat) / 1000
    )
    drawn = repeat * (2 * calls + 4 * (calls // 4) + 1000 * batches)
    results["lease_calls_per_million"] = (client.lease_calls - leases_before) / drawn * 1e6
    return results


def measure_snowflake(client: SnowflakeClient, calls: int, repeat: int) -> dict[str, float]:
    for _ in range(calls):
        client.next_id(SNOWFLAKE_TAG)  # warm: the worker ID is granted on the first
    names = {"f": client.next_id, "t": SNOWFLAKE_TAG, "r": range(calls)}
    return {
        "snowflake_next_id_ns": _best_ns("for _ in r: f(t)", names, calls, repeat),
        "snowflake_next_id_4t_ns": _threads_ns(
            lambda: client.next_id(SNOWFLAKE_TAG), 4, calls // 4, repeat
        ),
    }


def report(results: dict[str, float], command: str) -> str:
    c, n = results["count_ns"], results["next_id_ns"]
    c4, n4 = results["count_4t_ns"], results["next_id_4t_ns"]
    batch = results["next_ids_1000_ns_per_id"]
    rows = [
        ("next(itertools.count()), 1 thread", c, ""),
        ("client.next_id(), 1 thread", n, f"{n / c:.2f}x count (target <= 3x, <= 100 ns)"),
        ("shared count, 4 threads (wall per ID)", c4, ""),
        ("client.next_id(), 4 threads (wall per ID)", n4, f"{n4 / c4:.2f}x count"),
        ("client.next_ids(1000), per ID", batch, "target >= 50M IDs/s"),
    ]
    if "snowflake_next_id_ns" in results:
        f, f4 = results["snowflake_next_id_ns"], results["snowflake_next_id_4t_ns"]
        rows += [
            ("snowflake next_id(), 1 thread", f, f"{f / n:.2f}x client.next_id (target <= 2x)"),
            ("snowflake next_id(), 4 threads (wall per ID)", f4, f"{f4 / n4:.2f}x client.next_id"),
        ]
    lines = [
        f"{label:<44} {ns:8.1f} ns  {1e3 / ns:7.1f}M IDs/s  {note}" for label, ns, note in rows
    ]
    lines.append(
        f"{'HTTP lease calls per million IDs':<44} {results['lease_calls_per_million']:8.2f}"
    )
    lines.append(f"reproduce: {command}")
    return "\n".join(lines)


def main(argv: Sequence[str]) -> int:
    parser = argparse.ArgumentParser(prog="ops/bench client", description=__doc__.split("\n")[0])
    parser.add_argument("--calls", type=int, default=2_000_000, help="IDs per timed loop")
    parser.add_argument("--repeat", type=int, default=5, help="loops per figure (best is kept)")
    args = parser.parse_args(argv)
    command = "ops/bench client " + shlex.join(argv)
    workdir = Path(tempfile.mkdtemp(prefix="idpool-client-bench-"))
    redis_server = RedisServer(workdir / "redis", "--save", "", "--appendonly", "no").start()
    conn = pymysql.connect(host="127.0.0.1", user="root", autocommit=True)
    conn.cursor().execute(f"DROP DATABASE IF EXISTS `{DATABASE}`")
    env = env_with(
        IDPOOL_MYSQL_URL=f"mysql://root@127.0.0.1:3306/{DATABASE}",
        IDPOOL_REDIS_URL=redis_server.url,
    )
    node = NodeProcess(env, workdir / "node")
    try:
        cli = [sys.executable, "-m", "idpool.service.cli", "tag", "add", TAG, "--step", "1000"]
        subprocess.run(cli, env=env, check=True, stdout=subprocess.DEVNULL)
        # 16 sequence bits: 65,536 IDs per ms, so the hot path's cost is measured,
        # not the default layout's cap of 4,096 IDs per ms per worker ID
        flake = [*cli[:-3], SNOWFLAKE_TAG, "--snowflake", "--worker-bits", "6"]
        flake += ["--sequence-bits", "16"]
        subprocess.run(flake, env=env, check=True, stdout=subprocess.DEVNULL)
        node.start()
        with IdPoolClient([node.base_url], return_at_exit=False) as client:
            results = measure(client, args.calls, args.repeat)
        with SnowflakeClient([node.base_url]) as snowflakes:
            results.update(measure_snowflake(snowflakes, args.calls, args.repeat))
        print(f"{command}\nnode log: {node.logs[-1]}")
        print(report(results, command))
    finally:
        if node.proc is not None:
            node.stop()
        redis_server.kill9()
        conn.cursor().execute(f"DROP DATABASE IF EXISTS `{DATABASE}`")
        conn.close()
    return 0
