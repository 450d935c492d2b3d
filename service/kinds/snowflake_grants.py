"""How a worker ID of a snowflake tag is granted here: to this node's own
generator (``snowflake_leases.py``) or to a client through POST /worker/{tag}
(``service/workers.py``, bounded by ``ClientCaps``).

A grant claims a generation from the ledger (fenced by the high-water mark:
it names the lease, which a renewal or release must show), then asks Redis's
grant script for a worker ID (``pool/worker_store.py``) for the tag's lease
TTL (recorded in its row when it was added; ``IDPOOL_WORKER_LEASE_SECONDS`` for
a tag made before), with a quarantine that outlasts every lease any node may
have granted. A client's grant is first checked against the client caps (read
only: a capped caller writes no ledger row). A refusal is counted by why
(``refusals``: full, capped, quarantine) and, unless it was a client's cap,
makes requests fail at once until it may be answered otherwise (a
quarantine's end, or RETRY_SECONDS after a store failed): no claim per request.
"""

from __future__ import annotations

import logging
from collections import Counter
from collections.abc import Callable

from idpool.pool.errors import (
    IdPoolError,
    InvalidInput,
    StoreUnavailable,
    TagDisabled,
    UnknownTag,
)
from idpool.pool.lease_store import fingerprint
from idpool.pool.snowflake import Layout, WorkerLeaseLost, lease_ms_of
from idpool.pool.values import TagRow
from idpool.pool.worker_store import ClientCaps, Grant, WorkerRefused, WorkerStore

from .context import KindContext

SNOWFLAKE = "snowflake"  # the kind's name (the ledger's kind column)
# The least quarantine of a tag whose row records no lease TTL (made before it was
# recorded): covers every node whose IDPOOL_WORKER_LEASE_SECONDS is up to 60 s.
OLD_TAG_QUARANTINE_MS = 60_000
RETRY_SECONDS = 0.5  # after a failed grant, requests fail at once for this long
logger = logging.getLogger("idpool.snowflake")


class WorkerGrants:
    """Worker IDs of snowflake tags granted here, and the refusals met (the base
    of ``SnowflakeKind``, whose generators and renewals hold them)."""

    def __init__(self, ctx: KindContext, monotonic: Callable[[], float]) -> None:
        self.ctx = ctx
        self._monotonic = monotonic
        self._retry: dict[str, tuple[float, str]] = {}  # tag -> (no grant before, why)
        self._refused: dict[str, str] = {}  # tag -> why the last grant failed
        # (tag, why) -> grants refused here: "full" (every worker ID held), "capped"
        # (a client over IDPOOL_WORKER_CLIENT_SHARE or _HOLDER_MAX), "quarantine"
        self.refusals: Counter[tuple[str, str]] = Counter()
        self.ttl = ctx.worker_lease_seconds
        self.margin = ctx.worker_margin_seconds

    def lease_ms(self, row: TagRow) -> tuple[int, int]:
        """The TTL of a grant for the tag, and the quarantine any grant or renewal
        sets on a hash it finds missing or of another incarnation.

        The TTL is the tag's own, recorded in its ledger row at creation, whatever
        this node's IDPOOL_WORKER_LEASE_SECONDS (this node's for a tag made before
        it was recorded). The quarantine is the largest of that and this node's
        setting (the script adds the largest TTL its Redis saw granted): it must
        outlast every lease any node may have granted, even after Redis lost all
        it knew; with the tag's TTL the same on every node, it does."""
        own = int(self.ttl * 1000)
        recorded = lease_ms_of(row.layout)
        if not recorded:
            # A tag made before the TTL was recorded: other nodes may grant it with a
            # longer setting of their own, so the quarantine is at least OLD_TAG_QUARANTINE_MS
            # (Redis restarted empty, A granted 20 s, B set 3 s: 4,548 duplicates).
            # A node set above it is still covered only if it sees the restart first.
            return own, max(own, OLD_TAG_QUARANTINE_MS)
        return recorded, max(recorded, own)

    def store(self, tag: str) -> WorkerStore:
        workers = self.ctx.parts.workers
        if workers is None:
            raise WorkerLeaseLost(tag, "snowflake tags need Redis for worker IDs (not embedded)")
        return workers

    async def lease_worker(
        self, tag: str, holder: str, caps: ClientCaps | None = None
    ) -> tuple[Grant, Layout, float]:
        """A worker ID of ``tag`` for ``holder`` (this node, or a client through
        POST /worker/{tag}, bounded by ``caps``), and the monotonic time the grant
        was sent (the holder's lease runs from then). Raises WorkerLeaseLost
        naming why not. A client's refusal leaves this node's own grants be."""
        layout, ttl_ms, quarantine_ms = await self._lease_terms(tag)
        store = self.store(tag)
        await self._may_ask(tag)
        if caps is not None:  # before the claim: a capped caller writes no ledger row
            await self._client_room(tag, store, layout, holder, caps)
        generation = await self._claim_generation(tag)
        sent = self._monotonic()
        grant = await self._ask_grant(
            tag, store, generation, layout, holder, ttl_ms, quarantine_ms, caps
        )
        self._refused.pop(tag, None)
        self._retry.pop(tag, None)
        logger.info(
            "event=worker_granted tag=%s worker=%d generation=%d floor_ms=%d holder=%s lease=%s",
            tag,
            grant.worker,
            generation,
            grant.floor_ms,
            holder,
            fingerprint(grant.secret),  # never the secret: a log line cannot renew or release
        )
        return grant, layout, sent

    async def _lease_terms(self, tag: str) -> tuple[Layout, int, int]:
        """The snowflake tag's layout, lease TTL and quarantine (ms); refuses a
        tag of another kind (400 ``wrong_kind``) or a lease too short to hold."""
        row = await self.ctx.tags.lookup(tag)
        if row.kind != SNOWFLAKE:
            raise InvalidInput("wrong_kind", f"tag {tag!r} is a {row.kind} tag, not snowflake")
        layout = Layout.from_text(row.layout)
        ttl_ms, quarantine_ms = self.lease_ms(row)
        if ttl_ms <= 2 * self.margin * 1000:
            # The holder would stop at once (its deadline is the lease less the margin).
            raise WorkerLeaseLost(
                tag,
                f"the tag's worker lease ({ttl_ms} ms, fixed when it was added) is not more than "
                f"twice this node's IDPOOL_WORKER_MARGIN_SECONDS ({self.margin} s): lower it",
            )
        return layout, ttl_ms, quarantine_ms

    async def _may_ask(self, tag: str) -> None:
        """Raise WorkerLeaseLost while a grant may not be asked for ``tag`` yet, or
        its fence cannot be checked."""
        # After a refusal, ask again only once it may be answered otherwise: a
        # quarantine's end, or a moment after a store failed (no claim per request).
        retry_at, why = self._retry.get(tag, (0.0, ""))
        if self._monotonic() < retry_at:
            raise WorkerLeaseLost(tag, why)
        # A snowflake tag has no format: a row carrying one, or a name recorded with
        # another, is a formatted tag whose kind was edited by hand (its strings could
        # be numbers this tag makes). Checked once per tag and process (check_fence).
        try:
            await self.ctx.fence.check_fence(tag)
        except StoreUnavailable as e:
            raise self._refuse(tag, f"no worker ID: Redis: {e.detail}", RETRY_SECONDS) from e

    async def _claim_generation(self, tag: str) -> int:
        """A new generation of ``tag`` from the ledger."""
        try:
            # A generation from the ledger (fenced by the high-water mark): names the
            # lease, which a renewal or release must show.
            claim = await self.ctx.source.claims.claim(tag, 1, kind=SNOWFLAKE)
        except (UnknownTag, TagDisabled):
            raise
        except IdPoolError as e:
            raise self._refuse(tag, f"no worker ID: {e}", RETRY_SECONDS) from e
        return claim.range.start

    async def _ask_grant(
        self,
        tag: str,
        store: WorkerStore,
        generation: int,
        layout: Layout,
        holder: str,
        ttl_ms: int,
        quarantine_ms: int,
        caps: ClientCaps | None,
    ) -> Grant:
        """Redis's grant of a worker ID under ``generation``; a refusal is counted
        and raised as WorkerLeaseLost."""
        try:
            # No "first grant" exception: a grant that finds no hash always waits a
            # quarantine (only the tag's creation makes the hash without one).
            return await store.grant(
                tag,
                generation=generation,
                workers=layout.workers,
                holder=holder,
                ttl_ms=ttl_ms,
                quarantine_ms=quarantine_ms,
                caps=caps,
            )
        except WorkerRefused as e:
            self.refusals[(tag, e.why)] += 1
            if e.why == "capped":
                raise WorkerLeaseLost(tag, str(e)) from None
            raise self._refuse(tag, str(e), max(RETRY_SECONDS, e.retry_ms / 1000)) from None
        except StoreUnavailable as e:
            raise self._refuse(tag, f"no worker ID: Redis: {e.detail}", RETRY_SECONDS) from e

    async def _client_room(
        self, tag: str, store: WorkerStore, layout: Layout, holder: str, caps: ClientCaps
    ) -> None:
        try:
            await store.room(tag, workers=layout.workers, holder=holder, caps=caps)
        except WorkerRefused as e:
            self.refusals[(tag, e.why)] += 1
            raise WorkerLeaseLost(tag, str(e)) from None
        except StoreUnavailable as e:
            raise self._refuse(tag, f"no worker ID: Redis: {e.detail}", RETRY_SECONDS) from e

    def _refuse(self, tag: str, why: str, wait: float) -> WorkerLeaseLost:
        self._refused[tag] = why
        self._retry[tag] = (self._monotonic() + wait, why)
        return WorkerLeaseLost(tag, why)
