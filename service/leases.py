"""The lease API: whole ranges for client libraries that hand out IDs in-process.

``POST /lease/{tag}?count=N`` leases one or more ranges covering at most N IDs
(the client's wish, clamped to ``IDPOOL_CLIENT_MAX_COUNT``); a range longer than
that is cut, and its rest goes back to the head of the pool list in the script
that records the lease (``pool/lease_store.py``), before it is answered.
``POST /lease/return`` with ``{"lease": id, "secret": ..., "tag": ..., "from":
first unused ID}`` takes the unused tail back, once, to the head of the tag's
pool list. It needs what only the leaseholder has: the lease's secret (given
only in the lease answer, stored only hashed) and, for a guarded tag, one of its
tokens, as the lease did. Logs name a lease by its fingerprint, never by its id
or secret: a line read from a log cannot return someone's lease.

A lease that could not be recorded is never handed out: its range is waste
(``event=range_abandoned reason=lease_not_recorded``), never a range that a
client holds but cannot return, or that could be returned twice.
"""

from __future__ import annotations

import logging
import re
from typing import Any

from idpool_client.formats import TagFormat, period_of_row
from starlette.requests import Request
from starlette.responses import Response

from idpool.pool.errors import (
    Draining,
    InvalidInput,
    LeaseClash,
    LeaseRefused,
    StoreNotSent,
    StoreUnavailable,
    TagDisabled,
)
from idpool.pool.lease_store import LeaseStore, fingerprint, new_lease
from idpool.pool.ranges import MAX_ID, TAG_RULE, IdRange, is_valid_tag
from idpool.pool.waste import Reason

from . import auth, preamble
from .errors import HttpRefusal, json_response
from .kinds import spec_of
from .runtime import Runtime

logger = logging.getLogger("idpool.leases")

LEASE_ID = re.compile(r"[A-Za-z0-9_-]{1,64}")  # a lease id, and a lease secret


async def lease_ranges(run: Runtime, tag: str, count: int) -> list[IdRange]:
    """Ranges holding about ``count`` IDs of ``tag``, from where the node's own
    buffers get theirs: one pop from the pool, and one ledger claim for what it
    lacks (fenced by the high-water mark, as every claim). Fewer when only the
    claim failed: the client asks again sooner. Raises UnknownTag (after the
    node's cheap tag-list lookup: no pop for a made-up name) and what fetch raises.

    Leased IDs are not reported as consumption: a lease is taken in bulk, and
    counting it would size the pool for a burst (the client's own prefetch
    follows its use instead).
    """
    row = await run.node.tags.lookup(tag)
    refused = spec_of(row.kind).refuse_lease(tag)  # e.g. snowflake: lease a worker ID
    if refused is not None:
        raise refused
    return await run.node.source.fetch(tag, count)


def merge(ranges: list[IdRange]) -> list[IdRange]:
    """Join ranges that follow one another (a claim right after a pool range often does)."""
    merged: list[IdRange] = []
    for r in ranges:
        if merged and merged[-1].end == r.start:
            merged[-1] = IdRange(merged[-1].start, r.end)
        else:
            merged.append(r)
    return merged


def split(ranges: list[IdRange], count: int) -> tuple[list[IdRange], list[IdRange]]:
    """(the first ``count`` IDs of ``ranges``, the rest), both in serving order."""
    leased: list[IdRange] = []
    rest: list[IdRange] = []
    wanted = count
    for r in ranges:
        if wanted <= 0:
            rest.append(r)
        elif len(r) <= wanted:
            leased.append(r)
            wanted -= len(r)
        else:
            leased.append(IdRange(r.start, r.start + wanted))
            rest.append(IdRange(r.start + wanted, r.end))
            wanted = 0
    return leased, rest


def _parse_count(request: Request, limit: int) -> int | None:
    values = request.query_params.getlist("count")
    if not values:
        return None  # one range (cut at the cap like any lease)
    raw = values[0]
    # int(raw), not raw == "0": "00" is zero too (it was leased as a 200 with no lease)
    if len(values) > 1 or not (raw.isascii() and raw.isdigit()) or len(raw) > 19 or not int(raw):
        raise InvalidInput(
            "bad_count",
            f"count must be a positive integer, not {raw[:40]!r} (a count above this node's "
            f"IDPOOL_CLIENT_MAX_COUNT, {limit}, is cut to it)",
        )
    return min(int(raw), limit)  # the client's wish, clamped


async def _body(request: Request) -> dict[str, Any]:
    example = (
        '{"lease": "<id>", "secret": "<secret>", "tag": "<tag>", "from": <first unused ID>}'
        " (lease, secret: from the answer of POST /lease/{tag})"
    )
    return await preamble.json_object(
        request, f"send a JSON object: {example}", f"the body must be a JSON object: {example}"
    )


def _lease_store(run: Runtime) -> LeaseStore:
    store = run.lease_store()
    if store is None:
        raise HttpRefusal(
            "leases_unavailable", "leases need Redis; this node runs without it (embedded)"
        )
    return store


async def lease(request: Request) -> Response:
    tag = preamble.path_tag(request)
    run: Runtime = request.state.run
    count = _parse_count(request, run.settings.client_max_count)
    store = _lease_store(run)
    if run.node.draining:
        raise Draining("node is shutting down")
    row = await run.node.tags.lookup(tag)  # its tokens are read with it
    await auth.check_token(run.node.tags, tag, request)
    refused = spec_of(row.kind).refuse_lease(tag)  # strict: only nodes keep its order
    if refused is not None:
        raise refused
    fmt = run.node.formatted.format_for(tag)
    row_name, since, until = await _lease_row(run, tag, fmt)
    taken = merge(await lease_ranges(run, row_name, 1 if count is None else count))
    # A client asks for what it may hold (its max_count bounds its holdings): a
    # longer range is cut, and its rest goes back to the pool with the record.
    # Without a count, one range: cut too (a tag's dynamic step may exceed the cap).
    ranges, rest = split(taken, run.settings.client_max_count if count is None else count)
    leases = [(*new_lease(row_name), r) for r in ranges]  # in the slot of the row it returns to
    await _record(run, store, row_name, leases, rest)
    answer: list[dict[str, Any]] = [
        {"lease": i, "secret": secret, "first": r.start, "last": r.end - 1}
        for i, secret, r in leases
    ]
    body: dict[str, Any] = {"tag": tag, "count": sum(len(r) for r in ranges), "leases": answer}
    if fmt is not None:
        # With period keys, the key of the lease's period only (its numbers are
        # rendered in it alone), never the tag's.
        period = period_of_row(row_name)
        body["format"] = fmt.to_json(secret=True, period=None if period is None else period[1])
        if row_name != tag:
            body["period"] = {"key": row_name.rpartition("@")[2], "from": since, "until": until}
            for one in answer:
                one["sequence"] = row_name  # the row its tail goes back to
    return json_response(body)


async def _lease_row(run: Runtime, tag: str, fmt: TagFormat | None) -> tuple[str, float, float]:
    """(row name, from, until) of the ledger row a lease of ``tag`` draws from, once
    the name's format fence holds. A formatted tag: the client renders as the node
    does, so the answer carries the format (with the obfuscation key: only to a
    holder of the tag's token); with a reset the numbers come from the period's
    row, named in each lease."""
    await run.node.fence.check_fence(tag)  # a row edited by hand: its 503 first
    if fmt is None:  # a plain row: its name must not be a formatted tag's (the fence)
        return tag, 0.0, 0.0
    if fmt.obfuscation is not None and not run.node.tags.tokens.get(tag):
        # Anyone may lease a tag without tokens: its key would undo the
        # obfuscation of every ID of the tag for whoever asked.
        raise HttpRefusal(
            "key_needs_token",
            f"tag {tag!r} is obfuscated and a lease carries its key, which goes only to "
            f"a holder of one of its tokens: add one (`idpool tag token add {tag}`) and "
            f"give it to the client, or ask a node for each ID (GET /id/{tag})",
        )
    return await run.node.formatted.lease_row(tag, fmt)


async def _record(
    run: Runtime,
    store: LeaseStore,
    row_name: str,
    leases: list[tuple[str, str, IdRange]],
    rest: list[IdRange],
) -> None:
    """Record the leases and push the rest back; on a failure, waste both."""
    try:
        recorded = await store.record(row_name, leases, rest)
    except (StoreUnavailable, LeaseClash) as e:
        # Not recorded, or not known to be: a lease that could not be returned
        # (or, if half-known, returned twice) is never handed out, and the rest
        # may or may not be back in the list. Waste both.
        unsent = isinstance(e, StoreNotSent | LeaseClash)
        rest_reason = Reason.PUSH_NOT_SENT if unsent else Reason.PUSH_OUTCOME_UNKNOWN
        for _, _, r in leases:
            run.node.waste.record(row_name, [r], Reason.LEASE_NOT_RECORDED, str(e))
        for r in rest:
            run.node.waste.record(row_name, [r], rest_reason, str(e))
        raise HttpRefusal("unavailable", f"could not record the lease in Redis: {e}") from e
    run.node.waste.dropped(recorded.dropped)
    for lease_id, _, r in leases:
        logger.info(
            "event=range_leased tag=%s range=%s lease=%s",
            row_name,
            r.to_text(),
            fingerprint(lease_id),
        )


def _return_fields(body: dict[str, Any]) -> tuple[str, str, int, str]:
    lease_id, secret, start = body.get("lease"), body.get("secret"), body.get("from")
    tag = body.get("tag")
    if not isinstance(lease_id, str) or not LEASE_ID.fullmatch(lease_id):
        raise InvalidInput("bad_lease", "lease must be the id POST /lease/{tag} answered")
    if not isinstance(secret, str) or not LEASE_ID.fullmatch(secret):
        raise InvalidInput(
            "bad_secret", "secret must be the lease's secret POST /lease/{tag} answered"
        )
    if isinstance(start, bool) or not isinstance(start, int) or not 1 <= start <= MAX_ID + 1:
        raise InvalidInput("bad_from", "from must be the first unused ID of the lease (an integer)")
    if not isinstance(tag, str) or not is_valid_tag(_tag_of(tag)):
        raise InvalidInput(
            "bad_tag",
            f"tag must be the lease's tag (its sequence, if the lease names one), "
            f"a valid tag: {TAG_RULE}",
        )
    return lease_id, secret, start, tag


def _tag_of(name: str) -> str:
    """The tag of a lease's row (its ``sequence`` field): itself, or the tag of a period's row."""
    found = period_of_row(name)
    return name if found is None else found[0]


async def give_back(request: Request) -> Response:
    lease_id, secret, start, tag = _return_fields(await _body(request))
    run: Runtime = request.state.run
    store = _lease_store(run)
    # A period's row (TAG@KEY) is returned to with the tag's own token.
    guarded = _tag_of(tag)
    try:
        await run.node.tags.lookup(guarded)  # its tokens are read with it
    except TagDisabled:
        pass  # its tail still goes back to its pool (and its tokens are known)
    if not auth.allowed(run.node.tags, guarded, request):  # a return needs what the lease did
        raise HttpRefusal(
            "unauthorized", auth.refusal_message(guarded), {"www-authenticate": "Bearer"}
        )
    try:
        returned = await store.give_back(lease_id, secret, start, tag)
    except LeaseRefused:
        raise  # the error table answers it by its code
    except StoreUnavailable as e:
        # Outcome unknown: the client may retry; the tombstone makes that safe.
        logger.warning(
            "event=lease_return_failed lease=%s detail=%r", fingerprint(lease_id), e.detail
        )
        raise HttpRefusal("unavailable", f"{e}; retry the return, it is safe") from e
    run.node.waste.dropped(returned.dropped)
    tail = returned.tail
    if tail is not None:
        run.node.stats.tags[returned.tag].ids_returned += len(tail)
        logger.info(
            "event=lease_returned tag=%s range=%s lease=%s",
            returned.tag,
            tail.to_text(),
            fingerprint(lease_id),
        )
    given = None if tail is None else {"first": tail.start, "last": tail.end - 1}
    return json_response(
        {
            "lease": lease_id,
            "tag": returned.tag,
            "returned": given,
            "count": 0 if tail is None else len(tail),
        }
    )
