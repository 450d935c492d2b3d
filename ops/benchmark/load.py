"""Drive one load run with wrk and read back what it measured."""

from __future__ import annotations

import json
import shutil
import subprocess
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

REPORT_SCRIPT = Path(__file__).with_name("report.lua")


@dataclass(frozen=True)
class Load:
    """How wrk drives every contender: the same for all of them in one run."""

    threads: int = 1
    connections: int = 64
    timeout_s: int = 2


@dataclass(frozen=True)
class Result:
    requests: int
    errors: int  # connect, read, write, timeout, and answers other than 2xx/3xx
    seconds: float
    p50_ms: float
    p99_ms: float
    p999_ms: float
    max_ms: float
    ids_per_request: int

    @property
    def req_per_s(self) -> float:
        return self.requests / self.seconds

    @property
    def ids_per_s(self) -> float:
        return (self.requests - self.errors) * self.ids_per_request / self.seconds

    def as_dict(self) -> dict[str, Any]:
        return {**asdict(self), "req_per_s": self.req_per_s, "ids_per_s": self.ids_per_s}


def wrk_path() -> str:
    path = shutil.which("wrk")
    if path is None:
        raise SystemExit("ops/bench needs wrk: apt-get install wrk")
    return path


def run_wrk(url: str, seconds: float, load: Load, ids_per_request: int = 1) -> Result:
    """Run wrk against ``url`` for ``seconds`` (bounded: wrk stops itself, and we
    kill it if it overstays by 30 s)."""
    command = [
        wrk_path(),
        f"-t{load.threads}",
        f"-c{load.connections}",
        f"-d{max(1, round(seconds))}s",
        "--timeout",
        f"{load.timeout_s}s",
        "-s",
        str(REPORT_SCRIPT),
        url,
    ]
    done = subprocess.run(
        command, capture_output=True, text=True, timeout=seconds + 30, check=False
    )
    if done.returncode != 0:
        raise RuntimeError(f"wrk failed ({done.returncode}): {done.stdout}{done.stderr}".strip())
    report = json.loads(done.stdout.strip().splitlines()[-1])
    errors = report["errors"]
    latency = report["latency_us"]
    return Result(
        requests=report["requests"],
        errors=sum(errors.values()),
        seconds=report["duration_us"] / 1e6,
        p50_ms=latency["p50"] / 1000,
        p99_ms=latency["p99"] / 1000,
        p999_ms=latency["p999"] / 1000,
        max_ms=latency["max"] / 1000,
        ids_per_request=ids_per_request,
    )
