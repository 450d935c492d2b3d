"""A MariaDB Galera cluster of our own on loopback, for the tests and the fault suite.

Three (or more) ``mariadbd`` members with Debian's ``galera-4`` provider, every
port free and private: each member's SQL port, its group-communication port
(Galera's 4567), its IST port (4568) and its SST port (4444). The first member
bootstraps the cluster (``--wsrep-new-cluster``); the others join it and get
their data by SST (``wsrep_sst_method=rsync``). The rsync SST runs as the
member's user, so members started by root run as ``mysql`` in a temp directory
that user owns (``tempfile``'s own directories are 0700 root: the cluster makes
its own, removed by ``stop()``); started by anyone else they run as that user.

Failure detection is shortened (a member killed with ``-9`` is evicted after
about 2 s rather than Galera's 5-15 s), so a test or fault scenario sees the
cluster shrink and grow back within seconds.
"""

from __future__ import annotations

import os
import pwd
import shutil
import subprocess
import tempfile
import time
from pathlib import Path

from .processes import free_port
from .servers import ServerProcess

PROVIDERS = ("/usr/lib/galera/libgalera_smm.so", "/usr/lib/libgalera_smm.so")
# the rsync SST runs as the member's user, who must own the datadir; mariadbd
# changes user only when started by root
USER = "mysql" if os.geteuid() == 0 else pwd.getpwuid(os.geteuid()).pw_name

# keepalive <= inactive_check <= suspect <= inactive (Galera refuses other orders)
_PROVIDER_OPTIONS = (
    "evs.keepalive_period=PT0.5S",
    "evs.inactive_check_period=PT0.5S",
    "evs.suspect_timeout=PT2S",
    "evs.inactive_timeout=PT3S",
    "evs.install_timeout=PT3S",
    "gcache.size=64M",
    "pc.wait_prim_timeout=PT10S",
)


def provider() -> str:
    """The wsrep provider library (Debian's galera-4 package)."""
    for path in PROVIDERS:
        if Path(path).exists():
            return path
    raise FileNotFoundError(f"no Galera provider at {' or '.join(PROVIDERS)}: install galera-4")


class GaleraMember(ServerProcess):
    """One ``mariadbd`` of the cluster: its own datadir, SQL, gcomm, IST and SST ports."""

    stop_timeout = 60.0

    def __init__(self, directory: Path, name: str) -> None:
        super().__init__(directory)
        self.name = name
        self.gcomm_port = free_port()
        self.ist_port = free_port()
        self.sst_port = free_port()

    def url(self, database: str) -> str:
        return f"mysql://root@127.0.0.1:{self.port}/{database}"

    def client(self, program: str = "mariadb") -> list[str]:
        return [program, "--no-defaults", "-h127.0.0.1", f"-P{self.port}", "-uroot"]

    @property
    def data(self) -> Path:
        return self.dir / "data"

    def start(self, peers: list[GaleraMember] | None = None, *, bootstrap: bool = False) -> None:
        """Start the member; it joins ``peers`` (or bootstraps a new cluster)."""
        addresses = ",".join(f"127.0.0.1:{p.gcomm_port}" for p in peers or [])
        options = (
            f"gmcast.listen_addr=tcp://127.0.0.1:{self.gcomm_port}",
            f"ist.recv_addr=127.0.0.1:{self.ist_port}",
            *_PROVIDER_OPTIONS,
        )
        args = [
            "mariadbd",
            "--no-defaults",
            f"--user={USER}",
            f"--datadir={self.data}",
            f"--port={self.port}",
            "--bind-address=127.0.0.1",
            f"--socket={self.dir / 'mysqld.sock'}",
            f"--pid-file={self.dir / 'mysqld.pid'}",
            f"--log-error={self.dir / 'mysqld.err'}",
            "--innodb-buffer-pool-size=32M",
            "--innodb-log-file-size=16M",
            "--innodb-autoinc-lock-mode=2",
            "--innodb-flush-log-at-trx-commit=2",  # Galera's durability is the other members
            "--binlog-format=ROW",
            "--skip-log-bin",
            "--wsrep-on=ON",
            f"--wsrep-provider={provider()}",
            f"--wsrep-cluster-address=gcomm://{addresses}",
            "--wsrep-cluster-name=idpool-test",
            f"--wsrep-node-name={self.name}",
            f"--wsrep-node-address=127.0.0.1:{self.gcomm_port}",
            f"--wsrep-node-incoming-address=127.0.0.1:{self.port}",
            f"--wsrep-sst-receive-address=127.0.0.1:{self.sst_port}",
            "--wsrep-sst-method=rsync",
            f"--wsrep-provider-options={';'.join(options)}",
            "--wsrep-slave-threads=2",
            *(["--wsrep-new-cluster"] if bootstrap else []),
        ]
        self.proc = subprocess.Popen(args, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)

    def status(self, name: str) -> str | None:
        """A ``wsrep_*`` status variable (None when the member does not answer)."""
        try:
            out = subprocess.run(
                [*self.client(), "-N", "-e", f"SHOW STATUS LIKE '{name}'"],
                capture_output=True,
                text=True,
                timeout=5,
            ).stdout.split()
        except subprocess.TimeoutExpired:
            return None
        return out[1] if len(out) == 2 else None

    def synced(self) -> bool:
        return self.status("wsrep_local_state_comment") == "Synced"

    def sql(self, statement: str, database: str = "") -> str:
        return subprocess.run(
            [*self.client(), "-N", "-e", statement, *([database] if database else [])],
            check=True,
            capture_output=True,
            text=True,
            timeout=30,
        ).stdout


class GaleraCluster:
    """``size`` Galera members on loopback; ``members[i].url(db)`` for a node on member i.

    ``kill9(i)`` and ``rejoin(i)`` are the faults; ``stop()`` stops every member
    by PID and removes the cluster's directory (kept with ``keep=True``).
    """

    def __init__(self, size: int = 3, *, keep: bool = False) -> None:
        self.dir = Path(tempfile.mkdtemp(prefix="idpool-galera-"))
        self.keep = keep
        self.members = [GaleraMember(self.dir / f"m{i}", f"m{i}") for i in range(size)]

    def start(self, timeout: float = 120.0) -> GaleraCluster:
        first = self.members[0]
        os.chmod(self.dir, 0o755)
        for member in self.members:
            member.dir.mkdir()
            member.data.mkdir()
        # The first member's system tables; the others receive them by SST.
        subprocess.run(
            [
                "mariadb-install-db",
                "--no-defaults",
                f"--user={USER}",
                f"--datadir={first.data}",
                "--auth-root-authentication-method=normal",
                "--skip-test-db",
            ],
            check=True,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        if os.geteuid() == 0:
            _give_to_user(self.dir)
        first.start(bootstrap=True)
        self.wait_synced(first, timeout)
        for member in self.members[1:]:
            member.start(self.peers(member))
            self.wait_synced(member, timeout)
        self.wait_size(len(self.members), timeout)
        return self

    # -- what the fault suite's cluster uses of a single server ------------------

    def url(self, database: str) -> str:
        """The first member's URL (``member_url`` for the others)."""
        return self.members[0].url(database)

    def member_url(self, index: int, database: str) -> str:
        return self.members[index % len(self.members)].url(database)

    def client(self, program: str = "mariadb") -> list[str]:
        """A client of the first member that runs."""
        running = [m for m in self.members if m.proc is not None] or self.members
        return running[0].client(program)

    def ensure_up(self) -> None:
        """Every member running again (after a fault went wrong)."""
        for index, member in enumerate(self.members):
            if member.proc is None:
                self.rejoin(index)
            else:
                member.resume()

    def peers(self, member: GaleraMember) -> list[GaleraMember]:
        return [m for m in self.members if m is not member]

    def wait_synced(self, member: GaleraMember, timeout: float) -> float:
        """Wait until ``member`` answers SQL and is Synced; returns the seconds waited."""
        started = time.monotonic()
        deadline = started + timeout
        while time.monotonic() < deadline:
            if member.proc is not None and member.proc.poll() is not None:
                raise RuntimeError(
                    f"galera member {member.name} exited ({member.proc.returncode}); "
                    f"see {member.dir / 'mysqld.err'}"
                )
            if member.synced():
                return time.monotonic() - started
            time.sleep(0.2)
        raise TimeoutError(f"galera member {member.name} not Synced after {timeout}s")

    def wait_size(self, size: int, timeout: float) -> float:
        """Wait until every running member sees a primary component of ``size``."""
        started = time.monotonic()
        deadline = started + timeout
        while time.monotonic() < deadline:
            running = [m for m in self.members if m.proc is not None]
            if all(m.status("wsrep_cluster_size") == str(size) for m in running):
                return time.monotonic() - started
            time.sleep(0.2)
        raise TimeoutError(f"galera cluster did not reach {size} members in {timeout}s")

    def kill9(self, index: int) -> None:
        self.members[index].kill9()

    def rejoin(self, index: int, timeout: float = 120.0) -> float:
        """Start a stopped member again (it catches up by IST or SST); returns the
        seconds until it and every peer are Synced in a primary component of all
        running members (a donor stays Desynced for a while after its joiner is done,
        and holds writes up while it is)."""
        member = self.members[index]
        started = time.monotonic()
        member.start(self.peers(member))
        deadline = started + timeout
        running = [m for m in self.members if m.proc is not None]
        for each in [member, *self.peers(member)]:
            if each.proc is not None:
                self.wait_synced(each, max(deadline - time.monotonic(), 0.0))
        self.wait_size(len(running), max(deadline - time.monotonic(), 1.0))
        return time.monotonic() - started

    def sql(self, statement: str, database: str = "", member: int = 0) -> str:
        return self.members[member].sql(statement, database)

    def stop(self) -> None:
        for member in self.members:
            if member.proc is not None:
                member.resume()
                member.stop()
        if not self.keep:
            shutil.rmtree(self.dir, ignore_errors=True)


def _give_to_user(directory: Path) -> None:
    user = pwd.getpwnam(USER)
    for root, dirs, files in os.walk(directory):
        for name in [root, *(os.path.join(root, n) for n in dirs + files)]:
            os.chown(name, user.pw_uid, user.pw_gid)
