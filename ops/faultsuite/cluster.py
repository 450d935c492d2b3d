"""One scenario's processes: its own redis-server, three or more `idpool serve`
nodes and a standalone `idpool preload`, against the run's private MariaDB.

Every process start is a run with a log file of its own; a run that ended by
``kill -9`` is remembered, so the accounting can charge what it held as waste.
"""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

from redis import Redis

from ops.toolkit import (
    GaleraCluster,
    LocalCluster,
    MariaPair,
    MariaServer,
    NodeProcess,
    PreloaderProcess,
    RedisSentinelGroup,
    RedisServer,
    env_with,
)

STEP = 1000

# Node settings: a fixed step (the dynamic step would grow ranges to a million
# IDs and make each Redis restart waste millions), a pool sized to outlast a
# MySQL outage of the lengths the suite injects (30 s of consumption, at least
# 30 ranges), and a rate window short enough to size it within seconds. The cap
# on the depth keeps the preloader's start-up overestimate in check (the rate
# over its first two samples counts the nodes filling their buffers: see
# ops/README.md); at the suite's ~7,000 IDs/s the target is ~210 ranges.
NODE_ENV = {
    "IDPOOL_STEP_SECONDS": "0",
    "IDPOOL_POOL_DEPTH": "30",
    "IDPOOL_POOL_SECONDS": "30",
    "IDPOOL_MAX_POOL_DEPTH": "300",
    "IDPOOL_RATE_WINDOW": "10",
    "IDPOOL_PRELOAD_INTERVAL": "0.5",
    "IDPOOL_CREATE_DATABASE": "1",
}

REDIS_MODES = {
    # AOF fsynced every second: a kill -9 loses up to the last second of writes.
    "aof": ("--appendonly", "yes", "--appendfsync", "everysec", "--save", ""),
    # RDB only, snapshots taken by the fault itself (SAVE), so a restart can
    # load an old one on purpose.
    "rdb": ("--appendonly", "no", "--save", ""),
}


_ACTIONS = {
    "kill9": "kill -9",
    "stop": "shut down (SIGTERM)",
    "start": "started",
    "pause": "SIGSTOP (hang)",
    "resume": "SIGCONT",
}


@dataclass
class Run:
    """One start of one process: its log, and whether it ended by kill -9."""

    name: str
    log: Path
    killed: bool = False


@dataclass
class Cluster:
    directory: Path
    # a pair: primary + replica behind a proxy; Galera: node i on member i % 3
    maria: MariaServer | MariaPair | GaleraCluster
    tag: str
    redis_mode: str = "aof"
    nodes: int = 3
    sentinel: bool = False  # Redis as primary + replica + three Sentinels
    redis_cluster: bool = False  # a Redis Cluster of 3 primaries + 3 replicas
    # A database per scenario: a preloader fills every tag of its database, and
    # must not refill the tags of scenarios that are over.
    database: str = "idpool_faults"
    env_overrides: dict[str, str] = field(default_factory=dict)
    idle_tags: int = 0  # tags nobody asks for, beside the scenario's
    strict: bool = False  # the scenario's tag is created --strict
    kind: str = "segment"  # the scenario tag's kind
    step: int = STEP  # the scenario's tag's range size
    redis: RedisServer | RedisSentinelGroup | LocalCluster = field(init=False)
    node_procs: list[NodeProcess] = field(init=False, default_factory=list)
    preloader: PreloaderProcess = field(init=False)
    killed_logs: set[Path] = field(init=False, default_factory=set)
    events: list[tuple[float, str]] = field(init=False, default_factory=list)
    problems: list[str] = field(init=False, default_factory=list)
    dumped: dict[Path, int] = field(init=False, default_factory=dict)  # dump -> its max_id
    started_at: float = field(init=False, default=0.0)

    def __post_init__(self) -> None:
        self.directory.mkdir(parents=True, exist_ok=True)
        args = REDIS_MODES[self.redis_mode]
        if self.redis_cluster:
            self.redis = LocalCluster(self.directory / "redis")
        elif self.sentinel:
            self.redis = RedisSentinelGroup(self.directory / "redis", *args)
        else:
            self.redis = RedisServer(self.directory / "redis", *args)

    @property
    def env(self) -> dict[str, str]:
        return env_with(
            IDPOOL_MYSQL_URL=self.maria.url(self.database),
            IDPOOL_REDIS_URL=self.redis.url,
            **{**NODE_ENV, **self.env_overrides},
        )

    def env_for(self, index: int) -> dict[str, str]:
        """Process ``index``'s settings: on Galera, each on a member of its own
        (node i on member i, the preloader on the member after the last node's)."""
        if not isinstance(self.maria, GaleraCluster):
            return self.env
        return {**self.env, "IDPOOL_MYSQL_URL": self.maria.member_url(index, self.database)}

    @property
    def ports(self) -> list[int]:
        return [node.port for node in self.node_procs]

    def start(self) -> None:
        self.started_at = time.monotonic()
        self.redis.start()
        subprocess.run(
            [sys.executable, "-m", "idpool.service.cli", "tag", "add", self.tag]
            + (
                ["--step", str(self.step)] + (["--strict"] if self.strict else [])
                if self.kind == "segment"
                else ["--kind", self.kind]
            ),
            env=self.env,
            check=True,
            stdout=subprocess.DEVNULL,
        )
        if self.idle_tags:
            self.add_idle_tags(self.idle_tags)
        self.node_procs = [
            NodeProcess(self.env_for(i), self.directory / f"node{i}") for i in range(self.nodes)
        ]
        self.preloader = PreloaderProcess(
            self.env_for(self.nodes), self.directory / "preloader"
        )
        for proc in [*self.node_procs, self.preloader]:
            proc.start(wait=False)
        for proc in [*self.node_procs, self.preloader]:
            proc.wait_ready(60)
        self.note("cluster up")

    def add_idle_tags(self, count: int) -> None:
        """Tags nobody asks for, in the ledger beside the scenario's tag (issue 11:
        the suite must pass with a thousand of them configured)."""
        rows = ", ".join(f"('idle-{i:05d}', 1, {STEP}, {STEP}, 1000000, 1)" for i in range(count))
        insert = (
            "INSERT INTO idpool_tags (tag, max_id, step, min_step, max_step, start_id) "
            f"VALUES {rows}"
        )
        subprocess.run(self.maria.client() + ["-e", insert, self.database], check=True)

    def note(self, what: str) -> None:
        self.events.append((time.monotonic() - self.started_at, what))

    def runs(self) -> list[Run]:
        procs: list[NodeProcess] = [*self.node_procs, self.preloader]
        return [
            Run(path.name, path, path in self.killed_logs) for proc in procs for path in proc.logs
        ]

    # -- node faults ---------------------------------------------------------

    def kill9_node(self, index: int) -> None:
        node = self.node_procs[index]
        self.killed_logs.add(node.logs[-1])
        node.kill9()
        self.note(f"node{index} kill -9")

    def sigterm_node(self, index: int) -> bool:
        clean = self.node_procs[index].stop()
        self.note(f"node{index} SIGTERM, exited {'cleanly' if clean else 'NOT cleanly'}")
        return clean

    def start_node(self, index: int) -> None:
        self.node_procs[index].start(wait=True)
        self.note(f"node{index} restarted and ready")

    # -- store faults ---------------------------------------------------------

    def redis_client(self) -> Redis:
        """A client of the (current master) Redis; on a cluster, of the primary
        that serves the scenario's tag now."""
        if isinstance(self.redis, LocalCluster):
            return self.redis.primary_of(f"{{{self.tag}}}").client()
        return Redis(port=self.redis.port, socket_timeout=5)

    def redis_cluster_of(self) -> LocalCluster:
        assert isinstance(self.redis, LocalCluster), "a Redis Cluster scenario's fault"
        return self.redis

    def sentinel_group(self) -> RedisSentinelGroup:
        assert isinstance(self.redis, RedisSentinelGroup), "a Sentinel scenario's fault"
        return self.redis

    def galera(self) -> GaleraCluster:
        assert isinstance(self.maria, GaleraCluster), "a Galera scenario's fault"
        return self.maria

    def maria_pair(self) -> MariaPair:
        assert isinstance(self.maria, MariaPair), "a MariaDB replication scenario's fault"
        return self.maria

    def redis_snapshot(self) -> Path:
        """SAVE now and keep a copy of the dump, to restore later."""
        self.redis_client().save()
        copy = self.directory / f"dump-{len(self.events)}.rdb"
        shutil.copy(self.redis.dir / "dump.rdb", copy)
        self.note(f"redis RDB snapshot saved ({copy.name})")
        return copy

    def redis_restart_from(self, snapshot: Path) -> None:
        """kill -9 Redis and start it on the old snapshot."""
        assert isinstance(self.redis, RedisServer)
        self.redis.kill9()
        shutil.copy(snapshot, self.redis.dir / "dump.rdb")
        self.redis.start()
        self.note(f"redis kill -9, restarted from the older RDB {snapshot.name}")

    def store(self, name: str, action: str) -> None:
        """``action`` (kill9, stop, start, pause, resume) on the scenario's Redis or
        the run's MariaDB, noted on the timeline."""
        server = self.redis if name == "redis" else self.maria
        assert isinstance(server, MariaServer | RedisServer), "a single server's fault"
        getattr(server, action)()
        self.note(f"{name} {_ACTIONS[action]}")

    def ensure_stores_up(self) -> None:
        """After a fault went wrong: both stores running again, so the scenario can end."""
        if isinstance(self.redis, RedisSentinelGroup):
            self.redis.ensure_up()
        if isinstance(self.redis, LocalCluster):
            for node in self.redis.nodes:
                if node.proc is None:
                    node.start()
        if isinstance(self.maria, GaleraCluster):
            self.maria.ensure_up()
        for name, server in (("redis", self.redis), ("mariadb", self.maria)):
            if isinstance(server, RedisSentinelGroup | LocalCluster | GaleraCluster):
                continue
            if server.proc is None:
                self.store(name, "start")
            else:
                server.resume()

    def mysql_dump(self) -> Path:
        """mariadb-dump of this tag's ledger row, as a backup to restore later."""
        path = self.directory / f"ledger-{len(self.events)}.sql"
        dump = ["--no-create-info", "--replace", "--skip-comments", f"--where=tag='{self.tag}'"]
        with open(path, "wb") as out:
            subprocess.run(
                self.maria.client("mariadb-dump") + dump + [self.database, "idpool_tags"],
                check=True,
                stdout=out,
            )
        # The dump's own max_id, from the dump: a claim between the dump and a
        # read after it would make the rewind look smaller than it is.
        found = re.search(rb"\('[^']*',(\d+),", path.read_bytes())
        self.dumped[path] = int(found.group(1)) if found else self.ledger_max_id()
        self.note(f"ledger row dumped ({path.name}, max_id={self.dumped[path]})")
        return path

    def mysql_restore(self, dump: Path) -> None:
        """Load the old dump: the tag's max_id goes back in time."""
        before = self.ledger_max_id()
        with open(dump, "rb") as src:
            subprocess.run(self.maria.client() + [self.database], check=True, stdin=src)
        self.note(
            f"ledger restored from {dump.name} (max_id {before} -> {self.dumped[dump]}); "
            f"max_id read just after: {self.ledger_max_id()}"
        )

    def ledger_row(self) -> tuple[int, int]:
        """(start_id, max_id) of the tag, read with the mariadb client."""
        query = f"SELECT start_id, max_id FROM idpool_tags WHERE tag = '{self.tag}'"
        out = subprocess.run(
            self.maria.client() + ["-N", "-e", query, self.database],
            check=True,
            capture_output=True,
            text=True,
        ).stdout.split()
        return int(out[0]), int(out[1])

    def ledger_max_id(self) -> int:
        return self.ledger_row()[1]

    # -- the end --------------------------------------------------------------

    def stop(self) -> list[str]:
        """Stop every node and the preloader gracefully (SIGTERM, all at once), then
        Redis. Returns what did not go as it should."""
        problems = []
        procs: list[NodeProcess] = [p for p in [*self.node_procs, self.preloader] if p.proc]
        for proc in procs:
            if proc.proc is not None and proc.proc.poll() is not None:
                code = proc.proc.returncode
                problems.append(f"{proc.logs[-1].name} had exited by itself: {code}")
        for proc in procs:
            if proc.proc is not None and proc.proc.poll() is None:
                proc.terminate()
        for proc in procs:
            assert proc.proc is not None
            try:
                code = proc.proc.wait(60)
            except subprocess.TimeoutExpired:
                proc.proc.kill()
                code = proc.proc.wait()
                problems.append(f"{proc.logs[-1].name} did not stop in 60 s; killed")
            if code not in (0, -15):
                problems.append(f"{proc.logs[-1].name} exited with {code}")
            proc.proc = None
        self.note("nodes and preloader stopped (SIGTERM)")
        return problems

    def close(self) -> None:
        """Kill whatever is still running (after a failure), and stop Redis."""
        for proc in [*self.node_procs, getattr(self, "preloader", None)]:
            if proc is not None and proc.proc is not None:
                if proc.proc.poll() is None:
                    proc.proc.kill()
                proc.proc.wait()
                proc.proc = None
        if isinstance(self.redis, RedisSentinelGroup | LocalCluster):
            self.redis.stop()
        elif self.redis.proc is not None:
            self.redis.resume()  # a paused server ignores SIGTERM until it runs again
            self.redis.stop()
