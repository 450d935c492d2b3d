"""The HTTP servers the benchmark starts and stops."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]  # the repository


def http_get(url: str, timeout: float = 10.0) -> tuple[int, str]:
    try:
        with urllib.request.urlopen(url, timeout=timeout) as answer:
            return answer.status, answer.read().decode()
    except urllib.error.HTTPError as e:
        return e.code, e.read().decode()


def stop(proc: subprocess.Popen[bytes], grace: float = 35.0) -> None:
    """SIGTERM the process we started (uvicorn's parent stops its own workers);
    SIGKILL its process group only if it overstays."""
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(grace)
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)  # its own group: only what it started
            proc.wait(5)


@dataclass
class HttpServer:
    """One contender: a command that serves HTTP on ``port`` until SIGTERM."""

    name: str
    command: list[str]
    env: dict[str, str]
    port: int
    ready_path: str
    log: Path
    proc: subprocess.Popen[bytes] | None = None

    @property
    def base(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self, timeout: float = 60.0) -> HttpServer:
        with self.log.open("ab") as log:
            self.proc = subprocess.Popen(
                self.command,
                env={**os.environ, "PYTHONPATH": str(ROOT), **self.env},
                cwd=ROOT,
                stdout=log,
                stderr=log,
                # A process group of its own (stopped as one), not a session: Linux's
                # autogroup gives each session an equal share of the CPU, so a server
                # in a session of its own got one of the two cores against wrk's
                # session however many workers it ran (a granian 2-worker contender
                # measured 24.8k req/s so, 43.8k in wrk's session, same minute).
                process_group=0,
            )
        try:
            self._wait_ready(timeout)
        except BaseException:  # not ready, or interrupted: stop what we started
            self.stop()
            raise
        return self

    def _wait_ready(self, timeout: float) -> None:
        assert self.proc is not None
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"{self.name} exited at start; see {self.log}")
            with contextlib.suppress(OSError):
                if http_get(self.base + self.ready_path, timeout=2)[0] == 200:
                    return
            time.sleep(0.2)
        raise RuntimeError(f"{self.name} not ready after {timeout}s; see {self.log}")

    def stop(self) -> None:
        if self.proc is not None:
            stop(self.proc)

    def cpu_ticks(self) -> dict[int, int]:
        """CPU time (user + system, in clock ticks) of each process serving requests."""
        return {pid: _cpu_ticks(pid) for pid in self.workers()}

    def workers(self) -> list[int]:
        """uvicorn's worker processes (spawned), granian's (forked: every child of
        its supervisor), or the server itself when it runs one worker in-process."""
        assert self.proc is not None
        children = _children(self.proc.pid)
        workers = [p for p in children if "spawn_main" in _cmdline(p)]
        if not workers and _is_granian(self.proc.pid):
            workers = children
        return workers or [self.proc.pid]

    def rss_kib(self) -> dict[int, int]:
        """Resident memory of each process serving requests."""
        return {pid: _rss_kib(pid) for pid in self.workers()}


def uvicorn_command(factory: str, port: int, workers: int) -> list[str]:
    """An ops.benchmark.apps factory under uvicorn with the settings `idpool serve` uses."""
    return [
        sys.executable, "-m", "uvicorn", factory, "--factory",
        "--host", "127.0.0.1", "--port", str(port), "--workers", str(workers),
        "--no-access-log", "--log-level", "warning", "--lifespan", "on",
        "--timeout-graceful-shutdown", "30",
    ]  # fmt: skip


def granian_command(factory: str, port: int, workers: int) -> list[str]:
    """An ops.benchmark.apps RSGI factory under granian, threads set as `idpool serve`
    sets them (service/cli/granian.py: one Rust thread per worker, single-threaded
    runtime)."""
    return [
        sys.executable, "-m", "granian", "--interface", "rsgi", "--factory",
        "--host", "127.0.0.1", "--port", str(port), "--workers", str(workers),
        "--runtime-threads", "1", "--runtime-mode", "st", "--http", "1", "--no-ws",
        "--log-level", "warning", factory,
    ]  # fmt: skip


def idpool_command(
    port: int, workers: int, access_log: bool = False, http: str = "granian"
) -> list[str]:
    """The production command, as a user runs it, on the HTTP server ``http``.
    Access lines are logged at INFO, so a node with its access log on runs at
    that level."""
    level = "info" if access_log else "warning"
    command = [sys.executable, "-m", "idpool.service.cli", "--log-level", level, "serve"]
    command += ["--host", "127.0.0.1", "--port", str(port), "--workers", str(workers)]
    return command + ["--http", http] + (["--access-log"] if access_log else [])


def _children(pid: int) -> list[int]:
    try:
        text = Path(f"/proc/{pid}/task/{pid}/children").read_text()
    except OSError:
        return []
    return [int(p) for p in text.split()]


def _is_granian(pid: int) -> bool:
    command = _cmdline(pid)
    return "granian" in command or "--http granian" in command


def _cmdline(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_text().replace("\0", " ")
    except OSError:
        return ""


def _cpu_ticks(pid: int) -> int:
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return 0
    return int(fields[11]) + int(fields[12])  # utime, stime (fields 14 and 15 of stat)


def _rss_kib(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    return 0
