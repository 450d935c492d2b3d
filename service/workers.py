"""Worker IDs of snowflake tags for client libraries, which then make IDs
in-process (``client/idpool_client/snowflake.py``).

``POST /worker/{tag}`` grants a worker ID (the node claims its generation and
runs the grant script, as for its own) and answers its lease's ``secret``;
``POST /worker/{tag}/renew`` and ``POST /worker/{tag}/release`` with
``{"worker": n, "generation": g, "secret": s, "last_ms": t}`` renew it or give it
back. The grant and each renewal answer the lease's ``expires_ms`` (the Redis
server's clock): the client makes no ID with a later time (a later holder's floor
is at or above it). A renewal refused (409 ``worker_lost``) means the client must stop making
IDs with that worker ID; 403 ``wrong_secret`` means the caller is not the holder
(nothing changed). The secret is only in the grant's answer: Redis keeps its
SHA-256, logs a 12-hex ``fingerprint`` of it; the generation alone (the tag's
ledger ``max_id``) is guessable and was once enough to release someone's lease.
"""

from __future__ import annotations

import logging
from typing import Any

import orjson
from starlette.requests import Request
from starlette.responses import Response

from idpool.pool.errors import InvalidInput, StoreUnavailable
from idpool.pool.snowflake import WorkerLeaseLost
from idpool.pool.worker_store import (
    MAX_LAST_MS,
    ClientCaps,
    Grant,
    LastTooLate,
    WorkerRefused,
)

from . import preamble
from .errors import HttpRefusal, json_response
from .kinds.snowflake import LeasesWorkers
from .leases import LEASE_ID
from .runtime import Runtime

logger = logging.getLogger("idpool.snowflake")


def _kind(run: Runtime) -> LeasesWorkers:
    """The node's kind that leases worker IDs (one: snowflake)."""
    return next(k for k in run.node.kinds.values() if isinstance(k, LeasesWorkers))


async def _checked(request: Request) -> tuple[Runtime, str]:
    # a fresh row: disabled since the node's last reload?
    return await preamble.tag_request(request, refuse_draining=True, fresh=True)


async def grant(request: Request) -> Response:
    run, tag = await _checked(request)
    holder = request.query_params.get("holder", "client")
    holder = "".join(c for c in holder[:64] if c.isalnum() or c in "-_.:") or "client"
    kind = _kind(run)
    caps = ClientCaps(run.settings.worker_client_share, run.settings.worker_holder_max)
    given, layout, _ = await kind.lease_worker(tag, holder, caps)
    return json_response(
        {
            "tag": tag,
            "worker": given.worker,
            "generation": given.generation,
            "secret": given.secret,  # only here: renew and release must show it
            "floor_ms": given.floor_ms,
            "server_ms": given.server_ms,
            # The lease's TTL as Redis recorded it (the tag's): the holder's deadline
            # counts from it, and from each renewal's ttl_ms after.
            "ttl_ms": given.ttl_ms,
            # The lease's expiry as the script recorded it: the holder makes no ID
            # past it (every later holder's floor is at or above it), whatever its
            # clock reads; each renewal answers the new one.
            "expires_ms": given.expires_ms,
            "margin_ms": int(kind.margin * 1000),
            "layout": layout.fields(),
        }
    )


def _fields(body: Any, tag: str) -> tuple[Grant, int]:
    example = '{"worker": n, "generation": g, "secret": s, "last_ms": t}'
    if not isinstance(body, dict) or not all(
        isinstance(body.get(f), int) and not isinstance(body.get(f), bool) and body[f] >= 0
        for f in ("worker", "generation", "last_ms")
    ):
        raise InvalidInput("bad_body", f"send {example}, as POST /worker/{tag} answered")
    secret = body.get("secret")
    if not isinstance(secret, str) or not LEASE_ID.fullmatch(secret):
        # A client older than worker secrets lands here: it stops using the worker
        # ID (any 4xx to a renewal does), which is the safe side.
        raise InvalidInput(
            "bad_secret",
            f"secret must be the worker lease's secret POST /worker/{tag} answered; send {example}",
        )
    if body["last_ms"] > MAX_LAST_MS:
        raise InvalidInput(
            "bad_body",
            f"last_ms {body['last_ms']} is not a unix time in ms (at most {MAX_LAST_MS})",
        )
    return Grant(body["worker"], body["generation"], 0, 0, 0, secret), body["last_ms"]


async def _change(request: Request, op: str) -> Response:
    run, tag = await _checked(request)
    try:
        body = orjson.loads(await request.body())
    except orjson.JSONDecodeError:
        body = None
    held, last_ms = _fields(body, tag)
    kind = _kind(run)
    store = kind.store(tag)
    # ttl_ms only renews a lease granted before TTLs were recorded in its field;
    # any other renews by its own recorded TTL, whichever node this is.
    ttl_ms, quarantine_ms = kind.lease_ms(await run.node.tags.lookup(tag))
    expires: dict[str, int] = {}
    try:
        if op == "renew":
            renewed = await store.renew(tag, held, last_ms, ttl_ms, quarantine_ms)
            ttl_ms = renewed.ttl_ms
            expires["expires_ms"] = renewed.expires_ms  # the holder's new ceiling
        else:
            await store.release(tag, held, last_ms, quarantine_ms)
    except LastTooLate as e:
        raise InvalidInput("bad_body", f"nothing was changed: {e}") from None
    except WorkerRefused as e:
        if e.why == "wrong_secret":
            logger.warning(
                "event=worker_secret_refused tag=%s worker=%d op=%s", tag, held.worker, op
            )
            raise HttpRefusal(
                "wrong_secret",
                f"the secret is not the one POST /worker/{tag} answered for worker "
                f"{held.worker} (generation {held.generation}): nothing was changed",
            ) from None
        raise HttpRefusal("worker_lost", f"stop using worker {held.worker}: {e}") from None
    except StoreUnavailable as e:
        raise WorkerLeaseLost(tag, f"not {op}ed: Redis: {e.detail}") from e
    done = "renewed" if op == "renew" else "released"  # not "releaseed"
    answer = {"tag": tag, "worker": held.worker, done: True, "ttl_ms": ttl_ms, **expires}
    return json_response(answer)


async def renew(request: Request) -> Response:
    return await _change(request, "renew")


async def release(request: Request) -> Response:
    return await _change(request, "release")
