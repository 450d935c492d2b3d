"""What a kind may use of its node: ``KindContext``, built before the kinds.

A kind gets this, never the Node: the tag directory, the claims (through the
range source), the stores' optional parts, health, stats, waste, the node's
clock (``pool/clock.py``) and the node's settings for kinds, the format fence;
and, for a kind served from segment buffers, the buffers (``buffer.Buffers``:
the Node holds them and their housekeeping).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from idpool.pool.clock import Clock
from idpool.pool.stores import StoreParts
from idpool.pool.waste import WasteRecorder

from ..buffer import Buffers
from ..formatted import FormatFence
from ..health import StoreHealth
from ..source import RangeSource
from ..stats import NodeStats
from ..tags import TagDirectory


@dataclass(frozen=True)
class KindContext:
    """Everything a kind of ID may reach on its node (no Node: no cycle)."""

    tags: TagDirectory
    source: RangeSource  # its claims (``source.claims``) and its pool
    parts: StoreParts  # the stores' optional roles (None in embedded mode)
    health: StoreHealth
    stats: NodeStats
    waste: WasteRecorder
    buffers: Buffers
    fence: FormatFence  # every name's format fence, checked before a tag is first served
    draining: Callable[[], bool]  # the node is shutting down
    # the node's one clock (pool/clock.py): a kind's sleeps and plain time reads go
    # through it; bind ``clock.monotonic`` once where a hot path reads it. Not a
    # snowflake tag's lease clock, which is its own (kinds/snowflake_leases.py).
    clock: Clock
    # the wall time formatted IDs are dated by: ``clock.now``, read through
    # Node.wall_clock when called (a test sets that to a date of its choosing)
    wall_clock: Callable[[], float]
    node_id: str = ""
    reserve_seconds: float = 0.0
    worker_lease_seconds: float = 10.0
    worker_margin_seconds: float = 2.0
