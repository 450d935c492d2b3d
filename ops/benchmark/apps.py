"""The contenders that are not idpool's own ``idpool serve``, as uvicorn factories.

Each answers ``GET /id/{tag}`` with one ID as text, like idpool, and reads its
stores from the same ``IDPOOL_*`` variables (see pool/settings.py):

- ``ceiling``: a counter in memory, no store: what Starlette on uvicorn can do.
- ``bare_asgi``: the same counter as a plain ASGI callable, no framework: what
  uvicorn alone can do (idpool's fast path skips Starlette, so it can pass the
  ceiling; this row shows how far it could go).
- ``bare_rsgi``: the same counter as an RSGI app on granian: what granian alone
  can do through the interface idpool's hot routes use.
- ``redis_incr``: one Redis ``INCR`` per ID.
- ``mysql_ticket``: one Flickr-style ticket per ID (``REPLACE INTO`` then
  ``SELECT LAST_INSERT_ID()`` on the same connection).
- ``classic_leaf``: idpool's own node and fast path, its double buffer refilled
  straight from the MySQL ledger, with no Redis tier (Meituan Leaf-segment as
  published).
- ``slowed_idpool``: idpool's app whose ledger and pool calls each wait
  ``BENCH_STORE_DELAY`` seconds first; the delay lives here, not in idpool.
"""

from __future__ import annotations

import asyncio
import contextlib
import inspect
import itertools
import os
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from typing import Any, cast

import aiomysql
import pymysql
import redis.asyncio as aioredis
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import PlainTextResponse, Response
from starlette.routing import Route
from starlette.types import Receive, Scope, Send

from idpool.pool.claims import LedgerClaims
from idpool.pool.errors import IdPoolError
from idpool.pool.ledger import Ledger
from idpool.pool.settings import Settings
from idpool.pool.stores import LedgerStore, PoolStore, open_stores
from idpool.service.app import NodeApp, create_app
from idpool.service.node import Node
from idpool.service.source import RangeSource

Handler = Callable[[Request], Awaitable[Response]]
TICKETS_TABLE = "bench_tickets64"
TICKETS_SCHEMA = f"""CREATE TABLE IF NOT EXISTS {TICKETS_TABLE} (
  id BIGINT UNSIGNED NOT NULL AUTO_INCREMENT,
  stub CHAR(1) NOT NULL DEFAULT '',
  PRIMARY KEY (id),
  UNIQUE KEY stub (stub)
) ENGINE=InnoDB"""
MYSQL_PEER_CONNECTIONS = 16  # per worker; the ledger's own pool holds 4


def _unavailable(e: BaseException) -> Response:
    return PlainTextResponse(f"store error: {type(e).__name__}: {e}", status_code=503)


def ceiling() -> Starlette:
    counter = itertools.count(1)

    async def one_id(request: Request) -> Response:
        return PlainTextResponse(str(next(counter)))

    return Starlette(routes=[Route("/id/{tag}", one_id)])


def bare_asgi() -> Callable[[Scope, Receive, Send], Awaitable[None]]:
    counter = itertools.count(1)

    async def app(scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "lifespan":
            while (await receive())["type"] != "lifespan.shutdown":
                await send({"type": "lifespan.startup.complete"})
            await send({"type": "lifespan.shutdown.complete"})
            return
        body = str(next(counter)).encode()
        length = str(len(body)).encode()
        headers = [(b"content-length", length), (b"content-type", b"text/plain; charset=utf-8")]
        await send({"type": "http.response.start", "status": 200, "headers": headers})
        await send({"type": "http.response.body", "body": body})

    return app


def bare_rsgi() -> object:
    """The same counter as an RSGI app on granian: what granian's RSGI alone can do
    (idpool on granian answers its hot routes through RSGI: service/rsgi.py)."""
    counter = itertools.count(1)
    headers = [("content-type", "text/plain; charset=utf-8")]

    class App:
        async def __rsgi__(self, scope: Any, protocol: Any) -> None:
            protocol.response_bytes(200, headers, str(next(counter)).encode())

    return App()


def redis_incr() -> Starlette:
    settings = Settings.from_env()
    client = aioredis.Redis.from_url(settings.redis_url, max_connections=256)
    prefix = f"{settings.redis_prefix}:incr:"

    async def one_id(request: Request) -> Response:
        try:
            value = await client.incr(prefix + request.path_params["tag"])
        except aioredis.RedisError as e:
            return _unavailable(e)
        return PlainTextResponse(str(value))

    @asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[None]:
        yield
        await client.aclose()

    return Starlette(routes=[Route("/id/{tag}", one_id)], lifespan=lifespan)


def mysql_ticket() -> Starlette:
    params = Settings.from_env().mysql_params()
    state: dict[str, Any] = {}

    async def one_id(request: Request) -> Response:
        try:
            async with state["pool"].acquire() as conn, conn.cursor() as cur:
                await cur.execute(f"REPLACE INTO {TICKETS_TABLE} (stub) VALUES ('a')")
                await cur.execute("SELECT LAST_INSERT_ID()")
                (value,) = await cur.fetchone()
        except pymysql.err.MySQLError as e:  # deadlocks under concurrent REPLACE INTO
            return _unavailable(e)
        return PlainTextResponse(str(value))

    @asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[None]:
        pool = await aiomysql.create_pool(
            host=params.host,
            port=params.port,
            user=params.user,
            password=params.password,
            db=params.database,
            autocommit=True,
            minsize=1,
            maxsize=MYSQL_PEER_CONNECTIONS,
        )
        async with pool.acquire() as conn, conn.cursor() as cur:
            await cur.execute(TICKETS_SCHEMA)
        state["pool"] = pool
        yield
        pool.close()
        await pool.wait_closed()

    return Starlette(routes=[Route("/id/{tag}", one_id)], lifespan=lifespan)


def classic_leaf() -> NodeApp:
    settings = Settings.from_env()
    state: dict[str, Node] = {}

    async def one_id(request: Request) -> Response:
        # what NodeApp's fast path leaves to the route: no ID in memory
        tag: str = request.path_params["tag"]
        try:
            value = await state["node"].next_id(tag)
        except IdPoolError as e:
            return _unavailable(e)
        return PlainTextResponse(str(value))

    @asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[None]:
        assert isinstance(app, NodeApp)
        ledger = await Ledger.connect(settings)
        source = RangeSource(LedgerClaims(ledger, None), None)  # no Redis tier at all
        node = state["node"] = app.node = Node(source, prefetch_at=settings.prefetch_at)
        yield
        with contextlib.suppress(IdPoolError):
            await node.shutdown()  # no pool to return to: remainders are waste, as in Leaf
        app.node = None
        await ledger.close()

    return NodeApp(settings, routes=[Route("/id/{tag}", one_id)], lifespan=lifespan)


class Slowed:
    """Delegates to a store; every coroutine method first sleeps ``delay`` seconds."""

    def __init__(self, inner: object, delay: float) -> None:
        self._inner = inner
        self._delay = delay

    def __getattr__(self, name: str) -> Any:
        attr = getattr(self._inner, name)
        if name in ("close", "check") or not inspect.iscoroutinefunction(attr):
            return attr
        delay = self._delay

        async def slowed(*args: Any, **kwargs: Any) -> Any:
            await asyncio.sleep(delay)
            return await attr(*args, **kwargs)

        return slowed


async def _slowed_stores(settings: Settings) -> tuple[LedgerStore, PoolStore]:
    ledger, pool = await open_stores(settings)
    delay = float(os.environ.get("BENCH_STORE_DELAY", "0"))
    return cast(LedgerStore, Slowed(ledger, delay)), cast(PoolStore, Slowed(pool, delay))


def slowed_idpool() -> Starlette:
    return create_app(Settings.from_env(), stores=_slowed_stores)
