"""The ``snowflake`` kind: time-ordered IDs made in memory from a leased worker ID.

Its guarantee, no snowflake ID ever made twice, and where each part is enforced:

- **One holder per worker ID at a time**: one Redis script grants, renews and
  releases on the Redis server's clock, each lease under a fresh ledger
  generation and a secret only its holder has; a Redis that restarted empty or
  failed over grants nothing for a quarantine outlasting every lease
  (``pool/worker_store.py``). A holder stops ``IDPOOL_WORKER_MARGIN_SECONDS``
  before its lease could expire (from the last renewal *sent*), and at once when
  a renewal is refused (``snowflake_leases.py``; ``Generator.stop_at``).
- **A new holder starts above every time the previous used**: renewals and the
  release carry the last time used, and a grant's floor is above the previous
  holder's last time and expiry (``pool/worker_store.py``); one holder never goes
  below its floor or last time, and worker bits keep holders apart
  (``idpool_client/generator.py``).
- **No ID dated past the lease's expiry**: the grant and each renewal answer the
  expiry the script recorded, and the generator makes no ID of a later time unit
  (``ceiling_ms``, set by ``snowflake_leases.py``), whatever the clock does
  (``idpool_client/generator.py``).
- **Clock steps and pauses**: a step back up to 1 s is waited out; a larger one
  stops the tag here (503 ``clock_behind``, /readyz 503) until the clock passes
  the last time used; a leap past the expiry stops it (503 ``worker_unavailable``,
  ``event=clock_ahead``) until a renewal records a later one
  (``idpool_client/generator.py``, ``snowflake_leases.py``). A pause or suspend
  counts on the lease clock (CLOCK_BOOTTIME): a holder that wakes past its
  deadline makes no ID until a renewal succeeds, or asks for a new worker ID.
- **Client worker leases capped**: POST /worker/{tag} grants clients at most
  ``IDPOOL_WORKER_CLIENT_SHARE`` of a tag's worker IDs (the rest stay for nodes)
  and ``IDPOOL_WORKER_HOLDER_MAX`` per holder name, counted in the grant script
  and checked before the generation is claimed (``pool/worker_store.py``
  ``ClientCaps``; ``snowflake_grants.py``; ``service/workers.py``).

What it assumes of clocks and Redis: docs/design/snowflake.md, "Clocks".

Here is everything else about the kind: its rules for the stores (made only
under a name that never issued IDs, recorded by its layout), its fields at tag
add (a layout: a preset and overrides), its creation (the worker hash, made
with Redis only), why it is never removed and takes no start or step, its batch
cap, how its IDs decode (publicly: a layout hides nothing), how the CLI
shows it, its /metrics families, and what POST /worker/{tag} asks of the
kind (``LeasesWorkers``).
"""

from __future__ import annotations

import argparse
import contextlib
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any, Protocol, runtime_checkable

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric

from idpool.pool.errors import IdPoolError, InvalidInput
from idpool.pool.kind_rules import KindRules
from idpool.pool.ranges import MAX_ID
from idpool.pool.snowflake import (
    LAYOUT_FIELDS,
    LAYOUT_RANGES,
    LAYOUTS,
    Generator,
    Layout,
    check_layout,
    lease_ms_of,
    wall_ms,
)
from idpool.pool.stores import LedgerStore, StoreParts, parts_of
from idpool.pool.values import TagRow
from idpool.pool.worker_store import ClientCaps, Grant, WorkerStore

from .context import KindContext
from .interface import Draft, IdKind, KindSpec, Spell
from .snowflake_grants import SNOWFLAKE
from .snowflake_leases import SnowflakeKind, batch_limit, check_count

# A snowflake tag's layout: a preset (``layout``) and overrides of its fields
SNOWFLAKE_FIELDS = frozenset({"layout", *LAYOUT_FIELDS})


@runtime_checkable
class LeasesWorkers(Protocol):
    """A kind whose IDs are made from a leased worker ID (``SnowflakeKind``): what
    POST /worker/{tag} (service/workers.py) asks of it, and the generators it makes
    IDs with (tag -> Generator, NodeApp's fast path reads them)."""

    generators: dict[str, Generator]
    margin: float  # seconds before its lease could expire that a holder stops

    async def lease_worker(
        self, tag: str, holder: str, caps: ClientCaps | None = None
    ) -> tuple[Grant, Layout, float]: ...

    def lease_ms(self, row: TagRow) -> tuple[int, int]: ...

    def store(self, tag: str) -> WorkerStore: ...


class SnowflakeSpec(KindSpec):
    name = SNOWFLAKE
    rank = 2
    # made only under a name that never issued IDs; recorded by its layout
    rules = KindRules(
        SNOWFLAKE, new_name_only=True, needs_redis=True, record_prefix=f"{SNOWFLAKE}:"
    )
    ranges = False  # its row's max_id counts worker-ID grants
    removable = False  # check_removable says why
    start_movable = False  # check_range_change says why
    public_decode = True
    cli_flag_help = (
        "time-ordered IDs made in memory from leased worker IDs (same as --kind snowflake)"
    )
    fields = SNOWFLAKE_FIELDS
    fields_code = "bad_layout"
    summary = "time-ordered, made in memory from a leased worker ID"
    api_fields = {
        "layout": {
            "type": "string",
            "enum": list(LAYOUTS),
            "description": "snowflake tags: default (41 bits of ms, 10 worker, 12 "
            "sequence) or js53 (37 bits of 10 ms, 8 worker, 8 sequence; below 2^53); "
            "the fields below override it",
        },
        **{
            field: {"type": "integer", "minimum": low, "maximum": high}
            for field, (low, high) in LAYOUT_RANGES.items()
        },
    }
    row_schema = {  # row_fields
        "layout": {
            "type": "object",
            "description": "a snowflake tag's layout (only on snowflake tags); its max_id "
            "counts worker-ID grants",
        },
        "bits": {"type": "integer", "description": "a snowflake tag's ID size in bits"},
    }

    def make(self, ctx: KindContext) -> IdKind:
        return SnowflakeKind(ctx)

    def shape(
        self, fields: Mapping[str, object], draft: Draft, name: Spell, lease_ms: int
    ) -> Draft:
        moved = [f for f in ("start", "step") if fields.get(f) is not None]
        if moved:
            # Its max_id counts worker-ID grants: a start near 2^63 would leave it a few
            # grants for its whole life (as PATCH refuses: check_range_change).
            raise InvalidInput(
                "wrong_kind",
                f"a snowflake tag takes no {name(moved[0])} (its IDs come from the clock, a "
                "worker ID and a sequence; its row counts worker-ID grants): give a layout",
            )
        if draft.top is not None:
            raise InvalidInput("bad_body", f"a snowflake tag takes no {name('max')}: give a layout")
        given = sorted(f for f in SNOWFLAKE_FIELDS if fields.get(f) is not None)
        layout = check_layout({f: fields.get(f) for f in given}, wall_ms(), name)
        # The row counts worker-ID grants (max_id: one generation per grant) and keeps the
        # tag's worker-lease TTL beside its layout (``.l10000``, pool/snowflake.py
        # lease_ms_of): one value every node grants with, so a quarantine outlasts them all.
        text = layout.to_text() + (f".l{lease_ms}" if lease_ms > 0 else "")
        return draft.but(step=1, end_id=MAX_ID, layout=text)

    def cli_arguments(self, add: argparse.ArgumentParser, integer: Callable[[str], int]) -> None:
        add.add_argument(
            "--layout",
            default=None,
            help="snowflake layout: default (41 bits of ms, 10 worker, 12 sequence bits) or "
            "js53 (37 bits of 10 ms, 8 worker, 8 sequence: every ID below 2^53)",
        )
        for field, what in (
            ("time_bits", "bits of time since the epoch"),
            ("worker_bits", "bits of worker ID (how many holders at once)"),
            ("sequence_bits", "bits of sequence within a time unit"),
            ("unit_ms", "time unit in ms (1 to 1000)"),
            ("epoch_ms", "unix ms of time 0 (default: now); not in the future"),
        ):
            flag = f"--{field.replace('_', '-')}"  # as cli/common.flag spells a field
            add.add_argument(flag, dest=field, type=integer, default=None, help=what)

    def check_stores(self, tag: str, parts: StoreParts) -> None:
        """A snowflake tag needs Redis (its worker IDs are leased there): none in
        embedded mode, where it was made and then refused on every request."""
        if parts.workers is None:
            raise InvalidInput(
                "bad_kind",
                f"tag {tag!r}: snowflake tags need Redis, where their worker IDs are "
                "leased; not in embedded mode (use a segment tag, or run with Redis)",
            )

    async def prepare(self, ledger: LedgerStore, parts: StoreParts, row: TagRow) -> None:
        await prepare_workers(ledger, parts, row)

    def check_removable(self, row: TagRow) -> None:
        """Refuse to remove a snowflake tag (InvalidInput ``wrong_kind``): its IDs come
        from the clock since its layout's epoch, not from ranges, so the tombstone's
        max_id cannot fence them, and the name added again (a new epoch: its creation)
        would make the old tag's IDs again as its clock catches up."""
        raise InvalidInput(
            "wrong_kind",
            f"tag {row.tag!r} is a snowflake tag and cannot be removed: added again, its "
            "IDs would restart from a new epoch and repeat the old ones; disable it instead "
            f"(`idpool tag disable {row.tag}`)",
        )

    def check_range_change(self, row: TagRow, change: str) -> None:
        check_range_change(row, change)

    def check_count(self, row: TagRow, count: int, max_count: int) -> None:
        """A cap below IDPOOL_MAX_COUNT is named (check_count); one above is not (the
        node's own message is the limit: "at most 2048000" answered a count the
        node refuses from 10,001 on)."""
        layout = Layout.from_text(row.layout)
        if batch_limit(layout) < max_count:
            check_count(row.tag, layout, count)

    def refuse_lease(self, tag: str) -> Exception | None:
        return InvalidInput(
            "wrong_kind",
            f"tag {tag!r} is a {self.name} tag: lease a worker ID with POST /worker/{tag} "
            "(the Python client: idpool_client.snowflake.SnowflakeClient)",
        )

    def decode(self, row: TagRow, value: str) -> dict[str, Any] | None:
        """A snowflake tag's ID: its time, worker ID and sequence."""
        if not (value.isascii() and value.isdigit()) or len(value) > 19:
            raise InvalidInput("bad_id", f"{value[:40]!r} is not an ID of tag {row.tag!r} (digits)")
        # Refuses what the tag's layout cannot have made by now (another tag's ID, a
        # made-up number); what it cannot tell apart is in docs/design/snowflake.md.
        parts = Layout.from_text(row.layout).decode(int(value), now_ms=wall_ms())
        return {"tag": row.tag, "kind": row.kind, "value": value, **parts}

    def row_fields(self, row: TagRow) -> dict[str, Any]:
        """A snowflake tag's layout, for the admin API and the CLI's list."""
        if not row.layout:
            return {}
        layout = Layout.from_text(row.layout)
        return {"layout": layout.fields(), "bits": layout.bits}

    def cli_added(self, row: TagRow) -> str | None:
        return f"added {row.tag}: kind snowflake, {self._layout_text(row)}"

    def cli_listed(self, row: TagRow) -> list[str] | None:
        # the columns of a range; its layout under it
        state = "disabled" if row.disabled else "enabled"
        n = row.max_id - row.start_id
        grants = f"{n} worker ID grant{'' if n == 1 else 's'}"
        return [
            f"{row.tag:<24} {'-':>20} {'-':>10} {'-':>12} {'-':>20} {'-':>10} "
            f"{state:>8}  {row.description}",
            f"{'':<24} {self._layout_text(row)}; {grants}",
        ]

    def cli_decoded(self, found: Mapping[str, Any]) -> list[str] | None:
        return [f"{key:<10} {value}" for key, value in found.items()]  # one line each

    def metrics(self, held: Sequence[tuple[str, Mapping[str, Any]]]) -> Iterable[Metric]:
        """Per snowflake tag served here: its worker ID, lease and clock."""
        worker = GaugeMetricFamily(
            "idpool_snowflake_worker", "Worker ID this process holds for the tag", labels=["tag"]
        )
        lease = GaugeMetricFamily(
            "idpool_snowflake_lease_seconds",
            "Seconds until this process stops issuing unless the lease is renewed",
            labels=["tag"],
        )
        behind = GaugeMetricFamily(
            "idpool_snowflake_clock_behind_ms",
            "How far the clock is behind the last time used (0: not; above 0: not issuing)",
            labels=["tag"],
        )
        episodes = CounterMetricFamily(
            "idpool_snowflake_clock_behind_events",
            "Large steps back of the clock that stopped the tag here",
            labels=["tag"],
        )
        refusals = CounterMetricFamily(
            "idpool_snowflake_worker_refusals",
            "Worker-ID grants refused here, by why: full (every worker ID of the tag held), "
            "capped (a client over IDPOOL_WORKER_CLIENT_SHARE or IDPOOL_WORKER_HOLDER_MAX), "
            "quarantine",
            labels=["tag", "why"],
        )
        for tag, shown in held:  # snowflake_leases.py's holding: Unheld or WorkerHeld
            if "refusals" not in shown:
                continue
            for why, count in shown.get("refusals", {}).items():
                refusals.add_metric([tag, why], count)
            if shown.get("worker") is None:
                continue
            worker.add_metric([tag], shown["worker"])
            lease.add_metric([tag], max(0.0, shown["lease_left_s"]))
            behind.add_metric([tag], shown["clock_behind_ms"])
            episodes.add_metric([tag], shown["clock_behind_events"])
        return (worker, lease, behind, episodes, refusals)

    def _layout_text(self, row: TagRow) -> str:
        shown = self.row_fields(row)
        layout = shown["layout"]
        return (
            f"{layout['time_bits']} bits of {layout['unit_ms']} ms since {layout['epoch_ms']}, "
            f"{layout['worker_bits']} worker bits, {layout['sequence_bits']} sequence bits "
            f"({shown['bits']}-bit IDs)"
        )


def check_range_change(row: TagRow, change: str) -> None:
    """Refuse a new start or step on a snowflake tag (InvalidInput ``wrong_kind``).
    Its ``max_id`` counts worker-ID grants, not IDs: a step means nothing there, and
    a start moved up once let a grant pass as the tag's first and skip the
    quarantine (issue 25's review: 3,674 duplicate IDs). A kind never changes, so
    reading the row first is enough."""
    if row.kind == SNOWFLAKE:
        raise InvalidInput(
            "wrong_kind",
            f"tag {row.tag!r} is a snowflake tag: it has no {change} (its IDs come from the "
            "clock, a worker ID and a sequence; its layout is fixed at creation)",
        )


async def prepare_workers(ledger: LedgerStore, parts: StoreParts, row: TagRow) -> None:
    """Make the worker hash of a snowflake tag just created, so that its first
    grants need no quarantine even when several nodes race for them. Only while
    no generation was claimed (``max_id == start_id`` in the row just made);
    with Redis or the ledger down the first grant waits out one quarantine
    instead (safe, only slower, once).

    ``init`` makes the hash *with* a quarantine, like any new hash; the row is
    then read again, and only if it still shows no generation claimed does
    ``lift`` clear it (atomically: if the hash is still init's, with no worker
    granted in it). Race: this process stalls after the row, a node claims a
    generation and is granted worker 0, Redis restarts empty, and only then
    does init arrive; lifting there would grant worker 0 again while its holder
    serves. Any grant that ran before init claimed its generation before it, so
    the row read after init shows it (the quarantine stays); a grant claimed
    after that read waits in the quarantine until lift, or finds it lifted."""
    store = parts.workers
    if row.kind != SNOWFLAKE or row.max_id != row.start_id or store is None:
        return
    with contextlib.suppress(IdPoolError):  # StoreUnavailable, UnknownTag: keep it
        made = await store.init(row.tag, lease_ms_of(row.layout))
        if made is not None and (await ledger.get_tag(row.tag)).max_id == row.max_id:
            await store.lift(row.tag, made)


async def prepare_tag(ledger: LedgerStore, pool: object, row: TagRow) -> None:
    """``prepare_workers`` for the stores a caller opened (the parts they hold)."""
    await prepare_workers(ledger, parts_of(ledger, pool), row)


SPEC = SnowflakeSpec()
