"""``ops/scale``: run the chosen scenarios, print what was measured and the
command that reproduces it, optionally write everything as JSON."""

from __future__ import annotations

import argparse
import json
import os
import shlex
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from importlib import metadata
from pathlib import Path
from typing import Any

from . import scenarios

ROOT = Path(__file__).resolve().parents[2]
SCENARIOS = ("idle", "busy", "lowrate")


@dataclass(frozen=True)
class Plan:
    scenarios: tuple[str, ...]
    tags: tuple[int, ...]
    nodes: tuple[int, ...]
    window: float
    settle: float
    fill_limit: float
    depth: int
    busy_idle_tags: int
    busy_seconds: float
    busy_warmup: float
    busy_rounds: int
    connections: int
    busy_step: int
    lowrate_duration: float
    lowrate_rate: float
    lowrate_nodes: int
    lowrate_step: int
    json: Path | None
    redis_cluster: bool = False

    def command(self) -> str:
        """Every choice spelled out, so the line reproduces this run whatever the defaults."""
        args = [f"--scenario={s}" for s in self.scenarios]
        if "idle" in self.scenarios:
            args += [
                f"--tags={','.join(map(str, self.tags))}",
                f"--nodes={','.join(map(str, self.nodes))}",
                f"--window={self.window:g}",
                f"--settle={self.settle:g}",
            ]
        if "busy" in self.scenarios:
            args += [
                f"--busy-idle-tags={self.busy_idle_tags}",
                f"--busy-seconds={self.busy_seconds:g}",
                f"--busy-warmup={self.busy_warmup:g}",
                f"--busy-rounds={self.busy_rounds}",
                f"--connections={self.connections}",
                f"--busy-step={self.busy_step}",
            ]
        if "lowrate" in self.scenarios:
            args += [
                f"--lowrate-duration={self.lowrate_duration:g}",
                f"--lowrate-rate={self.lowrate_rate:g}",
                f"--lowrate-nodes={self.lowrate_nodes}",
                f"--lowrate-step={self.lowrate_step}",
            ]
        args += [f"--fill-limit={self.fill_limit:g}"]
        if self.redis_cluster:
            args += ["--redis-cluster"]
        return "ops/scale " + shlex.join(args)


def _ints(text: str) -> tuple[int, ...]:
    try:
        values = tuple(int(v) for v in text.split(","))
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r}: comma-separated integers") from None
    if not values or min(values) < 1:
        raise argparse.ArgumentTypeError(f"{text!r}: every value at least 1")
    return values


def parse(argv: Sequence[str] | None) -> Plan:
    p = argparse.ArgumentParser(
        prog="ops/scale",
        description="Idle cost by tags and nodes, a busy tag beside idle ones, and the "
        "rate and claims at a low steady rate (issue 11), on private stores.",
    )
    p.add_argument(
        "--scenario",
        action="append",
        choices=SCENARIOS,
        help="idle, busy or lowrate; repeat for several (default: all three)",
    )
    p.add_argument("--tags", type=_ints, default=(10, 1000, 5000, 10000), help="idle: tag counts")
    p.add_argument("--nodes", type=_ints, default=(1, 3), help="idle: node counts")
    p.add_argument("--window", type=float, default=30.0, help="idle: seconds measured")
    p.add_argument(
        "--settle", type=float, default=5.0, help="idle: seconds between filled and measuring"
    )
    p.add_argument(
        "--fill-limit",
        type=float,
        default=120.0,
        help="seconds from start allowed for every list to fill (default 120)",
    )
    p.add_argument("--busy-idle-tags", type=int, default=3000, help="busy: idle tags beside")
    p.add_argument("--busy-seconds", type=float, default=20.0, help="busy: seconds per load run")
    p.add_argument("--busy-warmup", type=float, default=3.0, help="busy: warm-up seconds")
    p.add_argument("--busy-rounds", type=int, default=1, help="busy: rounds (order alternates)")
    p.add_argument("--connections", type=int, default=64, help="busy: closed-loop connections")
    p.add_argument("--busy-step", type=int, default=100_000, help="busy: step of the busy tag")
    p.add_argument("--lowrate-duration", type=float, default=300.0, help="lowrate: seconds")
    p.add_argument("--lowrate-rate", type=float, default=10.0, help="lowrate: IDs/s")
    p.add_argument("--lowrate-nodes", type=int, default=2, help="lowrate: nodes")
    p.add_argument("--lowrate-step", type=int, default=1000, help="lowrate: the tag's step")
    p.add_argument("--json", type=Path, help="write every figure to this JSON file")
    p.add_argument(
        "--redis-cluster",
        action="store_true",
        help="idle: the pool on a Redis Cluster of 3 primaries + 3 replicas (ops/redis_cluster.py)",
    )
    a = p.parse_args(argv)
    if a.busy_rounds < 1 or a.lowrate_nodes < 1 or a.busy_idle_tags < 10:
        p.error("--busy-rounds and --lowrate-nodes at least 1, --busy-idle-tags at least 10")
    if min(a.window, a.busy_seconds, a.lowrate_duration, a.lowrate_rate) <= 0:
        p.error("durations and the rate must be positive")
    return Plan(
        scenarios=tuple(dict.fromkeys(a.scenario or SCENARIOS)),
        tags=a.tags,
        nodes=a.nodes,
        window=a.window,
        settle=a.settle,
        fill_limit=a.fill_limit,
        depth=int(os.environ.get("IDPOOL_POOL_DEPTH") or 4),
        busy_idle_tags=a.busy_idle_tags,
        busy_seconds=a.busy_seconds,
        busy_warmup=a.busy_warmup,
        busy_rounds=a.busy_rounds,
        connections=a.connections,
        busy_step=a.busy_step,
        lowrate_duration=a.lowrate_duration,
        lowrate_rate=a.lowrate_rate,
        lowrate_nodes=a.lowrate_nodes,
        lowrate_step=a.lowrate_step,
        json=a.json,
        redis_cluster=a.redis_cluster,
    )


def machine() -> dict[str, Any]:
    commit = subprocess.run(
        ["git", "describe", "--always", "--dirty"], capture_output=True, text=True, cwd=ROOT,
        check=False,
    ).stdout.strip()  # fmt: skip
    import idpool

    try:
        version = metadata.version("idpool")
    except metadata.PackageNotFoundError:
        version = "?"
    idpool_env = {k: v for k, v in os.environ.items() if k.startswith("IDPOOL_")}
    return {
        "commit": commit or "?",
        "idpool": f"{version} from {Path(idpool.__file__).resolve().parent.parent}",
        "python": sys.executable,
        "cores": os.cpu_count(),
        "load_avg_at_start": [round(x, 2) for x in os.getloadavg()],
        "wrk": shutil.which("wrk") or "absent (asyncio client)",
        "idpool_env": {k: v for k, v in idpool_env.items() if "URL" not in k and "TOKEN" not in k},
    }


def main(argv: Sequence[str] | None = None) -> int:
    plan = parse(argv)
    # SIGTERM unwinds like Ctrl-C, so every process and database is cleaned up
    signal.signal(signal.SIGTERM, lambda signum, frame: sys.exit(128 + signum))
    workdir = Path(tempfile.mkdtemp(prefix="idpool-scale-"))
    started = time.time()
    info = machine()
    print(f"{plan.command()}\nlogs in {workdir}; commit {info['commit']}", flush=True)
    results: dict[str, Any] = {"command": plan.command(), "machine": info}
    if "idle" in plan.scenarios:
        results["idle"] = [_idle_row(plan, workdir, t, n) for t in plan.tags for n in plan.nodes]
    if "busy" in plan.scenarios:
        results["busy"] = _guarded(
            scenarios.busy,
            workdir,
            plan.busy_idle_tags,
            rounds=plan.busy_rounds,
            seconds=plan.busy_seconds,
            warmup=plan.busy_warmup,
            connections=plan.connections,
            busy_step=plan.busy_step,
            fill_limit=plan.fill_limit,
            depth=plan.depth,
        )
    if "lowrate" in plan.scenarios:
        results["lowrate"] = _guarded(
            scenarios.low_rate,
            workdir,
            duration=plan.lowrate_duration,
            rate=plan.lowrate_rate,
            nodes=plan.lowrate_nodes,
            step=plan.lowrate_step,
            depth=plan.depth,
        )
    results["date"] = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime(started))
    results["wall_seconds"] = round(time.time() - started)
    results["load_avg_at_end"] = [round(x, 2) for x in os.getloadavg()]
    print(render(plan, results))
    if plan.json is not None:
        plan.json.write_text(json.dumps(results, indent=1))
        print(f"results written to {plan.json}")
    return 0


def _guarded(scenario: Callable[..., dict[str, Any]], *args: Any, **kwargs: Any) -> dict[str, Any]:
    """Run a scenario; a failure is reported in its place and the run goes on."""
    try:
        return scenario(*args, **kwargs)
    except Exception as e:
        print(f"   FAILED: {e!r}", flush=True)
        return {"error": repr(e)}


def _idle_row(plan: Plan, workdir: Path, tags: int, nodes: int) -> dict[str, Any]:
    """One size of the idle scenario; a failure is reported in its row and the run goes on."""
    try:
        return scenarios.idle(
            workdir,
            tags,
            nodes,
            window=plan.window,
            settle=plan.settle,
            fill_limit=plan.fill_limit,
            depth=plan.depth,
            redis_cluster=plan.redis_cluster,
        )
    except Exception as e:
        print(f"   FAILED: {e!r}", flush=True)
        return {"tags": tags, "nodes": nodes, "error": repr(e)}


def _pct(value: float) -> str:
    return f"{value:.1f}%"


def _render_idle(plan: Plan, r: dict[str, Any]) -> list[str]:
    """The idle table."""
    lines: list[str] = []
    lines += [
        "",
        "idle: "
        + ("Redis Cluster 3+3" if plan.redis_cluster else "private Redis")
        + f", fresh database, tags of step {scenarios.IDLE_STEP}; "
        f"{plan.window:g} s window after the lists filled (+{plan.settle:g} s)",
        "| tags | nodes | node CPU at idle | per node | "
        "Redis commands/s at idle | seconds to fill every list | Redis CPU | load avg |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for row in r["idle"]:
        if "error" in row:
            lines.append(f"| {row['tags']:,} | {row['nodes']} | failed: {row['error']} |")
            continue
        fill = (
            f"{row['fill_s']:.1f}"
            if row["fill_s"] is not None
            else f"not within {row['fill_limit_s']:g} "
            f"({row['short_lists_after_window']} short after the window)"
        )
        lines.append(
            f"| {row['tags']:,} | {row['nodes']} | {_pct(row['node_cpu_pct'])} | "
            f"{_pct(row['node_cpu_pct_per_node'])} | "
            f"{row['redis_cmds_per_s']:,.0f} | {fill} | {_pct(row['redis_cpu_pct'])} | "
            f"{row['load_avg_1m_before']} |"
        )
    return lines


def _render_busy(plan: Plan, r: dict[str, Any]) -> list[str]:
    """Busy tag beside idle tags."""
    lines: list[str] = []
    b = r["busy"]
    lines += [
        "",
        f"busy beside idle: GET /id/busy on one node, {plan.connections} connections, "
        f"{plan.busy_seconds:g} s per run, median of {b['rounds']} round(s)",
    ]
    for key, label in (("small", "10 tags"), ("large", f"{b['idle_tags']} idle tags + busy")):
        for run in b[key]["runs"]:
            lines.append(
                f"  {label:<24} {run['req_per_s']:>9,.0f} req/s  p50 {run['p50_ms']:.2f} ms  "
                f"p99 {run['p99_ms']:.2f} ms  max {run['max_ms']:.1f} ms  "
                f"errors {run['errors']}  node CPU {_pct(run['node_cpu_pct'])} "
                f"= {run['cpu_us_per_req']:.0f} us/req  "
                f"load {run['load_avg_1m_before']}"
            )
    lines.append(
        f"  ratio {b['idle_tags']} idle / 10 tags: throughput {b['ratio_req_per_s']:.3f}x "
        f"[{'met' if b['throughput_target_met'] else 'MISS'} >= 0.95x], "
        f"p99 {b['ratio_p99']:.2f}x [{'met' if b['p99_target_met'] else 'MISS'} <= 1.1x]; "
        f"node CPU per request {b['ratio_cpu_per_req']}x (info)"
    )
    return lines


def _render_lowrate(plan: Plan, r: dict[str, Any]) -> list[str]:
    """Low rate with a restart."""
    lines: list[str] = []
    lr = r["lowrate"]
    pub = lr["published"]
    rs, st, su = pub["redis_rate"], pub["status_cluster_ids_per_s"], pub["supply_seconds"]
    rst = lr["restart"]
    error = f", error {rst['error']}" if "error" in rst else ""
    lines += [
        "",
        f"low rate: {lr['rate_asked']:g} IDs/s on one tag for {lr['duration_s']:g} s over "
        f"{lr['nodes']} node(s), node 1 restarted half-way (stop {rst.get('stop_s')} s, "
        f"ready {rst.get('ready_s')} s, returned {rst.get('returned')} "
        f"abandoned {rst.get('abandoned')}{error})",
        f"  handed out {lr['handed_out']:,} IDs (duplicates {lr['duplicates']}, retried "
        f"{lr['requests_retried']}, failed {lr['requests_failed']}); step "
        f"{lr['step_at_start']} -> {lr['step_at_end']}",
        f"  claimed from MySQL {lr['claimed_from_mysql']:,} IDs: excess {lr['excess_ids']:,} "
        f"= {lr['excess_ranges']} ranges of {lr['step_at_start']} vs bound "
        f"{lr['bound_ranges']} (min depth {plan.depth} + 2 x {lr['nodes']} nodes) "
        f"[{'met' if lr['bound_met'] else 'MISS'}]; of it in the pool "
        f"{lr['in_pool_ids']:,}, in node buffers {lr['held_by_nodes_ids']:,}",
        "  published rate over the second half (asked "
        f"{lr['rate_asked']:g}): Redis stats `rate` {_range(rs)} "
        f"[{'met' if rs['within_0.5x_2x'] else 'MISS'} 0.5x-2x]; /status.json "
        f"cluster_ids_per_s {_range(st)} [{'met' if st['within_0.5x_2x'] else 'MISS'}]; "
        f"idpool_pool_supply_seconds {_range(su)}, absent from /metrics in "
        f"{su['absent']} of {su['of']} node samples",
    ]
    return lines


def render(plan: Plan, r: dict[str, Any]) -> str:
    m = r["machine"]
    lines = [
        "",
        f"idpool scale measurement, {r['date']}, {r['wall_seconds']} s, commit {m['commit']}",
        f"code: idpool {m['idpool']}; {m['cores']} cores; load average at start "
        f"{m['load_avg_at_start']}, at end {r['load_avg_at_end']}; load generator {m['wrk']}",
        f"IDPOOL_ settings given to nodes: {m['idpool_env'] or 'defaults'}; "
        f"minimum pool depth {plan.depth}",
    ]
    if "idle" in r:
        lines += _render_idle(plan, r)
    for name in ("busy", "lowrate"):
        if "error" in r.get(name, {}):
            lines += ["", f"{name}: failed: {r[name]['error']}"]
    if "busy" in r and "error" not in r["busy"]:
        lines += _render_busy(plan, r)
    if "lowrate" in r and "error" not in r["lowrate"]:
        lines += _render_lowrate(plan, r)
    lines += ["", f"reproduce: {r['command']}"]
    return "\n".join(lines)


def _range(s: dict[str, Any]) -> str:
    if s.get("last") is None:
        return "never published"
    return f"{s['min']:g}..{s['max']:g} (last {s['last']:g})"
