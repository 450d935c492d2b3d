"""`idpool serve` and `idpool preload` processes on this machine, and what the
tests, the fault suite, the benchmark and the rolling restart need around them:
free ports, waiting for a port or for `/readyz`, and reading a node's
`event=node_stopped` line from its log. Store servers are in ``ops/servers.py``.
"""

from __future__ import annotations

import contextlib
import os
import re
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Callable
from pathlib import Path

NODE_STOPPED = re.compile(r"event=node_stopped returned=(\d+) abandoned=(\d+)")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def wait_for_port(port: int, timeout: float = 10.0, host: str = "127.0.0.1") -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        with contextlib.suppress(OSError), socket.create_connection((host, port), 0.2):
            return
        time.sleep(0.05)
    raise TimeoutError(f"nothing listening on {host}:{port} after {timeout}s")


def wait_port_closed(host: str, port: int, timeout: float) -> None:
    """Wait until nothing accepts connections on host:port (the node has exited)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            socket.create_connection((host, port), 0.2).close()
        except OSError:
            return
        time.sleep(0.05)
    raise TimeoutError(f"{host}:{port} still accepts connections after {timeout}s")


def wait_ready(
    base_url: str, timeout: float, failed: Callable[[], str | None] = lambda: None
) -> None:
    """Poll ``GET /readyz`` until 200; ``failed()`` returns why to give up early, if any."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if (why := failed()) is not None:
            raise RuntimeError(why)
        try:
            with urllib.request.urlopen(base_url + "/readyz", timeout=1) as r:
                if r.status == 200:
                    return
        except OSError:
            time.sleep(0.05)
    raise TimeoutError(f"{base_url}/readyz did not answer 200 within {timeout}s")


def node_stopped(log_text: str) -> tuple[int, int] | None:
    """(returned, abandoned) ranges from the last `event=node_stopped` line, if any."""
    found = NODE_STOPPED.findall(log_text)
    return (int(found[-1][0]), int(found[-1][1])) if found else None


def env_with(**values: str) -> dict[str, str]:
    env = dict(os.environ)
    env.update(values)
    return env


class NodeProcess:
    """One `idpool serve` process on its own port, logging to a file.

    Each start writes a log file of its own (``logs``), so the ranges one run
    held can be read back after it was killed.
    """

    def __init__(
        self,
        env: dict[str, str],
        log_path: Path,
        port: int | None = None,
        *,
        args: tuple[str, ...] = (),  # more `idpool serve` options, e.g. ("--embedded",)
        cwd: Path | None = None,
    ) -> None:
        self.env = env
        self.port = port or free_port()
        self.log_path = log_path
        self.args = args
        self.cwd = cwd
        self.proc: subprocess.Popen[bytes] | None = None
        self.logs: list[Path] = []  # every log file this node wrote, one per start

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def command(self) -> list[str]:
        serve = [sys.executable, "-m", "idpool.service.cli", "serve", "--port", str(self.port)]
        return [*serve, *self.args]

    def start(self, wait: bool = True, ready_timeout: float = 20.0) -> NodeProcess:
        path = self.log_path.with_suffix(f".{len(self.logs)}.log")
        self.logs.append(path)
        with open(path, "wb") as log:
            self.proc = subprocess.Popen(
                self.command(), env=self.env, cwd=self.cwd, stdout=log, stderr=subprocess.STDOUT
            )
        if wait:
            try:
                self.wait_ready(ready_timeout)
            except BaseException:
                self.kill9()  # a node that never got ready is not left running
                raise
        return self

    def exited(self) -> str | None:
        """Why waiting for this process is pointless (it exited), if it is."""
        if self.proc is not None and self.proc.poll() is not None:
            return f"{self.command()[3]} exited with {self.proc.returncode}: see {self.logs[-1]}"
        return None

    def wait_ready(self, timeout: float = 20.0) -> None:
        try:
            wait_ready(self.base_url, timeout, self.exited)
        except TimeoutError:
            raise TimeoutError(f"node on port {self.port} not ready; see {self.logs[-1]}") from None

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

    def held_ranges(self, log_index: int, claimed: bool = True) -> list[tuple[int, int]]:
        """Ranges one run of this node took (and, with ``claimed``, its preloader
        claimed), as [start, end), from its log."""
        events = "taken|claimed" if claimed else "taken"
        pattern = re.compile(rf"event=range_(?:{events}) tag=\S+ range=(\d+)-(\d+)")
        text = self.logs[log_index].read_text(errors="replace")
        return [(int(m.group(1)), int(m.group(2)) + 1) for m in pattern.finditer(text)]


class PreloaderProcess(NodeProcess):
    """A standalone `idpool preload` process; ready once it logs that it started."""

    def command(self) -> list[str]:
        return [sys.executable, "-m", "idpool.service.cli", "preload", *self.args]

    def wait_ready(self, timeout: float = 20.0) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if (why := self.exited()) is not None:
                raise RuntimeError(why)
            if b"event=preloader_started" in self.logs[-1].read_bytes():
                return
            time.sleep(0.05)
        raise TimeoutError(f"preloader not started; see {self.logs[-1]}")
