"""One scenario's world: a private redis-server, a fresh database on the shared
MariaDB, tags written straight into the ledger, and ``idpool serve`` processes.

Everything started here is stopped by ``World.close()`` (safe twice), which the
scenarios reach through ``with World(...)`` also on Ctrl-C, SIGTERM (turned into
SystemExit by ``run.py``) and exceptions.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import threading
import time
import urllib.error
import urllib.request
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType
from typing import Any

import pymysql
import redis

from ops.toolkit import LocalCluster, NodeProcess, RedisServer, env_with, wait_ready

MYSQL_HOST, MYSQL_PORT, MYSQL_USER = "127.0.0.1", 3306, "root"
TABLE = "idpool_tags"
PREFIX = "idpool"  # IDPOOL_REDIS_PREFIX given to every node, so the keys below are known


def pool_key(tag: str) -> str:
    return f"{PREFIX}:{{{tag}}}:pool"


def stats_key(tag: str) -> str:
    return f"{PREFIX}:{{{tag}}}:stats"


def database_name() -> str:
    return f"idpool_scale_{os.getpid()}"


def mysql(database: str | None = None) -> Any:
    return pymysql.connect(
        host=MYSQL_HOST,
        port=MYSQL_PORT,
        user=MYSQL_USER,
        database=database,
        autocommit=True,
        connect_timeout=5,
        read_timeout=60,
        write_timeout=60,
    )


def http_get(url: str, timeout: float = 10.0) -> tuple[int, bytes]:
    try:
        with urllib.request.urlopen(url, timeout=timeout) as answer:
            return int(answer.status), answer.read()
    except urllib.error.HTTPError as e:
        return int(e.code), e.read()


@dataclass(frozen=True)
class TagSpec:
    name: str
    step: int
    start: int = 1


class World:
    """Private Redis + fresh database + nodes, for one scenario (or one round of it)."""

    def __init__(
        self,
        workdir: Path,
        label: str,
        node_env: dict[str, str] | None = None,
        redis_cluster: bool = False,
    ) -> None:
        self.dir = workdir / label
        self.dir.mkdir(parents=True, exist_ok=True)
        self.database = database_name()
        self.redis_server: RedisServer | None = None
        self.cluster: LocalCluster | None = None  # a Redis Cluster 3+3 instead of one Redis
        self.use_cluster = redis_cluster
        self._servers: list[redis.Redis] = []
        self.nodes: list[NodeProcess] = []
        self.extra_env = node_env or {}
        self._redis: Any = None
        self.started_at = 0.0  # monotonic time the first node was started
        # close() and a restart in another thread: no node may start once closing began
        self._lock = threading.Lock()
        self._closing = False

    # --- lifecycle -------------------------------------------------------------

    def __enter__(self) -> World:
        try:
            if self.use_cluster:
                self.cluster = LocalCluster(self.dir / "redis").start()
            else:
                self.redis_server = RedisServer(
                    self.dir / "redis", "--save", "", "--appendonly", "no"
                ).start()
            conn = mysql()
            try:
                with conn.cursor() as cur:
                    cur.execute(f"DROP DATABASE IF EXISTS `{self.database}`")
                    cur.execute(f"CREATE DATABASE `{self.database}`")
            finally:
                conn.close()
            self._create_table()
        except BaseException:
            self.close()
            raise
        return self

    def __exit__(
        self,
        kind: type[BaseException] | None,
        value: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()

    def close(self) -> None:
        """Stop every node, the Redis server, and drop the database. Safe twice."""
        with self._lock:
            self._closing = True
            nodes, self.nodes = self.nodes, []
        for node in nodes:
            if node.proc is not None and node.proc.poll() is None:
                node.proc.send_signal(signal.SIGTERM)
        for node in nodes:
            stop_process(node)
        if self._redis is not None:
            with contextlib.suppress(redis.RedisError):
                self._redis.close()
            self._redis = None
        if self.redis_server is not None:
            server, self.redis_server = self.redis_server, None
            with contextlib.suppress(subprocess.TimeoutExpired):
                server.stop()
            server.kill9()
        for client in self._servers:
            client.close()
        self._servers = []
        if self.cluster is not None:
            cluster, self.cluster = self.cluster, None
            cluster.stop()
        with contextlib.suppress(pymysql.err.MySQLError):
            conn = mysql()
            try:
                with conn.cursor() as cur:
                    cur.execute(f"DROP DATABASE IF EXISTS `{self.database}`")
            finally:
                conn.close()

    # --- stores ----------------------------------------------------------------

    @property
    def redis_url(self) -> str:
        if self.cluster is not None:
            return self.cluster.url
        assert self.redis_server is not None
        return self.redis_server.url

    def servers(self) -> list[redis.Redis]:
        """A client of each primary (the one Redis, or every shard's primary)."""
        if self.cluster is None:
            return [self.redis]
        if not self._servers:  # the primaries do not change in a measurement
            self._servers = [n.client() for n in self.cluster.shard_primaries()]
        return self._servers

    @property
    def mysql_url(self) -> str:
        return f"mysql://{MYSQL_USER}@{MYSQL_HOST}:{MYSQL_PORT}/{self.database}"

    @property
    def redis(self) -> Any:
        """A client of the pool: a ``redis.Redis``, or a ``RedisCluster`` (same calls)."""
        if self._redis is None:
            if self.cluster is not None:
                port = self.cluster.nodes[0].port
                self._redis = redis.RedisCluster(host="127.0.0.1", port=port, socket_timeout=10)
            else:
                self._redis = redis.Redis.from_url(self.redis_url, socket_timeout=10)
        return self._redis

    def _create_table(self) -> None:
        # The schema of the idpool installed in this Python: the probe follows it.
        from idpool.pool.ledger import SCHEMA

        conn = mysql(self.database)
        try:
            with conn.cursor() as cur:
                cur.execute(SCHEMA)
        finally:
            conn.close()

    def add_tags(self, tags: list[TagSpec], batch: int = 1000) -> None:
        """Bulk INSERT into the ledger, as a probe that bypasses idpool would."""
        conn = mysql(self.database)
        try:
            with conn.cursor() as cur:
                cur.execute(f"SHOW COLUMNS FROM {TABLE}")
                columns = {str(row[0]) for row in cur.fetchall()}
                wanted = ["tag", "max_id", "step", "start_id", "min_step", "max_step"]
                names = [c for c in wanted if c in columns]
                sql = (
                    f"INSERT INTO {TABLE} ({', '.join(names)}) "
                    f"VALUES ({', '.join(['%s'] * len(names))})"
                )
                for i in range(0, len(tags), batch):
                    rows = []
                    for t in tags[i : i + batch]:
                        value = {
                            "tag": t.name,
                            "max_id": t.start,
                            "step": t.step,
                            "start_id": t.start,
                            "min_step": t.step,
                            "max_step": max(t.step, 1_000_000),
                        }
                        rows.append(tuple(value[c] for c in names))
                    cur.executemany(sql, rows)
        finally:
            conn.close()

    def ledger_row(self, tag: str) -> dict[str, int]:
        conn = mysql(self.database)
        try:
            with conn.cursor() as cur:
                cur.execute(f"SELECT max_id, start_id, step FROM {TABLE} WHERE tag = %s", (tag,))
                row = cur.fetchone()
        finally:
            conn.close()
        if row is None:
            raise RuntimeError(f"tag {tag} vanished from the ledger")
        return {"max_id": int(row[0]), "start_id": int(row[1]), "step": int(row[2])}

    def commands_processed(self) -> int:
        """Commands so far, summed over the primaries."""
        return sum(int(c.info("stats")["total_commands_processed"]) for c in self.servers())

    def command_calls(self) -> dict[str, int]:
        """Calls so far by command (``INFO commandstats``; commands run by scripts
        included), summed over the primaries."""
        calls: dict[str, int] = {}
        for client in self.servers():
            for name, value in client.info("commandstats").items():
                if isinstance(value, dict) and "calls" in value:
                    key = name.removeprefix("cmdstat_")
                    calls[key] = calls.get(key, 0) + int(value["calls"])
        return calls

    def redis_cpu_seconds(self) -> float:
        """CPU seconds so far, summed over the primaries."""
        total = 0.0
        for client in self.servers():
            info = client.info("cpu")
            total += float(info["used_cpu_sys"]) + float(info["used_cpu_user"])
        return total

    def short_lists(self, tags: list[str], depth: int) -> int:
        """How many of the tags' pool lists hold fewer than ``depth`` ranges."""
        short = 0
        for i in range(0, len(tags), 2000):
            pipe = self.redis.pipeline(transaction=False)
            for tag in tags[i : i + 2000]:
                pipe.llen(pool_key(tag))
            short += sum(1 for n in pipe.execute() if int(n) < depth)
        return short

    def wait_filled(self, tags: list[str], depth: int, limit: float) -> float | None:
        """Seconds from the first node's start until every list held ``depth``
        ranges; None if that did not happen within ``limit`` seconds of the start."""
        while True:
            if self.short_lists(tags, depth) == 0:
                return time.monotonic() - self.started_at
            if time.monotonic() - self.started_at >= limit:
                return None
            self.check_nodes()
            time.sleep(0.5)

    # --- nodes -----------------------------------------------------------------

    def node_env(self) -> dict[str, str]:
        return env_with(
            IDPOOL_MYSQL_URL=self.mysql_url,
            IDPOOL_REDIS_URL=self.redis_url,
            IDPOOL_REDIS_PREFIX=PREFIX,
            **self.extra_env,
        )

    def start_nodes(self, count: int, ready_timeout: float = 120.0) -> None:
        env = self.node_env()
        self.started_at = time.monotonic()
        for i in range(count):
            node = NodeProcess(env, self.dir / f"node{i + 1}")
            self.nodes.append(node)
            node.start(wait=False)
        for node in self.nodes:
            node.wait_ready(ready_timeout)

    def restart_node(self, index: int, ready_timeout: float = 120.0) -> dict[str, float]:
        """SIGTERM one node, wait for its exit, start it again on the same port."""
        node = self.nodes[index]
        began = time.monotonic()
        clean = stop_process(node)
        stopped = time.monotonic()
        with self._lock:
            if self._closing:
                raise RuntimeError("world closed during the restart")
            node.start(wait=False)
        wait_ready(node.base_url, ready_timeout, node.exited)
        return {
            "stop_s": round(stopped - began, 2),
            "ready_s": round(time.monotonic() - stopped, 2),
            "clean_exit": float(clean),
        }

    def check_nodes(self) -> None:
        for node in self.nodes:
            if (why := node.exited()) is not None:
                raise RuntimeError(why)

    def cpu_ns(self) -> dict[int, int]:
        """Nanoseconds on CPU of every thread of every node process and its
        descendants, by thread id."""
        used: dict[int, int] = {}
        for node in self.nodes:
            if node.proc is not None:
                for pid in process_tree(node.proc.pid):
                    used.update(thread_cpu_ns(pid))
        return used


def stop_process(node: NodeProcess, grace: float = 30.0) -> bool:
    """SIGTERM (if still running) and wait; SIGKILL if it overstays. True if clean."""
    proc = node.proc
    if proc is None:
        return True
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
    try:
        code = proc.wait(grace)
    except subprocess.TimeoutExpired:
        proc.kill()
        code = proc.wait(10)
    node.proc = None
    return code in (0, -signal.SIGTERM)


def process_tree(pid: int) -> list[int]:
    """The process and its descendants (bounded: a tree of at most 1,000)."""
    found: list[int] = []
    todo = [pid]
    while todo and len(found) < 1000:
        p = todo.pop()
        found.append(p)
        for task in Path(f"/proc/{p}/task").glob("*/children"):
            with contextlib.suppress(OSError):
                todo += [int(c) for c in task.read_text().split()]
    return found


def thread_cpu_ns(pid: int) -> dict[int, int]:
    """Nanoseconds on CPU of each thread of ``pid``, by thread id. The first
    field of ``schedstat``: exact, where ``stat``'s utime + stime are sampled
    in clock ticks (10 ms) and read 0 for an idle node over a short window."""
    used: dict[int, int] = {}
    for stat in Path(f"/proc/{pid}/task").glob("*/schedstat"):
        with contextlib.suppress(OSError, ValueError, IndexError):
            used[int(stat.parent.name)] = int(stat.read_text().split()[0])
    return used


def cpu_percent(before: dict[int, int], after: dict[int, int], seconds: float) -> float:
    """% of one core used between two samples of nanoseconds by thread id; a
    thread gone by the second sample counts up to the first, one born since
    counts whole."""
    used = sum(after.get(tid, t) - t for tid, t in before.items())
    used += sum(t for tid, t in after.items() if tid not in before)
    return 100.0 * used / 1e9 / seconds
