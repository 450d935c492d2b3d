"""The OpenAPI 3.0 description of a node's HTTP API, served at ``/openapi.json``.

Written by hand next to the routes rather than generated from them: the fast
path in ``app.py`` answers before routing, and the interesting part (which
error codes each route answers, and why) is not in any signature.
``tests/test_openapi.py`` checks that every Starlette route is described here
and runs schemathesis against a live node to check the answers match.
"""

from __future__ import annotations

from typing import Any

from idpool_client.formats import MAX_TEMPLATE, RESETS

from idpool.pool.ranges import MAX_ID, MAX_STEP, TAG_PATTERN
from idpool.pool.snowflake import LAYOUT_RANGES, LAYOUTS

from . import metrics
from .errors import BY_CODE
from .kinds import DEFAULT_KIND, KINDS

Schema = dict[str, Any]

_ERROR: Schema = {
    "type": "object",
    "required": ["error", "message"],
    "properties": {
        "error": {"type": "string", "description": "a stable code, e.g. unknown_tag"},
        "message": {"type": "string", "description": "what to fix, for people"},
    },
    "additionalProperties": False,
}
_TAG_ROW: Schema = {
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
        "kind": {
            "type": "string",
            "description": "how its IDs are made: segment (trend-increasing, served from "
            "memory), strict (strictly increasing in real time across every node) or "
            "snowflake (time-ordered, made in memory from a leased worker ID)",
        },
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
        "layout": {
            "type": "object",
            "description": "a snowflake tag's layout (only on snowflake tags); its max_id "
            "counts worker-ID grants",
        },
        "bits": {"type": "integer", "description": "a snowflake tag's ID size in bits"},
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
# An ID: an integer, or a string for a tag with a format template
_ID: Schema = {"oneOf": [{"type": "integer"}, {"type": "string"}]}
_FORMAT: Schema = {
    "type": "object",
    "description": "a formatted tag's rendering, for the client to render as the node "
    "does (idpool_client/formats.py); key: the obfuscation key, hex",
    "properties": {
        "template": {"type": "string", "nullable": True},
        "reset": {"type": "string", "nullable": True},
        "obfuscate": {"type": "boolean"},
        "max": {"type": "integer"},
        "key": {"type": "string"},
    },
}
_TAG_PARAM: Schema = {
    "name": "tag",
    "in": "path",
    "required": True,
    "description": "1 to 64 characters from A-Z a-z 0-9 _ . -, starting with a letter or digit",
    "schema": {"type": "string", "pattern": f"^{TAG_PATTERN.pattern}$"},
}
_TOKEN_PARAM: Schema = {
    "name": "token",
    "in": "query",
    "required": False,
    "description": "one of the tag's tokens, for clients that cannot send a header "
    "(Authorization: Bearer <token> works too); only for tags that have tokens",
    "schema": {"type": "string"},
}


def _error(status: str, *codes: str) -> tuple[str, Schema]:
    """One status's answer, described from the error table (service/errors.py)."""
    assert all(BY_CODE[code].status == int(status) for code in codes), codes
    why = "; ".join(f"`{code}`: {BY_CODE[code].why}" for code in codes)
    return status, {
        "description": why,
        "content": {"application/json": {"schema": {"$ref": "#/components/schemas/Error"}}},
    }


def _ok(description: str, media: str, schema: Schema, status: str = "200") -> tuple[str, Schema]:
    return status, {"description": description, "content": {media: {"schema": schema}}}


_TEXT: Schema = {"type": "string"}
_ID_ERRORS = [
    _error("400", "bad_tag", "bad_count"),
    _error("401", "unauthorized"),
    _error("404", "unknown_tag", "not_found"),
    _error("405", "method_not_allowed"),
    _error("410", "tag_disabled"),
    _error("503", "unavailable", "tag_exhausted", "draining", "worker_unavailable", "clock_behind"),
]
_ADMIN_ERRORS = [
    _error("401", "unauthorized"),
    _error("404", "admin_off", "unknown_tag", "unknown_token", "not_found"),
    _error("405", "method_not_allowed"),
    _error("503", "unavailable"),
]


def _op(summary: str, answers: list[tuple[str, Schema]], **more: Any) -> Schema:
    return {"summary": summary, "responses": dict(answers), **more}


def _one_id(summary: str) -> Schema:
    return _op(
        summary,
        [
            _ok(
                "one ID: decimal text, or the tag's format rendered",
                "text/plain",
                {"type": "string", "minLength": 1},
            ),
            *_ID_ERRORS,
        ],  # fmt: skip
        parameters=[_TAG_PARAM, _TOKEN_PARAM],
        security=_TAG_SECURITY,
    )


# A tag with tokens needs one (bearer or the token parameter); one without, nothing.
_TAG_SECURITY: list[Schema] = [{}, {"tag_token": []}]


def _admin(summary: str, answers: list[tuple[str, Schema]], **more: Any) -> Schema:
    return _op(summary, [*answers, *_ADMIN_ERRORS], security=[{"bearer": []}], **more)


def _body(schema: Schema) -> Schema:
    return {"required": True, "content": {"application/json": {"schema": schema}}}


_RANGES: Schema = {"type": "array", "items": {"type": "string"}}
# The answers of the lease and token routes
_LEASES: Schema = {
    "type": "object",
    "required": ["tag", "count", "leases"],
    "properties": {
        "tag": {"type": "string"},
        "count": {"type": "integer"},
        "leases": {
            "type": "array",
            "items": {
                "type": "object",
                "required": ["lease", "secret", "first", "last"],
                "properties": {
                    "lease": {"type": "string"},
                    "secret": {"type": "string"},
                    "first": {"type": "integer"},
                    "last": {"type": "integer"},
                    "sequence": {
                        "type": "string",
                        "description": "a tag with a reset: the period's row (TAG@KEY) the "
                        "numbers come from; give it as tag when returning the lease",
                    },
                },
            },
        },
        "format": _FORMAT,
        "period": {
            "type": "object",
            "description": "a tag with a reset: the UTC period the numbers belong to; "
            "render them only with a date in [from, until) (unix seconds)",
            "properties": {
                "key": {"type": "string"},
                "from": {"type": "number"},
                "until": {"type": "number"},
            },
        },
    },
}

_RETURNED: Schema = {
    "type": "object",
    "required": ["lease", "tag", "returned", "count"],
    "properties": {
        "lease": {"type": "string"},
        "tag": {"type": "string"},
        "returned": {
            "type": "object",
            "nullable": True,
            "properties": {
                "first": {"type": "integer"},
                "last": {"type": "integer"},
            },
        },
        "count": {"type": "integer"},
    },
}

_NEW_TOKEN: Schema = {
    "type": "object",
    "required": ["tag", "id", "token", "created_at"],
    "properties": {
        "tag": {"type": "string"},
        "id": {"type": "string"},
        "token": {"type": "string"},
        "created_at": {"type": "string"},
    },
}

_TOKEN_IDS: Schema = {
    "type": "object",
    "required": ["tag", "tokens"],
    "properties": {
        "tag": {"type": "string"},
        "tokens": {
            "type": "array",
            "items": {
                "type": "object",
                "required": ["id", "created_at"],
                "properties": {
                    "id": {"type": "string"},
                    "created_at": {"type": "string"},
                },
            },
        },
    },
}

_REVOKED: Schema = {
    "type": "object",
    "required": ["tag", "revoked"],
    "properties": {
        "tag": {"type": "string"},
        "revoked": {"type": "string"},
    },
}

_DRAINED: Schema = {
    "type": "object",
    "required": ["draining", "returned", "abandoned"],
    "properties": {
        "draining": {"type": "boolean"},
        "returned": _RANGES,
        "abandoned": _RANGES,
    },
}


_TAG_ROW_REF: Schema = {"$ref": "#/components/schemas/TagRow"}
_REMOVED: Schema = {
    "type": "object",
    "required": ["tag", "removed", "wasted"],
    "properties": {
        "tag": {"type": "string"},
        "removed": _TAG_ROW_REF,
        "wasted": {"type": "integer"},
    },
}


def document(max_count: int) -> Schema:
    """The OpenAPI document of a node whose ``/ids`` takes up to ``max_count``."""
    return {
        "openapi": "3.0.3",
        "info": {
            "title": "idpool",
            "version": metrics.VERSION,
            "description": "Distributed 64-bit IDs: unique across every node, roughly "
            "increasing. Errors are JSON {error, message}.",
        },
        "paths": {
            **_id_paths(max_count),
            **_lease_paths(),
            **_snowflake_paths(),
            **_operator_paths(),
            **_admin_paths(),
        },
        "components": _COMPONENTS,
    }


def _id_paths(max_count: int) -> Schema:
    return {
        "/id/{tag}": {"get": _one_id("One ID")},
        "/api/segment/get/{tag}": {"get": _one_id("One ID (Meituan Leaf's path)")},
        "/ids/{tag}": {
            "get": _op(
                "A batch of IDs, increasing within each range",
                [
                    _ok(
                        "the IDs",
                        "application/json",
                        {
                            "type": "object",
                            "required": ["tag", "ids"],
                            "properties": {
                                "tag": {"type": "string"},
                                "ids": {
                                    "type": "array",
                                    "items": _ID,
                                    "description": "integers; strings for a tag with a "
                                    "format template",
                                },
                            },
                            "additionalProperties": False,
                        },
                    ),
                    *_ID_ERRORS,
                ],  # fmt: skip
                security=_TAG_SECURITY,
                parameters=[
                    _TAG_PARAM,
                    _TOKEN_PARAM,
                    {
                        "name": "count",
                        "in": "query",
                        "required": True,
                        "schema": {"type": "integer", "minimum": 1, "maximum": max_count},
                    },
                ],
            )
        },
    }


def _lease_paths() -> Schema:
    return {
        "/lease/{tag}": {
            "post": _op(
                "Lease whole ranges covering about count IDs, for a client library",
                [
                    _ok(
                        "the leases",
                        "application/json",
                        _LEASES,
                    ),
                    _error("400", "bad_tag", "bad_count", "wrong_kind"),
                    *_ID_ERRORS[1:2],
                    _error("403", "key_needs_token"),
                    *_ID_ERRORS[2:-1],
                    _error("408", "body_too_slow"),
                    _error("409", "strict_tag"),
                    _error("413", "body_too_large"),
                    _error("503", "unavailable", "tag_exhausted", "draining", "leases_unavailable"),
                ],  # fmt: skip
                security=_TAG_SECURITY,
                parameters=[
                    _TAG_PARAM,
                    _TOKEN_PARAM,
                    {
                        "name": "count",
                        "in": "query",
                        "required": False,
                        "description": "IDs wanted (clamped to IDPOOL_CLIENT_MAX_COUNT); "
                        "none: one range",
                        "schema": {"type": "integer", "minimum": 1},
                    },
                ],  # fmt: skip
            )
        },
        "/lease/return": {
            "post": _op(
                "Give back the unused tail of a lease, once",
                [
                    _ok(
                        "what was returned",
                        "application/json",
                        _RETURNED,
                    ),
                    _error(
                        "400",
                        "bad_body",
                        "bad_lease",
                        "bad_secret",
                        "bad_from",
                        "bad_tag",
                        "outside_lease",
                        "wrong_tag",
                    ),
                    _error("401", "unauthorized"),
                    _error("403", "wrong_secret"),
                    _error("404", "unknown_tag", "not_found"),
                    _error("405", "method_not_allowed"),
                    _error("409", "unknown_lease", "already_returned"),
                    _error("408", "body_too_slow"),
                    _error("413", "body_too_large"),
                    _error("503", "unavailable", "leases_unavailable"),
                ],  # fmt: skip
                requestBody=_body(
                    {
                        "type": "object",
                        "required": ["lease", "secret", "tag", "from"],
                        "properties": {
                            "lease": {"type": "string"},
                            "secret": {"type": "string"},
                            "from": {"type": "integer"},
                            "tag": {"type": "string"},
                        },
                    }
                ),  # fmt: skip
                security=_TAG_SECURITY,
                parameters=[_TOKEN_PARAM],
            )
        },
    }


_WORKER: Schema = {
    "type": "object",
    "required": ["worker", "generation", "secret", "last_ms"],
    "properties": {
        "worker": {"type": "integer", "minimum": 0},
        "generation": {"type": "integer", "minimum": 0},
        "secret": {
            "type": "string",
            "description": "the secret POST /worker/{tag} answered (stored only hashed)",
        },
        "last_ms": {"type": "integer", "minimum": 0, "description": "last unix ms used"},
    },
}


def _snowflake_paths() -> Schema:
    change_errors = [
        _error("400", "bad_tag", "bad_body", "bad_secret", "wrong_kind"),
        _error("401", "unauthorized"),
        _error("404", "unknown_tag", "not_found"),
        _error("405", "method_not_allowed"),
        _error("409", "worker_lost"),
        _error("410", "tag_disabled"),
        _error("503", "unavailable", "draining", "worker_unavailable"),
        _error("403", "wrong_secret"),
    ]
    grant: Schema = {
        "type": "object",
        "required": ["tag", "worker", "generation", "secret", "ttl_ms"],
        "properties": {
            "secret": {
                "type": "string",
                "description": "the lease's secret: renew and release must show it; "
                "given only here, never logged",
            }
        },
    }
    changed: Schema = {"type": "object", "required": ["tag", "worker", "ttl_ms"]}
    return {
        "/worker/{tag}": {
            "post": _op(
                "Lease a worker ID of a snowflake tag, for a client that makes IDs in-process",
                [
                    _ok("the worker ID, its time floor and lease", "application/json", grant),
                    _error("400", "bad_tag", "wrong_kind"),
                    *change_errors[1:4],
                    change_errors[5],
                    _error("503", "unavailable", "draining", "worker_unavailable"),
                ],
                security=_TAG_SECURITY,
                parameters=[_TAG_PARAM, _TOKEN_PARAM],
            )
        },
        "/worker/{tag}/renew": {
            "post": _op(
                "Renew a worker ID's lease, with the last time used",
                [_ok("renewed", "application/json", changed), *change_errors],
                security=_TAG_SECURITY,
                parameters=[_TAG_PARAM, _TOKEN_PARAM],
                requestBody=_body(_WORKER),
            )
        },
        "/worker/{tag}/release": {
            "post": _op(
                "Give a worker ID back, with the last time used",
                [_ok("released", "application/json", changed), *change_errors],
                security=_TAG_SECURITY,
                parameters=[_TAG_PARAM, _TOKEN_PARAM],
                requestBody=_body(_WORKER),
            )
        },
        "/decode/{tag}/{id}": {
            "get": _op(
                "What an ID says: a snowflake ID's time, worker ID and sequence",
                [
                    _ok("the parts", "application/json", {"type": "object"}),
                    _error("400", "bad_tag", "bad_id", "not_decodable"),
                    _error("401", "unauthorized"),
                    _error("404", "unknown_tag", "not_found"),
                    _error("405", "method_not_allowed"),
                    _error("410", "tag_disabled"),
                    _error("503", "unavailable"),
                ],
                security=_TAG_SECURITY,
                parameters=[
                    _TAG_PARAM,
                    {"name": "id", "in": "path", "required": True, "schema": {"type": "string"}},
                    _TOKEN_PARAM,
                ],
            )
        },
    }


def _operator_paths() -> Schema:
    return {
        "/healthz": {"get": _op("Liveness", [_ok("ok", "text/plain", _TEXT)])},
        "/readyz": {
            "get": _op(
                "Readiness: 503 while starting, draining, or with no IDs and no Redis",
                [_ok("ready", "text/plain", _TEXT), _error("503", "not_ready")],
            )
        },
        "/metrics": {"get": _op("Prometheus metrics", [_ok("exposition", "text/plain", _TEXT)])},
        "/status": {"get": _op("Status page", [_ok("HTML page", "text/html", _TEXT)])},
        "/status.json": {
            "get": _op(
                "The status page's data",
                [
                    _ok(
                        "snapshot",
                        "application/json",
                        {
                            "type": "object",
                            "required": ["node", "stores", "tags"],
                        },
                    )
                ],  # fmt: skip
            )
        },
        "/openapi.json": {
            "get": _op(
                "This document", [_ok("OpenAPI 3.0", "application/json", {"type": "object"})]
            )  # fmt: skip
        },
    }


def _admin_paths() -> Schema:
    new_tag: Schema = {
        "type": "object",
        "required": ["tag"],
        "properties": {
            "tag": {"type": "string", "pattern": f"^{TAG_PATTERN.pattern}$"},
            "step": {"type": "integer", "minimum": 1, "maximum": MAX_STEP},
            "start": {"type": "integer", "minimum": 1, "maximum": MAX_ID},
            "max": {"type": "integer", "minimum": 1, "maximum": MAX_ID - 1, "nullable": True},
            "description": {"type": "string", "maxLength": 255},
            "kind": {"type": "string", "enum": list(KINDS), "default": DEFAULT_KIND},
            "strict": {
                "type": "boolean",
                "default": False,
                "description": "true: kind strict (IDs strictly increasing in real time "
                "across every node; no client leases)",
            },
            "layout": {
                "type": "string",
                "enum": list(LAYOUTS),
                "description": "snowflake tags: default (41 bits of ms, 10 worker, 12 "
                "sequence) or js53 (37 bits of 10 ms, 8 worker, 8 sequence; below 2^53); "
                "the fields below override it",
            },
            **{
                field: {"type": "integer", "minimum": low, "maximum": high}
                for field, (low, high) in LAYOUT_RANGES.items()
            },
            "format": {
                "type": "string",
                "nullable": True,
                "maxLength": MAX_TEMPLATE,
                "description": "a template with one {id} ({id:06d}, {id:b36}, {id:b62}) and "
                "any {date:%Y%m%d} (UTC), e.g. INV-{date:%Y%m%d}-{id:06d}",
            },
            "reset": {
                "type": "string",
                "nullable": True,
                "enum": [*RESETS, None],
                "description": "restart {id} at 1 each UTC period; the format must show it",
            },
            "obfuscate": {
                "type": "boolean",
                "description": "unique numbers that do not show the count (a keyed "
                "permutation of 1..max)",
            },
        },
        "additionalProperties": False,
    }
    return {
        "/admin/tags": {
            "get": _admin(
                "List tags",
                [
                    _ok(
                        "every tag",
                        "application/json",
                        {
                            "type": "object",
                            "required": ["tags"],
                            "properties": {"tags": {"type": "array", "items": _TAG_ROW_REF}},
                        },
                    )
                ],  # fmt: skip
            ),
            "post": _admin(
                "Create a tag",
                [
                    _ok("created", "application/json", _TAG_ROW_REF, "201"),
                    _error(
                        "400",
                        "bad_body",
                        "bad_tag",
                        "bad_step",
                        "bad_start",
                        "bad_max",
                        "bad_description",
                        "bad_kind",
                        "bad_layout",
                        "bad_format",
                        "bad_reset",
                        "bad_obfuscate",
                    ),
                    _error("409", "tag_exists", "format_changed"),
                    _error("408", "body_too_slow"),
                    _error("413", "body_too_large"),
                ],  # fmt: skip
                requestBody=_body(new_tag),
            ),
        },
        **_admin_tag_paths(),
        **_admin_token_paths(),
    }


def _admin_tag_paths() -> Schema:
    change: Schema = {
        "type": "object",
        "minProperties": 1,
        "properties": {
            "step": {"type": "integer", "minimum": 1, "maximum": MAX_STEP},
            "start": {"type": "integer", "minimum": 1, "maximum": MAX_ID},
            "disabled": {"type": "boolean"},
        },
        "additionalProperties": False,
    }
    return {
        "/admin/tags/{tag}": {
            "patch": _admin(
                "Change the step, move the start forward, disable or enable",
                [
                    _ok("the row after the change", "application/json", _TAG_ROW_REF),
                    _error("400", "bad_body", "bad_tag", "bad_step", "bad_start", "bad_disabled"),
                    _error("409", "start_below_issued", "start_above_max", "start_on_reset"),
                    _error("408", "body_too_slow"),
                    _error("413", "body_too_large"),
                ],  # fmt: skip
                parameters=[_TAG_PARAM],
                requestBody=_body(change),
            ),
            "delete": _admin(
                "Remove the tag for good: unknown from then on, its tokens dropped, its "
                "ready ranges wasted; the name added again starts above all it issued",
                [
                    _ok(
                        "the row as it was removed, and the ready IDs wasted",
                        "application/json",
                        _REMOVED,
                    ),
                    _error("400", "bad_tag", "wrong_kind"),
                ],  # fmt: skip
                parameters=[_TAG_PARAM],
            ),
        },
        "/admin/tags/{tag}/decode": {
            "get": _admin(
                "An ID of the tag back to what it was made from (its sequence number)",
                [
                    _ok(
                        "what the ID was made from",
                        "application/json",
                        {
                            "type": "object",
                            "required": ["tag", "kind", "value", "sequence"],
                            "properties": {
                                "tag": {"type": "string"},
                                "kind": {"type": "string"},
                                "value": {"type": "string"},
                                "sequence": {"type": "integer"},
                                "period": {
                                    "type": "string",
                                    "description": "a reset tag's period key (its row TAG@KEY)",
                                },
                            },
                        },
                    ),
                    _error("400", "bad_tag", "bad_value", "bad_id"),
                ],  # fmt: skip
                parameters=[
                    _TAG_PARAM,
                    {
                        "name": "value",
                        "in": "query",
                        "required": True,
                        "schema": {"type": "string"},
                    },
                ],
            )
        },
    }


def _admin_token_paths() -> Schema:
    return {
        "/admin/tags/{tag}/tokens": {
            "post": _admin(
                "Make a token for the tag; from then on the tag needs one",
                [
                    _ok(
                        "the token: shown this once, stored only hashed",
                        "application/json",
                        _NEW_TOKEN,
                        "201",
                    ),
                    _error("400", "bad_tag"),
                ],  # fmt: skip
                parameters=[_TAG_PARAM],
            ),
            "get": _admin(
                "The tag's token ids (never the tokens)",
                [
                    _ok(
                        "token ids",
                        "application/json",
                        _TOKEN_IDS,
                    ),
                    _error("400", "bad_tag"),
                ],  # fmt: skip
                parameters=[_TAG_PARAM],
            ),
        },
        "/admin/tags/{tag}/tokens/{token_id}": {
            "delete": _admin(
                "Revoke one token",
                [
                    _ok(
                        "revoked",
                        "application/json",
                        _REVOKED,
                    ),
                    _error("400", "bad_tag"),
                ],  # fmt: skip
                parameters=[
                    _TAG_PARAM,
                    {
                        "name": "token_id",
                        "in": "path",
                        "required": True,
                        "schema": {"type": "string"},
                    },
                ],  # fmt: skip
            ),
        },
        "/admin/drain": {
            "post": _admin(
                "Stop serving here and return the remainders to the pool",
                [
                    _ok(
                        "what was returned or abandoned",
                        "application/json",
                        _DRAINED,
                    )
                ],  # fmt: skip
            )
        },
    }


_COMPONENTS: Schema = {
    "schemas": {"Error": _ERROR, "TagRow": _TAG_ROW},
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
