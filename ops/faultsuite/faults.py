"""The faults the suite injects, and the scenarios built from them.

A fault is injected and undone in one call (``hold`` seconds of outage in
between), so faults never overlap: a node restarted while a store is down would
refuse to start, which is documented behaviour, not the hazard under test.
"""

from __future__ import annotations

import http.client
import random
import re
import threading
import time
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass

from redis import Redis

from .cluster import Cluster
from .snowflake import SNOWFLAKE_ENV

Fault = Callable[[Cluster, random.Random, float], None]

# Failed attempts a client may see while a node goes away; it retries on another
# node. Anything else (a 503 naming a store, a timeout, a 500) is a failure.
NODE_GONE = frozenset(
    {
        "ConnectionRefusedError",
        "ConnectionResetError",
        "RemoteDisconnected",
        "BrokenPipeError",
        "IncompleteRead",
        "BadStatusLine",
    }
)
DRAINING = frozenset({"503 draining"})


def node_kill9(cluster: Cluster, rng: random.Random, hold: float) -> None:
    index = rng.randrange(len(cluster.node_procs))
    cluster.kill9_node(index)
    time.sleep(min(hold, 1.0))
    cluster.start_node(index)


def node_sigterm(cluster: Cluster, rng: random.Random, hold: float) -> None:
    index = rng.randrange(len(cluster.node_procs))
    if not cluster.sigterm_node(index):
        cluster.problems.append(f"node{index} did not exit cleanly on SIGTERM")
    time.sleep(min(hold, 1.0))
    cluster.start_node(index)


def _supply(redis: Redis, tag: str) -> tuple[int, bytes | None]:
    """What a restart could bring back: the list's length and head, or a strict
    tag's state (1 and its ``next``)."""
    depth = int(redis.llen(f"idpool:{{{tag}}}:pool"))
    if depth:
        return depth, redis.lindex(f"idpool:{{{tag}}}:pool", 0)  # type: ignore[return-value]
    state = redis.hget(f"idpool:{{{tag}}}:strict", "next")
    return (0, None) if state is None else (1, state)  # type: ignore[return-value]


def redis_kill9_aof(cluster: Cluster, rng: random.Random, hold: float) -> None:
    # The hazard needs ranges in the list (nodes fetch their reserve in large pops,
    # so it is often empty), or a strict tag's state: wait for some, so the
    # restart has something to drop.
    redis = cluster.redis_client()
    wait_for(lambda: bool(_supply(redis, cluster.tag)[0]), 20.0)
    cluster.store("redis", "kill9")
    time.sleep(min(hold, 1.0))
    cluster.store("redis", "start")


def redis_old_rdb(cluster: Cluster, rng: random.Random, hold: float) -> None:
    redis = cluster.redis_client()
    # The hazard needs a snapshot that lists ranges nodes pop afterwards (or a
    # strict state they take from afterwards). Nodes fetch their reserve in large
    # pops, so the list is often empty: wait for one.
    wait_for(lambda: bool(_supply(redis, cluster.tag)[0]), 20.0)
    snapshot = cluster.redis_snapshot()
    head = _supply(redis, cluster.tag)[1]
    time.sleep(hold)  # traffic goes on: nodes pop ranges the snapshot still lists
    if not wait_for(lambda: _supply(redis, cluster.tag)[1] != head, 20.0):
        cluster.note("the snapshot's head range (or strict next) was not taken before the restart")
    cluster.redis_restart_from(snapshot)


def redis_restart_empty(cluster: Cluster, rng: random.Random, hold: float) -> None:
    """kill -9 of a Redis that saves nothing: it comes back empty (a new incarnation).
    Then waits out the quarantine of snowflake tags (one lease) and a renewal."""
    cluster.store("redis", "kill9")
    time.sleep(min(hold, 1.0))
    cluster.store("redis", "start")
    lease = float(cluster.env_overrides.get("IDPOOL_WORKER_LEASE_SECONDS", "10"))
    time.sleep(lease * 1.5)


def redis_hang(cluster: Cluster, rng: random.Random, hold: float) -> None:
    cluster.store("redis", "pause")
    try:
        time.sleep(hold)
    finally:
        cluster.store("redis", "resume")


def redis_down(cluster: Cluster, rng: random.Random, hold: float) -> None:
    cluster.store("redis", "stop")
    time.sleep(hold)
    cluster.store("redis", "start")


def mysql_down(cluster: Cluster, rng: random.Random, hold: float) -> None:
    cluster.store("mariadb", "stop")
    time.sleep(hold)
    cluster.store("mariadb", "start")


def mysql_hang(cluster: Cluster, rng: random.Random, hold: float) -> None:
    cluster.store("mariadb", "pause")
    try:
        time.sleep(hold)
    finally:
        cluster.store("mariadb", "resume")


def both_down(cluster: Cluster, rng: random.Random, hold: float) -> None:
    cluster.store("redis", "stop")
    cluster.store("mariadb", "stop")
    time.sleep(hold)
    cluster.store("mariadb", "start")
    cluster.store("redis", "start")


def mysql_rewind(cluster: Cluster, rng: random.Random, hold: float) -> None:
    dump = cluster.mysql_dump()
    # the dump's own max_id: a claim between a read before the dump and the dump
    # made the waits below end at once (a strict tag, claiming every few seconds,
    # then met the restore with no claim after it)
    dumped = cluster.dumped[dump]
    time.sleep(hold)  # nodes and preloaders claim past the dumped max_id
    # A rewind only bites if claims were made after the dump, and only shows if
    # claims are made after the restore: wait for both (bounded).
    wait_for(lambda: cluster.ledger_max_id() > dumped, 20.0)
    cluster.mysql_restore(dump)
    if wait_for(lambda: cluster.ledger_max_id() != dumped, 20.0):
        cluster.note(f"ledger claimed again: max_id now {cluster.ledger_max_id()}")


def redis_sentinel_failover(cluster: Cluster, rng: random.Random, hold: float) -> None:
    """Lagging replica, primary kill -9, Sentinel promotes the replica; the old
    primary stays down ``hold`` seconds, then comes back (Sentinel makes it a replica)."""
    _redis_failover(cluster, hold, back_during_failover=False)


def redis_sentinel_return(cluster: Cluster, rng: random.Random, hold: float) -> None:
    """The same, but the old primary restarts (with its AOF, as a master) as soon as
    the Sentinels see it down, while they fail over."""
    _redis_failover(cluster, hold, back_during_failover=True)


def _redis_failover(cluster: Cluster, hold: float, back_during_failover: bool) -> None:
    group = cluster.sentinel_group()
    key = f"idpool:{{{cluster.tag}}}:pool"
    # The hazard needs ranges in the replica's copy of the list, which the promoted
    # replica must drop (range_abandoned). Nodes fetch their reserve in large pops, so
    # the list is often empty: lag the replica only once its copy holds ranges.
    watched = Redis(port=group.replica().port, socket_timeout=2, decode_responses=True)
    for _ in range(5):
        group.wait_replicated(group.replica(), 60.0)  # each failover starts from a synced replica
        wait_for(lambda: bool(watched.llen(key)), 20.0)
        replica = group.lag_replica()
        if watched.llen(key):
            break
        cluster.note(f"redis replica :{replica.port} lagged with an empty list; again")
        watched.replicaof("127.0.0.1", group.port)
    cluster.note(f"redis replica :{replica.port} lagging (REPLICAOF a port nobody listens on)")
    # under Sentinel's +fix-slave-config delay (~8 s), which would end the lag
    time.sleep(min(hold, 3.0))
    behind = group.replica_offset_behind()
    old = group.master()
    old.kill9()
    killed = time.monotonic()
    cluster.note(f"redis primary :{old.port} kill -9; the replica lacks {behind} bytes of stream")
    if back_during_failover:
        seen = group.wait_failover_started(30.0)
        old.start()
        cluster.note(
            f"Sentinels saw the primary down after {seen:.1f}s; old primary restarted "
            "at once (a master again, its AOF data, a new run_id)"
        )
    group.wait_master(replica.port, 30.0)
    cluster.note(
        f"every Sentinel names the lagging replica :{replica.port} master, "
        f"{time.monotonic() - killed:.1f}s after the kill"
    )
    if not back_during_failover:
        time.sleep(hold)
        old.start()
        # Sentinel turns it into a replica ~8-15 s later (+convert-to-slave); the next
        # failover waits for that, not this one
        cluster.note(f"old primary :{old.port} restarted (Sentinel will make it a replica)")
        return
    # Sentinel converts a returned master only after it has reported that role for
    # 8 s, at its next INFO of it (every 10 s): 8-20 s, then a full resync. 30 s was
    # too short on a loaded machine; this waits for Sentinel's worst case twice over.
    took = group.wait_replicated(old, 60.0)
    cluster.note(
        f"old primary :{old.port} is a replica in sync (Sentinel converted it), "
        f"{took:.1f}s after the switch"
    )


def mysql_replica_failover(cluster: Cluster, rng: random.Random, hold: float) -> None:
    """Lagging binlog replica, primary kill -9, replica promoted as it is and the proxy
    switched to it; ``hold`` seconds later the old primary is rebuilt as a replica."""
    pair = cluster.maria_pair()
    pair.wait_replicated(30.0)
    pair.lag_replica()
    before = cluster.ledger_max_id()
    cluster.note(f"mariadb replica :{pair.replica.port} lagging (STOP SLAVE SQL_THREAD)")
    time.sleep(min(hold, 5.0))
    wait_for(lambda: cluster.ledger_max_id() > before, 20.0)  # claims the replica lacks
    query = f"SELECT max_id FROM idpool_tags WHERE tag = '{cluster.tag}'"
    on_replica = int(pair.sql(pair.replica, query, cluster.database).strip() or 0)
    on_primary = cluster.ledger_max_id()
    pair.primary.kill9()
    cluster.note(
        f"mariadb primary kill -9: max_id {on_primary} there, {on_replica} on the replica "
        f"({on_primary - on_replica:,} IDs behind)"
    )
    time.sleep(0.5)  # an orchestrator's detection time
    pair.promote_replica()
    cluster.note(f"replica :{pair.primary.port} promoted as it was; proxy switched to it")
    if wait_for(lambda: cluster.ledger_max_id() != on_replica, 20.0):
        cluster.note(
            f"ledger claimed on the promoted replica: max_id now {cluster.ledger_max_id()}"
        )
    time.sleep(hold)
    pair.rebuild_replica()
    cluster.note(f"old primary rebuilt as a replica :{pair.replica.port} of the new one")


def galera_member_kill9(cluster: Cluster, rng: random.Random, hold: float) -> None:
    """kill -9 of a random Galera member under load; the others evict it and go on;
    ``hold`` seconds later it restarts and catches up (IST or SST) before it serves."""
    galera = cluster.galera()
    index = rng.randrange(len(galera.members))
    on_it = [f"node{i}" for i in range(len(cluster.node_procs)) if i % len(galera.members) == index]
    if len(cluster.node_procs) % len(galera.members) == index:
        on_it.append("preloader")
    before = cluster.ledger_max_id()
    galera.kill9(index)
    cluster.note(f"galera member m{index} kill -9 (serving {', '.join(on_it) or 'nobody'})")
    evicted = galera.wait_size(len(galera.members) - 1, 30.0)
    cluster.note(f"the other members evicted m{index} after {evicted:.1f}s")
    time.sleep(hold)
    took = galera.rejoin(index)
    cluster.note(
        f"m{index} restarted and Synced in {took:.1f}s; max_id {before} -> "
        f"{cluster.ledger_max_id()} meanwhile"
    )
    time.sleep(1.0)  # claims on the rejoined member too
    cluster.note(f"claims retried after certification failures: {ledger_retries(cluster)}")


def ledger_retries(cluster: Cluster) -> str:
    """``idpool_ledger_retries_total`` of each running node, from its /metrics."""
    found = []
    for i, node in enumerate(cluster.node_procs):
        if node.proc is None:
            continue
        try:
            with urllib.request.urlopen(f"{node.base_url}/metrics", timeout=5) as r:
                text = r.read().decode()
        except OSError as e:
            found.append(f"node{i}: {type(e).__name__}")
            continue
        counts = re.findall(r'^idpool_ledger_retries_total\{(.*)\} (\S+)$', text, re.M)
        found.append(f"node{i}: " + (", ".join(f"{lb} {n}" for lb, n in counts) or "0"))
    return "; ".join(found)


def redis_blip_mysql_rewind(cluster: Cluster, rng: random.Random, hold: float) -> None:
    """Two faults at once: a Redis blip (every process's claims skip Redis for a
    moment), then MySQL goes back to before the claims made meanwhile.

    A claim made while Redis was skipped, and pushed or served without raising
    the shared high-water mark, would be claimed again from the rewound MySQL by
    a process reading the stale mark (500 IDs twice in the review's reproduction).
    """
    dump = cluster.mysql_dump()
    dumped = cluster.dumped[dump]  # the dump's own max_id (see mysql_rewind)
    wait_for(lambda: cluster.ledger_max_id() > dumped, 20.0)
    cluster.store("redis", "pause")
    time.sleep(min(hold, 0.8))  # shorter than a store timeout: a blip, not an outage
    cluster.store("redis", "resume")
    time.sleep(0.3)  # claims in the skip window that follows
    cluster.mysql_restore(dump)
    if wait_for(lambda: cluster.ledger_max_id() != dumped, 20.0):
        cluster.note(f"ledger claimed again: max_id now {cluster.ledger_max_id()}")


def unknown_tag_flood_mysql_down(cluster: Cluster, rng: random.Random, hold: float) -> None:
    """MariaDB down, and meanwhile a client floods every node with made-up tag
    names; the real tag must be served from the pool throughout."""
    flood = TagFlood(cluster.ports, seed=rng.randrange(2**31))
    cluster.store("mariadb", "stop")
    flood.start()
    try:
        time.sleep(hold)
    finally:
        sent = flood.stop()
        cluster.note(f"flood of made-up tags: {sent} requests")
        cluster.store("mariadb", "start")


class TagFlood:
    """Threads sending GET /id/{random name} to every node, bounded in time and count."""

    def __init__(self, ports: list[int], seed: int, threads: int = 4, limit: int = 200_000) -> None:
        self.ports = ports
        self.seed = seed
        self.threads = threads
        self.limit = limit
        self.sent = 0
        self._stop = threading.Event()
        self._workers: list[threading.Thread] = []

    def start(self) -> None:
        for i in range(self.threads):
            worker = threading.Thread(target=self._run, args=(self.seed + i,), daemon=True)
            worker.start()
            self._workers.append(worker)

    def stop(self) -> int:
        self._stop.set()
        for worker in self._workers:
            worker.join(10)
        return self.sent

    def _run(self, seed: int) -> None:
        rng = random.Random(seed)
        conns: dict[int, http.client.HTTPConnection] = {}
        while not self._stop.is_set() and self.sent < self.limit:
            port = rng.choice(self.ports)
            name = f"flood-{rng.getrandbits(64):016x}"
            try:
                conn = conns.setdefault(port, http.client.HTTPConnection("127.0.0.1", port, 2))
                conn.request("GET", f"/id/{name}")
                conn.getresponse().read()
            except (OSError, http.client.HTTPException):
                conns.pop(port, None)  # a node restarting: open a new connection next time
            self.sent += 1


def wait_for(condition: Callable[[], bool], timeout: float) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if condition():
            return True
        time.sleep(0.1)
    return False


def cluster_primary_kill9(cluster: Cluster, rng: random.Random, hold: float) -> None:
    """kill -9 of the primary serving the tag (its list holding ranges); the
    cluster promotes its replica; the old primary comes back ``hold`` s later, a
    replica with no data."""
    group = cluster.redis_cluster_of()
    redis = cluster.redis_client()
    wait_for(lambda: bool(redis.llen(f"idpool:{{{cluster.tag}}}:pool")), 20.0)
    primary = group.primary_of(f"{{{cluster.tag}}}")
    replica = group.replicas_of(primary)[0]
    primary.kill9()
    cluster.note(f"redis cluster primary :{primary.port} (the tag's shard) kill -9")
    took = group.wait_promoted(replica, 60.0)
    cluster.note(f"replica :{replica.port} promoted, cluster ok {took:.1f}s after the kill")
    time.sleep(hold)
    group.restart(primary)
    group.wait_ok(60.0)
    cluster.note(f"old primary :{primary.port} restarted empty, back as a replica")


def cluster_failover(cluster: Cluster, rng: random.Random, hold: float) -> None:
    """CLUSTER FAILOVER on the replica of the tag's shard: a planned switch."""
    group = cluster.redis_cluster_of()
    redis = cluster.redis_client()
    wait_for(lambda: bool(redis.llen(f"idpool:{{{cluster.tag}}}:pool")), 20.0)
    replica = group.replicas_of(group.primary_of(f"{{{cluster.tag}}}"))[0]
    group.failover(replica)
    cluster.note(f"CLUSTER FAILOVER: replica :{replica.port} is the tag's primary")
    time.sleep(hold)


def cluster_shard_restart_empty(cluster: Cluster, rng: random.Random, hold: float) -> None:
    """The tag's whole shard (primary and replica) kill -9, down ``hold`` s, then
    both restarted with no data: the list and the high-water mark are gone."""
    group = cluster.redis_cluster_of()
    primary = group.primary_of(f"{{{cluster.tag}}}")
    shard = [primary, *group.replicas_of(primary)]
    for node in shard:
        node.kill9()
    cluster.note(f"redis cluster shard {[n.port for n in shard]} (the tag's) kill -9")
    time.sleep(hold)
    for node in shard:
        group.restart(node)
    group.wait_ok(60.0)
    cluster.note("the shard restarted empty; cluster ok")


@dataclass(frozen=True)
class Scenario:
    name: str
    what: str
    faults: tuple[Fault, ...]  # one is drawn at random for each injection
    redis_mode: str = "aof"
    tolerated: frozenset[str] = frozenset()  # failed-attempt kinds a client may retry past
    expect_events: tuple[str, ...] = ()  # log events the fault must provoke
    env: tuple[tuple[str, str], ...] = ()  # node settings of this scenario
    # Requests may fail on every node (both stores down); they must fail with a 503
    # whose message names every store in ``names_down``, and succeed again after.
    names_down: tuple[str, ...] = ()
    # Stores of the scenario: "single" (one Redis, the run's MariaDB), "sentinel"
    # (Redis primary + replica + three Sentinels), "mysql-replica" (a MariaDB
    # primary + binlog replica of the scenario's own, behind a TCP proxy), "galera"
    # (3 Galera members of the scenario's own; node i on member i) or "cluster" (a
    # Redis Cluster of 3 primaries and 3 replicas).
    topology: str = "single"
    # Seconds in a row that requests may fail on every node (a failover); 0: none may
    failure_budget: float = 0.0
    kind: str = "segment"  # the tag's kind: snowflake scenarios check IDs, not ranges
    step: int = 0  # the tag's step; 0: the suite's (cluster.STEP)


SCENARIOS = (
    Scenario(
        "node-kill9",
        "kill -9 of a random node, restarted a second later",
        (node_kill9,),
        tolerated=NODE_GONE,
    ),
    Scenario(
        "node-sigterm",
        "SIGTERM of a random node (graceful: remainders go back), then restart",
        (node_sigterm,),
        tolerated=NODE_GONE | DRAINING,
    ),
    Scenario(
        "redis-kill9-aof",
        "kill -9 of Redis (AOF everysec: the last second of pops is lost), restart",
        (redis_kill9_aof,),
        expect_events=("range_abandoned",),
    ),
    Scenario(
        "redis-old-rdb",
        "Redis (RDB) snapshot saved, traffic goes on, then kill -9 and restart from it",
        (redis_old_rdb,),
        redis_mode="rdb",
        expect_events=("range_abandoned",),
    ),
    # expect_events below: proof that the nodes or the preloader saw the outage
    # (store_down: a node's background health probe found the store gone)
    Scenario(
        "redis-hang",
        "Redis SIGSTOP for HOLD seconds, then SIGCONT",
        (redis_hang,),
        expect_events=("store_down",),
    ),
    Scenario(
        "redis-down",
        "Redis shut down for HOLD seconds, then started",
        (redis_down,),
        expect_events=("store_down",),
    ),
    Scenario(
        "mysql-down",
        "MariaDB shut down for HOLD seconds, then started",
        (mysql_down,),
        expect_events=("store_down",),
    ),
    Scenario(
        "mysql-hang",
        "MariaDB SIGSTOP for HOLD seconds, then SIGCONT",
        (mysql_hang,),
        expect_events=("store_down",),
    ),
    Scenario(
        "mysql-rewind",
        "ledger row dumped, traffic goes on, then the old dump is restored (max_id goes back)",
        (mysql_rewind,),
        expect_events=("stale_ledger",),
        # a small pool, so the preloader claims from the rewound ledger within seconds
        env=(
            ("IDPOOL_POOL_SECONDS", "2"),
            ("IDPOOL_POOL_DEPTH", "5"),
            ("IDPOOL_MAX_POOL_DEPTH", "20"),
        ),
    ),
    Scenario(
        "redis-blip-mysql-rewind",
        "two faults: Redis paused under a second (claims skip it), then the ledger row "
        "restored from a dump taken before",
        (redis_blip_mysql_rewind,),
        expect_events=("stale_ledger",),
        env=(
            ("IDPOOL_POOL_SECONDS", "2"),
            ("IDPOOL_POOL_DEPTH", "5"),
            ("IDPOOL_MAX_POOL_DEPTH", "20"),
        ),
    ),
    Scenario(
        "unknown-tag-flood",
        "MariaDB shut down for HOLD seconds while clients flood every node with made-up tags",
        (unknown_tag_flood_mysql_down,),
        expect_events=("store_down",),
    ),
    Scenario(
        "both-down",
        "Redis and MariaDB shut down for HOLD seconds (nodes serve their buffers), then started",
        (both_down,),
        tolerated=frozenset({"503 unavailable"}),
        expect_events=("request_failed",),
        names_down=("mysql", "redis"),
        # no reserve beyond Leaf's two ranges, so the buffers run dry within the hold
        env=(("IDPOOL_RESERVE_SECONDS", "0"),),
    ),
    Scenario(
        "redis-sentinel",
        "Redis primary + replica + 3 Sentinels: replica made to lag, primary kill -9, "
        "Sentinel promotes the lagging replica; the old primary is back HOLD s later",
        (redis_sentinel_failover,),
        expect_events=("range_abandoned",),
        topology="sentinel",
        tolerated=frozenset({"503 unavailable"}),
        failure_budget=5.0,
        # a mark counts once the replica has it: the failover cannot lose one
        env=(("IDPOOL_REDIS_MARK_REPLICAS", "1"),),
    ),
    Scenario(
        "redis-sentinel-return",
        "as redis-sentinel, but the old primary restarts (a master, with its AOF) while "
        "the Sentinels fail over, and is turned into a replica",
        (redis_sentinel_return,),
        expect_events=("range_abandoned",),
        topology="sentinel",
        tolerated=frozenset({"503 unavailable"}),
        failure_budget=5.0,
        # a mark counts once the replica has it: the failover cannot lose one
        env=(("IDPOOL_REDIS_MARK_REPLICAS", "1"),),
    ),
    Scenario(
        "mysql-replica",
        "MariaDB primary + binlog replica behind a TCP proxy: replica lagging (SQL thread "
        "stopped), primary kill -9, replica promoted as it is, proxy switched to it",
        (mysql_replica_failover,),
        expect_events=("stale_ledger",),
        topology="mysql-replica",
    ),
    # Snowflake tags (issue 25): no ranges, so the check is on the IDs themselves
    # (ops/faultsuite/snowflake.py): no duplicate, time-ordered at the scale of a second.
    Scenario(
        "snowflake-node-kill9",
        "snowflake tag: kill -9 of a random node, restarted a second later on its port",
        (node_kill9,),
        tolerated=NODE_GONE,
        kind="snowflake",
        env=SNOWFLAKE_ENV,
        expect_events=("worker_granted",),
    ),
    Scenario(
        "snowflake-redis-empty",
        "snowflake tag: kill -9 of a Redis that saves nothing, restarted empty: every "
        "holder loses its worker ID, nothing is granted for one lease (3 s)",
        (redis_restart_empty,),
        redis_mode="rdb",
        tolerated=frozenset({"503 worker_unavailable"}),
        failure_budget=8.0,
        kind="snowflake",
        env=SNOWFLAKE_ENV,
        expect_events=("worker_lease_lost",),
    ),
    Scenario(
        "snowflake-redis-hang",
        "snowflake tag: Redis SIGSTOP for HOLD seconds (under the lease less its margin), "
        "then SIGCONT: renewals fail, holders serve on",
        (redis_hang,),
        kind="snowflake",
        # renewals every 2 s that give up after 1 s: one fails within any 3 s hang,
        # while the lease (8 s less 1 s) outlasts it
        env=(
            ("IDPOOL_WORKER_LEASE_SECONDS", "8"),
            ("IDPOOL_WORKER_MARGIN_SECONDS", "1"),
            ("IDPOOL_STORE_TIMEOUT", "1"),
        ),
        expect_events=("worker_renew_failed",),
    ),
    Scenario(
        "galera",
        "3 Galera members, node i and the preloader on members of their own, a small pool "
        "(nodes claim from their own member, racing each other): a random member kill -9, "
        "restarted HOLD s later (rejoins by IST/SST)",
        (galera_member_kill9,),
        expect_events=("store_down",),
        topology="galera",
        # a node on the dead member whose buffers and the pool ran dry answers 503
        # and the client tries the next node; no request may fail on every node
        tolerated=frozenset({"503 unavailable"}),
        # nodes keep no reserve beyond their two ranges, the pool holds two, and
        # ranges are small: each node claims from its own member several times a
        # second, racing the others (certification conflicts, claimed again)
        step=100,
        env=(
            ("IDPOOL_RESERVE_SECONDS", "0"),
            ("IDPOOL_POOL_SECONDS", "0"),
            ("IDPOOL_POOL_DEPTH", "2"),
            ("IDPOOL_MAX_POOL_DEPTH", "2"),
        ),
    ),
    Scenario(
        "cluster-primary-kill9",
        "Redis Cluster 3+3: kill -9 of the primary serving the tag, its replica promoted; "
        "the old primary back HOLD s later",
        (cluster_primary_kill9,),
        expect_events=("range_abandoned",),
        topology="cluster",
        tolerated=frozenset({"503 unavailable"}),
        failure_budget=5.0,
        env=(("IDPOOL_REDIS_MARK_REPLICAS", "1"),),
    ),
    Scenario(
        "cluster-failover",
        "Redis Cluster 3+3: CLUSTER FAILOVER of the tag's shard (a planned switch)",
        (cluster_failover,),
        expect_events=("range_abandoned",),
        topology="cluster",
        tolerated=frozenset({"503 unavailable"}),
        failure_budget=5.0,
        env=(("IDPOOL_REDIS_MARK_REPLICAS", "1"),),
    ),
    Scenario(
        "cluster-shard-empty",
        "Redis Cluster 3+3: the tag's whole shard (primary and replica) kill -9, down "
        "HOLD s, restarted empty",
        (cluster_shard_restart_empty,),
        expect_events=("store_down",),
        topology="cluster",
        tolerated=frozenset({"503 unavailable"}),
        failure_budget=5.0,
        env=(("IDPOOL_REDIS_MARK_REPLICAS", "1"),),
    ),
    Scenario(
        "mixed",
        "random faults of every kind above, one at a time",
        (
            node_kill9,
            node_sigterm,
            redis_kill9_aof,
            redis_hang,
            redis_down,
            mysql_down,
            mysql_hang,
            mysql_rewind,
            redis_blip_mysql_rewind,
            unknown_tag_flood_mysql_down,
        ),
        tolerated=NODE_GONE | DRAINING,
    ),
)
