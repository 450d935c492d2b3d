"""HTTP API of a node (Starlette), and its lifespan.

``GET /id/{tag}`` and ``GET /api/segment/get/{tag}`` (Leaf's path) answer one ID
as text; ``GET /ids/{tag}?count=N`` answers ``{"tag": ..., "ids": [...]}``.
Errors are ``{"error": code, "message": what to fix}``: 400 bad tag or count,
404 unknown tag, 503 when no range can be had or the node is stopping.
Operators get ``/healthz``, ``/readyz``, ``/metrics``, ``/status`` (HTML),
``/status.json``, ``/openapi.json`` and, with ``IDPOOL_ADMIN_TOKEN`` set, ``/admin/...``.

``NodeApp`` answers ``/id`` and ``/ids`` requests it can serve from memory
before Starlette's routing (the fast path), and hands those of a tag of a
``direct`` kind straight to the kind; the routes answer everything else.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Callable, Sequence
from contextlib import asynccontextmanager

import orjson
from idpool_client.formats import TagFormat
from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.requests import ClientDisconnect, Request
from starlette.responses import Response
from starlette.routing import BaseRoute
from starlette.types import Lifespan, Message, Receive, Scope, Send

from idpool.pool.errors import IdPoolError
from idpool.pool.settings import Settings
from idpool.pool.stores import open_stores

from . import openapi, routes
from .errors import (
    ANSWERS,
    ERROR_HEADER_RAW,
    HttpRefusal,
    answer_error,
    answer_http_error,
    error,
    explain,
)
from .kinds import IdKind
from .node import Node
from .node_routes import CLIENT_GONE, many_ids, one_id
from .runtime import Runtime, StoreOpener, open_runtime


def _too_large(limit: int) -> str:
    return (
        f"the request body is over {limit} bytes (IDPOOL_MAX_BODY_BYTES); "
        "idpool's calls take a JSON object of a few hundred bytes"
    )


def _declared_length(scope: Scope) -> int:
    for name, value in scope["headers"]:
        if name == b"content-length":
            return int(value) if value.isdigit() else 0  # the server refuses a bad one
    return 0


def _limited(receive: Receive, limit: int, seconds: float) -> Receive:
    """``receive``, refusing a body once it passes ``limit`` bytes (a chunked body
    has no Content-Length to check up front): nothing past it is kept; and one
    that has not arrived whole ``seconds`` after the request began (408)."""
    seen = 0
    deadline = time.monotonic() + seconds

    async def limited() -> Message:
        nonlocal seen
        try:
            async with asyncio.timeout(_left(deadline)):
                message = await receive()
        except TimeoutError:
            raise HTTPException(408, _too_slow(seconds)) from None
        seen += len(message.get("body", b""))
        if seen > limit:
            raise HTTPException(413, _too_large(limit))
        return message

    return limited


def _left(deadline: float) -> float:
    return max(0.0, deadline - time.monotonic())


def _too_slow(seconds: float) -> str:
    return (
        f"the request body did not arrive whole within {seconds:g} s "
        "(IDPOOL_BODY_SECONDS); send it at once"
    )


_clock = time.perf_counter
_LEAF_PREFIX = "/api/segment/get/"
_TEXT_PLAIN = (b"content-type", b"text/plain; charset=utf-8")  # as PlainTextResponse sends it
_JSON = (b"content-type", b"application/json")  # as Response(media_type=...) sends it
Answer = tuple[str, bytes, tuple[bytes, bytes]]  # latency route, body, content-type header
_OK = {"id": ("id", 200), "ids": ("ids", 200)}  # the fast path's request-count keys
# The handler whose row of the route table (service/routes.py) a direct answer stands for
_HANDLER = {"id": one_id, "ids": many_ids}


async def _client_gone(request: Request, exc: Exception) -> Response:
    return Response(status_code=CLIENT_GONE)


class NodeApp(Starlette):
    """Starlette, with the requests that matter most answered before routing.

    ``GET /id/{tag}`` (or Leaf's path) for a tag whose buffer holds an ID, and
    ``GET /ids/{tag}?count=N`` (that exact query) when the buffer holds N IDs,
    are answered here: a dict lookup, ``take()`` or ``take_many()`` and two ASGI
    messages. Starlette's middleware, router, Request and Response cost more
    than everything else in such a request (BENCHMARKS.md, "the fast path").
    Every other request, and every one that must wait for a range, fail, or be
    validated (a tag with no buffer), goes through the routes in create_app,
    which answer it the same way (they read the node from ``request.state.run``),
    except those of a tag of a ``direct`` kind (``KindSpec.direct``: no memory
    to answer from), handed to its kind here without the routing
    (``_direct``, ``_answer_direct``).
    """

    def __init__(
        self,
        settings: Settings,
        stores: StoreOpener = open_stores,
        *,
        routes: list[BaseRoute],
        lifespan: Lifespan[Starlette] | None = None,
        label_of: Callable[[str], str] = routes.label_of,
        api_document: bytes = b"{}",
    ) -> None:
        super().__init__(
            routes=routes,
            lifespan=open_runtime_while_serving if lifespan is None else lifespan,
            exception_handlers={
                HTTPException: answer_http_error,
                IdPoolError: answer_error,
                HttpRefusal: answer_error,
                # A client gone before its body was read: nothing to answer, nothing
                # to log (a traceback per connection, which anyone could send).
                ClientDisconnect: _client_gone,
            },
        )
        self.settings = settings
        self.stores = stores
        self.node: Node | None = None  # the runtime's node, set by the lifespan while it serves
        self.max_count = settings.max_count  # the largest /ids count the fast path answers
        self.max_body = settings.max_body_bytes  # the largest request body read
        self.body_seconds = settings.body_seconds  # how long a body may take to arrive
        self.label_of = label_of  # a routed request's metrics label (routes.label_of)
        self.api_document = api_document  # /openapi.json, built once

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        node = self.node
        # Behind a root path Starlette routes on the path without it: leave those to it.
        if (
            node is not None
            and scope["type"] == "http"
            and scope["method"] == "GET"
            and not scope.get("root_path")
        ):
            started = _clock()
            answer = self._from_memory(node, scope["path"], scope["query_string"])
            if answer is not None:
                route, body, content_type = answer
                # A client that hung up before its answer: its IDs are waste, counted.
                if (await receive())["type"] == "http.disconnect":
                    _undelivered(node, scope["path"], route, body)
                    return
                node.stats.latency[route].observe(_clock() - started)  # as the routes do
                try:
                    await _send(send, body, content_type)
                except OSError:  # a server that says so (ASGI 2.4) when the client is gone
                    _undelivered(node, scope["path"], route, body)
                    raise
                node.stats.requests[_OK[route]] += 1
                return
            direct = self._direct(node, scope["path"], scope["query_string"])
            if direct is not None:
                await self._answer_direct(node, scope, receive, send, started, *direct)
                return
        if scope["type"] != "http":
            await super().__call__(scope, receive, send)
            return
        if node is not None:
            counts, errors = node.stats.requests, node.stats.errors
            route, method = self.label_of(scope["path"]), scope["method"]
            answer_to = send

            async def counted(message: Message) -> None:
                if message["type"] == "http.response.start":
                    counts[(route, message["status"])] += 1
                    if message["status"] >= 400:
                        for name, value in message.get("headers", ()):
                            if name == ERROR_HEADER_RAW:
                                code = value.decode("latin-1")
                                errors[(route, code)] += 1
                                ANSWERS.note(scope.get("endpoint"), method, code)
                await answer_to(message)

            send = counted
        # Bodies are refused over the limit before they are read: up front by their
        # Content-Length, and while read when chunked (GET routes never read one).
        if _declared_length(scope) > self.max_body:
            # the body is not read
            too_large = error("body_too_large", _too_large(self.max_body), {"connection": "close"})
            await too_large(scope, receive, send)
            return
        if scope["method"] not in ("GET", "HEAD"):
            receive = _limited(receive, self.max_body, self.body_seconds)
        await super().__call__(scope, receive, send)

    def _from_memory(self, node: Node, path: str, query: bytes) -> Answer | None:
        """(route, body, content type) for a GET the node can answer from its
        buffers as the routes would, or None to leave the request to the routes.

        take() and take_many() are synchronous: no await between reading and
        advancing a buffer, so concurrent requests cannot get the same ID.
        """
        guarded = node.tags.tokens  # tags with tokens: the routes check the token
        # Tags whose rows carry a format (and period rows, never served by name):
        # one truthiness test of an empty dict while no tag has a format.
        formats = node.tags.formats
        if path.startswith("/ids/"):
            tag = path[5:]
            if formats and tag in formats:
                return self._formatted(node, tag, formats[tag], query)
            buf = node.buffers.get(tag)  # only valid tags (no "/") have a buffer
            if buf is None:
                return _from_kinds(node, tag, query, self.max_count)
            if (guarded and tag in guarded) or not (
                1 <= (count := _count(query)) <= min(self.max_count, buf.in_memory)
            ):
                return None
            return "ids", orjson.dumps({"tag": tag, "ids": buf.take_many(count)}), _JSON
        if path.startswith("/id/"):
            tag = path[4:]
        elif path.startswith(_LEAF_PREFIX):
            tag = path[len(_LEAF_PREFIX) :]
        else:
            return None
        if guarded and tag in guarded:
            return None
        if formats and tag in formats:
            return self._formatted(node, tag, formats[tag], None)
        buf = node.buffers.get(tag)  # "/id/a/b" finds none
        value: int | list[int] | None
        if buf is not None:
            value = buf.take()
        else:  # another kind that serves from memory (snowflake), synchronously too
            for kind in node.from_memory:
                if (value := kind.take_now(tag, 0)) is not None:
                    break
            else:
                return None  # the route answers it (e.g. 503 naming the cause), and logs it
        return None if value is None else ("id", str(value).encode(), _TEXT_PLAIN)

    def _direct(self, node: Node, path: str, query: bytes) -> tuple[str, IdKind, str, int] | None:
        """(route, kind, tag, count) for a GET of a tag of a ``direct`` kind that the
        routes would hand straight to its kind (the same forms the memory path
        takes: a known, enabled tag without tokens, on a node not draining); else None."""
        direct = node.direct
        if not direct:
            return None
        if path.startswith("/ids/"):
            tag, route, count = path[5:], "ids", _count(query)
            if not 1 <= count <= self.max_count:
                return None
        elif path.startswith("/id/"):
            tag, route, count = path[4:], "id", 1
        elif path.startswith(_LEAF_PREFIX):
            tag, route, count = path[len(_LEAF_PREFIX) :], "id", 1
        else:
            return None
        row = node.tags.rows.get(tag)  # "/id/a/b" finds none
        if row is None or row.disabled or (kind := direct.get(row.kind)) is None:
            return None
        guarded = node.tags.tokens
        if (guarded and tag in guarded) or node.draining:
            return None
        return route, kind, tag, count

    async def _answer_direct(
        self,
        node: Node,
        scope: Scope,
        receive: Receive,
        send: Send,
        started: float,
        route: str,
        kind: IdKind,
        tag: str,
        n: int,
    ) -> None:
        """A request for a tag of a ``direct`` kind, answered as the routes would,
        without their routing: the answer waits for the kind (strict's shared
        counter, group-committed); an error is answered from the same table (and
        recorded for the route-table check, as the routes' are), and the IDs of a
        client that hung up meanwhile are waste, as on the fast path."""
        try:
            ids: Sequence[int | str]
            if route == "id":
                value = await kind.next_id(tag)
                ids, body, content_type = (value,), str(value).encode(), _TEXT_PLAIN
            else:
                ids = await kind.next_ids(tag, n)
                body, content_type = orjson.dumps({"tag": tag, "ids": ids}), _JSON
        except IdPoolError as e:
            row, message = explain(scope["state"]["run"], e, tag)  # as answer_error words it
            node.stats.requests[(route, row.status)] += 1
            node.stats.errors[(route, row.code)] += 1
            ANSWERS.note(_HANDLER[route], "GET", row.code)  # tests: is it in the route's row?
            body = orjson.dumps({"error": row.code, "message": message})
            await _send(send, body, _JSON, row.status, [(ERROR_HEADER_RAW, row.code.encode())])
            return
        if (await receive())["type"] == "http.disconnect":
            node.undelivered(tag, ids)
            node.stats.requests[(route, CLIENT_GONE)] += 1
            return
        node.stats.latency[route].observe(_clock() - started)
        try:
            await _send(send, body, content_type)
        except OSError:  # a server that says so (ASGI 2.4) when the client is gone
            node.undelivered(tag, ids)
            node.stats.requests[(route, CLIENT_GONE)] += 1
            raise
        node.stats.requests[_OK[route]] += 1

    def _formatted(
        self, node: Node, tag: str, fmt: TagFormat | None, query: bytes | None
    ) -> Answer | None:
        """The fast path of a formatted tag (``query`` None: ``/id``): as the routes
        answer it, or None to leave it to them (a period row's name: 400 there)."""
        if fmt is None or (node.tags.tokens and tag in node.tags.tokens):
            return None
        if query is None:
            value = node.formatted.take_now(tag, fmt, 0)
            return None if value is None else ("id", str(value).encode(), _TEXT_PLAIN)
        if not 1 <= (count := _count(query)) <= self.max_count:
            return None
        ids = node.formatted.take_now(tag, fmt, count)
        return None if ids is None else ("ids", orjson.dumps({"tag": tag, "ids": ids}), _JSON)


def _count(query: bytes) -> int:
    """The fast path's count: ``count=`` and 1 to 6 digits, the whole query; 0 for
    any other form (the route answers it, with its message)."""
    digits = query[6:]
    if query.startswith(b"count=") and digits.isdigit() and len(digits) <= 6:
        return int(digits)
    return 0


def _from_kinds(node: Node, tag: str, query: bytes, max_count: int) -> Answer | None:
    """``/ids`` of a tag of another kind that serves from memory (snowflake), when
    it can be made without waiting."""
    if (
        not node.from_memory
        or (node.tags.tokens and tag in node.tags.tokens)
        or not 1 <= (count := _count(query)) <= max_count
    ):
        return None
    for kind in node.from_memory:
        ids = kind.take_now(tag, count)
        if ids is not None:
            return "ids", orjson.dumps({"tag": tag, "ids": ids}), _JSON
    return None


def _undelivered(node: Node, path: str, route: str, body: bytes) -> None:
    """Count the IDs of a fast answer that could not be delivered as waste."""
    if route == "ids":
        answer = orjson.loads(body)
        node.undelivered(answer["tag"], answer["ids"])
    else:
        tag = path[4:] if path.startswith("/id/") else path[len(_LEAF_PREFIX) :]
        node.undelivered(tag, [body.decode()])  # rendered, for a formatted tag
    node.stats.requests[(route, CLIENT_GONE)] += 1


async def _send(
    send: Send,
    body: bytes,
    content_type: tuple[bytes, bytes],
    status: int = 200,
    extra: list[tuple[bytes, bytes]] | None = None,
) -> None:
    headers = [(b"content-length", str(len(body)).encode()), content_type]
    if extra:
        headers += extra
    await send({"type": "http.response.start", "status": status, "headers": headers})
    await send({"type": "http.response.body", "body": body})


@asynccontextmanager
async def open_runtime_while_serving(app: Starlette) -> AsyncIterator[dict[str, Runtime]]:
    """Open the runtime, hand it to the handlers (``request.state.run``) and to
    the fast path (``app.node``); close it in reverse."""
    assert isinstance(app, NodeApp)
    run = await open_runtime(app.settings, app.stores)
    try:
        run.start()
        app.node = run.node
        yield {"run": run}
        await run.stop()
    finally:
        app.node = None
        await run.close()


def create_app(settings: Settings | None = None, *, stores: StoreOpener = open_stores) -> NodeApp:
    """The node's app: the routes, labels and /openapi.json of the route table."""
    settings = settings or Settings.from_env()
    return NodeApp(
        settings,
        stores,
        routes=routes.starlette_routes(),
        label_of=routes.label_of,
        api_document=orjson.dumps(openapi.document(routes.TABLE, settings.max_count)),
    )
