"""The handlers of a node's own routes: IDs (what the fast path leaves to the
routes), health, status, metrics and the API document. ``service/routes.py`` lists
them; ``service/app.py`` (NodeApp, the fast path) answers most ``/id`` and ``/ids``
requests before they get here.
"""

from __future__ import annotations

import time
from typing import Any

import orjson
from starlette.requests import Request
from starlette.responses import HTMLResponse, PlainTextResponse, Response

from idpool.pool.errors import IdPoolError, InvalidInput

from . import auth, metrics, preamble, status_page
from .errors import HttpRefusal, error, json_response
from .kinds import spec_of
from .node import Node
from .runtime import Runtime

CLIENT_GONE = 499  # the request count's code for an answer not delivered (nginx's)
_clock = time.perf_counter


def _head_refused() -> HttpRefusal:
    # Starlette answers HEAD on every GET route by running the GET handler:
    # here that would take IDs and throw them away.
    return HttpRefusal(
        "method_not_allowed",
        "use GET: a HEAD here would use up IDs; probe /readyz or /healthz instead",
        {"allow": "GET"},
    )


async def one_id(request: Request) -> Response:
    """What NodeApp's fast path leaves here: the first request for a tag, a
    wait for a range, a bad or unknown tag, a stopping node with no IDs left,
    or a root path (next_id then takes from memory without waiting)."""
    started = _clock()
    if request.method == "HEAD":
        raise _head_refused()
    run, tag = await preamble.tag_request(request)
    node = run.node
    value = await node.next_id(tag)
    if await request.is_disconnected():  # hung up while it waited: the ID is waste
        node.undelivered(tag, [value])
        return Response(status_code=CLIENT_GONE)
    node.stats.latency["id"].observe(_clock() - started)
    return PlainTextResponse(str(value))


async def many_ids(request: Request) -> Response:
    started = _clock()
    if request.method == "HEAD":
        raise _head_refused()
    tag = preamble.path_tag(request)
    run: Runtime = request.state.run
    try:
        count = preamble.count(request, run.settings.max_count)
    except InvalidInput:
        # names the tag's own cap where it is below the node's
        await _kind_count(run.node, tag, request, run.settings.max_count)
        raise
    await auth.check_token(run.node.tags, tag, request)
    ids = await run.node.next_ids(tag, count)
    if await request.is_disconnected():
        run.node.undelivered(tag, ids)
        return Response(status_code=CLIENT_GONE)
    body = orjson.dumps({"tag": tag, "ids": ids})
    run.node.stats.latency["ids"].observe(_clock() - started)
    return Response(body, media_type="application/json")


async def _kind_count(node: Node, tag: str, request: Request, max_count: int) -> None:
    """For a count over IDPOOL_MAX_COUNT: a kind whose own cap is lower (snowflake's
    batch) refuses it naming that cap (KindSpec.check_count), the one every smaller
    count meets too. Not for a guarded tag (before its token is checked: its kind
    stays unsaid)."""
    raw = request.query_params.get("count", "")
    if not (raw.isascii() and raw.isdigit()) or len(raw) > 12 or tag in node.tags.tokens:
        return
    try:
        row = await node.tags.lookup(tag)
    except IdPoolError:
        return  # the count's own message
    spec_of(row.kind).check_count(row, int(raw), max_count)


async def healthz(request: Request) -> Response:
    return PlainTextResponse("ok")


async def readyz(request: Request) -> Response:
    run: Runtime | None = getattr(request.state, "run", None)
    if run is None:
        return error("not_ready", "node is starting or shutting down")
    why = run.node.not_ready()
    if why is None and run.drain_requested():  # another worker drained: this one soon too
        why = "node is draining or shutting down"
    if why is not None:
        return error("not_ready", f"{why}: see /status for the stores")
    # Still ready: the node serves its buffers and the pool, and every node
    # shares this cause (taking them out would help no one); the body says it.
    stopped = run.node.health.claims_stopped()
    return PlainTextResponse("ready" if stopped is None else f"ready ({stopped})")


async def status_json(request: Request) -> Response:
    return json_response(await request.state.run.snapshot())


async def status_html(request: Request) -> Response:
    run: Runtime = request.state.run

    async def render() -> bytes:
        return status_page.render(await run.snapshot()).encode()

    return HTMLResponse(await run.render_once_a_second("status", render))


async def metrics_text(request: Request) -> Response:
    run: Runtime = request.state.run

    async def render() -> bytes:
        return metrics.render(await run.snapshot(), run.node.stats)

    body = await run.render_once_a_second("metrics", render)
    return Response(body, media_type=metrics.CONTENT_TYPE)


async def openapi_json(request: Request) -> Response:
    app: Any = request.app  # a NodeApp (service/app.py), which imports this module
    return Response(app.api_document, media_type="application/json")
