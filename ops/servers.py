"""Store servers of our own on loopback, for the tests, the fault-injection suite
and the benchmark.

A private redis-server and a private mariadbd that can be killed, paused and
restarted by PID, and a TCP proxy that can cut a store off from a node without
stopping the store. `idpool` processes themselves are in ``ops/processes.py``.
"""

from __future__ import annotations

import contextlib
import signal
import socket
import subprocess
import threading
from pathlib import Path

from .processes import free_port, wait_for_port


class ServerProcess:
    """A server of our own on a free port: killed, stopped, paused by its PID only."""

    stop_timeout = 10.0

    def __init__(self, directory: Path) -> None:
        self.dir = directory
        self.port = free_port()
        self.proc: subprocess.Popen[bytes] | None = None

    def kill9(self) -> None:
        if self.proc is not None:
            self.proc.send_signal(signal.SIGKILL)
            self.proc.wait()
            self.proc = None

    def stop(self) -> None:
        """SIGTERM and wait: a clean shutdown (Redis writes its AOF/RDB, InnoDB flushes)."""
        if self.proc is not None:
            self.proc.terminate()
            self.proc.wait(self.stop_timeout)
            self.proc = None

    def pause(self) -> None:
        """SIGSTOP: the server hangs; connections stay open but nothing answers."""
        assert self.proc is not None
        self.proc.send_signal(signal.SIGSTOP)

    def resume(self) -> None:
        assert self.proc is not None
        self.proc.send_signal(signal.SIGCONT)


class RedisServer(ServerProcess):
    """A redis-server of the test's own, on its own port and directory."""

    def __init__(self, directory: Path, *args: str) -> None:
        super().__init__(directory)
        self.args = args

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def start(self) -> RedisServer:
        self.dir.mkdir(parents=True, exist_ok=True)
        self.proc = subprocess.Popen(
            [
                "redis-server",
                "--port",
                str(self.port),
                "--bind",
                "127.0.0.1",
                "--dir",
                str(self.dir),
                "--logfile",
                str(self.dir / "redis.log"),
                *self.args,
            ],
        )
        wait_for_port(self.port)
        return self


class MariaServer(ServerProcess):
    """A mariadbd of its own (own datadir, port and socket): stoppable, unlike the shared one.

    ``args`` are more mariadbd options (``--server-id=1``, ``--log-bin=...`` for a
    replication primary); without a ``--log-bin`` the binary log is off.
    """

    stop_timeout = 60.0

    def __init__(self, directory: Path, *args: str) -> None:
        super().__init__(directory)
        self.args = args

    def url(self, database: str) -> str:
        return f"mysql://root@127.0.0.1:{self.port}/{database}"

    def client(self, program: str = "mariadb") -> list[str]:
        """Command line of a client (mariadb, mariadb-dump) connected to this server."""
        return [program, "--no-defaults", "-h127.0.0.1", f"-P{self.port}", "-uroot"]

    def start(self, timeout: float = 60.0) -> MariaServer:
        data = self.dir / "data"
        if not data.exists():
            self.dir.mkdir(parents=True, exist_ok=True)
            # --no-defaults: the machine's my.cnf names the shared server's user and paths
            subprocess.run(
                [
                    "mariadb-install-db",
                    "--no-defaults",
                    "--user=root",
                    f"--datadir={data}",
                    "--auth-root-authentication-method=normal",
                    "--skip-test-db",
                ],
                check=True,
                stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL,
            )
        self.proc = subprocess.Popen(
            [
                "mariadbd",
                "--no-defaults",
                "--user=root",
                f"--datadir={data}",
                f"--port={self.port}",
                "--bind-address=127.0.0.1",
                f"--socket={self.dir / 'mysqld.sock'}",
                f"--pid-file={self.dir / 'mysqld.pid'}",
                f"--log-error={self.dir / 'mysqld.err'}",
                "--innodb-buffer-pool-size=32M",
                "--innodb-log-file-size=16M",
                *(() if any(a.startswith("--log-bin") for a in self.args) else ("--skip-log-bin",)),
                *self.args,
            ],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        wait_for_port(self.port, timeout)
        return self


class TcpProxy:
    """Forwards 127.0.0.1:port to a target; `cut()` drops every connection and
    refuses new ones until `restore()`, like a store that went away."""

    def __init__(self, target_port: int) -> None:
        self.target_port = target_port  # change it with retarget()
        self.port = free_port()
        self._listener: socket.socket | None = None
        self._conns: list[socket.socket] = []
        self._lock = threading.Lock()
        self.restore()

    def restore(self) -> None:
        listener = socket.socket()
        listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        listener.bind(("127.0.0.1", self.port))
        listener.listen(64)
        self._listener = listener
        threading.Thread(target=self._accept, args=(listener,), daemon=True).start()

    def cut(self) -> None:
        with self._lock:
            if self._listener is not None:
                # shutdown wakes the thread blocked in accept(); close alone would not
                with contextlib.suppress(OSError):
                    self._listener.shutdown(socket.SHUT_RDWR)
                self._listener.close()
                self._listener = None
            for conn in self._conns:
                with contextlib.suppress(OSError):
                    conn.shutdown(socket.SHUT_RDWR)
                conn.close()
            self._conns.clear()

    close = cut

    def retarget(self, target_port: int) -> None:
        """Point the address at another server, as a virtual IP or proxy moves in a
        failover: every open connection is dropped, new ones reach the new target."""
        self.cut()
        self.target_port = target_port
        self.restore()

    def _accept(self, listener: socket.socket) -> None:
        while True:
            try:
                client, _ = listener.accept()
            except OSError:
                return
            try:
                upstream = socket.create_connection(("127.0.0.1", self.target_port))
            except OSError:
                client.close()
                continue
            with self._lock:
                if self._listener is not listener:
                    client.close()
                    upstream.close()
                    return
                self._conns += [client, upstream]
            for a, b in ((client, upstream), (upstream, client)):
                threading.Thread(target=_pipe, args=(a, b), daemon=True).start()


def _pipe(src: socket.socket, dst: socket.socket) -> None:
    try:
        while data := src.recv(65536):
            dst.sendall(data)
    except OSError:
        pass
    finally:
        with contextlib.suppress(OSError):
            dst.shutdown(socket.SHUT_WR)
