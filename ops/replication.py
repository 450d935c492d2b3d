"""Replicated store servers of our own on loopback, for the fault suite and the
tests: a Redis primary + replica watched by three Sentinels, and a MariaDB
primary + replica with binlog replication behind a TCP proxy.

Both can be made to *lag* for real, then lose their primary (``kill -9``) and
fail over to the lagging replica, which is the case the fencing in
docs/design/failovers.md is for:

- Redis: ``lag_replica()`` points the replica at a port where nothing listens
  (``REPLICAOF 127.0.0.1 <closed port>``). It keeps its data and replication ID
  but receives nothing more, while the primary goes on taking writes. (Pausing
  the replica with SIGSTOP does not make it lag: the kernel keeps the stream in
  the socket buffers and the replica reads it all when it resumes, even after
  the primary died.) Sentinel would point a replica that follows the wrong
  master back at the right one after about 8 s (``+fix-slave-config``), so the
  primary is killed within a few seconds of the lag starting.
- MariaDB: ``lag_replica()`` is ``STOP SLAVE SQL_THREAD``: the replica keeps
  receiving the binlog but applies none of it; ``promote_replica()`` discards
  what it has not applied (``RESET SLAVE ALL``), as an asynchronous failover
  does, turns ``read_only`` off and moves the proxy to it.
"""

from __future__ import annotations

import shutil
import subprocess
import time
from pathlib import Path

from redis import Redis
from redis.exceptions import RedisError

from .processes import free_port, wait_for_port
from .servers import MariaServer, RedisServer, ServerProcess, TcpProxy

SERVICE = "mymaster"
DOWN_AFTER_MS = 1000  # Sentinel: a master silent this long is subjectively down
FAILOVER_TIMEOUT_MS = 4000


class SentinelServer(ServerProcess):
    """``redis-server sentinel.conf --sentinel`` of our own, watching one master."""

    def __init__(self, directory: Path, master_port: int, quorum: int) -> None:
        super().__init__(directory)
        self.master_port = master_port
        self.quorum = quorum

    def start(self) -> SentinelServer:
        self.dir.mkdir(parents=True, exist_ok=True)
        conf = self.dir / "sentinel.conf"
        if not conf.exists():  # Sentinel rewrites its file; a restart keeps what it learnt
            conf.write_text(
                "\n".join(
                    [
                        f"port {self.port}",
                        "bind 127.0.0.1",
                        f"dir {self.dir}",
                        f"logfile {self.dir / 'sentinel.log'}",
                        f"sentinel monitor {SERVICE} 127.0.0.1 {self.master_port} {self.quorum}",
                        f"sentinel down-after-milliseconds {SERVICE} {DOWN_AFTER_MS}",
                        # Sentinel starts no new failover of a master within twice this
                        # of the last one: the suite's failovers come seconds apart
                        f"sentinel failover-timeout {SERVICE} {FAILOVER_TIMEOUT_MS}",
                        f"sentinel parallel-syncs {SERVICE} 1",
                        "",
                    ]
                )
            )
        self.proc = subprocess.Popen(["redis-server", str(conf), "--sentinel"])
        wait_for_port(self.port)
        return self


class RedisSentinelGroup:
    """A Redis primary, one replica and three Sentinels (quorum 2).

    ``url`` is the ``redis+sentinel://`` URL idpool is given; ``port`` is the port
    of whichever server the Sentinels call master now.
    """

    def __init__(self, directory: Path, *redis_args: str, sentinels: int = 3) -> None:
        self.dir = directory
        # A full resync starts at once, not after Redis's default 5 s wait for more
        # replicas (a returning old primary always needs one: its replication ID is gone).
        redis_args = ("--repl-diskless-sync-delay", "0", *redis_args)
        self.servers = [
            RedisServer(directory / "redis-a", *redis_args),
            RedisServer(directory / "redis-b", *redis_args),
        ]
        first = self.servers[0]
        # the replica's own option: it follows the first server from its first start
        self.servers[1].args += ("--replicaof", "127.0.0.1", str(first.port))
        self.sentinels = [
            SentinelServer(directory / f"sentinel{i}", first.port, quorum=2)
            for i in range(sentinels)
        ]

    @property
    def url(self) -> str:
        hosts = ",".join(f"127.0.0.1:{s.port}" for s in self.sentinels)
        return f"redis+sentinel://{hosts}/{SERVICE}/0"

    def start(self) -> RedisSentinelGroup:
        """Start the servers, then the Sentinels; on any failure stop what started
        (a caller holding no group yet could not)."""
        try:
            for server in self.servers:
                server.start()
            self.wait_replicated(self.servers[1], 20.0)
            for sentinel in self.sentinels:
                sentinel.start()
            self.wait_master(self.servers[0].port, 20.0)
        except BaseException:
            self.stop()
            raise
        return self

    # -- who is who -------------------------------------------------------------

    def sentinel_view(self) -> list[int | None]:
        """The master's port according to each Sentinel (None: no answer)."""
        ports: list[int | None] = []
        for sentinel in self.sentinels:
            try:
                client = Redis(port=sentinel.port, socket_timeout=1)
                addr = client.sentinel_get_master_addr_by_name(SERVICE)
                ports.append(int(addr[1]) if isinstance(addr, tuple) else None)
            except (RedisError, OSError):
                ports.append(None)
        return ports

    @property
    def port(self) -> int:
        """The current master's port, by the Sentinels' majority."""
        votes = [p for p in self.sentinel_view() if p is not None]
        if not votes:
            raise RuntimeError("no Sentinel answers")
        return max(set(votes), key=votes.count)

    def master(self) -> RedisServer:
        port = self.port
        return next(s for s in self.servers if s.port == port)

    def replica(self) -> RedisServer:
        port = self.port
        return next(s for s in self.servers if s.port != port)

    def wait_master(self, port: int, timeout: float) -> float:
        """Wait until every Sentinel names ``port`` as master and it says it is one;
        returns the seconds waited."""
        started = time.monotonic()
        deadline = started + timeout
        while time.monotonic() < deadline:
            if all(p == port for p in self.sentinel_view()) and self._role(port) == "master":
                # and the Sentinels see it up (redis-py refuses a master they see down)
                return time.monotonic() - started
            time.sleep(0.1)
        raise TimeoutError(f"Sentinels did not settle on master {port}: {self.sentinel_view()}")

    def wait_replicated(self, replica: RedisServer, timeout: float) -> float:
        """Wait until ``replica``'s link to its master is up and it has applied every
        write the master had taken when called (a link up alone may still lack the
        last ones); returns the seconds waited."""
        started = time.monotonic()
        role = None
        target = None
        while time.monotonic() - started < timeout:
            try:
                info = Redis(port=replica.port, socket_timeout=1).info("replication")
                role = info.get("role")
                if target is None and info.get("master_link_status") == "up":
                    master = Redis(port=int(info["master_port"]), socket_timeout=1)
                    target = int(master.info("replication")["master_repl_offset"])
                done = int(info.get("slave_repl_offset", -1))
                if target is not None and info.get("master_link_status") == "up" and done >= target:
                    return time.monotonic() - started
            except (RedisError, OSError):
                pass
            time.sleep(0.1)
        raise TimeoutError(
            f"redis {replica.port} did not sync with its master in {timeout:.0f}s (role: {role})"
        )

    def wait_failover_started(self, timeout: float) -> float:
        """Wait until a Sentinel sees the master objectively down or is failing it
        over; returns the seconds waited."""
        started = time.monotonic()
        while time.monotonic() - started < timeout:
            for sentinel in self.sentinels:
                try:
                    state = Redis(port=sentinel.port, socket_timeout=1).sentinel_master(SERVICE)
                except (RedisError, OSError):
                    continue
                flags = str(state.get("flags", "")) if isinstance(state, dict) else ""
                if "o_down" in flags or "failover_in_progress" in flags:
                    return time.monotonic() - started
            time.sleep(0.05)
        raise TimeoutError("no Sentinel started a failover")

    @staticmethod
    def _role(port: int) -> str | None:
        try:
            return str(Redis(port=port, socket_timeout=1).info("replication")["role"])
        except (RedisError, OSError):
            return None

    # -- faults -----------------------------------------------------------------

    def lag_replica(self) -> RedisServer:
        """The replica stops receiving the primary's writes (see the module docstring)."""
        replica = self.replica()
        Redis(port=replica.port, socket_timeout=2).replicaof("127.0.0.1", free_port())
        return replica

    def replica_offset_behind(self) -> int:
        """Bytes of replication stream the replica lacks (master offset - replica offset)."""
        master = Redis(port=self.master().port, socket_timeout=2).info("replication")
        replica = Redis(port=self.replica().port, socket_timeout=2).info("replication")
        done = int(replica.get("slave_repl_offset", replica.get("master_repl_offset", 0)))
        return int(master["master_repl_offset"]) - done

    # -- whole group (for the fault suite's clean-up) ---------------------------

    def ensure_up(self) -> None:
        """Every server and Sentinel running (after a fault went wrong)."""
        servers: list[RedisServer | SentinelServer] = [*self.servers, *self.sentinels]
        for server in servers:
            if server.proc is None:
                server.start()
            else:
                server.resume()

    def stop(self) -> None:
        for server in [*self.sentinels, *self.servers]:
            if server.proc is not None:
                server.resume()
                server.stop()


class MariaPair:
    """A MariaDB primary and a binlog replica, clients reaching the primary through a
    TCP proxy (``port``) that ``promote_replica`` moves to the replica.

    Offers what the fault suite's cluster uses of a single ``MariaServer``
    (``url``, ``client``; ``proc``, ``start``, ``resume`` act on the primary).
    Both servers write a binary log, so either can be the primary; after a
    failover ``rebuild_replica`` turns the dead one into a fresh replica of the
    new primary (a new datadir loaded from a dump), ready for the next failover.
    """

    def __init__(self, directory: Path) -> None:
        self.dir = directory
        self._server_ids = 0
        self.primary = self._server(directory / "a")
        self.replica = self._server(directory / "b")
        self.proxy: TcpProxy | None = None

    def _server(self, directory: Path) -> MariaServer:
        self._server_ids += 1
        return MariaServer(
            directory,
            f"--server-id={self._server_ids}",
            "--log-bin=mysql-bin",
            "--binlog-format=ROW",
            "--read-only=1",  # every server starts as a replica; the primary is opened by SQL
        )

    @property
    def port(self) -> int:
        assert self.proxy is not None
        return self.proxy.port

    @property
    def proc(self) -> subprocess.Popen[bytes] | None:
        return self.primary.proc

    def url(self, database: str) -> str:
        return f"mysql://root@127.0.0.1:{self.port}/{database}"

    def client(self, program: str = "mariadb") -> list[str]:
        return [program, "--no-defaults", "-h127.0.0.1", f"-P{self.port}", "-uroot"]

    def start(self) -> MariaPair:
        if self.proxy is not None:  # a restart of the primary (fault suite clean-up)
            self.primary.start()
            self.sql(self.primary, "SET GLOBAL read_only = 0")
            return self
        self.primary.start()
        self.replica.start()
        self.sql(self.primary, "SET GLOBAL read_only = 0")
        self._follow(self.replica)
        self.proxy = TcpProxy(self.primary.port)
        return self

    def resume(self) -> None:
        self.primary.resume()

    def stop(self) -> None:
        for server in (self.primary, self.replica):
            if server.proc is not None:
                server.resume()
                server.stop()
        if self.proxy is not None:
            self.proxy.cut()

    # -- replication ------------------------------------------------------------

    @staticmethod
    def sql(server: MariaServer, statement: str, database: str = "") -> str:
        return subprocess.run(
            [*server.client(), "-N", "-e", statement, *([database] if database else [])],
            check=True,
            capture_output=True,
            text=True,
            timeout=30,
        ).stdout

    def _follow(self, replica: MariaServer) -> None:
        self.sql(
            replica,
            f"CHANGE MASTER TO MASTER_HOST='127.0.0.1', MASTER_PORT={self.primary.port}, "
            "MASTER_USER='root', MASTER_PASSWORD='', MASTER_USE_GTID=slave_pos; START SLAVE",
        )

    def wait_replicated(self, timeout: float) -> None:
        """Wait until the replica has applied everything the primary wrote."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            target = self.sql(self.primary, "SELECT @@gtid_binlog_pos").strip()
            done = self.sql(self.replica, "SELECT @@gtid_slave_pos").strip()
            if target == done:
                return
            time.sleep(0.1)
        raise TimeoutError("MariaDB replica did not catch up")

    def lag_replica(self) -> None:
        """The replica keeps fetching the binlog but applies none of it."""
        self.sql(self.replica, "STOP SLAVE SQL_THREAD")

    def promote_replica(self) -> None:
        """Promote the replica as it is (what it has not applied is lost, as in an
        asynchronous failover), open it for writes and move the proxy to it."""
        self.sql(self.replica, "STOP SLAVE; RESET SLAVE ALL; SET GLOBAL read_only = 0")
        self.primary, self.replica = self.replica, self.primary
        assert self.proxy is not None
        self.proxy.retarget(self.primary.port)

    def rebuild_replica(self) -> None:
        """Replace the old (dead) primary by a fresh replica of the new one: a new
        datadir, loaded from a consistent dump, following from the dump's GTID."""
        old = self.replica
        if old.proc is not None:
            old.kill9()
        shutil.rmtree(old.dir, ignore_errors=True)
        self.replica = fresh = self._server(old.dir)
        fresh.start()
        system = ("information_schema", "mysql", "performance_schema", "sys")
        databases = [d for d in self.sql(self.primary, "SHOW DATABASES").split() if d not in system]
        if databases:
            dump = subprocess.run(
                [
                    *self.primary.client("mariadb-dump"),
                    "--single-transaction",
                    "--gtid",
                    "--master-data=1",
                    "--databases",
                    *databases,
                ],
                check=True,
                capture_output=True,
                timeout=60,
            ).stdout
            subprocess.run(fresh.client(), input=dump, check=True, timeout=60)
        self._follow(fresh)
