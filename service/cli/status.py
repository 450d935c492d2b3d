"""``idpool pool show`` (per tag, the ledger and the pool's list) and ``idpool
status`` (the cluster view of /status), read from the stores."""

from __future__ import annotations

import argparse
import time

from idpool.pool.settings import Settings
from idpool.pool.stores import open_stores

from ..cluster_reports import node_ttl
from ..kinds import spec_of
from ..status import cluster, read_stores, runway_text, tag_entries
from .common import counted, show


def add_parsers(sub: argparse._SubParsersAction, embedded: argparse.ArgumentParser) -> None:  # type: ignore[type-arg]
    sub.add_parser(
        "status", parents=[embedded], help="the cluster: live nodes, and per tag its supply"
    )
    pool = sub.add_parser("pool", help="inspect the Redis pool").add_subparsers(
        dest="pool_command", required=True
    )
    pool.add_parser("show", parents=[embedded], help="depth and head range per tag")


async def pool_show(settings: Settings, args: argparse.Namespace) -> int:
    """The per-tag part of /status, from the stores (no node's buffers here)."""
    ledger, pool = await open_stores(settings)
    try:
        names = [row.tag for row in await ledger.list_tags()]
        entries = tag_entries(None, await read_stores(ledger, pool, names), names)
    finally:
        await pool.close()
        await ledger.close()
    print(
        f"{'tag':<20} {'step':>9} {'max_id':>14} {'depth':>6} {'target':>6} {'pool IDs':>12} "
        f"{'IDs/s':>9} {'minutes':>8}  head range"
    )
    for t in entries:
        if not spec_of(t["kind"]).ranges:  # snowflake: made in memory from a leased worker ID
            print(f"{t['tag']:<20} {'-':>9} {'-':>14} {'-':>6} {'-':>6} {'-':>12} {'-':>9} "
                  f"{'-':>8}  ({t['kind']}: no pool; see `idpool tag list`)")  # fmt: skip
            continue
        pooled = t["pool"] or {}
        rate = t["rate"].get("cluster_ids_per_s")
        print(
            f"{t['tag']:<20} {show(t['step']):>9} {show(t['max_id']):>14} "
            f"{show(pooled.get('depth')):>6} {show(pooled.get('target_depth')):>6} "
            f"{show(pooled.get('ids')):>12} {show(rate):>9} "
            f"{show(pooled.get('minutes_of_supply')):>8}  {show(pooled.get('head'))}"
        )
    return 0


async def status(settings: Settings, args: argparse.Namespace) -> int:
    """The cluster view of /status, in a terminal."""
    ledger, pool = await open_stores(settings)
    try:
        names = [row.tag for row in await ledger.list_tags()]
        view = await read_stores(ledger, pool, names, node_ttl(settings.report_seconds))
    finally:
        await pool.close()
        await ledger.close()
    shown = cluster(view)
    for store, detail in view.errors.items():
        print(f"! {store} down: {detail}")
    now = time.strftime("%Y-%m-%d %H:%M:%S")
    print(f"{counted(len(shown['nodes']), 'live node')} (as of {now})")
    print(f"  {'node':<24} {'pid':>8} {'version':>8} {'seen':>6} {'tags':>5}  state")
    for n in shown["nodes"]:
        state = ", ".join(n["problems"]) or "serving"
        print(
            f"  {show(n['addr']):<24} {show(n['pid']):>8} {show(n['version']):>8} "
            f"{n['last_seen_s']:>5}s {n['tags']:>5}  {state}"
        )
    print(
        f"  {'tag':<20} {'max_id':>14} {'max':>16} {'ranges':>9} {'minutes':>8} {'IDs/s':>9} "
        f"{'returned':>9} {'runway':>9}  wasted / state"
    )
    for t in shown["tags"]:
        ranges = "-" if t["depth"] is None else f"{t['depth']}/{t['target_depth'] or '-'}"
        wasted = " ".join(f"{reason}={ids}" for reason, ids in sorted(t["wasted"].items()))
        bounded = t["max"] is not None or t["max_id"] is None  # no row: not known
        state = ", ".join(t["problems"])
        print(
            f"  {t['tag']:<20} {show(t['max_id']):>14} {show(t['max']):>16} {ranges:>9} "
            f"{show(t['minutes_of_supply']):>8} {show(t['ids_per_s']):>9} "
            f"{t['returned']:>9} {runway_text(t['runway_s'], bounded, ''):>9}"
            f"  {wasted or '-'}" + (f"  [{state}]" if state else "")
        )
    if len(names) > len(shown["tags"]):
        print(f"  ... and {len(names) - len(shown['tags'])} more tags (idpool tag list)")
    return 0
