"""``ops/bench``: start every contender on loopback, load each with wrk, print one
table and write a JSON file. See BENCHMARKS.md for the method.

Phases, in order: the in-process micro-benchmark; for each worker count, the
ceiling, idpool and the peers, all up at once and measured in turns (``--reps``
rounds, a different one first in each round, so ratios compare runs minutes
apart at most); the stall test; the memory soak.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import re
import shlex
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from importlib import metadata
from pathlib import Path
from typing import Any

import pymysql
import redis

from idpool.pool.keys import Keys
from idpool.pool.settings import Settings
from ops.toolkit import RedisServer, free_port

from . import micro
from .load import Load, Result, run_wrk, wrk_path
from .servers import (
    ROOT,
    HttpServer,
    granian_command,
    http_get,
    idpool_command,
    uvicorn_command,
)

# created and dropped by the benchmark; nothing else uses it. IDPOOL_BENCH_DATABASE
# names another, for two benchmarks on one MariaDB at once (each drops its own).
DATABASE = os.environ.get("IDPOOL_BENCH_DATABASE", "idpool_bench")
MYSQL_SERVER = "mysql://root@127.0.0.1:3306"
REDIS_PREFIX = "idpool_bench"
BATCH = 1000
SNOWFLAKE_TAG = "sf"  # a snowflake tag (issue 25): its /id against the segment tag's
FORMAT = "INV-{date:%Y%m%d}-{id:06d}"  # the formatted contender's template
CLOCK_TICKS = os.sysconf("SC_CLK_TCK")  # units of /proc/<pid>/stat CPU times
MAX_REDO = 2  # runs done again when one uvicorn worker got nearly all connections


@dataclass(frozen=True)
class Plan:
    quick: bool
    reps: int
    seconds: int
    warmup: int
    workers: tuple[int, ...]
    load: Load
    step: int
    stall_delay: float
    stall_step: int | None
    stall_range_seconds: float
    stall_pool_depth: int
    soak_seconds: int
    out: Path
    redis_url: str | None

    def estimate_seconds(self) -> int:
        """Rough wall time (servers start in ~2 s; a stall-test run also reads
        /metrics through the slowed stores)."""
        per_run = self.seconds + 0.5
        main = 2 * len(SERVERS) + self.warmup * len(MAIN) + self.reps * len(MAIN) * per_run
        stall = len(STALL) * (3 + self.warmup) + self.reps * len(STALL) * (self.seconds + 3)
        soak = self.soak_seconds + 10 if self.soak_seconds else 0
        return round(20 + len(self.workers) * main + stall + 10 + soak)


@dataclass(frozen=True)
class Contender:
    key: str
    server: str
    path: str
    ids: int = 1


APPS = "ops.benchmark.apps:"

# server key -> (what it runs, readiness path); commands are built per port and worker count
SERVERS: dict[str, tuple[Callable[[int, int], list[str]], str]] = {
    "ceiling": (lambda port, w: uvicorn_command(APPS + "ceiling", port, w), "/id/bench"),
    "bare_asgi": (lambda port, w: uvicorn_command(APPS + "bare_asgi", port, w), "/id/bench"),
    # The HTTP tier (issue 31): the bare ceilings of each server's own interface,
    # and idpool on each server (the default, granian, is "idpool").
    "bare_rsgi": (lambda port, w: granian_command(APPS + "bare_rsgi", port, w), "/id/bench"),
    "idpool": (lambda port, w: idpool_command(port, w), "/readyz"),
    "idpool_uvicorn": (lambda port, w: idpool_command(port, w, http="uvicorn"), "/readyz"),
    "idpool_log": (lambda port, w: idpool_command(port, w, access_log=True), "/readyz"),
    "redis_incr": (lambda port, w: uvicorn_command(APPS + "redis_incr", port, w), "/id/x"),
    "mysql_ticket": (lambda port, w: uvicorn_command(APPS + "mysql_ticket", port, w), "/id/x"),
    "classic_leaf": (
        lambda port, w: uvicorn_command(APPS + "classic_leaf", port, w),
        "/id/leaf",
    ),
}

MAIN = [
    Contender("ceiling", "ceiling", "/id/bench"),
    Contender("bare ASGI (info)", "bare_asgi", "/id/bench"),
    Contender("bare RSGI granian (info)", "bare_rsgi", "/id/bench"),
    Contender("idpool /id", "idpool", "/id/bench"),
    Contender("idpool /id on uvicorn", "idpool_uvicorn", "/id/bench"),
    Contender("idpool /ids x1000", "idpool", f"/ids/bench?count={BATCH}", BATCH),
    Contender("idpool /id snowflake", "idpool", f"/id/{SNOWFLAKE_TAG}"),
    # a formatted tag (issue 24): the same node, the same fast path, plus rendering
    Contender("idpool /id formatted", "idpool", "/id/invoice"),
    Contender("idpool /id obfuscated (info)", "idpool", "/id/hidden"),
    Contender("idpool /id, access log", "idpool_log", "/id/bench"),
    Contender("redis INCR", "redis_incr", "/id/bench"),
    Contender("mysql ticket", "mysql_ticket", "/id/bench"),
    Contender("classic leaf", "classic_leaf", "/id/leaf"),
]

# stall contender -> (store delay on?, prefetch on?)
STALL = {
    "double buffer, fast stores": (False, True),
    "double buffer, slow stores": (True, True),
    "single buffer, fast stores": (False, False),
    "single buffer, slow stores": (True, False),
}


@dataclass
class Run:
    phase: str
    workers: int
    contender: str
    round: int
    load_avg_before: float
    result: Result
    extra: dict[str, float] = field(default_factory=dict)

    def as_dict(self) -> dict[str, Any]:
        d = {k: v for k, v in asdict(self).items() if k != "result"}
        return {**d, **self.result.as_dict()}


class Bench:
    def __init__(self, plan: Plan, workdir: Path) -> None:
        self.plan = plan
        self.workdir = workdir
        self.runs: list[Run] = []
        self.env: dict[str, str] = {}
        self.redis_url = ""

    # --- setup ---------------------------------------------------------------

    def setup(self) -> None:
        _mysql(f"DROP DATABASE IF EXISTS `{DATABASE}`", f"CREATE DATABASE `{DATABASE}`")
        self.env = {
            "IDPOOL_MYSQL_URL": f"{MYSQL_SERVER}/{DATABASE}",
            "IDPOOL_REDIS_URL": self.redis_url,
            "IDPOOL_REDIS_PREFIX": REDIS_PREFIX,
            "IDPOOL_STEP_SECONDS": "0",  # fixed step: the same ranges in every round
        }
        self.add_tag("bench", self.plan.step)
        self.add_tag("leaf", self.plan.step)
        self.add_tag(SNOWFLAKE_TAG, 0)
        self.add_tag("invoice", self.plan.step, "--format", FORMAT)
        self.add_tag("hidden", self.plan.step, "--obfuscate")

    def add_tag(self, tag: str, step: int, *options: str) -> None:
        """A segment tag of ``step`` (with ``options``), or (step 0) a snowflake tag."""
        command = [sys.executable, "-m", "idpool.service.cli", "--log-level", "warning"]
        command += ["tag", "add"]
        subprocess.run(
            [*command, tag, *(["--step", str(step)] if step else ["--snowflake"]), *options],
            env={**os.environ, "PYTHONPATH": str(ROOT), **self.env},
            cwd=ROOT,
            check=True,
            capture_output=True,
            timeout=60,
        )

    def start(self, name: str, command: list[str], port: int, ready: str, **env: str) -> HttpServer:
        log = self.workdir / f"{name.replace(' ', '_').replace(',', '')}.log"
        server = HttpServer(name, command, {**self.env, **env}, port, ready, log)
        print(f"  starting {name} on :{port}", flush=True)
        return server.start()

    # --- one load run --------------------------------------------------------

    def measure(
        self, phase: str, workers: int, c: Contender, server: HttpServer, rnd: int, seconds: int
    ) -> Run:
        """One wrk run. uvicorn's workers share one listening socket and wrk opens
        its connections in one burst, so now and then one worker takes nearly all
        of them and the others idle: that run measures one worker, whatever the
        contender. Such a run (busiest worker over 1/workers + 25% of the CPU) is
        done again, at most twice; the count is kept in the results."""
        redone = -1
        while redone < MAX_REDO:
            redone += 1
            load_avg = os.getloadavg()[0]
            cpu_before = server.cpu_ticks()
            result = run_wrk(server.base + c.path, seconds, self.plan.load, c.ids)
            cpu = [server.cpu_ticks().get(pid, t) - t for pid, t in cpu_before.items()]
            busiest = max(cpu) / max(1, sum(cpu))
            print(
                f"    round {rnd} {c.key:<26} {result.req_per_s:>10,.0f} req/s "
                f"p99 {result.p99_ms:6.2f} ms p999 {result.p999_ms:7.2f} ms "
                f"errors {result.errors} busiest worker {busiest:.0%}",
                flush=True,
            )
            if workers == 1 or busiest <= 1 / workers + 0.25:
                break
        run = Run(phase, workers, c.key, rnd, load_avg, result)
        # server CPU per request: less sensitive than req/s to how much of the
        # machine the server got while others (wrk, other processes) ran
        cpu_us = sum(cpu) / CLOCK_TICKS * 1e6 / max(1, result.requests)
        run.extra.update(busiest_worker_cpu_share=busiest, redone=redone, cpu_us_per_req=cpu_us)
        return run

    def wait_for_pool(self, tag: str, timeout: float = 120.0) -> None:
        """Until the slowed preloaders have filled the tag's list: the test is about
        riding out slow stores while the pool lasts, not about an empty pool."""
        want = self.plan.stall_pool_depth // 2
        key = Keys(REDIS_PREFIX).pool(tag)
        client = redis.Redis.from_url(self.redis_url, socket_timeout=5)
        deadline = time.monotonic() + timeout
        try:
            while (depth := int(client.llen(key))) < want:
                if time.monotonic() > deadline:
                    raise RuntimeError(f"pool of {tag} holds {depth} ranges after {timeout}s")
                time.sleep(0.5)
        finally:
            client.close()

    def warm(self, c: Contender, server: HttpServer) -> None:
        run_wrk(server.base + c.path, self.plan.warmup, self.plan.load, c.ids)

    # --- phases --------------------------------------------------------------

    def main_phase(self, workers: int) -> None:
        print(f"== {workers} worker(s), {self.plan.load.connections} connections", flush=True)
        servers: dict[str, HttpServer] = {}
        try:
            for key, (command, ready) in SERVERS.items():
                port = free_port()
                servers[key] = self.start(f"{key}-w{workers}", command(port, workers), port, ready)
            for c in MAIN:
                self.warm(c, servers[c.server])
            for rnd in range(self.plan.reps):
                turn = rnd % len(MAIN)
                for c in MAIN[turn:] + MAIN[:turn]:
                    run = self.measure(
                        "main", workers, c, servers[c.server], rnd, self.plan.seconds
                    )
                    self.runs.append(run)
        finally:
            for server in servers.values():
                server.stop()

    def stall_phase(self, step: int) -> None:
        delay, workers = self.plan.stall_delay, 1
        print(f"== stall test: stores {delay * 1000:.0f} ms per call, step {step}", flush=True)
        servers: dict[str, HttpServer] = {}
        contenders: dict[str, Contender] = {}
        try:
            for i, (key, (slow, prefetch)) in enumerate(STALL.items()):
                tag = f"stall{i}"
                self.add_tag(tag, step)
                port = free_port()
                env = {
                    "BENCH_STORE_DELAY": str(delay if slow else 0.0),
                    "IDPOOL_PREFETCH_AT": "0.1" if prefetch else "1",
                    "IDPOOL_POOL_DEPTH": str(self.plan.stall_pool_depth),
                }
                command = uvicorn_command(APPS + "slowed_idpool", port, workers)
                servers[key] = self.start(f"stall-{i}", command, port, "/readyz", **env)
                contenders[key] = Contender(key, key, f"/id/{tag}")
            for key, c in contenders.items():
                self.wait_for_pool(c.path.rsplit("/", 1)[1])
                self.warm(c, servers[key])
            for rnd in range(self.plan.reps):
                turn = rnd % len(STALL)
                keys = list(STALL)
                for key in keys[turn:] + keys[:turn]:
                    server, c = servers[key], contenders[key]
                    before = _ranges_taken(server, c.path.rsplit("/", 1)[1])
                    run = self.measure("stall", workers, c, server, rnd, self.plan.seconds)
                    after = _ranges_taken(server, c.path.rsplit("/", 1)[1])
                    run.extra["switches_per_s"] = (after - before) / run.result.seconds
                    run.extra["step"] = step
                    self.runs.append(run)
        finally:
            for server in servers.values():
                server.stop()

    def soak_phase(self) -> dict[str, Any]:
        seconds, workers = self.plan.soak_seconds, 1
        print(f"== memory soak: idpool, {workers} worker, {seconds} s at full load", flush=True)
        port = free_port()
        server = self.start("soak", idpool_command(port, workers), port, "/readyz")
        samples: list[tuple[float, int]] = []
        outcome: dict[str, Result] = {}
        try:
            idle = sum(server.rss_kib().values())
            load = threading.Thread(
                target=lambda: outcome.setdefault(
                    "r", run_wrk(server.base + "/id/bench", seconds, self.plan.load)
                )
            )
            started = time.monotonic()
            load.start()
            every = max(1.0, min(10.0, seconds / 20))
            while load.is_alive():
                load.join(every)
                if load.is_alive():
                    samples.append((time.monotonic() - started, sum(server.rss_kib().values())))
        finally:
            server.stop()
        if "r" not in outcome:
            raise RuntimeError("soak: wrk did not finish")
        result = outcome["r"]
        self.runs.append(Run("soak", workers, "idpool /id", 0, os.getloadavg()[0], result))
        # the first tenth is warm-up (buffers, pool, caches fill); "start" is after it
        warm = [s for s in samples if s[0] >= seconds / 10] or samples
        return {
            "seconds": seconds,
            "idle_rss_kib": idle,
            "start_rss_kib": warm[0][1],
            "end_rss_kib": samples[-1][1],
            "max_rss_kib": max(s[1] for s in samples),
            "samples": samples,
            "req_per_s": result.req_per_s,
            "errors": result.errors,
        }


# --- summaries -----------------------------------------------------------------


def _median(values: Sequence[float]) -> float:
    return statistics.median(values) if values else float("nan")


def summarize(runs: list[Run], phase: str, workers: int, baseline: str) -> list[dict[str, Any]]:
    """Medians per contender over rounds; ratios are taken round by round against
    the baseline run of the same round, then their median."""
    mine = [r for r in runs if r.phase == phase and r.workers == workers]
    base = {r.round: r for r in mine if r.contender == baseline}
    rows = []
    for name in dict.fromkeys(r.contender for r in mine):
        results = [r for r in mine if r.contender == name]
        rows.append(
            {
                "contender": name,
                "workers": workers,
                "rounds": len(results),
                "req_per_s": _median([r.result.req_per_s for r in results]),
                "ids_per_s": _median([r.result.ids_per_s for r in results]),
                "p50_ms": _median([r.result.p50_ms for r in results]),
                "p99_ms": _median([r.result.p99_ms for r in results]),
                "p999_ms": _median([r.result.p999_ms for r in results]),
                "errors": sum(r.result.errors for r in results),
                "requests": sum(r.result.requests for r in results),
                "ratio_req": _median(
                    [
                        r.result.req_per_s / base[r.round].result.req_per_s
                        for r in results
                        if r.round in base
                    ]
                ),
                "ratio_p99": _median(
                    [
                        r.result.p99_ms / base[r.round].result.p99_ms
                        for r in results
                        if r.round in base
                    ]
                ),
                "ratio_p999": _median(
                    [
                        r.result.p999_ms / base[r.round].result.p999_ms
                        for r in results
                        if r.round in base
                    ]
                ),
                "switches_per_s": _median([r.extra.get("switches_per_s", 0.0) for r in results]),
                "cpu_us_per_req": _median([r.extra.get("cpu_us_per_req", 0.0) for r in results]),
                "ratio_cpu": _median(
                    [
                        r.extra.get("cpu_us_per_req", 0.0)
                        / base[r.round].extra.get("cpu_us_per_req", 1.0)
                        for r in results
                        if r.round in base
                    ]
                ),
                "runs_redone": sum(int(r.extra.get("redone", 0)) for r in results),
                "busiest_worker_share": _median(
                    [r.extra.get("busiest_worker_cpu_share", 1.0) for r in results]
                ),
            }
        )
    return rows


def table(rows: list[dict[str, Any]], ratio_label: str) -> str:
    head = (
        f"{'contender':<28}{'req/s':>10}{'IDs/s':>14}{'p50 ms':>8}{'p99 ms':>8}{'p999 ms':>9}"
        f"{'errors':>8}{ratio_label:>11}{'p99 x':>7}{'CPU us/req':>11}{'CPU x':>7}{'busiest':>9}"
    )
    lines = [head]
    for r in rows:
        lines.append(
            f"{r['contender']:<28}{r['req_per_s']:>10,.0f}{r['ids_per_s']:>14,.0f}"
            f"{r['p50_ms']:>8.2f}{r['p99_ms']:>8.2f}{r['p999_ms']:>9.2f}{r['errors']:>8}"
            f"{r['ratio_req']:>11.3f}{r['ratio_p99']:>7.2f}{r['cpu_us_per_req']:>11.1f}"
            f"{r['ratio_cpu']:>7.2f}{r['busiest_worker_share']:>9.0%}"
        )
    return "\n".join(lines)


def check_targets(
    main: dict[int, dict[str, dict[str, Any]]],
    stall: dict[str, dict[str, Any]],
    micro_ns: dict[str, dict[str, float]],
    soak: dict[str, Any] | None,
    stall_delay_ms: float,
) -> list[dict[str, Any]]:
    """The issue's targets, each with what was measured and whether it was met."""
    out: list[dict[str, Any]] = []

    def target(name: str, measured: str, ok: bool) -> None:
        out.append({"target": name, "measured": measured, "met": ok})

    for w, rows in main.items():
        one, batch = rows["idpool /id"], rows["idpool /ids x1000"]
        target(
            f"{w}w: /id >= 0.9x ceiling req/s", f"{one['ratio_req']:.3f}x", one["ratio_req"] >= 0.9
        )
        target(
            f"{w}w: /id p99 <= 1.2x ceiling p99",
            f"{one['ratio_p99']:.2f}x",
            one["ratio_p99"] <= 1.2,
        )
        for peer, factor in (("redis INCR", 3), ("mysql ticket", 30)):
            x = one["req_per_s"] / rows[peer]["req_per_s"]
            target(f"{w}w: /id >= {factor}x {peer}", f"{x:.1f}x", x >= factor)
        flake = rows["idpool /id snowflake"]
        x = flake["req_per_s"] / one["req_per_s"]
        target(f"{w}w: /id snowflake >= 0.9x /id segment", f"{x:.3f}x", x >= 0.9)
        errors = one["errors"] + batch["errors"] + flake["errors"]
        target(f"{w}w: idpool errors == 0", str(errors), errors == 0)
        ids = batch["ids_per_s"]
        target(f"{w}w: batch of {BATCH} >= 10M IDs/s", f"{ids / 1e6:.1f}M", ids >= 10e6)
        target(f"{w}w: /id server CPU per request (info)", f"{one['ratio_cpu']:.2f}x ceiling", True)
        uv, bare = rows["idpool /id on uvicorn"], rows["bare RSGI granian (info)"]
        x, least = one["req_per_s"] / uv["req_per_s"], 1.5 if w == 1 else 1.2
        target(f"{w}w: /id granian >= {least}x /id uvicorn req/s", f"{x:.2f}x", x >= least)
        cpu = one["cpu_us_per_req"] / max(1e-9, uv["cpu_us_per_req"])
        ok = cpu <= 0.6 or w != 1  # the 0.6x target is the 1-worker one
        target(f"{w}w: /id granian CPU per request vs uvicorn", f"{cpu:.2f}x", ok)
        x = one["req_per_s"] / bare["req_per_s"]
        target(f"{w}w: /id granian >= 0.9x bare RSGI granian", f"{x:.3f}x", x >= 0.9)
        x = one["p99_ms"] / max(1e-9, uv["p99_ms"])
        target(f"{w}w: /id granian p99 <= /id uvicorn p99", f"{x:.2f}x", x <= 1.0)
        formatted = rows["idpool /id formatted"]["req_per_s"] / one["req_per_s"]
        target(
            f"{w}w: formatted /id >= 0.8x plain /id req/s", f"{formatted:.2f}x", formatted >= 0.8
        )
        hidden = rows["idpool /id obfuscated (info)"]["req_per_s"] / one["req_per_s"]
        target(f"{w}w: obfuscated /id vs plain /id (info)", f"{hidden:.2f}x", True)
        log = rows["idpool /id, access log"]["ratio_req"] / one["ratio_req"]  # both vs ceiling
        target(f"{w}w: access log cost (info)", f"{(1 - log) * 100:.0f}% fewer req/s", True)
    if stall:
        fast = stall["double buffer, fast stores"]["p999_ms"]
        slow = stall["double buffer, slow stores"]["p999_ms"]
        target(
            "stall: double-buffer p999 slow <= 1.5x fast", f"{slow / fast:.2f}x", slow <= 1.5 * fast
        )
        single = stall["single buffer, slow stores"]["p999_ms"]
        target(
            "stall: single buffer shows the stall (p999 >= store delay)",
            f"{single:.0f} ms",
            single >= stall_delay_ms,
        )
    take = micro_ns["steady"]["take_ns"]
    target("micro: buf.take() <= 100 ns", f"{take:.0f} ns (loop included)", take <= 100)
    if soak is not None:
        growth = soak["end_rss_kib"] / soak["start_rss_kib"] - 1
        target(
            f"soak {soak['seconds']} s: RSS flat (end within 10% of start)",
            f"{soak['start_rss_kib'] / 1024:.1f} -> {soak['end_rss_kib'] / 1024:.1f} MiB",
            growth <= 0.10,
        )
    return out


# --- machine -------------------------------------------------------------------


def machine(redis_url: str) -> dict[str, Any]:
    cpu = "unknown"
    for line in Path("/proc/cpuinfo").read_text().splitlines():
        if line.startswith("model name"):
            cpu = line.split(":", 1)[1].strip()
            break
    mem = Path("/proc/meminfo").read_text().splitlines()[0].split()[1]
    packages = ["starlette", "uvicorn", "uvloop", "httptools", "redis", "aiomysql", "orjson"]
    wrk = subprocess.run([wrk_path(), "--version"], capture_output=True, text=True, check=False)
    commit = subprocess.run(
        ["git", "describe", "--always", "--dirty"], capture_output=True, text=True, cwd=ROOT,
        check=False,
    ).stdout.strip()  # fmt: skip
    client = redis.Redis.from_url(redis_url, socket_timeout=5)
    redis_version = str(client.info("server")["redis_version"])
    client.close()
    return {
        "cpu": cpu,
        "cores": os.cpu_count(),
        "memory_gib": round(int(mem) / 1024 / 1024, 1),
        "kernel": platform.release(),
        "python": platform.python_version(),
        "packages": {p: metadata.version(p) for p in packages},
        "mariadb": str(_mysql("SELECT VERSION()")[0]),
        "redis": redis_version,
        "wrk": (wrk.stdout or wrk.stderr).split("\n")[0].split(" [")[0],
        "commit": commit,
        "load_avg_at_start": os.getloadavg(),
    }


def _mysql(*statements: str) -> tuple[Any, ...]:
    conn = pymysql.connect(host="127.0.0.1", port=3306, user="root", autocommit=True)
    try:
        with conn.cursor() as cur:
            for sql in statements:
                cur.execute(sql)
            return cur.fetchone() or ()
    finally:
        conn.close()


def _ranges_taken(server: HttpServer, tag: str) -> float:
    _, text = http_get(server.base + "/metrics", timeout=60)
    pattern = re.compile(r'^idpool_ranges_taken_total\{.*tag="' + re.escape(tag) + r'".*\} (\S+)$')
    return sum(float(m.group(1)) for line in text.splitlines() if (m := pattern.match(line)))


def _drop_redis_keys(url: str) -> None:
    client = redis.Redis.from_url(url, socket_timeout=5)
    try:
        for key in client.scan_iter(match=f"{REDIS_PREFIX}:*", count=1000):
            client.delete(key)
    finally:
        client.close()


# --- command line --------------------------------------------------------------


def parse(argv: Sequence[str] | None) -> Plan:
    p = argparse.ArgumentParser(
        prog="ops/bench", description=__doc__.split("\n\n")[0].replace("\n", " ")
    )
    p.add_argument("--quick", action="store_true", help="smoke run: 1 round of 2 s, 15 s soak")
    p.add_argument("--reps", type=int, help="rounds per contender (default 5, quick 1)")
    p.add_argument("--seconds", type=int, help="seconds per measured run (default 10, quick 2)")
    p.add_argument("--warmup", type=int, help="seconds of warm-up per contender (default 3)")
    p.add_argument("--workers", default="1,2", help="uvicorn worker counts (default 1,2)")
    p.add_argument("--connections", type=int, default=64, help="wrk connections (default 64)")
    p.add_argument("--threads", type=int, default=1, help="wrk threads (default 1)")
    p.add_argument("--step", type=int, default=1_000_000, help="range size of the main tags")
    p.add_argument("--stall-delay", type=float, default=0.2, help="seconds added per store call")
    p.add_argument("--stall-step", type=int, help="step of the stall test (default: see docs)")
    p.add_argument(
        "--soak-seconds", type=int, help="memory soak length (default 600, quick 15; 0 skips)"
    )
    p.add_argument("--out", type=Path, default=Path("bench-results.json"), help="JSON results file")
    p.add_argument(
        "--redis-url",
        help="use this Redis (keys under idpool_bench:) instead of a private redis-server",
    )
    a = p.parse_args(argv)
    q = a.quick
    return Plan(
        quick=q,
        reps=a.reps or (1 if q else 5),
        seconds=a.seconds or (2 if q else 10),
        warmup=a.warmup or (1 if q else 3),
        workers=tuple(int(w) for w in a.workers.split(",")),
        load=Load(threads=a.threads, connections=a.connections),
        step=a.step,
        stall_delay=a.stall_delay,
        stall_step=a.stall_step,
        stall_range_seconds=2.5 * a.stall_delay,
        stall_pool_depth=200,
        soak_seconds=(15 if q else 600) if a.soak_seconds is None else a.soak_seconds,
        out=a.out,
        redis_url=a.redis_url,
    )  # fmt: skip


def main(argv: Sequence[str] | None = None) -> int:
    plan = parse(argv)
    # SIGTERM unwinds like Ctrl-C, so every server started is stopped on the way out
    signal.signal(signal.SIGTERM, lambda signum, frame: sys.exit(128 + signum))
    command = "ops/bench " + shlex.join(sys.argv[1:] if argv is None else list(argv))
    workdir = Path(tempfile.mkdtemp(prefix="idpool-bench-"))
    print(
        f"{command}\nlogs in {workdir}; about {plan.estimate_seconds() // 60 + 1} minutes",
        flush=True,
    )
    started = time.time()
    private = None
    if not plan.redis_url:
        private = RedisServer(workdir / "redis", "--save", "", "--appendonly", "no").start()
    bench = Bench(plan, workdir)
    bench.redis_url = plan.redis_url or (private.url if private else "")
    try:
        info = machine(bench.redis_url)
        micro_ns = micro.run_all(plan.quick)
        print(f"== micro: {json.dumps(micro_ns)}", flush=True)
        bench.setup()
        micro_ns["handler"] = micro.handler_overhead(
            Settings.from_env(bench.env), "bench", formatted="invoice"
        )
        micro_ns["stores"] = micro.store_costs(Settings.from_env(bench.env), "bench")
        print(f"== micro handler, stores: {micro_ns['handler']} {micro_ns['stores']}", flush=True)
        main_rows: dict[int, dict[str, dict[str, Any]]] = {}
        for w in plan.workers:
            bench.main_phase(w)
            main_rows[w] = {r["contender"]: r for r in summarize(bench.runs, "main", w, "ceiling")}
        one_worker = main_rows.get(1) or next(iter(main_rows.values()))
        rate = one_worker["idpool /id"]["req_per_s"] / (1 if 1 in main_rows else plan.workers[0])
        stall_step = plan.stall_step or max(1000, round(rate * plan.stall_range_seconds, -3))
        bench.stall_phase(int(stall_step))
        stall_rows = summarize(bench.runs, "stall", 1, "double buffer, fast stores")
        soak = bench.soak_phase() if plan.soak_seconds else None
    finally:
        _mysql(f"DROP DATABASE IF EXISTS `{DATABASE}`")
        if private is not None:
            private.stop()
        else:
            _drop_redis_keys(bench.redis_url)
    stall_by_name = {r["contender"]: r for r in stall_rows}
    targets = check_targets(main_rows, stall_by_name, micro_ns, soak, plan.stall_delay * 1000)
    report = render(plan, command, info, main_rows, stall_rows, micro_ns, soak, targets, started)
    print(report)
    results = {
        "command": command,
        "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime(started)),
        "wall_seconds": round(time.time() - started),
        "machine": info,
        "plan": {k: str(v) if isinstance(v, Path) else v for k, v in asdict(plan).items()},
        "micro": micro_ns,
        "main": {str(w): list(rows.values()) for w, rows in main_rows.items()},
        "stall": stall_rows,
        "soak": soak,
        "targets": targets,
        "runs": [r.as_dict() for r in bench.runs],
    }
    plan.out.write_text(json.dumps(results, indent=1))
    print(f"results written to {plan.out}")
    return 0


def render(
    plan: Plan,
    command: str,
    info: dict[str, Any],
    main_rows: dict[int, dict[str, dict[str, Any]]],
    stall_rows: list[dict[str, Any]],
    micro_ns: dict[str, dict[str, float]],
    soak: dict[str, Any] | None,
    targets: list[dict[str, Any]],
    started: float,
) -> str:
    when = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime(started))
    lines = [
        "",
        f"idpool benchmark, {when}: `{command}`",
        f"machine: {info['cpu']}, {info['cores']} cores, {info['memory_gib']} GiB, "
        f"Linux {info['kernel']}, Python {info['python']}, MariaDB {info['mariadb']}, "
        f"Redis {info['redis']}, {info['wrk']}, commit {info['commit']}",
        f"load: wrk {plan.load.threads} thread(s), {plan.load.connections} connections, "
        f"{plan.seconds} s per run, median of {plan.reps} round(s); step {plan.step} (fixed)",
    ]
    for w, rows in main_rows.items():
        lines += [
            "",
            f"{w} uvicorn worker(s) per contender",
            table(list(rows.values()), "x ceiling"),
        ]
    if stall_rows:
        lines += [
            "",
            f"stall test: 1 worker, ledger and pool calls +{plan.stall_delay * 1000:.0f} ms "
            "in the slow rows",
            table(stall_rows, "x fast dbl"),
        ]
        lines += [
            f"  {r['contender']}: {r['switches_per_s']:.1f} range switches/s" for r in stall_rows
        ]
    s, sw, h = micro_ns["steady"], micro_ns["switching"], micro_ns["histogram"]
    hd, st = micro_ns["handler"], micro_ns["stores"]
    lines += [
        "",
        f"micro: buf.take() {s['take_ns']:.0f} ns within a range (loop included; empty loop "
        f"{s['empty_loop_ns']:.0f} ns), {sw['take_ns']:.0f} ns across ranges of {sw['step']:.0f}; "
        f"latency clock + histogram {h['clock_and_observe_ns']:.0f} ns per request",
        f"micro: GET /id, the ASGI app called in-process: idpool {hd['idpool_ns']:.0f} ns, "
        f"ceiling {hd['ceiling_ns']:.0f} ns, bare ASGI {hd['bare_ns']:.0f} ns (no HTTP)",
        f"stores, one call at a time: ledger claim {st['claim_us']:.0f} us, pool pop "
        f"{st['pop_us']:.0f} us round trip ({st['pop_redis_us']:.0f} us of Redis CPU)",
    ]
    if soak is not None:
        lines.append(
            f"soak: idpool 1 worker, {soak['seconds']} s at {soak['req_per_s']:,.0f} req/s, "
            f"errors {soak['errors']}: RSS idle {soak['idle_rss_kib'] / 1024:.1f} MiB, start "
            f"{soak['start_rss_kib'] / 1024:.1f}, end {soak['end_rss_kib'] / 1024:.1f}, max "
            f"{soak['max_rss_kib'] / 1024:.1f} MiB"
        )
    lines += ["", "targets:"]
    lines += [
        f"  [{'met ' if t['met'] else 'MISS'}] {t['target']}: {t['measured']}" for t in targets
    ]
    return "\n".join(lines)
