"""What a route does before its own work, written once: the path's tag checked,
the node not draining, the tag looked up, its token shown; the admin token; a
JSON object body; the ``count`` of ``/ids``.

Each raises the error the table answers (``service/errors.py``), in the order a
route must check them: nothing that tells of a tag (its kind, its IDs) before
its token is shown.
"""

from __future__ import annotations

import hmac
from typing import Any

import orjson
from starlette.requests import Request

from idpool.pool.errors import Draining, InvalidInput
from idpool.pool.ranges import TAG_RULE, is_valid_tag

from . import auth
from .errors import ErrorCode, HttpRefusal
from .runtime import Runtime


def path_tag(request: Request) -> str:
    """The path's tag; raises InvalidInput (400 bad_tag) for a malformed one."""
    tag: str = request.path_params["tag"]
    if not is_valid_tag(tag):
        raise InvalidInput(ErrorCode.BAD_TAG, f"tag {tag[:80]!r} is not valid: use {TAG_RULE}")
    return tag


async def tag_request(
    request: Request, *, refuse_draining: bool = False, fresh: bool = False
) -> tuple[Runtime, str]:
    """(the runtime, the path's tag) for a request that may go on: the tag valid
    (400), the node not draining if ``refuse_draining`` (503), the tag known and
    enabled (404, 410; ``fresh``: its row read again, not the node's copy), and
    one of its tokens shown if it has any (401)."""
    tag = path_tag(request)
    run: Runtime = request.state.run
    if refuse_draining and run.node.draining:
        raise Draining("node is shutting down")
    if fresh:
        await run.node.tags.lookup(tag)  # its tokens are read with it
    await auth.check_token(run.node.tags, tag, request)
    return run, tag


def admitted(request: Request) -> Runtime:
    """The runtime, for a request showing the admin token (compared in constant
    time); else raises the refusal: 404 admin_off with none set, else 401."""
    run: Runtime = request.state.run
    token = run.settings.admin_token.encode()
    if not token:
        raise HttpRefusal(
            ErrorCode.ADMIN_OFF, "the admin API is off: set IDPOOL_ADMIN_TOKEN to use it"
        )
    scheme, _, credential = request.headers.get("authorization", "").partition(" ")
    if scheme.lower() != "bearer" or not hmac.compare_digest(credential.encode(), token):
        raise HttpRefusal(
            ErrorCode.UNAUTHORIZED,
            "send Authorization: Bearer <IDPOOL_ADMIN_TOKEN>",
            {"www-authenticate": "Bearer"},
        )
    return run


async def json_object(request: Request, not_json: str, not_object: str) -> dict[str, Any]:
    """The body, a JSON object; else 400 bad_body with the route's own message
    (``not_json`` for a body that is not JSON, ``not_object`` for other JSON)."""
    try:
        body = orjson.loads(await request.body())
    except orjson.JSONDecodeError:
        raise InvalidInput(ErrorCode.BAD_BODY, not_json) from None
    if not isinstance(body, dict):
        raise InvalidInput(ErrorCode.BAD_BODY, not_object)
    return body


def count(request: Request, limit: int) -> int:
    """The query's ``count``: given once, an integer from 1 to ``limit``; else 400
    bad_count."""
    values = request.query_params.getlist("count")
    if len(values) != 1:
        raise InvalidInput(
            ErrorCode.BAD_COUNT, f"give count exactly once, as an integer from 1 to {limit}"
        )
    raw = values[0]
    if not (raw.isascii() and raw.isdigit()) or len(raw) > 12 or not 1 <= int(raw) <= limit:
        raise InvalidInput(
            ErrorCode.BAD_COUNT, f"count must be an integer from 1 to {limit}, not {raw[:40]!r}"
        )
    return int(raw)
