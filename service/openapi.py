"""The OpenAPI 3.0 description of a node's HTTP API, served at ``/openapi.json``,
built from the route table (``service/routes.py``) and the error table
(``service/errors.py``): each route's path, method, summary, parameters, answer
and error codes are declared once in its row; this module only turns rows into
the document. The schemas of one route are in ``service/api_schemas.py``; those
several routes share are named here.

``tests/test_openapi.py`` checks that every Starlette route is described and
runs schemathesis against a live node to check the answers match.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from enum import Enum
from typing import Any, Protocol

from idpool_client.formats import RESETS

from idpool.pool.ranges import TAG_PATTERN

from . import metrics
from .errors import BY_CODE, ErrorCode, ErrorRow
from .kinds import SPECS

Schema = dict[str, Any]
# A query parameter, or one made from the node's IDPOOL_MAX_COUNT (the /ids count)
Param = Schema | Callable[[int], Schema]


class Access(Enum):
    """Who may call a route: anyone; a tag's token holder (for a tag with tokens);
    the operator with IDPOOL_ADMIN_TOKEN."""

    PUBLIC = "public"
    TAG = "tag"
    ADMIN = "admin"


@dataclass(frozen=True)
class Ok:
    """A route's answer when it succeeds."""

    description: str
    schema: Schema
    media: str = "application/json"
    status: str = "200"


class Described(Protocol):
    """What the document needs of a row of the route table."""

    @property
    def path(self) -> str: ...
    @property
    def method(self) -> str: ...
    @property
    def summary(self) -> str: ...
    @property
    def answer(self) -> Ok: ...
    @property
    def errors(self) -> Sequence[ErrorCode]: ...
    @property
    def access(self) -> Access: ...
    @property
    def query(self) -> Sequence[Param]: ...
    @property
    def body(self) -> Schema | None: ...


def _kinds_described() -> str:
    """TagRow's ``kind``: every kind of the registry, and how its IDs are made."""
    named = [f"{name} ({spec.summary})" if spec.summary else name for name, spec in SPECS.items()]
    listed = " or ".join([", ".join(named[:-1]), named[-1]] if len(named) > 1 else named)
    return f"how its IDs are made: {listed}"


ERROR: Schema = {
    "type": "object",
    "required": ["error", "message"],
    "properties": {
        "error": {"type": "string", "description": "a stable code, e.g. unknown_tag"},
        "message": {"type": "string", "description": "what to fix, for people"},
    },
    "additionalProperties": False,
}
TAG_ROW: Schema = {
    "type": "object",
    "required": [
        "tag",
        "kind",
        "max_id",
        "step",
        "min_step",
        "max_step",
        "start_id",
        "max",
        "ids_left",
        "disabled",
        "description",
    ],  # fmt: skip
    "properties": {
        "tag": {"type": "string"},
        "kind": {"type": "string", "description": _kinds_described()},
        "max_id": {"type": "integer", "description": "first ID not yet claimed"},
        "step": {"type": "integer", "description": "IDs per range"},
        "min_step": {"type": "integer"},
        "max_step": {"type": "integer"},
        "start_id": {"type": "integer"},
        "max": {
            "type": "integer",
            "nullable": True,
            "description": "highest ID the tag may hand out; null: no bound below 2^63",
        },
        "ids_left": {"type": "integer", "description": "IDs not yet claimed below the max"},
        "disabled": {"type": "boolean"},
        "description": {"type": "string"},
        # what each kind adds to its rows (its module's row_schema), in the registry's order
        **{field: schema for spec in SPECS.values() for field, schema in spec.row_schema.items()},
        "format": {
            "type": "object",
            "nullable": True,
            "description": "how its IDs are rendered (null: plain integers); never the key",
            "properties": {
                "format": {"type": "string", "nullable": True},
                "reset": {"type": "string", "nullable": True, "enum": [*RESETS, None]},
                "obfuscate": {"type": "boolean"},
            },
        },
        "periods": {
            "type": "object",
            "description": "a tag with a reset: its latest periods' ledger positions (max_id)",
            "additionalProperties": {"type": "integer"},
        },
    },
}
TAG_ROW_REF: Schema = {"$ref": "#/components/schemas/TagRow"}
TEXT: Schema = {"type": "string"}
TAG_PARAM: Schema = {
    "name": "tag",
    "in": "path",
    "required": True,
    "description": "1 to 64 characters from A-Z a-z 0-9 _ . -, starting with a letter or digit",
    "schema": {"type": "string", "pattern": f"^{TAG_PATTERN.pattern}$"},
}
TOKEN_PARAM: Schema = {
    "name": "token",
    "in": "query",
    "required": False,
    "description": "one of the tag's tokens, for clients that cannot send a header "
    "(Authorization: Bearer <token> works too); only for tags that have tokens",
    "schema": {"type": "string"},
}
# A tag with tokens needs one (bearer or the token parameter); one without, nothing.
_SECURITY: dict[Access, list[Schema]] = {
    Access.TAG: [{}, {"tag_token": []}],
    Access.ADMIN: [{"bearer": []}],
}
_PATH_PARAM = re.compile(r"\{(\w+)\}")


def document(routes: Iterable[Described], max_count: int) -> Schema:
    """The OpenAPI document of ``routes`` on a node whose ``/ids`` takes up to ``max_count``."""
    paths: dict[str, Schema] = {}
    for route in routes:
        paths.setdefault(route.path, {})[route.method.lower()] = operation(route, max_count)
    return {
        "openapi": "3.0.3",
        "info": {
            "title": "idpool",
            "version": metrics.VERSION,
            "description": "Distributed 64-bit IDs: unique across every node, roughly "
            "increasing. Errors are JSON {error, message}.",
        },
        "paths": paths,
        "components": _COMPONENTS,
    }


def operation(route: Described, max_count: int) -> Schema:
    """One route's operation: its answer, then one answer per status of its error codes."""
    ok = route.answer
    responses = {
        ok.status: {"description": ok.description, "content": {ok.media: {"schema": ok.schema}}}
    }
    by_status: dict[int, list[ErrorCode]] = {}
    for code in route.errors:
        by_status.setdefault(BY_CODE[code].status, []).append(code)
    for status, codes in by_status.items():
        responses[str(status)] = _error_answer(codes)
    op: Schema = {"summary": route.summary, "responses": responses}
    if route.access in _SECURITY:
        op["security"] = _SECURITY[route.access]
    parameters = _parameters(route, max_count)
    if parameters:
        op["parameters"] = parameters
    if route.body is not None:
        op["requestBody"] = {
            "required": True,
            "content": {"application/json": {"schema": route.body}},
        }
    return op


def _error_answer(codes: list[ErrorCode]) -> Schema:
    """One status's error answer, described from the error table (service/errors.py)."""
    return {
        "description": "; ".join(f"`{code}`: {_why(BY_CODE[code])}" for code in codes),
        "content": {"application/json": {"schema": {"$ref": "#/components/schemas/Error"}}},
    }


def _why(row: ErrorRow) -> str:
    """The row's text, naming the kinds it is about from the registry."""
    if row.kinds is None:
        return row.why
    named = [name for name, spec in SPECS.items() if not row.kinds or getattr(spec, row.kinds)]
    return row.why.replace("{kinds}", ", ".join(named))


def _parameters(route: Described, max_count: int) -> list[Schema]:
    """The path's parameters in order, the tag's token, then the query's."""
    found = [
        TAG_PARAM if name == "tag" else _path_param(name)
        for name in _PATH_PARAM.findall(route.path)
    ]
    if route.access is Access.TAG:
        found.append(TOKEN_PARAM)
    found += [param(max_count) if callable(param) else param for param in route.query]
    return found


def _path_param(name: str) -> Schema:
    return {"name": name, "in": "path", "required": True, "schema": {"type": "string"}}


_COMPONENTS: Schema = {
    "schemas": {"Error": ERROR, "TagRow": TAG_ROW},
    "securitySchemes": {
        "bearer": {
            "type": "http",
            "scheme": "bearer",
            "description": "IDPOOL_ADMIN_TOKEN",
        },
        "tag_token": {
            "type": "http",
            "scheme": "bearer",
            "description": "one of the tag's tokens (idpool tag token add)",
        },
    },
}
