"""From an exception to an HTTP answer: one table, one exception handler.

Every error a route answers is a row of ``ERRORS``: its code, its status and
one line on why it happens (the OpenAPI description lists the same lines).
Handlers raise: an ``IdPoolError`` from the stores (its type picks the row), an
``InvalidInput`` (its code picks the row), or an ``HttpRefusal`` for what only
HTTP has (a missing token, the admin API off, a wrong method). The body is
always ``{"error": code, "message": what to fix}``.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from enum import StrEnum
from typing import Any

import orjson
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Match, Route

from idpool.pool.clock import SYSTEM_CLOCK, Clock
from idpool.pool.errors import (
    Draining,
    IdPoolError,
    InvalidInput,
    LeaseRefused,
    StartAboveMax,
    StartBelowIssued,
    TagDisabled,
    TagExhausted,
    TagExists,
    UnknownTag,
)
from idpool.pool.snowflake import ClockBehind, WorkerLeaseLost

logger = logging.getLogger("idpool.app")

ROUTES_HINT = "GET /id/{tag}, GET /ids/{tag}?count=N, GET /api/segment/get/{tag}"


class ErrorCode(StrEnum):
    """Every code an error answer may carry: its body's ``error`` (a row of ERRORS each)."""

    BAD_TAG = "bad_tag"
    BAD_COUNT = "bad_count"
    BAD_BODY = "bad_body"
    BAD_STEP = "bad_step"
    BAD_START = "bad_start"
    BAD_MAX = "bad_max"
    BAD_KIND = "bad_kind"
    BAD_LAYOUT = "bad_layout"
    BAD_ID = "bad_id"
    NOT_DECODABLE = "not_decodable"
    WRONG_KIND = "wrong_kind"
    BAD_DESCRIPTION = "bad_description"
    BAD_FORMAT = "bad_format"
    BAD_RESET = "bad_reset"
    BAD_OBFUSCATE = "bad_obfuscate"
    BAD_VALUE = "bad_value"
    BAD_DISABLED = "bad_disabled"
    BAD_LEASE = "bad_lease"
    BAD_SECRET = "bad_secret"
    BAD_FROM = "bad_from"
    OUTSIDE_LEASE = "outside_lease"
    WRONG_TAG = "wrong_tag"
    UNAUTHORIZED = "unauthorized"
    UNKNOWN_TAG = "unknown_tag"
    WRONG_SECRET = "wrong_secret"
    KEY_NEEDS_TOKEN = "key_needs_token"
    UNKNOWN_TOKEN = "unknown_token"
    ADMIN_OFF = "admin_off"
    NOT_FOUND = "not_found"
    HTTP_ERROR = "http_error"
    METHOD_NOT_ALLOWED = "method_not_allowed"
    TAG_EXISTS = "tag_exists"
    START_BELOW_ISSUED = "start_below_issued"
    START_ON_RESET = "start_on_reset"
    FORMAT_CHANGED = "format_changed"
    NAME_USED = "name_used"
    WORKER_LOST = "worker_lost"
    START_ABOVE_MAX = "start_above_max"
    UNKNOWN_LEASE = "unknown_lease"
    ALREADY_RETURNED = "already_returned"
    STRICT_TAG = "strict_tag"
    TAG_DISABLED = "tag_disabled"
    BODY_TOO_SLOW = "body_too_slow"
    BODY_TOO_LARGE = "body_too_large"
    TAG_EXHAUSTED = "tag_exhausted"
    DRAINING = "draining"
    NOT_READY = "not_ready"
    LEASES_UNAVAILABLE = "leases_unavailable"
    WORKER_UNAVAILABLE = "worker_unavailable"
    CLOCK_BEHIND = "clock_behind"
    UNAVAILABLE = "unavailable"


class HttpRefusal(Exception):
    """A request refused for a reason only HTTP has; ``code`` is a row of ERRORS."""

    def __init__(self, code: str, message: str, headers: dict[str, str] | None = None) -> None:
        super().__init__(message)
        self.code = ErrorCode(code)  # a code not in the table fails here, where it is raised
        self.headers = headers or {}


@dataclass(frozen=True)
class ErrorRow:
    code: ErrorCode
    status: int
    why: str  # for the OpenAPI description
    raised_by: type[Exception] | None = None  # the error type answered with this row
    # The kinds "{kinds}" in ``why`` stands for, by a flag of their KindSpec ("": every
    # kind): openapi.py names them from the registry, which imports this module
    kinds: str | None = None


ERRORS: tuple[ErrorRow, ...] = (
    ErrorRow(ErrorCode.BAD_TAG, 400, "the tag is not 1-64 characters of A-Z a-z 0-9 _ . -"),
    ErrorRow(
        ErrorCode.BAD_COUNT,
        400,
        "count missing, repeated, not an integer, or out of range (a snowflake tag: at most "
        "what one worker ID makes in 500 ms)",
    ),
    ErrorRow(
        ErrorCode.BAD_BODY, 400, "the body is not a JSON object, or names a field it does not take"
    ),
    ErrorRow(ErrorCode.BAD_STEP, 400, "step is not an integer in range"),
    ErrorRow(ErrorCode.BAD_START, 400, "start is not an integer in range"),
    ErrorRow(ErrorCode.BAD_MAX, 400, "max is not an integer in range, or below start"),
    ErrorRow(
        ErrorCode.BAD_KIND,
        400,
        "kind is not a kind of ID this node knows ({kinds})",
        kinds="",
    ),
    ErrorRow(
        ErrorCode.BAD_LAYOUT,
        400,
        "a snowflake layout field is out of range, its bits add up past 63, its epoch is "
        "in the future, or it lasts less than a year",
    ),
    ErrorRow(
        ErrorCode.BAD_ID,
        400,
        "the ID is not one the tag's layout can have made: not an integer of its bits, "
        "time unit 0 (its epoch), or a time over a minute ahead of now",
    ),
    ErrorRow(
        ErrorCode.NOT_DECODABLE,
        400,
        "GET /decode decodes {kinds} IDs only (others: admin decode)",
        kinds="public_decode",
    ),
    ErrorRow(
        ErrorCode.WRONG_KIND,
        400,
        "the call is for another kind of tag (e.g. a lease of a snowflake tag)",
    ),
    ErrorRow(ErrorCode.BAD_DESCRIPTION, 400, "description is not a string of at most 255"),
    ErrorRow(
        ErrorCode.BAD_FORMAT,
        400,
        "format is not a template with one {id} (unknown field, bad spec, literal braces, "
        "over 128 characters)",
    ),
    ErrorRow(
        ErrorCode.BAD_RESET,
        400,
        "reset is not daily, monthly or yearly, or the format lacks its date",
    ),
    ErrorRow(ErrorCode.BAD_OBFUSCATE, 400, "obfuscate is not true or false"),
    ErrorRow(
        ErrorCode.BAD_VALUE,
        400,
        "decode: the value is not an ID this tag's format makes, or its number was never issued",
    ),
    ErrorRow(ErrorCode.BAD_DISABLED, 400, "disabled is not true or false"),
    ErrorRow(ErrorCode.BAD_LEASE, 400, "lease is not an id POST /lease/{tag} answered"),
    ErrorRow(
        ErrorCode.BAD_SECRET,
        400,
        "secret missing, or not a secret POST /lease/{tag} or POST /worker/{tag} answered",
    ),
    ErrorRow(ErrorCode.BAD_FROM, 400, "from is not an integer"),
    ErrorRow(
        ErrorCode.OUTSIDE_LEASE, 400, "from is not between the lease's first ID and its last + 1"
    ),
    ErrorRow(ErrorCode.WRONG_TAG, 400, "the lease is another tag's"),
    ErrorRow(
        ErrorCode.UNAUTHORIZED,
        401,
        "missing or wrong token (the admin token; or the tag's own, for a tag with tokens)",
    ),
    ErrorRow(ErrorCode.UNKNOWN_TAG, 404, "no such tag (idpool tag add TAG)", UnknownTag),
    ErrorRow(
        ErrorCode.WRONG_SECRET,
        403,
        "the secret is not this lease's or worker lease's (only its answer gives it); "
        "nothing changed",
    ),
    ErrorRow(
        ErrorCode.KEY_NEEDS_TOKEN,
        403,
        "an obfuscated tag's lease carries its key, which goes only to a holder of one of "
        "its tokens: the tag has none (idpool tag token add TAG), or ask a node for each ID",
    ),
    ErrorRow(ErrorCode.UNKNOWN_TOKEN, 404, "the tag has no token with this id"),
    ErrorRow(ErrorCode.ADMIN_OFF, 404, "the admin API is off (no IDPOOL_ADMIN_TOKEN)"),
    ErrorRow(ErrorCode.NOT_FOUND, 404, "no such path"),
    ErrorRow(
        ErrorCode.HTTP_ERROR, 400, "another refusal of the HTTP layer (its status and detail)"
    ),
    ErrorRow(
        ErrorCode.METHOD_NOT_ALLOWED,
        405,
        "wrong method; Allow lists every method the path takes "
        "(not HEAD on /id and /ids: it would use up IDs)",
    ),
    ErrorRow(ErrorCode.TAG_EXISTS, 409, "the tag exists", TagExists),
    ErrorRow(ErrorCode.START_BELOW_ISSUED, 409, "a start may only move forward", StartBelowIssued),
    ErrorRow(
        ErrorCode.START_ON_RESET,
        409,
        "a tag with a reset restarts {id} at its start each period: its start cannot move",
    ),
    ErrorRow(
        ErrorCode.FORMAT_CHANGED,
        409,
        "the name was used before with another format (or none): add it with the same "
        "format, reset, obfuscate and max, or choose a new name",
    ),
    ErrorRow(
        ErrorCode.NAME_USED,
        409,
        "a name that issued IDs before, added again as another kind (a name keeps its "
        "kind), or as a snowflake tag (its clock-made IDs could repeat them): choose a new name",
    ),
    ErrorRow(ErrorCode.WORKER_LOST, 409, "the worker ID's lease is gone: stop making IDs with it"),
    ErrorRow(
        ErrorCode.START_ABOVE_MAX,
        409,
        "a start past the tag's max would leave it no ID",
        StartAboveMax,
    ),
    ErrorRow(
        ErrorCode.UNKNOWN_LEASE, 409, "no such lease: forged, expired, or Redis restarted since"
    ),
    ErrorRow(ErrorCode.ALREADY_RETURNED, 409, "returned before; a retried return has succeeded"),
    ErrorRow(
        ErrorCode.STRICT_TAG,
        409,
        "the tag is strict: client libraries cannot lease its IDs (ask a node for each ID)",
    ),
    ErrorRow(ErrorCode.TAG_DISABLED, 410, "an operator disabled the tag", TagDisabled),
    ErrorRow(
        ErrorCode.BODY_TOO_SLOW,
        408,
        "the body did not arrive whole within IDPOOL_BODY_SECONDS (10 s)",
    ),
    ErrorRow(
        ErrorCode.BODY_TOO_LARGE,
        413,
        "the body is over IDPOOL_MAX_BODY_BYTES (64 KiB); refused unread",
    ),
    ErrorRow(
        ErrorCode.TAG_EXHAUSTED,
        503,
        "the tag handed out every ID up to its max; other tags are served",
        TagExhausted,
    ),
    ErrorRow(ErrorCode.DRAINING, 503, "the node is shutting down; retry on another node", Draining),
    ErrorRow(
        ErrorCode.NOT_READY, 503, "the node is starting or stopping, or has no IDs and no pool"
    ),
    ErrorRow(ErrorCode.LEASES_UNAVAILABLE, 503, "leases need Redis; this node runs embedded"),
    ErrorRow(
        ErrorCode.WORKER_UNAVAILABLE,
        503,
        "a snowflake tag has no worker ID here: not granted (Redis down, every worker ID "
        "held, or the quarantine after a Redis restart), or its lease could not be renewed",
        WorkerLeaseLost,
    ),
    ErrorRow(
        ErrorCode.CLOCK_BEHIND,
        503,
        "this node's clock is behind the last time its snowflake worker ID used",
        ClockBehind,
    ),
    ErrorRow(
        ErrorCode.UNAVAILABLE,
        503,
        "no range could be had: the message names the store that is down",
        IdPoolError,  # every other IdPoolError: a store is down
    ),
)
BY_CODE: dict[str, ErrorRow] = {row.code: row for row in ERRORS}
assert set(BY_CODE) == set(ErrorCode), "every ErrorCode has exactly one row"
_BY_TYPE = {row.raised_by: row for row in ERRORS if row.raised_by is not None}


class AnswerLog:
    """For tests: while ``recording``, the node keeps every error it answers to a
    routed request as (handler, method, code) in ``seen``, and ``tests/conftest.py``
    checks each against the handler's row of the route table (``routes.unlisted``).
    Off, it costs one attribute read per error answer."""

    def __init__(self) -> None:
        self.recording = False
        self.seen: list[tuple[object, str, str]] = []

    def note(self, handler: object, method: str, code: str) -> None:
        if self.recording:
            self.seen.append((handler, method, code))


ANSWERS = AnswerLog()


# An error answer's code, so the metrics can tell a tag at its max (503 tag_exhausted,
# the client's to handle) from the service failing (503 unavailable).
ERROR_HEADER = "x-idpool-error"
ERROR_HEADER_RAW = ERROR_HEADER.encode()
_HEAD_REFUSED = frozenset({"/id/{tag}", "/api/segment/get/{tag}", "/ids/{tag}"})


def json_response(body: object, status_code: int = 200) -> Response:
    return Response(orjson.dumps(body), status_code=status_code, media_type="application/json")


def error(
    code: str, message: str, headers: dict[str, str] | None = None, status: int | None = None
) -> Response:
    """The error answer for ``code``; one that is not an ErrorCode raises ValueError."""
    row = BY_CODE[ErrorCode(code)]
    response = json_response(
        {"error": row.code, "message": message}, row.status if status is None else status
    )
    response.headers[ERROR_HEADER] = row.code  # counted by error code (idpool_http_errors_total)
    response.headers.update(headers or {})
    return response


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


def row_of(exc: Exception) -> ErrorRow:
    """The table's row for an exception: by its code, else by its nearest type.

    A code that is not an ErrorCode raises ValueError (a 500 with a traceback): a
    typo in a ``raise InvalidInput(...)`` is a bug to see, not a quiet 503."""
    if isinstance(exc, InvalidInput | HttpRefusal | LeaseRefused):
        return BY_CODE[ErrorCode(exc.code)]
    for kind in type(exc).__mro__:
        if kind in _BY_TYPE:
            return _BY_TYPE[kind]
    return BY_CODE[ErrorCode.UNAVAILABLE]


def message_of(exc: Exception, row: ErrorRow, tag: str, ledger: str = "") -> str:
    if row.code == "unknown_tag" and ledger:
        # Named: a tag just added to another ledger (another database, a SQLite file)
        # is unknown here, and "create it" alone sends the user round in circles.
        return (
            f"tag {tag!r} does not exist in this node's ledger, {ledger}; create it there "
            f"with `idpool tag add {tag}` (same IDPOOL_MYSQL_URL as this node)"
        )
    if row.code == "unknown_tag":
        return f"tag {tag!r} does not exist; create it with `idpool tag add {tag}`"
    if row.code == "tag_exhausted":
        return f"{exc}; other tags are served as usual"
    if row.code == "draining":
        return "this node is shutting down; retry on another node"
    return str(exc)


def explain(run: Any, exc: Exception, tag: str) -> tuple[ErrorRow, str]:
    """(its row, its message) for an error about ``tag``, as every answer words it:
    an unknown tag names the ledger; a 503 goes to the failure log too."""
    row = row_of(exc)
    ledger = run.settings.ledger_shown() if row.code == "unknown_tag" and run else ""
    message = message_of(exc, row, tag, ledger)
    if row.code == "unavailable":
        run.failures.log(tag, message)
    return row, message


async def answer_error(request: Request, exc: Exception) -> Response:
    """The one exception handler for what the routes raise."""
    tag = str(request.path_params.get("tag", ""))
    row, message = explain(getattr(request.state, "run", None), exc, tag)
    return error(row.code, message, getattr(exc, "headers", None))


async def answer_http_error(request: Request, exc: Exception) -> Response:
    """Starlette's own 404 and 405 (no such path, wrong method), as JSON with a hint."""
    assert isinstance(exc, HTTPException)
    if exc.status_code == 404:
        response = error("not_found", f"no such path {request.url.path[:80]!r}; use {ROUTES_HINT}")
    elif exc.status_code == 405:
        allowed = _allowed(request)
        return error(
            "method_not_allowed", f"use {allowed} here, not {request.method}", {"allow": allowed}
        )
    elif exc.status_code in (408, 413):
        # the rest of the body is not read
        code = "body_too_slow" if exc.status_code == 408 else "body_too_large"
        response = error(code, str(exc.detail), {"connection": "close"})
    else:
        response = error("http_error", str(exc.detail), status=exc.status_code)
    response.headers.update(exc.headers or {})
    return response


class FailureLog:
    """event=request_failed at most once a second, with how many it stands for: a
    flood of requests while a store is down must not become a flood of log lines."""

    def __init__(self, clock: Clock = SYSTEM_CLOCK) -> None:
        self._monotonic = clock.monotonic  # the runtime's clock (pool/clock.py)
        self._next = 0.0
        self._suppressed = 0

    def log(self, tag: str, reason: str) -> None:
        now = self._monotonic()
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
