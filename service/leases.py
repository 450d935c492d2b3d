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
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import orjson
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from idpool.pool.errors import (
    IdPoolError,
    StoreNotSent,
    StoreUnavailable,
    TagDisabled,
    TagExhausted,
    UnknownTag,
)
from idpool.pool.lease_store import (
    LeaseClash,
    LeaseRefused,
    LeaseStore,
    fingerprint,
    new_lease,
)
from idpool.pool.preloader import log_dropped
from idpool.pool.ranges import MAX_ID, TAG_RULE, IdRange, is_valid_tag
from idpool.pool.redis_pool import RedisPool
from idpool.pool.settings import Settings

from . import auth
from .buffer import Draining

if TYPE_CHECKING:
    from .app import Running

logger = logging.getLogger("idpool.leases")

LEASE_ID = re.compile(r"[A-Za-z0-9_-]{1,64}")  # a lease id, and a lease secret

_REFUSED_STATUS = {"unknown_lease": 409, "already_returned": 409, "wrong_secret": 403}
# others: 400


def _json(body: object, status_code: int = 200) -> Response:
    return Response(orjson.dumps(body), status_code=status_code, media_type="application/json")


def _error(status_code: int, code: str, message: str) -> Response:
    response = _json({"error": code, "message": message}, status_code)
    response.headers["x-idpool-error"] = code  # as service/app.py's error(): counted by code
    return response


async def lease_ranges(run: Running, tag: str, count: int) -> list[IdRange]:
    """Ranges holding about ``count`` IDs of ``tag``, from where the node's own
    buffers get theirs: one pop from the pool, and one ledger claim for what it
    lacks (fenced by the high-water mark, as every claim). Fewer when only the
    claim failed: the client asks again sooner. Raises UnknownTag (after the
    node's cheap tag-list lookup: no pop for a made-up name) and what fetch raises.

    Leased IDs are not reported as consumption: a lease is taken in bulk, and
    counting it would size the pool for a burst (the client's own prefetch
    follows its use instead).
    """
    await run.node.tags.lookup(tag)
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


def cut(ranges: list[IdRange], count: int) -> tuple[list[IdRange], list[IdRange]]:
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


def _parse_count(request: Request, limit: int) -> int | None | Response:
    values = request.query_params.getlist("count")
    if not values:
        return None  # one range, whatever its size
    raw = values[0]
    if len(values) > 1 or not (raw.isascii() and raw.isdigit()) or len(raw) > 19 or raw == "0":
        return _error(400, "bad_count", f"count must be a positive integer, not {raw[:40]!r}")
    return min(int(raw), limit)  # the client's wish, clamped


async def _body(request: Request) -> dict[str, Any] | Response:
    example = (
        '{"lease": "<id>", "secret": "<secret>", "tag": "<tag>", "from": <first unused ID>}'
        " (lease, secret: from the answer of POST /lease/{tag})"
    )
    try:
        body = orjson.loads(await request.body())
    except orjson.JSONDecodeError:
        return _error(400, "bad_body", f"send a JSON object: {example}")
    if not isinstance(body, dict):
        return _error(400, "bad_body", f"the body must be a JSON object: {example}")
    return body


def routes(settings: Settings, running: Callable[[], Running]) -> list[Route]:
    stores: dict[int, LeaseStore] = {}

    def lease_store(run: Running) -> LeaseStore | None:
        pool = run.pool
        if not isinstance(pool, RedisPool):
            return None  # the embedded mode has no Redis to record leases in
        store = stores.get(id(pool))
        if store is None:
            store = stores[id(pool)] = LeaseStore(
                pool.client, pool.keys, settings.client_lease_seconds, pool.send, pool.legacy
            )
        return store

    def no_store() -> Response:
        return _error(
            503, "leases_unavailable", "leases need Redis; this node runs without it (embedded)"
        )

    async def lease(request: Request) -> Response:
        tag: str = request.path_params["tag"]
        if not is_valid_tag(tag):
            return _error(400, "bad_tag", f"tag {tag[:80]!r} is not valid: use {TAG_RULE}")
        count = _parse_count(request, settings.client_max_count)
        if isinstance(count, Response):
            return count
        run = running()
        store = lease_store(run)
        if store is None:
            return no_store()
        if run.node.draining:
            return _error(503, "draining", "this node is shutting down; retry on another node")
        try:
            await run.node.tags.lookup(tag)  # its tokens are read with it
            if not auth.allowed(run.node.tags, tag, request):
                refused = _error(401, "unauthorized", auth.refusal_message(tag))
                refused.headers["www-authenticate"] = "Bearer"
                return refused
            taken = merge(await lease_ranges(run, tag, 1 if count is None else count))
        except UnknownTag:
            return _error(
                404, "unknown_tag", f"tag {tag!r} does not exist; create it with `idpool tag add`"
            )
        except TagDisabled as e:
            return _error(410, "tag_disabled", str(e))
        except TagExhausted as e:
            return _error(503, "tag_exhausted", f"{e}; other tags are served as usual")
        except (IdPoolError, Draining) as e:
            logger.warning("event=request_failed tag=%s reason=%r", tag, str(e))
            return _error(503, "unavailable", str(e))
        # A client asks for what it may hold (its max_count bounds its holdings): a
        # longer range is cut, and its rest goes back to the pool with the record.
        ranges, rest = (taken, []) if count is None else cut(taken, count)
        leases = [(*new_lease(tag), r) for r in ranges]
        try:
            recorded = await store.record(tag, leases, rest)
        except (StoreUnavailable, LeaseClash) as e:
            # Not recorded, or not known to be: a lease that could not be returned
            # (or, if half-known, returned twice) is never handed out, and the rest
            # may or may not be back in the list. Waste both.
            unsent = isinstance(e, (StoreNotSent, LeaseClash))
            rest_reason = "push_not_sent" if unsent else "push_outcome_unknown"
            reasons = [("lease_not_recorded", r) for r in ranges] + [(rest_reason, r) for r in rest]
            for reason, r in reasons:
                run.node.stats.waste(tag, reason, len(r))
                logger.error(
                    "event=range_abandoned tag=%s range=%s reason=%s detail=%r",
                    tag,
                    r.to_text(),
                    reason,
                    str(e),
                )
            return _error(503, "unavailable", f"could not record the lease in Redis: {e}")
        _log_dropped(run, recorded.dropped)
        for lease_id, _, r in leases:
            logger.info(
                "event=range_leased tag=%s range=%s lease=%s",
                tag,
                r.to_text(),
                fingerprint(lease_id),
            )
        answer = [
            {"lease": i, "secret": secret, "first": r.start, "last": r.end - 1}
            for i, secret, r in leases
        ]
        return _json({"tag": tag, "count": sum(len(r) for r in ranges), "leases": answer})

    async def give_back(request: Request) -> Response:
        body = await _body(request)
        if isinstance(body, Response):
            return body
        lease_id, secret, start = body.get("lease"), body.get("secret"), body.get("from")
        tag = body.get("tag")
        if not isinstance(lease_id, str) or not LEASE_ID.fullmatch(lease_id):
            return _error(400, "bad_lease", "lease must be the id POST /lease/{tag} answered")
        if not isinstance(secret, str) or not LEASE_ID.fullmatch(secret):
            return _error(
                400, "bad_secret", "secret must be the lease's secret POST /lease/{tag} answered"
            )
        if isinstance(start, bool) or not isinstance(start, int) or not 1 <= start <= MAX_ID + 1:
            return _error(
                400, "bad_from", "from must be the first unused ID of the lease (an integer)"
            )
        if not isinstance(tag, str) or not is_valid_tag(tag):
            return _error(400, "bad_tag", f"tag must be the lease's tag, a valid tag: {TAG_RULE}")
        run = running()
        store = lease_store(run)
        if store is None:
            return no_store()
        try:
            await run.node.tags.lookup(tag)  # its tokens are read with it
        except TagDisabled:
            pass  # its tail still goes back to its pool (and its tokens are known)
        except UnknownTag:
            return _error(404, "unknown_tag", f"tag {tag!r} does not exist")
        except IdPoolError as e:
            return _error(503, "unavailable", str(e))
        if not auth.allowed(run.node.tags, tag, request):  # a return needs what the lease did
            refused = _error(401, "unauthorized", auth.refusal_message(tag))
            refused.headers["www-authenticate"] = "Bearer"
            return refused
        try:
            returned = await store.give_back(lease_id, secret, start, tag)
        except LeaseRefused as e:
            return _error(_REFUSED_STATUS.get(e.code, 400), e.code, str(e))
        except StoreUnavailable as e:
            # Outcome unknown: the client may retry; the tombstone makes that safe.
            logger.warning(
                "event=lease_return_failed lease=%s detail=%r", fingerprint(lease_id), e.detail
            )
            return _error(503, "unavailable", f"{e}; retry the return, it is safe")
        _log_dropped(run, returned.dropped)
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
        return _json(
            {
                "lease": lease_id,
                "tag": returned.tag,
                "returned": given,
                "count": 0 if tail is None else len(tail),
            }
        )

    def _log_dropped(run: Running, dropped: list[str]) -> None:
        log_dropped(logger, dropped)
        for item in dropped:
            dropped_tag, _, text = item.partition("=")
            run.node.stats.waste(dropped_tag, "redis_new_incarnation", len(IdRange.from_text(text)))

    # /lease/return first: a tag named "return" cannot be leased over HTTP.
    return [
        Route("/lease/return", give_back, methods=["POST"]),
        Route("/lease/{tag}", lease, methods=["POST"]),
    ]
