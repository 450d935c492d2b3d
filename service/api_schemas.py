"""The bodies and answers of the node's routes, as OpenAPI 3.0 schemas.

Each is named once here and used by its row of the route table
(``service/routes.py``); the schemas several routes share, and the building of
the document, are in ``service/openapi.py``.
"""

from __future__ import annotations

from idpool_client.formats import MAX_TEMPLATE, RESETS

from idpool.pool.ranges import MAX_ID, MAX_STEP, TAG_PATTERN

from .kinds import DEFAULT_KIND, KINDS, SPECS
from .openapi import TAG_ROW_REF, Schema

# An ID: an integer, or a string for a tag with a format template
ID: Schema = {"oneOf": [{"type": "integer"}, {"type": "string"}]}
FORMAT: Schema = {
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


def ids_count(max_count: int) -> Schema:
    """The ``count`` parameter of ``/ids`` (its maximum is the node's IDPOOL_MAX_COUNT)."""
    return {
        "name": "count",
        "in": "query",
        "required": True,
        "schema": {"type": "integer", "minimum": 1, "maximum": max_count},
    }


IDS: Schema = {
    "type": "object",
    "required": ["tag", "ids"],
    "properties": {
        "tag": {"type": "string"},
        "ids": {
            "type": "array",
            "items": ID,
            "description": "integers; strings for a tag with a format template",
        },
    },
    "additionalProperties": False,
}
LEASE_COUNT: Schema = {
    "name": "count",
    "in": "query",
    "required": False,
    "description": "IDs wanted (clamped to IDPOOL_CLIENT_MAX_COUNT); none: one range",
    "schema": {"type": "integer", "minimum": 1},
}
LEASE_RETURN: Schema = {
    "type": "object",
    "required": ["lease", "secret", "tag", "from"],
    "properties": {
        "lease": {"type": "string"},
        "secret": {"type": "string"},
        "from": {"type": "integer"},
        "tag": {"type": "string"},
    },
}
GRANT: Schema = {
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
CHANGED: Schema = {"type": "object", "required": ["tag", "worker", "ttl_ms"]}
DECODED: Schema = {
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
}
DECODE_VALUE: Schema = {
    "name": "value",
    "in": "query",
    "required": True,
    "schema": {"type": "string"},
}
TAGS: Schema = {
    "type": "object",
    "required": ["tags"],
    "properties": {"tags": {"type": "array", "items": TAG_ROW_REF}},
}
STATUS: Schema = {"type": "object", "required": ["node", "stores", "tags"]}
RANGES: Schema = {"type": "array", "items": {"type": "string"}}

LEASES: Schema = {
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
        "format": FORMAT,
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
RETURNED: Schema = {
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
NEW_TOKEN: Schema = {
    "type": "object",
    "required": ["tag", "id", "token", "created_at"],
    "properties": {
        "tag": {"type": "string"},
        "id": {"type": "string"},
        "token": {"type": "string"},
        "created_at": {"type": "string"},
    },
}
TOKEN_IDS: Schema = {
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
REVOKED: Schema = {
    "type": "object",
    "required": ["tag", "revoked"],
    "properties": {
        "tag": {"type": "string"},
        "revoked": {"type": "string"},
    },
}
DRAINED: Schema = {
    "type": "object",
    "required": ["draining", "returned", "abandoned"],
    "properties": {
        "draining": {"type": "boolean"},
        "returned": RANGES,
        "abandoned": RANGES,
    },
}
REMOVED: Schema = {
    "type": "object",
    "required": ["tag", "removed", "wasted"],
    "properties": {
        "tag": {"type": "string"},
        "removed": TAG_ROW_REF,
        "wasted": {"type": "integer"},
    },
}
WORKER: Schema = {
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
NEW_TAG: Schema = {
    "type": "object",
    "required": ["tag"],
    "properties": {
        "tag": {"type": "string", "pattern": f"^{TAG_PATTERN.pattern}$"},
        "step": {"type": "integer", "minimum": 1, "maximum": MAX_STEP},
        "start": {"type": "integer", "minimum": 1, "maximum": MAX_ID},
        "max": {"type": "integer", "minimum": 1, "maximum": MAX_ID - 1, "nullable": True},
        "description": {"type": "string", "maxLength": 255},
        "kind": {"type": "string", "enum": list(KINDS), "default": DEFAULT_KIND},
        # each kind's own fields and flag (its module's api_fields), in the registry's order
        **{field: schema for spec in SPECS.values() for field, schema in spec.api_fields.items()},
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
TAG_CHANGE: Schema = {
    "type": "object",
    "minProperties": 1,
    "properties": {
        "step": {"type": "integer", "minimum": 1, "maximum": MAX_STEP},
        "start": {"type": "integer", "minimum": 1, "maximum": MAX_ID},
        "disabled": {"type": "boolean"},
    },
    "additionalProperties": False,
}
