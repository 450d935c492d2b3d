"""The node on granian's RSGI interface (``idpool serve --http granian``).

``GET /id`` and ``GET /ids`` answered from memory go straight from granian's
RSGI scope to ``NodeApp._from_memory`` (the same synchronous ``take()`` and
``take_many()`` as the ASGI fast path) and back as one ``response_bytes``:
no ASGI messages, no header list of bytes pairs. Everything else is handed to
the unchanged ASGI app through a small RSGI-to-ASGI adapter (granian serves one
interface per process). The ASGI lifespan (open the runtime; at the stop, return
every remainder) runs once per worker, from ``__rsgi_init__`` and
``__rsgi_del__``, with granian's own lifespan driver.
"""

from __future__ import annotations

import asyncio
import logging
import sys
from collections.abc import AsyncIterator
from typing import Any

import orjson
from granian._granian import RSGIHTTPProtocol as HTTPProtocol
from granian.asgi import LifespanProtocol
from granian.rsgi import Scope
from starlette.types import Message, Receive

from .app import _OK, NodeApp, _clock, create_app

logger = logging.getLogger("idpool.rsgi")

_ASGI = {"version": "3.0", "spec_version": "2.3"}


class RsgiNode:
    """A NodeApp served through RSGI: the hot routes natively, the rest via ASGI."""

    def __init__(self, app: NodeApp) -> None:
        self.app = app
        self.lifespan = LifespanProtocol(app)  # type: ignore[no-untyped-call]
        # granian's parser refuses over 100 header lines itself: a lower cap is checked here
        self.max_headers = app.settings.max_headers if app.settings.max_headers < 100 else 0

    def __rsgi_init__(self, loop: asyncio.AbstractEventLoop) -> None:
        # Before granian serves: a worker that cannot open its stores exits (as
        # uvicorn's does), rather than answering 503 for ever.
        loop.run_until_complete(self.lifespan.startup())  # type: ignore[no-untyped-call]
        if self.lifespan.interrupt:
            logger.error("event=startup_failed detail=%r", self.lifespan.exc)
            sys.exit(1)

    def __rsgi_del__(self, loop: asyncio.AbstractEventLoop) -> None:
        # After granian stopped serving (SIGTERM, SIGINT): return every remainder.
        loop.run_until_complete(self.lifespan.shutdown())  # type: ignore[no-untyped-call]

    async def __rsgi__(self, scope: Scope, protocol: HTTPProtocol) -> None:
        app = self.app
        # values(): every header line (keys() names each name once: 90 copies of one
        # header passed a cap of 10)
        if self.max_headers and len(scope.headers.values()) > self.max_headers:
            headers = [("content-type", "application/json"), ("connection", "close")]
            protocol.response_bytes(431, headers, _too_many(self.max_headers))
            return
        node = app.node
        if node is not None and scope.method == "GET" and scope.proto == "http":
            started = _clock()
            answer = app._from_memory(node, scope.path, scope.query_string.encode())
            if answer is not None:
                route, body, (_, content_type) = answer
                node.stats.latency[route].observe(_clock() - started)  # as the routes do
                # granian writes the answer after this returns: one that cannot be
                # delivered (the client hung up) is not seen here, nor counted as waste.
                protocol.response_bytes(200, [("content-type", content_type.decode())], body)
                node.stats.requests[_OK[route]] += 1
                return
        if scope.proto != "http":  # no websockets here: refuse the upgrade
            protocol.close(403)  # type: ignore[attr-defined]
            return
        await _as_asgi(app, self.lifespan.state, scope, protocol)


async def _as_asgi(
    app: NodeApp, state: dict[str, Any], scope: Scope, protocol: HTTPProtocol
) -> None:
    """One request through the ASGI app: the body streamed in chunks (the app's
    own limits apply as on uvicorn), the answer gathered and sent whole (every
    answer of a node is small)."""
    asgi_scope = _asgi_scope(scope, state)
    chunks = aiter(protocol)
    # Watched from the start: Starlette asks "disconnected?" with a receive() under a
    # cancelled scope, which must answer without waiting. Awaited only then, a
    # client that hung up while its ID was fetched was never seen (the ID served to
    # no one and not counted as waste).
    hung_up = asyncio.ensure_future(protocol.client_disconnect())
    receive = _receiver(chunks, hung_up)

    status = 500
    headers: list[tuple[str, str]] = []
    parts: list[bytes] = []
    answered = False

    async def send(message: Message) -> None:
        nonlocal status, headers, answered
        if message["type"] == "http.response.start":
            status = message["status"]
            headers = [(k.decode("latin-1"), v.decode("latin-1")) for k, v in message["headers"]]
        elif message["type"] == "http.response.body" and not answered:
            parts.append(message.get("body", b""))
            if not message.get("more_body", False):
                answered = True
                protocol.response_bytes(status, headers, b"".join(parts))

    try:
        await app(asgi_scope, receive, send)
    finally:
        hung_up.cancel()
    if not answered:  # the app sent no whole answer (a client that hung up meanwhile)
        protocol.response_empty(status if headers else 500, headers)


def _asgi_scope(scope: Scope, state: dict[str, Any]) -> dict[str, Any]:
    """The ASGI scope of an RSGI request (with a copy of the lifespan's state)."""
    host, _, port = scope.client.rpartition(":")
    server_host, _, server_port = scope.server.rpartition(":")
    return {
        "type": "http",
        "asgi": _ASGI,
        "http_version": scope.http_version,
        "method": scope.method,
        "scheme": scope.scheme,
        "path": scope.path,
        "raw_path": scope.path.encode(),
        # granian hands the query over as text decoded from UTF-8 (percent escapes
        # kept): encoded back the same way, never latin-1 (a '€' raised, a 500)
        "query_string": scope.query_string.encode(),
        "root_path": "",
        "headers": [(k.encode(), v.encode()) for k, v in scope.headers.items()],
        "client": (host, int(port or 0)),
        "server": (server_host, int(server_port or 0)),
        "state": state.copy(),
    }


def _receiver(chunks: AsyncIterator[Any], hung_up: asyncio.Future[None]) -> Receive:
    """The ASGI receive of one request: its body's chunks, then the client's
    hang-up (said first, whenever it is already seen)."""
    body_done = False

    async def receive() -> Message:
        nonlocal body_done
        if hung_up.done():  # as uvicorn: a client gone is said first, before its body
            return {"type": "http.disconnect"}
        if not body_done:
            try:
                chunk = await anext(chunks)
            except StopAsyncIteration:
                body_done = True
                return {"type": "http.request", "body": b"", "more_body": False}
            return {"type": "http.request", "body": bytes(chunk), "more_body": True}
        if not hung_up.done():
            await asyncio.shield(hung_up)
        return {"type": "http.disconnect"}

    return receive


def _too_many(limit: int) -> bytes:
    message = f"more than {limit} header lines (IDPOOL_MAX_HEADERS); send fewer"
    return orjson.dumps({"error": "too_many_headers", "message": message})


def create_rsgi_app() -> RsgiNode:
    """granian's factory: one per worker, like create_app for uvicorn."""
    die_with_parent()
    return RsgiNode(create_app())


def die_with_parent() -> None:
    """A granian worker is a child of its supervisor, even alone: if the supervisor
    is killed (SIGKILL, the OOM killer), the worker is killed too, as uvicorn's one
    process would be, rather than serve on as an orphan no one can stop by its PID."""
    import ctypes
    import os
    import signal

    parent = os.getppid()
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG (Linux)
    except (OSError, AttributeError):
        return  # not Linux: an orphan is possible there
    if os.getppid() != parent:  # the supervisor died before prctl: as if after
        os.kill(os.getpid(), signal.SIGKILL)
