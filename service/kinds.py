"""Kinds of ID: the one place where a tag's kind decides how its IDs are made
and served.

Every tag has a kind (the ledger's ``kind`` column, ``segment`` by default).
A node keeps one object per kind (``Node.kinds``) and hands each request for a
tag to the object of the tag's kind. A kind implements ``IdKind``. ``segment``:
ranges from the pool or the ledger, served from the node's double buffers
(``buffer.py``), answered from memory by NodeApp's fast path. ``strict``
(``strict_tags.py``): every request takes from one sequence in Redis, so IDs
increase in real time across every node. ``snowflake`` (``snowflake.py``):
time-ordered IDs made in memory from a leased worker ID. A new kind is a module beside this
one with a class implementing ``IdKind``, added to ``KINDS`` below
(docs/design.md, "Kinds of ID").
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any, Protocol, runtime_checkable

from idpool.pool.kind_rules import KindRules

from .snowflake import SNOWFLAKE, SnowflakeKind
from .strict_tags import STRICT, StrictKind

if TYPE_CHECKING:
    from .node import Node

SEGMENT = "segment"


class IdKind(Protocol):
    """How the IDs of one kind of tag are made and served on a node."""

    name: str  # the ledger's kind column
    # True: the kind keeps a SegmentBuffer per tag in ``node.buffers`` and
    # NodeApp answers from it before routing; False: every request comes here.
    from_memory: bool

    async def next_id(self, tag: str) -> int | str:
        """One ID of ``tag``; raises IdPoolError (answered by service/errors.py)."""
        ...

    async def next_ids(self, tag: str, count: int) -> list[int] | list[str]:
        """``count`` IDs of ``tag``, in the order handed out."""
        ...

    def describe(self, tag: str) -> dict[str, Any] | None:
        """What this node holds for the tag, shown as ``buffer`` in /status.json
        (None: nothing held here)."""
        ...

    def not_ready(self) -> str | None:
        """Why this node must not get requests because of this kind, or None."""
        ...

    async def close(self) -> None:
        """Give back what the kind holds (a graceful stop); safe twice."""
        ...


@runtime_checkable
class KeepsTags(Protocol):
    """What a kind without buffers may add to ``IdKind``: the tags it served here
    (their rows are read again every reload, so a disable counts within it; they
    show in /status), and a close at shutdown for what it has under way."""

    def served(self) -> set[str]: ...

    async def close(self) -> None: ...


class SegmentKind:
    """Ranges from the pool or the ledger, served from the node's double buffers."""

    name = SEGMENT
    from_memory = True

    def __init__(self, node: Node) -> None:
        self.node = node

    async def next_id(self, tag: str) -> int | str:
        fmt = self.node.formatted.format_for(tag)  # a rendering on top of the segment tag
        if fmt is not None:
            one = await self.node.formatted.take(tag, fmt, 0)
            assert not isinstance(one, list)
            return one
        return await self.node.take(tag)

    async def next_ids(self, tag: str, count: int) -> list[int] | list[str]:
        fmt = self.node.formatted.format_for(tag)
        if fmt is not None:
            many = await self.node.formatted.take(tag, fmt, count)
            assert isinstance(many, list)
            return many
        return await self.node.take_many(tag, count)

    def describe(self, tag: str) -> dict[str, Any] | None:
        buf = self.node.buffers.get(tag)
        if buf is None:
            return None
        return {
            "current": None if buf.current is None else buf.current.to_text(),
            "used": buf.used,
            "remaining": buf.remaining,
            "next": None if buf.next is None else buf.next.to_text(),
            "next_ready": buf.next is not None,
            "ready": [r.to_text() for r in buf.ready],  # served after current, in order
            "in_memory": buf.in_memory,
            "fetching": buf.fetching,
        }

    def not_ready(self) -> str | None:
        return None  # Node.not_ready decides from the stores and buffers

    async def close(self) -> None:
        return None  # Node.shutdown drains the buffers


# Every kind a tag may have: its name -> how a node makes its object.
KINDS: dict[str, Callable[[Node], IdKind]] = {
    SEGMENT: SegmentKind,
    STRICT: StrictKind,
    SNOWFLAKE: SnowflakeKind,
}


# What the stores must know of each kind (pool/kind_rules.py; the pool names none).
# The segment kind's are the pool's own default (a row of the schema's default kind).
SEGMENT_RULES = KindRules(SEGMENT, pooled=True, end_negated=False)
STRICT_RULES = KindRules(STRICT, fences_state=True, needs_redis=True)
SNOWFLAKE_RULES = KindRules(
    SNOWFLAKE, new_name_only=True, needs_redis=True, record_prefix=SNOWFLAKE + ":"
)
_RULES = {rules.name: rules for rules in (SEGMENT_RULES, STRICT_RULES, SNOWFLAKE_RULES)}


def rules_of(name: str) -> KindRules:
    """The rules of the kind ``name`` (a row's kind column). A name no kind here has
    (a row edited by hand, a newer release's kind) gets ``KindRules(name)``: nothing
    of it pooled, and no record prefix (its record is its format's)."""
    return _RULES.get(name) or KindRules(name)
