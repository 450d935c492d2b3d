"""The admin API: create tags, change a step, move a start forward, disable,
enable or remove a tag, add, list and revoke a tag's tokens, drain the node.

Every route needs ``Authorization: Bearer <IDPOOL_ADMIN_TOKEN>``, compared in
constant time. With no token configured the admin API is off (404). The token
never appears in a log line or an error body.
"""

from __future__ import annotations

import logging
from datetime import datetime
from typing import Any

from starlette.requests import Request
from starlette.responses import Response

from idpool.pool.claims import disable_tag, enable_tag, move_start, remove_tag
from idpool.pool.errors import InvalidInput
from idpool.pool.ranges import MAX_ID, MAX_STEP
from idpool.pool.tokens import hash_token, new_token
from idpool.pool.values import TagRow
from idpool.pool.waste import Reason

from . import preamble
from .decode import decode_issued, kind_fields
from .errors import error, json_response
from .formats import public_format, split_periods
from .tag_fields import check_int, check_range_change, check_removable, check_tag, new_tag

_CHANGE_FIELDS = frozenset({"step", "start", "disabled"})
logger = logging.getLogger("idpool.admin")


def tag_fields(row: TagRow) -> dict[str, Any]:
    """A tag as the admin API shows it."""
    return {
        "tag": row.tag,
        "kind": row.kind,
        "max_id": row.max_id,
        "step": row.step,
        "min_step": row.min_step,
        "max_step": row.max_step,
        "start_id": row.start_id,
        "max": row.max,
        "ids_left": row.left,
        "disabled": row.disabled,
        "description": row.description,
        **kind_fields(row),
        "format": public_format(row),  # null for a plain tag; never the obfuscation key
    }


async def _body(request: Request) -> dict[str, Any]:
    return await preamble.json_object(
        request,
        'send a JSON object, e.g. {"tag": "orders", "step": 1000}',
        "the body must be a JSON object",
    )


def _when(at: datetime) -> str:
    return at.isoformat()


async def list_tags(request: Request) -> Response:
    run = preamble.admitted(request)
    tags, periods = split_periods(await run.ledger.list_tags())
    shown = []
    for row in tags:
        fields = tag_fields(row)
        if row.tag in periods:  # a reset tag: each period's ledger position, newest first
            fields["periods"] = {
                key: p.max_id for key, p in sorted(periods[row.tag].items(), reverse=True)[:3]
            }
        shown.append(fields)
    return json_response({"tags": shown})


async def add_tag(request: Request) -> Response:
    run = preamble.admitted(request)
    lease_ms = int(run.settings.worker_lease_seconds * 1000)  # a snowflake tag's, for good
    spec = new_tag(await _body(request), run.settings.default_step, lease_ms=lease_ms)
    row = await spec.create(run.ledger, run.pool)
    return json_response(tag_fields(row), 201)


async def change_tag(request: Request) -> Response:
    run = preamble.admitted(request)
    tag = check_tag(request.path_params["tag"])
    body = await _body(request)
    if not body or not set(body) <= _CHANGE_FIELDS:
        raise InvalidInput(
            "bad_body",
            'send {"step": N}, {"start": N} and/or {"disabled": true|false}; '
            "nothing else can change",
        )
    disabled = body.get("disabled")
    if "disabled" in body and not isinstance(disabled, bool):
        raise InvalidInput("bad_disabled", "disabled must be true or false")
    step = check_int("step", body["step"], MAX_STEP) if "step" in body else None
    start = check_int("start", body["start"], MAX_ID) if "start" in body else None
    row = await run.ledger.get_tag(tag)
    if start is not None or step is not None:
        check_range_change(row, "start" if start is not None else "step")
    if start is not None:
        row = await move_start(run.ledger, run.pool, tag, start)
    if step is not None:
        row = await run.ledger.set_step(tag, step)
    if disabled is True:
        row, drained = await disable_tag(run.ledger, run.pool, tag)
        run.node.waste.record(tag, drained, Reason.TAG_DISABLED)
        await run.node.refresh_tags(tag)  # this node stops at once; others within seconds
    elif disabled is False:
        row = await enable_tag(run.ledger, tag)
        await run.node.refresh_tags(tag)
    return json_response(tag_fields(row))


async def decode_id(request: Request) -> Response:
    run = preamble.admitted(request)
    tag = check_tag(request.path_params["tag"])
    values = request.query_params.getlist("value")
    if len(values) != 1:
        raise InvalidInput("bad_value", "give value exactly once: ?value=<an ID of the tag>")
    row = await run.ledger.get_tag(tag)
    return json_response(await decode_issued(run.ledger, row, values[0], run.clock))


async def remove(request: Request) -> Response:
    run = preamble.admitted(request)
    tag = check_tag(request.path_params["tag"])
    check_removable(await run.ledger.get_tag(tag))  # a tag's kind never changes
    row, drained = await remove_tag(run.ledger, run.pool, tag)
    run.node.waste.record(tag, drained, Reason.TAG_REMOVED)
    await run.node.refresh_tags(tag)  # this node stops at once; others within a reload
    return json_response({"tag": tag, "removed": tag_fields(row), "wasted": sum(map(len, drained))})


async def add_token(request: Request) -> Response:
    run = preamble.admitted(request)
    tag = check_tag(request.path_params["tag"])
    token_id, token = new_token()
    row = await run.ledger.add_token(tag, token_id, hash_token(token))
    await run.node.tags.refresh()  # enforced here at once; elsewhere within a reload
    # The only time the token is shown: only its hash is stored.
    return json_response(
        {"tag": tag, "id": token_id, "token": token, "created_at": _when(row.created_at)},
        201,
    )


async def list_tokens(request: Request) -> Response:
    run = preamble.admitted(request)
    tag = check_tag(request.path_params["tag"])
    await run.ledger.get_tag(tag)
    rows = await run.ledger.list_tokens(tag)
    tokens = [{"id": t.token_id, "created_at": _when(t.created_at)} for t in rows]
    return json_response({"tag": tag, "tokens": tokens})


async def revoke_token(request: Request) -> Response:
    run = preamble.admitted(request)
    tag = check_tag(request.path_params["tag"])
    token_id = request.path_params["token_id"]
    revoked = await run.ledger.revoke_token(tag, token_id[:16])
    await run.node.tags.refresh()
    if not revoked:
        return error("unknown_token", f"tag {tag!r} has no token {token_id[:16]!r} (list them)")
    return json_response({"tag": tag, "revoked": token_id})


async def drain(request: Request) -> Response:
    run = preamble.admitted(request)
    report = await run.drain()  # every worker of the node drains (service/drain.py)
    return json_response(
        {
            "draining": True,
            "returned": [f"{tag}={r.to_text()}" for tag, r in report.returned],
            "abandoned": [f"{tag}={r.to_text()}" for tag, r in report.abandoned],
        }
    )
