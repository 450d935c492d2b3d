"""Replicated store servers of our own on loopback, for the fault suite and the
tests: a Redis primary + replica watched by three Sentinels, and a MariaDB
primary + replica with binlog replication behind a TCP proxy.

Both can be made to *lag* for real, then lose their primary (``kill -9``) and
fail over to the lagging replica, which is the case the fencing in
docs/design.md is for:

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

import subprocess
import time
from pathlib import Path

from redis import Redis
from redis.exceptions import RedisError

from .processes import free_port, wait_for_port
from .servers import MariaServer, RedisServer, ServerProcess, TcpProxy

SERVICE = "mymaster"
DOWN_AFTER_MS = 1000  # Sentinel: a master silent this long is subjectively down


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
                        f"sentinel failover-timeout {SERVICE} 10000",
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
        for server in self.servers:
            server.start()
        self.wait_replicated(self.servers[1], 20.0)
        for sentinel in self.sentinels:
            sentinel.start()
        self.wait_master(self.servers[0].port, 20.0)
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

    def wait_replicated(self, replica: RedisServer, timeout: float) -> None:
        """Wait until ``replica``'s link to its master is up and in sync."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            try:
                info = Redis(port=replica.port, socket_timeout=1).info("replication")
                if info.get("master_link_status") == "up":
                    return
            except (RedisError, OSError):
                pass
            time.sleep(0.1)
        raise TimeoutError(f"redis {replica.port} did not sync with its master")

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

    def stop(self) -> None:
        for server in [*self.sentinels, *self.servers]:
            if server.proc is not None:
                server.resume()
                server.stop()


class MariaPair:
    """A MariaDB primary and a binlog replica, clients reaching the primary through a
    TCP proxy (``port``) that ``promote_replica`` moves to the replica.

    Offers what the fault suite's cluster uses of a single ``MariaServer``
    (``url``, ``client``; ``proc``, ``start``, ``resume``, ... act on the
    server the proxy points at).
    """

    def __init__(self, directory: Path) -> None:
        self.dir = directory
        self.primary = MariaServer(
            directory / "primary", "--server-id=1", "--log-bin=mysql-bin", "--binlog-format=ROW"
        )
        self.replica = MariaServer(
            directory / "replica", "--server-id=2", "--read-only=1", "--relay-log=relay-bin"
        )
        self.proxy: TcpProxy | None = None
        self.promoted = False

    @property
    def active(self) -> MariaServer:
        return self.replica if self.promoted else self.primary

    @property
    def port(self) -> int:
        assert self.proxy is not None
        return self.proxy.port

    @property
    def proc(self) -> subprocess.Popen[bytes] | None:
        return self.active.proc

    def url(self, database: str) -> str:
        return f"mysql://root@127.0.0.1:{self.port}/{database}"

    def client(self, program: str = "mariadb") -> list[str]:
        return [program, "--no-defaults", "-h127.0.0.1", f"-P{self.port}", "-uroot"]

    def start(self) -> MariaPair:
        if self.proxy is not None:  # a restart of the active server (fault suite clean-up)
            self.active.start()
            return self
        self.primary.start()
        self.replica.start()
        self.sql(
            self.replica,
            f"CHANGE MASTER TO MASTER_HOST='127.0.0.1', MASTER_PORT={self.primary.port}, "
            "MASTER_USER='root', MASTER_PASSWORD='', MASTER_USE_GTID=slave_pos; START SLAVE",
        )
        self.proxy = TcpProxy(self.primary.port)
        return self

    def resume(self) -> None:
        self.active.resume()

    def stop(self) -> None:
        for server in (self.primary, self.replica):
            if server.proc is not None:
                server.resume()
                server.stop()
        if self.proxy is not None:
            self.proxy.cut()

    # -- replication ------------------------------------------------------------

    @staticmethod
    def sql(server: MariaServer, statement: str) -> str:
        return subprocess.run(
            [*server.client(), "-N", "-e", statement],
            check=True,
            capture_output=True,
            text=True,
            timeout=30,
        ).stdout

    def replica_status(self) -> dict[str, str]:
        out = subprocess.run(
            [*self.replica.client(), "-e", "SHOW SLAVE STATUS\\G"],
            check=True,
            capture_output=True,
            text=True,
            timeout=30,
        ).stdout
        status = {}
        for line in out.splitlines():
            key, sep, value = line.strip().partition(": ")
            if sep:
                status[key] = value
        return status

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

    def promote_replica(self) -> str:
        """Promote the replica as it is (what it has not applied is lost) and move the
        proxy to it. Returns the GTID position it was promoted at."""
        self.sql(self.replica, "STOP SLAVE; RESET SLAVE ALL; SET GLOBAL read_only = 0")
        position = self.sql(self.replica, "SELECT @@gtid_slave_pos").strip()
        self.promoted = True
        assert self.proxy is not None
        self.proxy.retarget(self.replica.port)
        return position
