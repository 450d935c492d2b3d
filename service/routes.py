"""The route table: every HTTP route of a node, declared once.

A row holds a route's path, method, handler, metrics label, summary, answer,
error codes (``ErrorCode``, the rows of ``service/errors.py``), who may call
it, its query parameters and its body. Everything else is derived from
``TABLE``: Starlette's routes (``starlette_routes``), ``/openapi.json``
(``service/openapi.py``), and the ``route`` label of the request metrics
(``label_of``). A handler that answers a code its row lacks fails the tests
(``tests/conftest.py`` checks every error answered in them against its row).

``GET /id`` and ``GET /ids`` are answered before routing when they can be
(``NodeApp``'s fast path); their rows describe them all the same.
"""

from __future__ import annotations

import os
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import BaseRoute, Route

from . import admin, api_schemas, decode, leases, workers
from .errors import ErrorCode
from .node_routes import (
    healthz,
    many_ids,
    metrics_text,
    one_id,
    openapi_json,
    readyz,
    status_html,
    status_json,
)
from .openapi import TAG_ROW_REF, TEXT, Access, Ok, Param, Schema

Handler = Callable[[Request], Awaitable[Response]]
OTHER = "other"  # the label of a path no row covers (a 404)


@dataclass(frozen=True)
class ApiRoute:
    """One route: one method on one path, and all that is said of it."""

    path: str
    method: str
    handler: Handler
    label: str  # the metrics' ``route`` label: a fixed name, never a tag
    summary: str
    answer: Ok
    errors: tuple[ErrorCode, ...] = ()  # in each status's order of the document
    access: Access = Access.PUBLIC
    query: tuple[Param, ...] = ()
    body: Schema | None = None


E = ErrorCode
# A route whose path names a tag: its token, the tag looked up, the path and method
_TAGGED = (E.UNAUTHORIZED, E.UNKNOWN_TAG, E.NOT_FOUND, E.METHOD_NOT_ALLOWED)
_ID_ERRORS = (
    *(E.BAD_TAG, E.BAD_COUNT, *_TAGGED, E.TAG_DISABLED),
    *(E.UNAVAILABLE, E.TAG_EXHAUSTED, E.DRAINING, E.WORKER_UNAVAILABLE, E.CLOCK_BEHIND),
)
_BODY = (E.BODY_TOO_SLOW, E.BODY_TOO_LARGE)  # a route that reads a body
_ADMIN = (
    *(E.UNAUTHORIZED, E.ADMIN_OFF, E.UNKNOWN_TAG, E.UNKNOWN_TOKEN, E.NOT_FOUND),
    *(E.METHOD_NOT_ALLOWED, E.UNAVAILABLE),
)
_WORKER_CHANGE = (
    *(E.BAD_TAG, E.BAD_BODY, E.BAD_SECRET, E.WRONG_KIND, *_TAGGED, E.WORKER_LOST),
    *(E.TAG_DISABLED, E.UNAVAILABLE, E.DRAINING, E.WORKER_UNAVAILABLE, E.WRONG_SECRET),
)
_ONE_ID = Ok(
    "one ID: decimal text, or the tag's format rendered",
    {"type": "string", "minLength": 1},
    "text/plain",
)


def _text(description: str, media: str = "text/plain") -> Ok:
    return Ok(description, TEXT, media)


TABLE: tuple[ApiRoute, ...] = (
    # IDs (NodeApp answers them first when it can)
    ApiRoute("/id/{tag}", "GET", one_id, "id", "One ID", _ONE_ID, _ID_ERRORS, Access.TAG),
    ApiRoute(
        "/api/segment/get/{tag}", "GET", one_id, "id", "One ID (Meituan Leaf's path)",
        _ONE_ID, _ID_ERRORS, Access.TAG,
    ),
    ApiRoute(
        "/ids/{tag}", "GET", many_ids, "ids", "A batch of IDs, increasing within each range",
        Ok("the IDs", api_schemas.IDS), _ID_ERRORS, Access.TAG, (api_schemas.ids_count,),
    ),
    # The operator's pages
    ApiRoute("/healthz", "GET", healthz, "healthz", "Liveness", _text("ok")),
    ApiRoute(
        "/readyz", "GET", readyz, "readyz",
        "Readiness: 503 while starting, draining, or with no IDs and no Redis",
        _text("ready"), (E.NOT_READY,),
    ),
    ApiRoute(
        "/status", "GET", status_html, "status", "Status page",
        _text("HTML page", "text/html"),
    ),
    ApiRoute(
        "/status.json", "GET", status_json, "status_json", "The status page's data",
        Ok("snapshot", api_schemas.STATUS),
    ),
    ApiRoute(
        "/metrics", "GET", metrics_text, "metrics", "Prometheus metrics", _text("exposition"),
    ),
    ApiRoute(
        "/openapi.json", "GET", openapi_json, "openapi", "This document",
        Ok("OpenAPI 3.0", {"type": "object"}),
    ),
    # The admin API (service/admin.py)
    ApiRoute(
        "/admin/tags", "GET", admin.list_tags, "admin", "List tags",
        Ok("every tag", api_schemas.TAGS), _ADMIN, Access.ADMIN,
    ),
    ApiRoute(
        "/admin/tags", "POST", admin.add_tag, "admin", "Create a tag",
        Ok("created", TAG_ROW_REF, status="201"),
        (
            *(E.BAD_BODY, E.BAD_TAG, E.BAD_STEP, E.BAD_START, E.BAD_MAX, E.BAD_DESCRIPTION),
            *(E.BAD_KIND, E.BAD_LAYOUT, E.BAD_FORMAT, E.BAD_RESET, E.BAD_OBFUSCATE),
            *(E.WRONG_KIND, E.TAG_EXISTS, E.FORMAT_CHANGED, E.NAME_USED, *_BODY, *_ADMIN),
        ),
        Access.ADMIN, body=api_schemas.NEW_TAG,
    ),
    ApiRoute(
        "/admin/tags/{tag}", "PATCH", admin.change_tag, "admin",
        "Change the step, move the start forward, disable or enable",
        Ok("the row after the change", TAG_ROW_REF),
        (
            *(E.BAD_BODY, E.BAD_TAG, E.BAD_STEP, E.BAD_START, E.BAD_DISABLED, E.WRONG_KIND),
            *(E.START_BELOW_ISSUED, E.START_ABOVE_MAX, E.START_ON_RESET, *_BODY, *_ADMIN),
        ),
        Access.ADMIN, body=api_schemas.TAG_CHANGE,
    ),
    ApiRoute(
        "/admin/tags/{tag}", "DELETE", admin.remove, "admin",
        "Remove the tag for good: unknown from then on, its tokens dropped, its "
        "ready ranges wasted; the name added again starts above all it issued",
        Ok("the row as it was removed, and the ready IDs wasted", api_schemas.REMOVED),
        (E.BAD_TAG, E.WRONG_KIND, *_ADMIN), Access.ADMIN,
    ),
    ApiRoute(
        "/admin/tags/{tag}/decode", "GET", admin.decode_id, "admin",
        "An ID of the tag back to what it was made from (its sequence number)",
        Ok("what the ID was made from", api_schemas.DECODED),
        (E.BAD_TAG, E.BAD_VALUE, E.BAD_ID, *_ADMIN), Access.ADMIN, (api_schemas.DECODE_VALUE,),
    ),
    ApiRoute(
        "/admin/tags/{tag}/tokens", "POST", admin.add_token, "admin",
        "Make a token for the tag; from then on the tag needs one",
        Ok("the token: shown this once, stored only hashed", api_schemas.NEW_TOKEN, status="201"),
        (E.BAD_TAG, *_ADMIN), Access.ADMIN,
    ),
    ApiRoute(
        "/admin/tags/{tag}/tokens", "GET", admin.list_tokens, "admin",
        "The tag's token ids (never the tokens)", Ok("token ids", api_schemas.TOKEN_IDS),
        (E.BAD_TAG, *_ADMIN), Access.ADMIN,
    ),
    ApiRoute(
        "/admin/tags/{tag}/tokens/{token_id}", "DELETE", admin.revoke_token, "admin",
        "Revoke one token", Ok("revoked", api_schemas.REVOKED), (E.BAD_TAG, *_ADMIN), Access.ADMIN,
    ),
    ApiRoute(
        "/admin/drain", "POST", admin.drain, "admin",
        "Stop serving here and return the remainders to the pool",
        Ok("what was returned or abandoned", api_schemas.DRAINED), _ADMIN, Access.ADMIN,
    ),
    # Client leases (service/leases.py); /lease/return first: a tag named
    # "return" cannot be leased over HTTP.
    ApiRoute(
        "/lease/return", "POST", leases.give_back, "lease",
        "Give back the unused tail of a lease, once", Ok("what was returned", api_schemas.RETURNED),
        (
            *(E.BAD_BODY, E.BAD_LEASE, E.BAD_SECRET, E.BAD_FROM, E.BAD_TAG, E.OUTSIDE_LEASE),
            *(E.WRONG_TAG, E.UNAUTHORIZED, E.WRONG_SECRET, E.UNKNOWN_TAG, E.NOT_FOUND),
            *(E.METHOD_NOT_ALLOWED, E.UNKNOWN_LEASE, E.ALREADY_RETURNED, *_BODY),
            *(E.UNAVAILABLE, E.LEASES_UNAVAILABLE),
        ),
        Access.TAG, body=api_schemas.LEASE_RETURN,
    ),
    ApiRoute(
        "/lease/{tag}", "POST", leases.lease, "lease",
        "Lease whole ranges covering about count IDs, for a client library",
        Ok("the leases", api_schemas.LEASES),
        (
            *(E.BAD_TAG, E.BAD_COUNT, E.WRONG_KIND, E.UNAUTHORIZED, E.KEY_NEEDS_TOKEN),
            *(E.UNKNOWN_TAG, E.NOT_FOUND, E.METHOD_NOT_ALLOWED, E.TAG_DISABLED),
            *(E.BODY_TOO_SLOW, E.STRICT_TAG, E.BODY_TOO_LARGE, E.UNAVAILABLE),
            *(E.TAG_EXHAUSTED, E.DRAINING, E.LEASES_UNAVAILABLE),
        ),
        Access.TAG, (api_schemas.LEASE_COUNT,),
    ),
    # Snowflake worker IDs for clients (service/workers.py) and decoding (service/decode.py)
    ApiRoute(
        "/worker/{tag}", "POST", workers.grant, "worker",
        "Lease a worker ID of a snowflake tag, for a client that makes IDs in-process",
        Ok("the worker ID, its time floor and lease", api_schemas.GRANT),
        (
            *(E.BAD_TAG, E.WRONG_KIND, *_TAGGED, E.TAG_DISABLED),
            *(E.UNAVAILABLE, E.DRAINING, E.WORKER_UNAVAILABLE),
        ),
        Access.TAG,
    ),
    ApiRoute(
        "/worker/{tag}/renew", "POST", workers.renew, "worker",
        "Renew a worker ID's lease, with the last time used",
        Ok("renewed", api_schemas.CHANGED), _WORKER_CHANGE, Access.TAG, body=api_schemas.WORKER,
    ),
    ApiRoute(
        "/worker/{tag}/release", "POST", workers.release, "worker",
        "Give a worker ID back, with the last time used",
        Ok("released", api_schemas.CHANGED), _WORKER_CHANGE, Access.TAG, body=api_schemas.WORKER,
    ),
    ApiRoute(
        "/decode/{tag}/{id}", "GET", decode.decode_id, "decode",
        "What an ID says: a snowflake ID's time, worker ID and sequence",
        Ok("the parts", {"type": "object"}),
        (
            *(E.BAD_TAG, E.BAD_ID, E.NOT_DECODABLE, *_TAGGED, E.TAG_DISABLED),
            E.UNAVAILABLE,
        ),
        Access.TAG,
    ),
)  # fmt: skip


def starlette_routes(table: tuple[ApiRoute, ...] = TABLE) -> list[BaseRoute]:
    """Starlette's routes, in the table's order (Starlette adds HEAD to a GET)."""
    return [Route(row.path, row.handler, methods=[row.method]) for row in table]


def _labels(table: tuple[ApiRoute, ...]) -> tuple[dict[str, str], list[tuple[str, str]]]:
    """(exact path -> label, [(prefix, label)] longest first). A label's prefix is the
    folder its routes share (``/admin/``), else each route's path up to its first
    parameter (``/id/``, ``/api/segment/get/``): a path under it, even one no route
    matches, counts there, as it always did."""
    exact = {row.path: row.label for row in table if "{" not in row.path}
    prefixes: set[tuple[str, str]] = set()
    for label in {row.label for row in table}:
        stems = [row.path.partition("{")[0] for row in table if row.label == label]
        common = os.path.commonprefix(stems)
        folder = common[: common.rfind("/") + 1]
        if folder != "/":
            prefixes.add((folder, label))
        else:
            prefixes |= {(stem, label) for stem in stems if stem.endswith("/")}
    return exact, sorted(prefixes, key=lambda p: -len(p[0]))


_EXACT, _PREFIXES = _labels(TABLE)


def label_of(path: str) -> str:
    """The ``route`` label of a request: a handful of names whatever the path
    (a tag in a label would let any client grow the series without bound)."""
    label = _EXACT.get(path)
    if label is not None:
        return label
    for prefix, label in _PREFIXES:
        if path.startswith(prefix):
            return label
    return OTHER


def row_of(handler: object, method: str) -> ApiRoute | None:
    """The row a request ran (HEAD runs a GET's); None for one the router refused."""
    method = "GET" if method == "HEAD" else method
    return next((r for r in TABLE if r.handler is handler and r.method == method), None)


def unlisted(seen: list[tuple[object, str, str]]) -> list[str]:
    """Of the error answers ``seen`` (errors.ANSWERS), those whose code is not in the
    row of the handler that answered it, as "METHOD /path: code"."""
    wrong = []
    for handler, method, code in seen:
        row = row_of(handler, method)
        if row is not None and code not in row.errors:
            wrong.append(f"{row.method} {row.path}: {code}")
    return sorted(set(wrong))
