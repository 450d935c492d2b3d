"""The admin API: create tags, change a step, move a start forward, disable,
enable or remove a tag, add, list and revoke a tag's tokens, drain the node.

Every route needs ``Authorization: Bearer <IDPOOL_ADMIN_TOKEN>``, compared in
constant time. With no token configured the admin API is off (404). The token
never appears in a log line or an error body.
"""

from __future__ import annotations

import hmac
import logging
from collections.abc import Callable
from datetime import datetime
from typing import TYPE_CHECKING, Any

import orjson
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from idpool.pool.claims import create_tag, disable_tag, enable_tag, move_start, remove_tag
from idpool.pool.errors import (
    IdPoolError,
    StartAboveMax,
    StartBelowIssued,
    StoreUnavailable,
    TagExists,
    UnknownTag,
)
from idpool.pool.ledger import TagRow
from idpool.pool.ranges import MAX_ID, MAX_STEP, TAG_RULE, IdRange, is_valid_tag
from idpool.pool.settings import Settings
from idpool.pool.tokens import hash_token, new_token

if TYPE_CHECKING:
    from .app import Running


_ADD_FIELDS = frozenset({"tag", "step", "start", "description", "max"})
_CHANGE_FIELDS = frozenset({"step", "start", "disabled"})
logger = logging.getLogger("idpool.admin")


def _json(body: object, status_code: int = 200) -> Response:
    return Response(orjson.dumps(body), status_code=status_code, media_type="application/json")


def _error(status_code: int, code: str, message: str) -> Response:
    return _json({"error": code, "message": message}, status_code)


def _row(row: TagRow) -> dict[str, Any]:
    return {
        "tag": row.tag,
        "max_id": row.max_id,
        "step": row.step,
        "min_step": row.min_step,
        "max_step": row.max_step,
        "start_id": row.start_id,
        "max": row.max,
        "ids_left": row.left,
        "disabled": row.disabled,
        "description": row.description,
    }


async def _body(request: Request) -> dict[str, Any] | Response:
    try:
        body = orjson.loads(await request.body())
    except orjson.JSONDecodeError:
        return _error(400, "bad_body", 'send a JSON object, e.g. {"tag": "orders", "step": 1000}')
    if not isinstance(body, dict):
        return _error(400, "bad_body", "the body must be a JSON object")
    return body


def _int(body: dict[str, Any], name: str, default: int | None, top: int) -> int | Response:
    value = body.get(name, default)
    if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= top:
        return _error(400, f"bad_{name}", f"{name} must be an integer from 1 to {top}")
    return value


def _when(at: datetime) -> str:
    return at.isoformat()


def _count_drained(
    run: Running, tag: str, drained: list[IdRange], reason: str = "tag_disabled"
) -> None:
    if drained:
        run.node.stats.waste(tag, reason, sum(map(len, drained)))
        logger.warning(
            "event=range_abandoned tag=%s range=%s reason=%s",
            tag,
            ",".join(r.to_text() for r in drained),
            reason,
        )


def routes(settings: Settings, running: Callable[[], Running]) -> list[Route]:
    token = settings.admin_token.encode()

    def denied(request: Request) -> Response | None:
        if not token:
            return _error(
                404, "admin_off", "the admin API is off: set IDPOOL_ADMIN_TOKEN to use it"
            )
        given = request.headers.get("authorization", "")
        scheme, _, credential = given.partition(" ")
        if scheme.lower() != "bearer" or not hmac.compare_digest(credential.encode(), token):
            response = _error(
                401, "unauthorized", "send Authorization: Bearer <IDPOOL_ADMIN_TOKEN>"
            )
            response.headers["www-authenticate"] = "Bearer"
            return response
        return None

    async def list_tags(request: Request) -> Response:
        if (refused := denied(request)) is not None:
            return refused
        try:
            rows = await running().ledger.list_tags()
        except StoreUnavailable as e:
            return _error(503, "unavailable", str(e))
        return _json({"tags": [_row(r) for r in rows]})

    async def add_tag(request: Request) -> Response:
        if (refused := denied(request)) is not None:
            return refused
        body = await _body(request)
        if isinstance(body, Response):
            return body
        unknown = sorted(set(body) - _ADD_FIELDS)
        if unknown:
            return _error(
                400,
                "bad_body",
                f"unknown field {unknown[0]!r}: a new tag takes "
                f"{', '.join(sorted(_ADD_FIELDS))} (only tag is required)",
            )
        tag = body.get("tag")
        if not isinstance(tag, str) or not is_valid_tag(tag):
            return _error(400, "bad_tag", f"tag must be a string of {TAG_RULE}")
        step = _int(body, "step", settings.default_step, MAX_STEP)
        start = _int(body, "start", 1, MAX_ID)
        description = body.get("description", "")
        if isinstance(step, Response):
            return step
        if isinstance(start, Response):
            return start
        top = _int(body, "max", MAX_ID - 1, MAX_ID - 1) if body.get("max") is not None else None
        if isinstance(top, Response):
            return top
        if top is not None and top < start:
            return _error(400, "bad_max", f"max must be at least start ({start})")
        if not isinstance(description, str) or len(description) > 255:
            return _error(400, "bad_description", "description must be a string of at most 255")
        run = running()
        try:
            row = await create_tag(
                run.ledger,
                run.pool,
                tag,
                step=step,
                start=start,
                description=description,
                end_id=MAX_ID if top is None else top + 1,
            )
        except TagExists:
            return _error(409, "tag_exists", f"tag {tag!r} already exists; change it with PATCH")
        except IdPoolError as e:
            return _error(503, "unavailable", str(e))
        return _json(_row(row), 201)

    async def change_tag(request: Request) -> Response:
        if (refused := denied(request)) is not None:
            return refused
        tag = request.path_params["tag"]
        if not is_valid_tag(tag):
            return _error(400, "bad_tag", f"tag must be {TAG_RULE}")
        body = await _body(request)
        if isinstance(body, Response):
            return body
        if not body or not set(body) <= _CHANGE_FIELDS:
            return _error(
                400,
                "bad_body",
                'send {"step": N}, {"start": N} and/or {"disabled": true|false}; '
                "nothing else can change",
            )
        disabled = body.get("disabled")
        if "disabled" in body and not isinstance(disabled, bool):
            return _error(400, "bad_disabled", "disabled must be true or false")
        step = _int(body, "step", None, MAX_STEP) if "step" in body else None
        start = _int(body, "start", None, MAX_ID) if "start" in body else None
        if isinstance(step, Response):
            return step
        if isinstance(start, Response):
            return start
        run = running()
        try:
            row = await run.ledger.get_tag(tag)
            if start is not None:
                row = await move_start(run.ledger, run.pool, tag, start)
            if step is not None:
                row = await run.ledger.set_step(tag, step)
            if disabled is True:
                row, drained = await disable_tag(run.ledger, run.pool, tag)
                _count_drained(run, tag, drained)
                await run.node.refresh_tags(tag)  # this node stops at once; others within seconds
            elif disabled is False:
                row = await enable_tag(run.ledger, tag)
                await run.node.refresh_tags(tag)
        except UnknownTag:
            return _error(404, "unknown_tag", f"tag {tag!r} does not exist")
        except StartBelowIssued as e:
            return _error(409, "start_below_issued", str(e))
        except StartAboveMax as e:
            return _error(409, "start_above_max", str(e))
        except IdPoolError as e:
            return _error(503, "unavailable", str(e))
        return _json(_row(row))

    async def remove(request: Request) -> Response:
        if (refused := denied(request)) is not None:
            return refused
        tag = request.path_params["tag"]
        if not is_valid_tag(tag):
            return _error(400, "bad_tag", f"tag must be {TAG_RULE}")
        run = running()
        try:
            row, drained = await remove_tag(run.ledger, run.pool, tag)
        except UnknownTag:
            return _error(404, "unknown_tag", f"tag {tag!r} does not exist")
        except IdPoolError as e:
            return _error(503, "unavailable", str(e))
        _count_drained(run, tag, drained, "tag_removed")
        await run.node.refresh_tags(tag)  # this node stops at once; others within a reload
        return _json({"tag": tag, "removed": _row(row), "wasted": sum(map(len, drained))})

    async def add_token(request: Request) -> Response:
        if (refused := denied(request)) is not None:
            return refused
        tag = request.path_params["tag"]
        if not is_valid_tag(tag):
            return _error(400, "bad_tag", f"tag must be {TAG_RULE}")
        run = running()
        token_id, token = new_token()
        try:
            row = await run.ledger.add_token(tag, token_id, hash_token(token))
            await run.node.tags.refresh()  # enforced here at once; elsewhere within a reload
        except UnknownTag:
            return _error(404, "unknown_tag", f"tag {tag!r} does not exist")
        except IdPoolError as e:
            return _error(503, "unavailable", str(e))
        # The only time the token is shown: only its hash is stored.
        return _json(
            {"tag": tag, "id": token_id, "token": token, "created_at": _when(row.created_at)},
            201,
        )

    async def list_tokens(request: Request) -> Response:
        if (refused := denied(request)) is not None:
            return refused
        tag = request.path_params["tag"]
        if not is_valid_tag(tag):
            return _error(400, "bad_tag", f"tag must be {TAG_RULE}")
        run = running()
        try:
            await run.ledger.get_tag(tag)
            rows = await run.ledger.list_tokens(tag)
        except UnknownTag:
            return _error(404, "unknown_tag", f"tag {tag!r} does not exist")
        except IdPoolError as e:
            return _error(503, "unavailable", str(e))
        tokens = [{"id": t.token_id, "created_at": _when(t.created_at)} for t in rows]
        return _json({"tag": tag, "tokens": tokens})

    async def revoke_token(request: Request) -> Response:
        if (refused := denied(request)) is not None:
            return refused
        tag, token_id = request.path_params["tag"], request.path_params["token_id"]
        if not is_valid_tag(tag):
            return _error(400, "bad_tag", f"tag must be {TAG_RULE}")
        run = running()
        try:
            revoked = await run.ledger.revoke_token(tag, token_id[:16])
            await run.node.tags.refresh()
        except IdPoolError as e:
            return _error(503, "unavailable", str(e))
        if not revoked:
            return _error(
                404, "unknown_token", f"tag {tag!r} has no token {token_id[:16]!r} (list them)"
            )
        return _json({"tag": tag, "revoked": token_id})

    async def drain(request: Request) -> Response:
        if (refused := denied(request)) is not None:
            return refused
        report = await running().node.shutdown()
        return _json(
            {
                "draining": True,
                "returned": [f"{tag}={r.to_text()}" for tag, r in report.returned],
                "abandoned": [f"{tag}={r.to_text()}" for tag, r in report.abandoned],
            }
        )

    return [
        Route("/admin/tags", list_tags, methods=["GET"]),
        Route("/admin/tags", add_tag, methods=["POST"]),
        Route("/admin/tags/{tag}", change_tag, methods=["PATCH"]),
        Route("/admin/tags/{tag}", remove, methods=["DELETE"]),
        Route("/admin/tags/{tag}/tokens", add_token, methods=["POST"]),
        Route("/admin/tags/{tag}/tokens", list_tokens, methods=["GET"]),
        Route("/admin/tags/{tag}/tokens/{token_id}", revoke_token, methods=["DELETE"]),
        Route("/admin/drain", drain, methods=["POST"]),
    ]
