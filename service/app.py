"""HTTP API of a node (Starlette), and its lifespan.

``GET /id/{tag}`` and ``GET /api/segment/get/{tag}`` (Leaf's path) answer one ID
as text; ``GET /ids/{tag}?count=N`` answers ``{"tag": ..., "ids": [...]}``.
Errors are ``{"error": code, "message": what to fix}``: 400 bad tag or count,
404 unknown tag, 503 when no range can be had or the node is stopping.
"""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import orjson
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import PlainTextResponse, Response
from starlette.routing import Route

from pool.claims import LedgerClaims
from pool.errors import IdPoolError, StaleLedger, UnknownTag
from pool.preloader import Preloader
from pool.ranges import TAG_RULE, is_valid_tag
from pool.settings import Settings
from pool.stores import open_stores

from .buffer import Draining
from .node import Node, NoRangeAvailable, RangeSource

logger = logging.getLogger("idpool.app")


def error(status: int, code: str, message: str) -> Response:
    body = orjson.dumps({"error": code, "message": message})
    return Response(body, status_code=status, media_type="application/json")


def _failure(tag: str, e: IdPoolError) -> Response:
    if isinstance(e, UnknownTag):
        return error(
            404, "unknown_tag", f"tag {tag!r} does not exist; create it with `idpool tag add {tag}`"
        )
    if isinstance(e, Draining):
        return error(503, "draining", "this node is shutting down; retry on another node")
    if isinstance(e, NoRangeAvailable | StaleLedger):
        logger.warning("event=request_failed tag=%s reason=%r", tag, str(e))
        return error(503, "unavailable", str(e))
    logger.error("event=request_failed tag=%s reason=%r", tag, str(e))
    return error(503, "unavailable", str(e))


def _bad_tag(tag: str) -> Response:
    return error(400, "bad_tag", f"tag {tag[:80]!r} is not valid: use {TAG_RULE}")


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


def create_app(settings: Settings | None = None) -> Starlette:
    settings = settings or Settings.from_env()
    holder: dict[str, Node] = {}

    async def one_id(request: Request) -> Response:
        tag: str = request.path_params["tag"]
        node = holder["node"]
        buf = node.buffers.get(tag)
        if buf is not None:  # hot path: a known tag with IDs in memory
            value = buf.take()
            if value is not None:
                return PlainTextResponse(str(value))
        if not is_valid_tag(tag):
            return _bad_tag(tag)
        try:
            value = await node.next_id(tag)
        except IdPoolError as e:
            return _failure(tag, e)
        return PlainTextResponse(str(value))

    async def many_ids(request: Request) -> Response:
        tag: str = request.path_params["tag"]
        if not is_valid_tag(tag):
            return _bad_tag(tag)
        count = _parse_count(request, settings.max_count)
        if isinstance(count, Response):
            return count
        try:
            ids = await holder["node"].next_ids(tag, count)
        except IdPoolError as e:
            return _failure(tag, e)
        return Response(orjson.dumps({"tag": tag, "ids": ids}), media_type="application/json")

    async def healthz(request: Request) -> Response:
        return PlainTextResponse("ok")

    async def readyz(request: Request) -> Response:
        node = holder.get("node")
        if node is None or node.draining:
            return error(503, "not_ready", "node is starting or shutting down")
        return PlainTextResponse("ready")

    @asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[None]:
        ledger, redis_pool = await open_stores(settings)
        preloader: Preloader | None = None
        try:
            claims = LedgerClaims(ledger, redis_pool)
            node = Node(
                RangeSource(claims, redis_pool),
                prefetch_at=settings.prefetch_at,
                unknown_tag_ttl=settings.unknown_tag_ttl,
            )
            holder["node"] = node
            if settings.preload:
                preloader = Preloader(settings, ledger, redis_pool, claims)
                preloader.start()
            logger.info("event=node_started preload=%s", settings.preload)
            yield
            # Shutdown, in reverse: the preloader's tick under way finishes its
            # push; the node stops serving and returns its remainders.
            if preloader is not None:
                await preloader.close()
            report = await node.shutdown()
            logger.info(
                "event=node_stopped returned=%d abandoned=%d",
                len(report.returned),
                len(report.abandoned),
            )
        finally:
            if preloader is not None:
                await preloader.close()
            await redis_pool.close()
            await ledger.close()

    routes = [
        Route("/id/{tag}", one_id),
        Route("/api/segment/get/{tag}", one_id),
        Route("/ids/{tag}", many_ids),
        Route("/healthz", healthz),
        Route("/readyz", readyz),
    ]
    return Starlette(routes=routes, lifespan=lifespan)
