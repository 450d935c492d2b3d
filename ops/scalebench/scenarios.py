"""The three scenarios of issue 11. Each builds its own World (private Redis,
fresh database), measures, and returns a plain dict for the report and JSON.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import redis

from ops.toolkit import node_stopped

from .load import drive
from .world import TagSpec, World, cpu_percent, http_get, pool_key, stats_key

IDLE_STEP = 1000  # step of every idle tag


def _idle_tags(count: int, prefix: str = "t") -> list[TagSpec]:
    return [TagSpec(f"{prefix}{i:05d}", IDLE_STEP) for i in range(count)]


# --- 1. idle ---------------------------------------------------------------------


def idle(
    workdir: Path,
    tags: int,
    nodes: int,
    *,
    window: float,
    settle: float,
    fill_limit: float,
    depth: int,
    redis_cluster: bool = False,
) -> dict[str, Any]:
    """T tags, N nodes, nothing requested: time to fill every list, then CPU and
    Redis traffic over ``window`` seconds (on a Redis Cluster 3+3 if asked)."""
    specs = _idle_tags(tags)
    names = [t.name for t in specs]
    where = " on a Redis Cluster of 3 primaries" if redis_cluster else ""
    print(f"== idle: {tags} tags, {nodes} node(s){where}", flush=True)
    with World(workdir, f"idle-{tags}x{nodes}", redis_cluster=redis_cluster) as world:
        world.add_tags(specs)
        world.start_nodes(nodes)
        fill_s = world.wait_filled(names, depth, fill_limit)
        print(
            f"   lists filled to {depth}: "
            + (f"{fill_s:.1f} s" if fill_s is not None else f"NOT within {fill_limit:.0f} s"),
            flush=True,
        )
        time.sleep(settle)
        world.check_nodes()
        load_avg = os.getloadavg()[0]
        calls0 = world.command_calls()
        cpu0, cmds0, rcpu0, t0 = (
            world.cpu_ns(),
            world.commands_processed(),
            world.redis_cpu_seconds(),
            time.monotonic(),
        )
        time.sleep(window)
        cpu1, cmds1, rcpu1, t1 = (
            world.cpu_ns(),
            world.commands_processed(),
            world.redis_cpu_seconds(),
            time.monotonic(),
        )
        calls1 = world.command_calls()
        world.check_nodes()
        seconds = t1 - t0
        short = world.short_lists(names, depth)
    row: dict[str, Any] = {
        "tags": tags,
        "nodes": nodes,
        "fill_s": None if fill_s is None else round(fill_s, 1),
        "fill_limit_s": fill_limit,
        "short_lists_after_window": short,
        "node_cpu_pct": round(cpu_percent(cpu0, cpu1, seconds), 2),
        "node_cpu_pct_per_node": round(cpu_percent(cpu0, cpu1, seconds) / nodes, 2),
        "redis_cluster": redis_cluster,
        # minus the INFO call that closes the window
        "redis_cmds_per_s": round((cmds1 - cmds0 - 1) / seconds, 1),
        "redis_cpu_pct": round(100 * (rcpu1 - rcpu0) / seconds, 1),
        "window_s": round(seconds, 1),
        # per command, busiest first: which calls the idle cost is made of
        "redis_calls_per_s": _per_second(calls0, calls1, seconds),
        "load_avg_1m_before": round(load_avg, 2),
    }
    top = ", ".join(f"{k} {v:g}" for k, v in list(row["redis_calls_per_s"].items())[:8])
    print(
        f"   node CPU {row['node_cpu_pct']}% ({row['node_cpu_pct_per_node']}% per node)  "
        f"Redis {row['redis_cmds_per_s']} cmd/s "
        f"(Redis CPU {row['redis_cpu_pct']}%)  load {row['load_avg_1m_before']}\n"
        f"   Redis calls/s by command: {top or '-'}",
        flush=True,
    )
    return row


def _per_second(before: dict[str, int], after: dict[str, int], seconds: float) -> dict[str, float]:
    rates = {k: round((n - before.get(k, 0)) / seconds, 1) for k, n in after.items()}
    return dict(sorted(((k, v) for k, v in rates.items() if v > 0), key=lambda kv: -kv[1]))


# --- 2. busy beside idle -----------------------------------------------------------


def busy_round(
    workdir: Path,
    label: str,
    total_tags: int,
    *,
    seconds: float,
    warmup: float,
    connections: int,
    busy_step: int,
    fill_limit: float,
    depth: int,
) -> dict[str, Any]:
    """One node with ``total_tags`` tags; closed-loop load on the tag ``busy``."""
    specs = [TagSpec("busy", busy_step), *_idle_tags(total_tags - 1)]
    with World(workdir, label) as world:
        world.add_tags(specs)
        world.start_nodes(1)
        fill_s = world.wait_filled([t.name for t in specs], depth, fill_limit)
        url = world.nodes[0].base_url + "/id/busy"
        drive(url, warmup, connections)
        load_avg = os.getloadavg()[0]
        cpu0 = world.cpu_ns()
        result = drive(url, seconds, connections)
        cpu = cpu_percent(cpu0, world.cpu_ns(), result.seconds)
        world.check_nodes()
    out = {
        "tags": total_tags,
        "fill_s": None if fill_s is None else round(fill_s, 1),
        "node_cpu_pct": round(cpu, 1),
        # node CPU per request: less sensitive than req/s to what else the machine runs
        "cpu_us_per_req": round(cpu / 100 * result.seconds * 1e6 / max(1, result.requests), 1),
        "load_avg_1m_before": round(load_avg, 2),
        **result.as_dict(),
    }
    print(
        f"   {label}: {total_tags} tags {result.req_per_s:,.0f} req/s p99 {result.p99_ms:.2f} ms "
        f"max {result.max_ms:.1f} ms errors {result.errors} ({result.tool}) "
        f"node CPU {out['cpu_us_per_req']} us/req load {load_avg:.2f}",
        flush=True,
    )
    return out


def busy(
    workdir: Path,
    idle_tags: int,
    *,
    rounds: int,
    seconds: float,
    warmup: float,
    connections: int,
    busy_step: int,
    fill_limit: float,
    depth: int,
) -> dict[str, Any]:
    """The busy tag on a node with 10 tags vs one with ``idle_tags`` more, in
    alternating order (A B, B A, ...), one fresh world per run."""
    print(f"== busy beside idle: 10 tags vs {idle_tags} idle tags + 1 busy", flush=True)
    runs: dict[str, list[dict[str, Any]]] = {"small": [], "large": []}
    sizes = {"small": 10, "large": idle_tags + 1}
    for rnd in range(rounds):
        order = ["small", "large"] if rnd % 2 == 0 else ["large", "small"]
        for key in order:
            runs[key].append(
                busy_round(
                    workdir,
                    f"busy-{key}-{rnd}",
                    sizes[key],
                    seconds=seconds,
                    warmup=warmup,
                    connections=connections,
                    busy_step=busy_step,
                    fill_limit=fill_limit,
                    depth=depth,
                )
            )

    def median(key: str, field: str) -> float:
        values = sorted(float(r[field]) for r in runs[key])
        mid = len(values) // 2
        return values[mid] if len(values) % 2 else (values[mid - 1] + values[mid]) / 2

    small_rps, large_rps = median("small", "req_per_s"), median("large", "req_per_s")
    small_p99, large_p99 = median("small", "p99_ms"), median("large", "p99_ms")
    ratio_rps = large_rps / small_rps if small_rps else float("nan")
    ratio_p99 = large_p99 / small_p99 if small_p99 else float("nan")
    small_cpu, large_cpu = median("small", "cpu_us_per_req"), median("large", "cpu_us_per_req")
    return {
        "idle_tags": idle_tags,
        "rounds": rounds,
        "small": {
            "req_per_s": small_rps,
            "p99_ms": small_p99,
            "cpu_us_per_req": small_cpu,
            "runs": runs["small"],
        },
        "large": {
            "req_per_s": large_rps,
            "p99_ms": large_p99,
            "cpu_us_per_req": large_cpu,
            "runs": runs["large"],
        },
        "ratio_req_per_s": round(ratio_rps, 3),
        "ratio_p99": round(ratio_p99, 3),
        "ratio_cpu_per_req": round(large_cpu / small_cpu, 3) if small_cpu else None,
        "throughput_target_met": ratio_rps >= 0.95,
        "p99_target_met": ratio_p99 <= 1.1,
    }


# --- 3. low rate -------------------------------------------------------------------

SUPPLY = re.compile(r'^idpool_pool_supply_seconds\{[^}]*tag="lowrate"[^}]*\} (\S+)$', re.M)


def _sample(world: World, tag: str, elapsed: float) -> dict[str, Any]:
    """The published rate, as Redis, /status.json and /metrics of each node show it."""
    sample: dict[str, Any] = {"t": round(elapsed, 1)}
    with contextlib.suppress(redis.RedisError):
        raw = world.redis.hget(stats_key(tag), "rate")
        sample["redis_rate"] = None if raw is None else float(raw)
    status_rates: list[float | None] = []
    supply: list[float | None] = []
    for node in world.nodes:
        rate: float | None = None
        seconds: float | None = None
        with contextlib.suppress(OSError, ValueError, KeyError):
            code, body = http_get(node.base_url + "/status.json", timeout=5)
            if code == 200:
                for entry in json.loads(body)["tags"]:
                    if entry["tag"] == tag:
                        rate = entry["rate"].get("cluster_ids_per_s")
        with contextlib.suppress(OSError, ValueError):
            code, body = http_get(node.base_url + "/metrics", timeout=5)
            if code == 200 and (m := SUPPLY.search(body.decode())):
                seconds = float(m.group(1))
        status_rates.append(rate)
        supply.append(seconds)
    sample["status_rate"] = status_rates
    sample["supply_seconds"] = supply
    return sample


def _text(value: bytes | str) -> str:
    return value.decode() if isinstance(value, bytes) else value


def _held_by_nodes(world: World, tag: str) -> int:
    """IDs in the nodes' buffers (current remainder and the prefetched range)."""
    held = 0
    for node in world.nodes:
        with contextlib.suppress(OSError, ValueError, KeyError, TypeError):
            code, body = http_get(node.base_url + "/status.json", timeout=5)
            for entry in json.loads(body)["tags"] if code == 200 else []:
                buf = entry.get("buffer") if entry["tag"] == tag else None
                if buf:
                    held += int(buf.get("remaining") or 0)
                    if buf.get("next"):
                        first, _, last = str(buf["next"]).partition("-")
                        held += int(last) - int(first) + 1
    return held


@dataclass
class _Paced:
    """What a paced run of single-ID requests saw."""

    seen: set[int] = field(default_factory=set)
    duplicates: int = 0
    retried: int = 0
    failed: int = 0
    samples: list[dict[str, Any]] = field(default_factory=list)
    restart: dict[str, Any] = field(default_factory=dict)

    def one_id(self, world: World, tag: str, i: int) -> None:
        """Request one ID, round robin from node ``i``; a failure goes to the next."""
        for attempt in range(len(world.nodes) + 1):
            node = world.nodes[(i + attempt) % len(world.nodes)]
            try:
                code, body = http_get(f"{node.base_url}/id/{tag}", timeout=2)
            except OSError:
                code, body = 0, b""
            if code == 200:
                value = int(body)
                self.duplicates += value in self.seen
                self.seen.add(value)
                return
            self.retried += 1
        self.failed += 1


def _paced_with_restart(
    world: World, tag: str, duration: float, rate: float, sample_every: float
) -> _Paced:
    """``rate`` IDs/s for ``duration`` s; node 0 restarted half-way, in a thread."""
    run = _Paced()

    def do_restart() -> None:
        try:
            run.restart.update(world.restart_node(0))
        except Exception as e:  # reported, and the run goes on on the other nodes
            run.restart["error"] = repr(e)

    restarter = threading.Thread(target=do_restart, daemon=True)
    started = time.monotonic()
    next_sample = 0.0
    for i in range(int(duration * rate)):
        due = started + i / rate
        if (wait := due - time.monotonic()) > 0:
            time.sleep(wait)
        elapsed = time.monotonic() - started
        if not restarter.is_alive() and not run.restart and elapsed >= duration / 2:
            restarter.start()
        run.one_id(world, tag, i)
        if elapsed >= next_sample:
            run.samples.append(_sample(world, tag, elapsed))
            next_sample += sample_every
    restarter.join(150)
    run.samples.append(_sample(world, tag, time.monotonic() - started))
    return run


def _ids_in_pool(world: World, tag: str) -> int:
    in_pool = 0
    for text in world.redis.lrange(pool_key(tag), 0, -1):
        first, _, last = _text(text).partition("-")
        in_pool += int(last) - int(first) + 1
    return in_pool


def low_rate(
    workdir: Path,
    *,
    duration: float,
    rate: float,
    nodes: int,
    step: int,
    depth: int,
    sample_every: float = 10.0,
) -> dict[str, Any]:
    """One tag at a steady ``rate`` IDs/s over ``nodes`` nodes (round robin, a
    failed request goes to the next node), one node restarted half-way."""
    tag = "lowrate"
    print(
        f"== low rate: {rate:g} IDs/s on one tag for {duration:.0f} s, {nodes} node(s), "
        f"step {step}, node 1 restarted at {duration / 2:.0f} s",
        flush=True,
    )
    with World(workdir, "lowrate") as world:
        world.add_tags([TagSpec(tag, step)])
        world.start_nodes(nodes)
        run = _paced_with_restart(world, tag, duration, rate, sample_every)
        row = world.ledger_row(tag)
        in_pool = _ids_in_pool(world, tag)
        held = _held_by_nodes(world, tag)
        stats = {_text(k): _text(v) for k, v in world.redis.hgetall(stats_key(tag)).items()}
        logs = [p.read_text(errors="replace") for p in world.nodes[0].logs]
    handed_out = len(run.seen)
    claimed = row["max_id"] - row["start_id"]
    excess = claimed - handed_out
    bound_ranges = depth + 2 * nodes
    stopped = node_stopped(logs[0]) if logs else None
    second_half = [s for s in run.samples if s["t"] >= duration / 2]
    return {
        "duration_s": duration,
        "rate_asked": rate,
        "nodes": nodes,
        "step_at_start": step,
        "step_at_end": row["step"],
        "handed_out": handed_out,
        "duplicates": run.duplicates,
        "requests_retried": run.retried,
        "requests_failed": run.failed,
        "claimed_from_mysql": claimed,
        "excess_ids": excess,
        "excess_ranges": round(excess / step, 1),
        "bound_ranges": bound_ranges,
        "bound_met": excess <= bound_ranges * step,
        "in_pool_ids": in_pool,
        "held_by_nodes_ids": held,
        "restart": {
            **run.restart,
            "returned": None if stopped is None else stopped[0],
            "abandoned": None if stopped is None else stopped[1],
        },
        "stats_hash_at_end": stats,
        "published": _published(second_half or run.samples, rate),
        "samples": run.samples,
    }


def _published(samples: list[dict[str, Any]], asked: float) -> dict[str, Any]:
    """Range and last value of each published figure over the samples given."""

    def summary(values: list[float]) -> dict[str, Any]:
        if not values:
            return {"min": None, "max": None, "last": None, "within_0.5x_2x": False}
        ok = all(asked / 2 <= v <= asked * 2 for v in values)
        return {"min": min(values), "max": max(values), "last": values[-1], "within_0.5x_2x": ok}

    redis_rates = [s["redis_rate"] for s in samples if s.get("redis_rate") is not None]
    status = [r for s in samples for r in s["status_rate"] if r is not None]
    supply = [v for s in samples for v in s["supply_seconds"] if v is not None]
    return {
        "redis_rate": summary(redis_rates),
        "status_cluster_ids_per_s": summary(status),
        "supply_seconds": {
            "min": min(supply, default=None),
            "max": max(supply, default=None),
            "last": supply[-1] if supply else None,
            # a node that knows no rate leaves the series out: an alert on it stays silent
            "absent": sum(v is None for s in samples for v in s["supply_seconds"]),
            "of": sum(len(s["supply_seconds"]) for s in samples),
        },
    }
