"""What a kind of ID is, to the rest of the node: ``KindSpec`` (one per kind,
``SPEC`` in its module: its rules, fields, policy and hooks) and ``IdKind`` (the
object a node makes of it, serving the kind's tags).

A hook's default here is what a kind without an opinion does (a plain kind:
no own fields, removable, no decoder). A kind overrides what it needs, in its
own module, and the registry (``__init__.py``) finds it there.
"""

from __future__ import annotations

import argparse
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any, NotRequired, Protocol, TypedDict, runtime_checkable

from prometheus_client.core import Metric

from idpool.pool.clock import SYSTEM_CLOCK, Clock
from idpool.pool.errors import InvalidInput
from idpool.pool.kind_rules import KindRules
from idpool.pool.stores import LedgerStore, StoreParts
from idpool.pool.values import TagRow

from .context import KindContext

Spell = Callable[[str], str]  # a field's name the caller's way: "step", or "--step"


class Held(TypedDict):
    """The keys of a kind's ``holding(tag)`` that the node reads (its own
    TypedDict adds the rest, shown as they are in /status.json)."""

    kind: str  # the kind's name (every kind's answer has it)
    # IDs of the tag this node handed out: /status.json's ``counters.ids_issued`` for a
    # tag without a segment buffer (service/status.py), 0 where a kind leaves it out
    issued: NotRequired[int]


class IdKind(Protocol):
    """How the IDs of one kind of tag are made and served on a node.

    Before it first serves a tag, a kind calls ``ctx.fence.check_fence(tag)``
    (``KindContext.fence``): the name's record beside its mark must be this row's,
    so a row whose kind or format was edited by hand cannot repeat IDs the name
    handed out as another kind. ``tests/test_kind_hand_edits.py`` runs over every
    kind of the registry and fails one that forgets (a toy kind did)."""

    async def next_id(self, tag: str) -> int | str:
        """One ID of ``tag``; raises IdPoolError (answered by service/errors.py)."""
        ...

    async def next_ids(self, tag: str, count: int) -> list[int] | list[str]:
        """``count`` IDs of ``tag``, in the order handed out."""
        ...

    def holding(self, tag: str) -> Mapping[str, Any] | None:
        """What this node holds for the tag, shown as ``buffer`` in /status.json
        (None: nothing held here). The node reads the keys of ``Held``: ``kind``
        (always) and ``issued`` (a kind without segment buffers that counts them)."""
        ...

    def not_ready(self) -> str | None:
        """Why this node must not get requests because of this kind, or None."""
        ...

    async def close(self) -> None:
        """Give back what the kind holds (a graceful stop); safe twice."""
        ...


@runtime_checkable
class TakesFromMemory(Protocol):
    """A kind NodeApp's fast path asks before routing (beside the segment buffers,
    which it reads itself): synchronous, no await between reading and advancing
    what it takes from, so two requests never get the same ID."""

    def take_now(self, tag: str, count: int) -> int | list[int] | None:
        """One ID for ``count == 0``, else ``count``; None: leave it to the routes
        (nothing held, a wait needed, or an error the route answers and logs)."""
        ...


@runtime_checkable
class KeepsTags(Protocol):
    """What a kind without buffers may add to ``IdKind``: the tags it served here
    (their rows are read again every reload, so a disable counts within it; they
    show in /status), and a close at shutdown for what it has under way."""

    def served(self) -> set[str]: ...

    async def close(self) -> None: ...


@runtime_checkable
class Stops(Protocol):
    """A kind that serves tags from what it holds itself (not the node's buffers):
    told at each tag reload which of them an operator disabled or removed."""

    def served(self) -> set[str]: ...

    def stop(self, tags: set[str], why: str) -> None:
        """Serve none of ``tags`` from memory any more (``why``: the 503's cause)."""
        ...


@dataclass(frozen=True)
class Draft:
    """A new tag's columns as the generic checks made them (service/tag_fields.py);
    a kind's ``shape`` may change them from its own fields."""

    tag: str
    step: int
    start: int
    end_id: int  # first ID never handed out (max + 1; MAX_ID: no bound)
    top: int | None  # the ``max`` given, if any
    layout: str = ""  # the kind's own column (a snowflake tag's layout)

    def but(self, **changes: Any) -> Draft:
        return replace(self, **changes)


class KindSpec:
    """One kind of ID: its name (the ledger's ``kind`` column), its rules for the
    stores, its policy, and its hooks. Subclassed once per kind module."""

    name: str = ""
    rank: int = 99  # where it is listed (CLI help, messages): the default kind first
    default: bool = False  # the kind of a tag added without one
    rules: KindRules = KindRules("")
    # Policy flags
    buffered: bool = False  # served from the node's segment buffers (NodeApp reads them)
    formats: bool = False  # may carry a format (service/formats.py renders its numbers)
    leasable: bool = False  # clients may lease its ranges (POST /lease)
    direct: bool = False  # NodeApp awaits the kind before routing (no memory to answer from)
    ranges: bool = True  # its row's start, step and max_id count IDs
    removable: bool = True  # ``tag remove`` may remove it (its tombstone fences its IDs)
    start_movable: bool = True  # ``tag start``/``tag step`` may change its range
    public_decode: bool = False  # GET /decode/{tag}/{id} answers for it (its IDs hide nothing)
    # ``{"<name>": true}`` asks for it over HTTP (and ``--<name>`` on the command line)
    api_flag: bool = False
    cli_flag_help: str = ""  # help of ``--<name>`` (a flag naming the kind); "": none
    fields: frozenset[str] = frozenset()  # its own fields at tag add
    fields_code: str = "bad_body"  # the error code of a field of its given to another kind
    # For /openapi.json (service/api_schemas.py, openapi.py): how its IDs are made, in
    # a few words; the schemas of its ``fields`` and flag at tag add; those of ``row_fields``
    summary: str = ""
    api_fields: Mapping[str, dict[str, Any]] = {}
    row_schema: Mapping[str, dict[str, Any]] = {}

    def make(self, ctx: KindContext) -> IdKind:
        """The node's object serving this kind."""
        raise NotImplementedError(self.name)

    # -- tag add --------------------------------------------------------

    def shape(
        self, fields: Mapping[str, object], draft: Draft, name: Spell, lease_ms: int
    ) -> Draft:
        """The tag's columns from its fields (raises InvalidInput). ``lease_ms``:
        IDPOOL_WORKER_LEASE_SECONDS of whoever adds it, in ms."""
        return draft

    def cli_arguments(self, add: argparse.ArgumentParser, integer: Callable[[str], int]) -> None:
        """Its own options of ``idpool tag add`` (its ``fields``, as ``--field``;
        ``integer``: the CLI's argument type for a number)."""

    def check_stores(self, tag: str, parts: StoreParts) -> None:
        """Refuse (InvalidInput) to add the tag to stores that cannot serve it."""

    async def prepare(self, ledger: LedgerStore, parts: StoreParts, row: TagRow) -> None:
        """What the tag needs beside its row, right after it is made."""

    # -- changes --------------------------------------------------------

    def check_removable(self, row: TagRow) -> None:
        """Refuse (InvalidInput ``wrong_kind``) to remove a tag not ``removable``."""
        if not self.removable:
            raise InvalidInput(
                "wrong_kind", f"tag {row.tag!r} is a {self.name} tag and cannot be removed"
            )

    def check_range_change(self, row: TagRow, change: str) -> None:
        """Refuse (InvalidInput ``wrong_kind``) a new ``start`` or ``step`` of a tag
        whose start is not ``start_movable``."""
        if not self.start_movable:
            raise InvalidInput(
                "wrong_kind", f"tag {row.tag!r} is a {self.name} tag: it has no {change}"
            )

    # -- serving --------------------------------------------------------

    def check_count(self, row: TagRow, count: int, max_count: int) -> None:
        """Refuse (InvalidInput) a count over IDPOOL_MAX_COUNT with the kind's own
        lower cap, if it has one (a message naming the cap every count meets)."""

    def refuse_lease(self, tag: str) -> Exception | None:
        """Why its ranges cannot be leased to a client (None: ``leasable``)."""
        if self.leasable:
            return None
        return InvalidInput(
            "wrong_kind", f"tag {tag!r} is a {self.name} tag: its IDs cannot be leased"
        )

    # -- reading IDs and rows ------------------------------------------

    def decode(self, row: TagRow, value: str) -> dict[str, Any] | None:
        """What ``value`` was made from; None: the kind's IDs cannot be decoded."""
        return None

    @property
    def decodes(self) -> bool:
        """Whether the kind has a decoder at all (overrides ``decode``): GET
        /decode tells one without it that none can decode its IDs, rather than
        sending the caller to the operator's calls, which refuse them too."""
        return type(self).decode is not KindSpec.decode

    async def check_issued(
        self, ledger: LedgerStore, row: TagRow, found: dict[str, Any], clock: Clock = SYSTEM_CLOCK
    ) -> None:
        """Refuse (InvalidInput) a decoded ID its tag never handed out."""

    def row_fields(self, row: TagRow) -> dict[str, Any]:
        """What the admin API and ``idpool tag list`` add to the row's columns."""
        return {}

    def cli_added(self, row: TagRow) -> str | None:
        """The line ``idpool tag add`` prints (None: the generic one)."""
        return None

    def cli_listed(self, row: TagRow) -> list[str] | None:
        """The lines of ``idpool tag list`` (None: the generic columns)."""
        return None

    def cli_decoded(self, found: Mapping[str, Any]) -> list[str] | None:
        """The lines of ``idpool tag decode`` (None: the generic one)."""
        return None

    def metrics(self, held: Sequence[tuple[str, Mapping[str, Any]]]) -> Iterable[Metric]:
        """Its own /metrics families, from (tag, ``holding``) of its tags held here
        (service/metrics.py asks every kind at each scrape, even with none held)."""
        return ()


class NamedOnly(KindSpec):
    """A kind the ledger names that no module here describes (a test's, or a
    newer idpool's): every hook's default."""

    def __init__(self, name: str) -> None:
        self.name = name
        self.rules = KindRules(name)
