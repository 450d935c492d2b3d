"""Real processes on loopback, for the tests and the fault-injection suite.

A private redis-server and a private mariadbd that can be killed, paused and
restarted; `idpool serve` and `idpool preload` processes logging to files; and a
TCP proxy that can cut a store off from a node without stopping the store.
"""

from __future__ import annotations

import contextlib
import os
import re
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.request
from pathlib import Path


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def wait_for_port(port: int, timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        with contextlib.suppress(OSError), socket.create_connection(("127.0.0.1", port), 0.2):
            return
        time.sleep(0.05)
    raise TimeoutError(f"nothing listening on 127.0.0.1:{port} after {timeout}s")


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
    """A mariadbd of its own (own datadir, port and socket): stoppable, unlike the shared one."""

    stop_timeout = 60.0

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
                "--skip-log-bin",
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
        self.target_port = target_port
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


def env_with(**values: str) -> dict[str, str]:
    env = dict(os.environ)
    env.update(values)
    return env


class NodeProcess:
    """One `idpool serve` process on its own port, logging to a file.

    Each start writes a log file of its own (``logs``), so the ranges one run
    held can be read back after it was killed.
    """

    def __init__(self, env: dict[str, str], log_path: Path, port: int | None = None) -> None:
        self.env = env
        self.port = port or free_port()
        self.log_path = log_path
        self.proc: subprocess.Popen[bytes] | None = None
        self.logs: list[Path] = []  # every log file this node wrote, one per start

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def command(self) -> list[str]:
        return [sys.executable, "-m", "service.cli", "serve", "--port", str(self.port)]

    def start(self, wait: bool = True) -> NodeProcess:
        path = self.log_path.with_suffix(f".{len(self.logs)}.log")
        self.logs.append(path)
        with open(path, "wb") as log:
            self.proc = subprocess.Popen(
                self.command(), env=self.env, stdout=log, stderr=subprocess.STDOUT
            )
        if wait:
            self.wait_ready()
        return self

    def wait_ready(self, timeout: float = 20.0) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc is not None and self.proc.poll() is not None:
                raise RuntimeError(f"node exited with {self.proc.returncode}: see {self.logs[-1]}")
            try:
                with urllib.request.urlopen(self.base_url + "/readyz", timeout=1) as r:
                    if r.status == 200:
                        return
            except OSError:
                time.sleep(0.05)
        raise TimeoutError(f"node on port {self.port} not ready; see {self.logs[-1]}")

    def terminate(self) -> None:
        """Send SIGTERM without waiting (see `stop`)."""
        assert self.proc is not None
        self.proc.terminate()

    def stop(self, timeout: float = 30.0) -> bool:
        """SIGTERM and wait: the node returns its remainders before it exits.

        True when it exited cleanly (uvicorn re-raises SIGTERM after a graceful
        shutdown, so -15 is a clean exit too).
        """
        assert self.proc is not None
        self.proc.terminate()
        code = self.proc.wait(timeout)
        self.proc = None
        return code in (0, -signal.SIGTERM)

    def kill9(self) -> None:
        assert self.proc is not None
        self.proc.send_signal(signal.SIGKILL)
        self.proc.wait()
        self.proc = None

    def held_ranges(self, log_index: int) -> list[tuple[int, int]]:
        """Ranges one run of this node took or claimed, as [start, end), from its log."""
        pattern = re.compile(r"event=range_(?:taken|claimed) tag=\S+ range=(\d+)-(\d+)")
        text = self.logs[log_index].read_text(errors="replace")
        return [(int(m.group(1)), int(m.group(2)) + 1) for m in pattern.finditer(text)]


class PreloaderProcess(NodeProcess):
    """A standalone `idpool preload` process; ready once it logs that it started."""

    def command(self) -> list[str]:
        return [sys.executable, "-m", "service.cli", "preload"]

    def wait_ready(self, timeout: float = 20.0) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc is not None and self.proc.poll() is not None:
                raise RuntimeError(
                    f"preloader exited with {self.proc.returncode}: see {self.logs[-1]}"
                )
            if b"event=preloader_started" in self.logs[-1].read_bytes():
                return
            time.sleep(0.05)
        raise TimeoutError(f"preloader not started; see {self.logs[-1]}")
