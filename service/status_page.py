"""The status page: the snapshot of `service/status.py` as one HTML page.

Rendered on the server from the same dict that `/status.json` returns, so the
two always agree; every number carries a `data-field` attribute naming its
place in the JSON. No script, no external asset; it refreshes every 5 seconds.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from html import escape
from typing import Any

from .status import QUIET_STATES, RUNWAY_SHORT_S, Snapshot, runway_text

_STYLE = """
body{font:14px/1.4 system-ui,sans-serif;margin:24px;color:#1b1f24;background:#fafbfc}
h1{font-size:20px;margin:0 0 4px}h2{font-size:16px;margin:24px 0 8px}
table{border-collapse:collapse;background:#fff}td,th{border:1px solid #d0d7de;padding:4px 8px;
text-align:right}th{background:#f0f3f6}td.l,th.l{text-align:left}.up{color:#1a7f37}
.down{color:#cf222e;font-weight:600}.muted{color:#6e7781}.warn{background:#fff8c5}
svg{background:#fff;border:1px solid #d0d7de}
.wide{overflow-x:auto;max-width:100%}.wide td,.wide th{padding:3px 5px;font-size:13px}
td.w{overflow-wrap:anywhere;min-width:5em}td.chart{min-width:204px}
"""
# .wide: a table wider than the window scrolls inside its box, never the page; long
# ranges, formats and names wrap (overflow-wrap) first, so the IDs/s chart (a
# fixed 200 px column) stays in view: the tag table was over 1,400 px and cut it.


def _cell(value: Any, field: str, cls: str = "") -> str:
    text = "-" if value is None else str(value)
    klass = f' class="{cls}"' if cls else ""
    return f'<td{klass} data-field="{escape(field)}">{escape(text)}</td>'


def _runway_cell(seconds: float | None, field: str, bounded: bool) -> str:
    short = seconds is not None and seconds < RUNWAY_SHORT_S
    klass = ' class="down"' if short else ""
    text = escape(runway_text(seconds, bounded))
    return f'<td{klass} data-value="{seconds}" data-field="{escape(field)}">{text}</td>'


def _bounded(t: dict[str, Any]) -> bool:
    """False only for a tag whose row says it has no max (no row: not known)."""
    return t.get("max") is not None or t.get("max_id") is None


def _chart(history: list[dict[str, float]], width: int = 200, height: int = 48) -> str:
    if len(history) < 2:
        return '<span class="muted">collecting</span>'
    top = max(p["ids_per_s"] for p in history) or 1.0
    step = width / (len(history) - 1)
    points = " ".join(
        f"{i * step:.1f},{height - 2 - (p['ids_per_s'] / top) * (height - 4):.1f}"
        for i, p in enumerate(history)
    )
    return (
        f'<svg width="{width}" height="{height}" role="img" aria-label="IDs per second">'
        f'<polyline fill="none" stroke="#0969da" stroke-width="1.5" points="{points}"/></svg>'
        f'<div class="muted">peak {top:g}/s</div>'
    )


def _problems(problems: list[str], field: str) -> str:
    if not problems:
        return f'<td class="l up" data-field="{escape(field)}">ok</td>'
    # disabled, removed, exhausted: what an operator did or a bound says, not an outage
    klass = "muted" if QUIET_STATES.issuperset(problems) else "down"
    text = escape(", ".join(problems))
    return f'<td class="l {klass}" data-field="{escape(field)}">{text}</td>'


def _cluster(snap: Snapshot) -> str:
    view = snap.get("cluster") or {"nodes": [], "tags": []}
    nodes = []
    for i, n in enumerate(view["nodes"]):
        p = f"cluster.nodes.{i}"
        nodes.append(
            f"<tr{' class=warn' if n['draining'] else ''}>"
            + _cell(n["addr"], f"{p}.addr", "l")
            + _cell(n["pid"], f"{p}.pid")
            + _cell(n["version"], f"{p}.version")
            + _cell(time.strftime("%H:%M:%S", time.gmtime(n["started_at"])), f"{p}.started_at")
            + _cell(n["last_seen_s"], f"{p}.last_seen_s")
            + _cell(n["tags"], f"{p}.tags")
            + _problems(n["problems"], f"{p}.problems")
            + f'<td class="l">{"this node" if n["this"] else ""}</td></tr>'
        )
    tags = []
    # tags with a problem first, then the busiest
    for i, t in _first(view["tags"], lambda t: len(t["problems"]) * 1e18 + (t["ids_per_s"] or 0)):
        p = f"cluster.tags.{i}"
        wasted = ", ".join(f"{reason} {ids}" for reason, ids in sorted(t["wasted"].items()))
        depth = "-" if t["depth"] is None else f"{t['depth']}/{t['target_depth'] or '-'}"
        tags.append(
            "<tr>"
            + _cell(t["tag"], f"{p}.tag", "l")
            + _cell(t["max_id"], f"{p}.max_id")
            + _cell(t["max"], f"{p}.max")
            + _cell(depth, f"{p}.depth")
            + _cell(t["minutes_of_supply"], f"{p}.minutes_of_supply")
            + _cell(t["ids_per_s"], f"{p}.ids_per_s")
            + _cell(t["returned"], f"{p}.returned")
            + _cell(wasted or "0", f"{p}.wasted", "l")
            + _runway_cell(t["runway_s"], f"{p}.runway_s", _bounded(t))
            + _problems(t["problems"], f"{p}.problems")
            + "</tr>"
        )
    return (
        f"<h2>Cluster: {len(view['nodes'])} live node{'s' * (len(view['nodes']) != 1)}</h2>"
        "<table>"
        '<tr><th class="l">node</th><th>pid</th><th>version</th><th>started (UTC)</th>'
        '<th>seen s ago</th><th>tags</th><th class="l">state</th><th></th></tr>'
        f"{''.join(nodes)}</table>"
        "<h2>Cluster tags</h2><div class=wide><table>"
        '<tr><th class="l">tag</th><th>max_id</th><th>max</th><th>pool ranges/target</th>'
        "<th>pool minutes</th><th>IDs/s</th><th>returned</th>"
        '<th class="l">wasted (why)</th><th>runway</th><th class="l">state</th></tr>'
        f"{''.join(tags)}</table></div>"
    )


PAGE_TAGS = 20  # rows per table: the page stays a few KB however many tags


def _first(
    items: list[dict[str, Any]], busy: Callable[[dict[str, Any]], float]
) -> list[tuple[int, dict[str, Any]]]:
    """The PAGE_TAGS busiest rows, with their index in the snapshot (data-field)."""
    ranked = sorted(enumerate(items), key=lambda pair: -busy(pair[1]))[:PAGE_TAGS]
    return sorted(ranked, key=lambda pair: pair[0])


def _more(total: int) -> str:
    if total <= PAGE_TAGS:
        return ""
    return (
        f'<div class="muted">the {PAGE_TAGS} busiest of {total} tags; every tag is in '
        '<a href="/status.json">/status.json</a></div>'
    )


def render(snap: Snapshot) -> str:
    node = snap["node"]
    stores = "".join(
        f'<li>{escape(name)}: <span class="{"up" if h["up"] else "down"}" '
        f'data-field="stores.{escape(name)}.up">{"up" if h["up"] else "down"}</span>'
        + (f' <span class="muted">{escape(str(h["error"]))}</span>' if h["error"] else "")
        + (
            f' <span class="down" data-field="stores.{escape(name)}.claims_stopped">'
            f'{escape(str(h["mark_replicas"]["claims_stopped"]))}</span>'
            if (h.get("mark_replicas") or {}).get("claims_stopped")
            else ""
        )
        + "</li>"
        for name, h in snap["stores"].items()
    )
    rows = []
    for i, t in _first(snap["tags"], lambda t: t["rate"]["node_ids_per_s"]):
        p = f"tags.{i}"
        buf = t["buffer"] or {}
        pool = t["pool"] or {}
        rows.append(
            "<tr>"
            + _cell(t["tag"], f"{p}.tag", "l w")
            + _cell(t["kind"], f"{p}.kind", "l")
            + _cell(t.get("format"), f"{p}.format", "l w")
            + _cell(buf.get("current"), f"{p}.buffer.current", "l w")
            + _cell(buf.get("used"), f"{p}.buffer.used")
            + _cell(buf.get("remaining"), f"{p}.buffer.remaining")
            + _cell(buf.get("next"), f"{p}.buffer.next", "l w")
            + _cell(pool.get("depth"), f"{p}.pool.depth")
            + _cell(pool.get("ids"), f"{p}.pool.ids")
            + _cell(pool.get("minutes_of_supply"), f"{p}.pool.minutes_of_supply")
            + _cell(t["step"], f"{p}.step")
            + _cell(t.get("max"), f"{p}.max")
            + _runway_cell(t.get("runway_s"), f"{p}.runway_s", _bounded(t))
            + _cell(t["counters"]["ids_issued"], f"{p}.counters.ids_issued")
            + _cell(t["rate"]["node_ids_per_s"], f"{p}.rate.node_ids_per_s")
            + f'<td class="l chart">{_chart(t["history"])}</td>'
            + "</tr>"
        )
    head = (
        '<tr><th class="l">tag</th><th class="l">kind</th><th class="l">format</th>'
        '<th class="l">current range</th>'
        "<th>used</th>"
        '<th>left</th><th class="l">next range</th><th>pool ranges</th><th>pool IDs</th>'
        "<th>pool minutes</th><th>step</th><th>max</th><th>runway</th><th>issued here</th>"
        "<th>IDs/s here</th>"
        '<th class="l">last 10 min</th></tr>'
    )
    state = "draining" if node["draining"] else "serving"
    # The tab says which node and which cluster: a PID says neither.
    addr = escape(str(node.get("addr") or f"pid {node['pid']}"))
    live = len((snap.get("cluster") or {}).get("nodes", []))
    title = f"idpool {addr} · cluster of {live} live node{'s' * (live != 1)}"
    return (
        '<!doctype html><html lang="en"><head><meta charset="utf-8">'
        f'<meta http-equiv="refresh" content="5"><title>{title}</title>'
        f"<style>{_STYLE}</style></head><body>"
        f'<h1>idpool node <span data-field="node.addr">{addr}</span> '
        f'<span class="muted">pid {node["pid"]}</span></h1>'
        f'<div>Updated <b data-field="updated_at">'
        f"{time.strftime('%Y-%m-%d %H:%M:%S', time.gmtime(snap.get('updated_at', 0)))}"
        "</b> UTC</div>"
        f'<div class="muted">{state}, up <span data-field="node.uptime_s">'
        f"{node['uptime_s']}</span> s; same data as "
        '<a href="/status.json">/status.json</a> and <a href="/metrics">/metrics</a></div>'
        f"<h2>Stores</h2><ul>{stores}</ul>"
        f"{_cluster(snap)}"
        f"<h2>Tags at this node</h2><div class=wide><table>{head}{''.join(rows)}</table></div>"
        f"{_more(len(snap['tags']))}"
        "</body></html>"
    )
