"""HTTP API of a node (Starlette), and its lifespan.

``GET /id/{tag}`` and ``GET /api/segment/get/{tag}`` (Leaf's path) answer one ID
as text; ``GET /ids/{tag}?count=N`` answers ``{"tag": ..., "ids": [...]}``.
Errors are ``{"error": code, "message": what to fix}``: 400 bad tag or count,
404 unknown tag, 503 when no range can be had or the node is stopping.
Operators get ``/healthz``, ``/readyz``, ``/metrics``, ``/status`` (HTML),
``/status.json``, ``/openapi.json`` and, with ``IDPOOL_ADMIN_TOKEN`` set, ``/admin/...``.

``NodeApp`` answers ``/id`` and ``/ids`` requests it can serve from memory
before Starlette's routing (the fast path); the routes answer everything else.
"""

from __future__ import annotations

import asyncio
import logging
import os
import socket
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass

import orjson
from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import HTMLResponse, PlainTextResponse, Response
from starlette.routing import Match, Route
from starlette.types import Message, Receive, Scope, Send

from idpool.pool.claims import LedgerClaims
from idpool.pool.errors import IdPoolError, TagDisabled, TagExhausted, UnknownTag
from idpool.pool.preloader import Preloader
from idpool.pool.ranges import TAG_RULE, is_valid_tag
from idpool.pool.settings import Settings
from idpool.pool.stores import LedgerStore, PoolStore, open_stores

from . import admin, auth, leases, metrics, openapi, status, status_page
from .buffer import Draining
from .node import Node, RangeSource, node_ttl
from .stats import route_of
from .tags import TagDirectory

logger = logging.getLogger("idpool.app")

# Opens the ledger and the pool at startup; open_stores in production, slowed
# or otherwise wrapped stores in the benchmark (ops/bench).
StoreOpener = Callable[[Settings], Awaitable[tuple[LedgerStore, PoolStore]]]


@dataclass
class Running:
    """What the lifespan opened, for the handlers."""

    node: Node
    ledger: LedgerStore
    pool: PoolStore
    preloader: Preloader
    store_reads: status.StoreReadsCache


def json_response(body: object, status_code: int = 200) -> Response:
    return Response(orjson.dumps(body), status_code=status_code, media_type="application/json")


def error(status_code: int, code: str, message: str) -> Response:
    response = json_response({"error": code, "message": message}, status_code)
    response.headers[ERROR_HEADER] = code  # counted by error code (idpool_http_errors_total)
    return response


def _failure(tag: str, e: IdPoolError) -> Response:
    if isinstance(e, UnknownTag):
        return error(
            404, "unknown_tag", f"tag {tag!r} does not exist; create it with `idpool tag add {tag}`"
        )
    if isinstance(e, Draining):
        return error(503, "draining", "this node is shutting down; retry on another node")
    if isinstance(e, TagExhausted):
        return error(503, "tag_exhausted", f"{e}; other tags are served as usual")
    if isinstance(e, TagDisabled):
        return error(410, "tag_disabled", str(e))
    _failures.log(tag, str(e))
    return error(503, "unavailable", str(e))


class _FailureLog:
    """event=request_failed at most once a second, with how many it stands for: a
    flood of requests while a store is down must not become a flood of log lines."""

    def __init__(self) -> None:
        self._next = 0.0
        self._suppressed = 0

    def log(self, tag: str, reason: str) -> None:
        now = time.monotonic()
        if now < self._next:
            self._suppressed += 1
            return
        logger.warning(
            "event=request_failed tag=%s reason=%r similar_since_last=%d",
            tag,
            reason,
            self._suppressed,
        )
        self._next, self._suppressed = now + 1.0, 0


_failures = _FailureLog()


def _head_refused() -> Response:
    # Starlette answers HEAD on every GET route by running the GET handler:
    # here that would take IDs and throw them away.
    response = error(
        405,
        "method_not_allowed",
        "use GET: a HEAD here would use up IDs; probe /readyz or /healthz instead",
    )
    response.headers["allow"] = "GET"
    return response


def _bad_tag(tag: str) -> Response:
    return error(400, "bad_tag", f"tag {tag[:80]!r} is not valid: use {TAG_RULE}")


ROUTES_HINT = "GET /id/{tag}, GET /ids/{tag}?count=N, GET /api/segment/get/{tag}"
_HEAD_REFUSED = frozenset({"/id/{tag}", "/api/segment/get/{tag}", "/ids/{tag}"})


def _allowed(request: Request) -> str:
    """Every method some route takes on this path, less a HEAD that is refused.

    Starlette's 405 names only the first route that matched the path: OPTIONS
    on /admin/tags said GET, HEAD, leaving out POST.
    """
    methods: set[str] = set()
    for route in request.app.routes:
        if isinstance(route, Route) and route.matches(request.scope)[0] != Match.NONE:
            methods |= route.methods or set()
            if route.path in _HEAD_REFUSED:
                methods.discard("HEAD")
    return ", ".join(sorted(methods))


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


def _limited(receive: Receive, limit: int) -> Receive:
    """``receive``, refusing a body once it passes ``limit`` bytes (a chunked body
    has no Content-Length to check up front): nothing past it is kept."""
    seen = 0

    async def limited() -> Message:
        nonlocal seen
        message = await receive()
        seen += len(message.get("body", b""))
        if seen > limit:
            raise HTTPException(413, _too_large(limit))
        return message

    return limited


async def _http_error(request: Request, exc: Exception) -> Response:
    """Starlette's own 404 and 405 (no such path, wrong method), as JSON with a hint."""
    assert isinstance(exc, HTTPException)
    if exc.status_code == 404:
        response = error(
            404, "not_found", f"no such path {request.url.path[:80]!r}; use {ROUTES_HINT}"
        )
    elif exc.status_code == 405:
        allowed = _allowed(request)
        response = error(405, "method_not_allowed", f"use {allowed} here, not {request.method}")
        response.headers["allow"] = allowed
        return response
    elif exc.status_code == 413:
        response = error(413, "body_too_large", str(exc.detail))
        response.headers["connection"] = "close"  # the rest of the body is not read
    else:
        response = error(exc.status_code, "http_error", str(exc.detail))
    response.headers.update(exc.headers or {})
    return response


async def _token_refused(node: Node, tag: str, request: Request) -> Response | None:
    """None when the tag has no tokens or the request shows one of them; else
    the 401 (or the tag's own failure: unknown, disabled)."""
    if tag not in node.tags.rows:
        try:
            await node.tags.lookup(tag)  # the tokens are read with the tag
        except IdPoolError as e:
            return _failure(tag, e)
    if auth.allowed(node.tags, tag, request):
        return None
    response = error(401, "unauthorized", auth.refusal_message(tag))
    response.headers["www-authenticate"] = "Bearer"
    return response


def _parse_count(request: Request, limit: int) -> int | Response:
    values = request.query_params.getlist("count")
    if len(values) != 1:
        return error(400, "bad_count", f"give count exactly once, as an integer from 1 to {limit}")
    raw = values[0]
    if not (raw.isascii() and raw.isdigit()) or len(raw) > 12 or not 1 <= int(raw) <= limit:
        return error(
            400, "bad_count", f"count must be an integer from 1 to {limit}, not {raw[:40]!r}"
        )
    return int(raw)


_clock = time.perf_counter
_LEAF_PREFIX = "/api/segment/get/"
_TEXT_PLAIN = (b"content-type", b"text/plain; charset=utf-8")  # as PlainTextResponse sends it
_JSON = (b"content-type", b"application/json")  # as Response(media_type=...) sends it
Answer = tuple[str, bytes, tuple[bytes, bytes]]  # latency route, body, content-type header
_OK = {"id": ("id", 200), "ids": ("ids", 200)}  # the fast path's request-count keys
CLIENT_GONE = 499  # the request count's code for an answer not delivered (nginx's)
# An error answer's code, so the metrics can tell a tag at its max (503 tag_exhausted,
# the client's to handle) from the service failing (503 unavailable).
ERROR_HEADER = "x-idpool-error"
ERROR_HEADER_RAW = ERROR_HEADER.encode()


class NodeApp(Starlette):
    """Starlette, with the requests that matter most answered before routing.

    ``GET /id/{tag}`` (or Leaf's path) for a tag whose buffer holds an ID, and
    ``GET /ids/{tag}?count=N`` (that exact query) when the buffer holds N IDs,
    are answered here: a dict lookup, ``take()`` or ``take_many()`` and two ASGI
    messages. Starlette's middleware, router, Request and Response cost more
    than everything else in such a request (BENCHMARKS.md, "the fast path").
    Every other request, and every one that must wait for a range, fail, or be
    validated (a tag with no buffer), goes through the routes in create_app,
    which answer it the same way.
    """

    node: Node | None = None  # set by the lifespan while the node serves
    max_count = 0  # the largest /ids count the fast path answers (settings.max_count)
    max_body = 65_536  # the largest request body read (settings.max_body_bytes)

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
        if scope["type"] != "http":
            await super().__call__(scope, receive, send)
            return
        if node is not None:
            counts, errors = node.stats.requests, node.stats.errors
            route = route_of(scope["path"])
            answer_to = send

            async def counted(message: Message) -> None:
                if message["type"] == "http.response.start":
                    counts[(route, message["status"])] += 1
                    if message["status"] >= 400:
                        for name, value in message.get("headers", ()):
                            if name == ERROR_HEADER_RAW:
                                errors[(route, value.decode("latin-1"))] += 1
                await answer_to(message)

            send = counted
        # Bodies are refused over the limit before they are read: up front by their
        # Content-Length, and while read when chunked (GET routes never read one).
        if _declared_length(scope) > self.max_body:
            too_large = error(413, "body_too_large", _too_large(self.max_body))
            too_large.headers["connection"] = "close"  # the body is not read
            await too_large(scope, receive, send)
            return
        if scope["method"] not in ("GET", "HEAD"):
            receive = _limited(receive, self.max_body)
        await super().__call__(scope, receive, send)

    def _from_memory(self, node: Node, path: str, query: bytes) -> Answer | None:
        """(route, body, content type) for a GET the node can answer from its
        buffers as the routes would, or None to leave the request to the routes.

        take() and take_many() are synchronous: no await between reading and
        advancing a buffer, so concurrent requests cannot get the same ID.
        """
        guarded = node.tags.tokens  # tags with tokens: the routes check the token
        if path.startswith("/ids/"):
            tag = path[5:]
            buf = node.buffers.get(tag)  # only valid tags (no "/") have a buffer
            digits = query[6:]  # after b"count="; any other query form goes to the route
            if (
                buf is None
                or (guarded and tag in guarded)
                or not query.startswith(b"count=")
                or not (digits.isdigit() and len(digits) <= 6)
                or not 1 <= (count := int(digits)) <= min(self.max_count, buf.in_memory)
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
        buf = node.buffers.get(tag)  # "/id/a/b" finds none
        value = None if buf is None else buf.take()
        return None if value is None else ("id", str(value).encode(), _TEXT_PLAIN)


def _undelivered(node: Node, path: str, route: str, body: bytes) -> None:
    """Count the IDs of a fast answer that could not be delivered as waste."""
    if route == "ids":
        answer = orjson.loads(body)
        node.undelivered(answer["tag"], answer["ids"])
    else:
        tag = path[4:] if path.startswith("/id/") else path[len(_LEAF_PREFIX) :]
        node.undelivered(tag, [int(body)])
    node.stats.requests[(route, CLIENT_GONE)] += 1


async def _send(send: Send, body: bytes, content_type: tuple[bytes, bytes]) -> None:
    headers = [(b"content-length", str(len(body)).encode()), content_type]
    await send({"type": "http.response.start", "status": 200, "headers": headers})
    await send({"type": "http.response.body", "body": body})


def create_app(settings: Settings | None = None, *, stores: StoreOpener = open_stores) -> NodeApp:
    settings = settings or Settings.from_env()
    state: dict[str, Running] = {}

    async def one_id(request: Request) -> Response:
        """What NodeApp's fast path leaves here: the first request for a tag, a
        wait for a range, a bad or unknown tag, a stopping node with no IDs left,
        or a root path (next_id then takes from memory without waiting)."""
        started = _clock()
        tag: str = request.path_params["tag"]
        node = state["run"].node
        if request.method == "HEAD":
            return _head_refused()
        if not is_valid_tag(tag):
            return _bad_tag(tag)
        if (refused := await _token_refused(node, tag, request)) is not None:
            return refused
        try:
            value = await node.next_id(tag)
        except IdPoolError as e:
            return _failure(tag, e)
        if await request.is_disconnected():  # hung up while it waited: the ID is waste
            node.undelivered(tag, [value])
            return Response(status_code=CLIENT_GONE)
        node.stats.latency["id"].observe(_clock() - started)
        return PlainTextResponse(str(value))

    async def many_ids(request: Request) -> Response:
        started = _clock()
        tag: str = request.path_params["tag"]
        if request.method == "HEAD":
            return _head_refused()
        if not is_valid_tag(tag):
            return _bad_tag(tag)
        count = _parse_count(request, settings.max_count)
        if isinstance(count, Response):
            return count
        node = state["run"].node
        if (refused := await _token_refused(node, tag, request)) is not None:
            return refused
        try:
            ids = await node.next_ids(tag, count)
        except IdPoolError as e:
            return _failure(tag, e)
        if await request.is_disconnected():
            node.undelivered(tag, ids)
            return Response(status_code=CLIENT_GONE)
        body = orjson.dumps({"tag": tag, "ids": ids})
        node.stats.latency["ids"].observe(_clock() - started)
        return Response(body, media_type="application/json")

    async def healthz(request: Request) -> Response:
        return PlainTextResponse("ok")

    async def readyz(request: Request) -> Response:
        run = state.get("run")
        if run is None:
            return error(503, "not_ready", "node is starting or shutting down")
        why = run.node.not_ready()
        if why is not None:
            return error(503, "not_ready", f"{why}: see /status for the stores")
        return PlainTextResponse("ready")

    async def take_snapshot() -> status.Snapshot:
        run = state["run"]
        return status.assemble(run.node, await run.store_reads.get(), run.preloader.wasted)

    async def status_json(request: Request) -> Response:
        return json_response(await take_snapshot())

    # The page and the exposition, rendered at most once a second however many
    # scrapers ask: rendering runs on the event loop, and four scrapers in a
    # tight loop rendering every time took most of it from /id. (/status.json
    # is built fresh: tools account for IDs from it.)
    rendered: dict[str, tuple[float, bytes]] = {}

    async def render_once_a_second(name: str, render: Callable[[], Awaitable[bytes]]) -> bytes:
        made = rendered.get(name)
        if made is None or time.monotonic() - made[0] >= status.STORE_READS_SECONDS:
            made = rendered[name] = (time.monotonic(), await render())
        return made[1]

    async def status_html(request: Request) -> Response:
        async def render() -> bytes:
            return status_page.render(await take_snapshot()).encode()

        return HTMLResponse(await render_once_a_second("status", render))

    async def metrics_text(request: Request) -> Response:
        async def render() -> bytes:
            return metrics.render(await take_snapshot(), state["run"].node.stats)

        body = await render_once_a_second("metrics", render)
        return Response(body, media_type=metrics.CONTENT_TYPE)

    api_document = orjson.dumps(openapi.document(settings.max_count))

    async def openapi_json(request: Request) -> Response:
        return Response(api_document, media_type="application/json")

    @asynccontextmanager
    async def lifespan(app: NodeApp) -> AsyncIterator[None]:
        ledger, pool = await stores(settings)
        claims = LedgerClaims(ledger, pool)
        preloader = Preloader(settings, ledger, pool, claims)
        source = RangeSource(claims, pool, on_low=preloader.refill_soon)
        node = Node(
            source,
            prefetch_at=settings.prefetch_at,
            tags=TagDirectory(ledger, min_interval=settings.unknown_tag_ttl),
            idle_seconds=settings.idle_seconds,
            reserve_seconds=settings.reserve_seconds,
            report_seconds=settings.report_seconds,
            tag_reload_seconds=settings.tag_reload_seconds,
        )
        store_reads = status.StoreReadsCache(
            lambda: status.read_stores(
                ledger, pool, node.shown_tags(), node_ttl(settings.report_seconds)
            )
        )
        node.node_id = f"{socket.gethostname()}-{os.getpid()}"
        node.identity = {
            "addr": settings.advertise or socket.gethostname(),
            "pid": str(os.getpid()),
            "version": metrics.VERSION,
            "started_at": f"{node.stats.started_at:.0f}",
        }
        node.extra_waste = lambda: preloader.wasted
        state["run"] = Running(node, ledger, pool, preloader, store_reads)
        app.node = node
        background = [
            asyncio.ensure_future(node.run_housekeeping()),
            asyncio.ensure_future(node.health.run()),
        ]
        try:
            if settings.preload:
                preloader.start()
            if settings.embedded:
                logger.warning(
                    "event=embedded_mode file=%s detail='one node; ledger and pool in this SQLite "
                    "file; MySQL and Redis are not used'",
                    settings.sqlite_path(),
                )
            logger.info("event=node_started preload=%s", settings.preload)
            yield
            # Shutdown, in reverse: the preloader's tick under way finishes its
            # push; the node stops serving and returns its remainders.
            await preloader.close()
            report = await node.shutdown()
            logger.info(
                "event=node_stopped returned=%d abandoned=%d",
                len(report.returned),
                len(report.abandoned),
            )
        finally:
            app.node = None
            for task in background:
                task.cancel()
            # Not waited for without a bound: aiomysql lets a query run on past its
            # cancellation, and one stuck on the server must not stall the stop.
            await asyncio.wait(background, timeout=settings.store_timeout)
            await node.leave()  # after the heartbeats stopped: none can re-register it
            await preloader.close()
            await pool.close()
            await ledger.close()

    routes = [
        Route("/id/{tag}", one_id),
        Route("/api/segment/get/{tag}", one_id),
        Route("/ids/{tag}", many_ids),
        Route("/healthz", healthz),
        Route("/readyz", readyz),
        Route("/status", status_html),
        Route("/status.json", status_json),
        Route("/metrics", metrics_text),
        Route("/openapi.json", openapi_json),
        *admin.routes(settings, lambda: state["run"]),
        *leases.routes(settings, lambda: state["run"]),
    ]
    app = NodeApp(routes=routes, lifespan=lifespan, exception_handlers={HTTPException: _http_error})
    app.max_count = settings.max_count
    app.max_body = settings.max_body_bytes
    return app
