"""The route table: what is derived from it, and the check that a handler answers
only the error codes its row declares."""

from __future__ import annotations

import dataclasses
import re
from pathlib import Path

import pytest
from starlette.routing import Route
from starlette.testclient import TestClient

from idpool.pool.errors import InvalidInput
from idpool.pool.settings import Settings
from idpool.service import routes
from idpool.service.app import create_app
from idpool.service.errors import ANSWERS, BY_CODE, ErrorCode, HttpRefusal, error, row_of

ROOT = Path(__file__).resolve().parent.parent
TOKEN = "routes-test-token"


def test_starlette_routes_are_the_table_in_order() -> None:
    app = create_app(Settings(admin_token=TOKEN))
    routed = [(r.path, sorted(r.methods or ())) for r in app.routes if isinstance(r, Route)]
    expected = [
        (row.path, sorted({row.method, "HEAD"} if row.method == "GET" else {row.method}))
        for row in routes.TABLE
    ]
    assert routed == expected
    assert routed.index(("/lease/return", ["POST"])) < routed.index(("/lease/{tag}", ["POST"]))


@pytest.mark.parametrize(
    ("path", "label"),
    [
        ("/id/orders", "id"),
        ("/id/a/b", "id"),
        ("/api/segment/get/orders", "id"),
        ("/ids/orders", "ids"),
        ("/lease/orders", "lease"),
        ("/lease/return", "lease"),
        ("/worker/flakes", "worker"),
        ("/worker/flakes/renew", "worker"),
        ("/decode/flakes/123", "decode"),
        ("/admin/tags", "admin"),
        ("/admin/tags/orders/tokens", "admin"),
        ("/admin/no-such", "admin"),
        ("/healthz", "healthz"),
        ("/readyz", "readyz"),
        ("/status", "status"),
        ("/status.json", "status_json"),
        ("/metrics", "metrics"),
        ("/openapi.json", "openapi"),
        ("/no/such/path", "other"),
        ("/healthz/x", "other"),
        ("/", "other"),
    ],
)
def test_the_route_label_is_the_rows_never_the_tag(path: str, label: str) -> None:
    assert routes.label_of(path) == label


def test_labels_are_few_and_every_row_declares_known_codes() -> None:
    assert len({row.label for row in routes.TABLE}) == 12
    for row in routes.TABLE:
        assert all(isinstance(code, ErrorCode) for code in row.errors), row.path
        assert len(set(row.errors)) == len(row.errors), (row.path, row.method)
    assert len({(row.path, row.method) for row in routes.TABLE}) == len(routes.TABLE)


def test_an_unknown_code_is_a_programming_error_not_a_503() -> None:
    with pytest.raises(ValueError):
        HttpRefusal("no_such_code", "x")
    with pytest.raises(ValueError):
        error("no_such_code", "x")
    with pytest.raises(ValueError):
        row_of(InvalidInput("no_such_code", "x"))
    assert row_of(InvalidInput("bad_tag", "x")) is BY_CODE[ErrorCode.BAD_TAG]


# The first argument of these calls, when it is a literal: a code the table must have
_RAISED = re.compile(r"\b(?:InvalidInput|HttpRefusal|LeaseRefused|error)\(\s*f?\"([a-z_{}]+)\"")


def test_every_code_written_in_the_source_is_an_error_code() -> None:
    written = set()
    for tree in ("pool", "service"):
        for path in (ROOT / tree).rglob("*.py"):
            written |= set(_RAISED.findall(path.read_text()))
    # bad_{field}: tag_fields.check_int, for step, start and max
    written = {code for code in written if "{" not in code} | {"bad_step", "bad_start", "bad_max"}
    assert written <= set(ErrorCode), sorted(written - set(ErrorCode))


def test_a_code_the_row_lacks_fails_the_check(
    settings: Settings, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A row with a code left out (here: GET /admin/tags without `unauthorized`) makes
    the check name it, as tests/conftest.py does after every test."""
    lacking = tuple(
        dataclasses.replace(row, errors=tuple(c for c in row.errors if c != "unauthorized"))
        if (row.path, row.method) == ("/admin/tags", "GET")
        else row
        for row in routes.TABLE
    )
    with TestClient(create_app(settings.with_changes(admin_token=TOKEN))) as c:
        assert c.get("/admin/tags").status_code == 401
        assert c.get("/admin/tags", headers={"authorization": f"Bearer {TOKEN}"}).is_success
    assert routes.unlisted(ANSWERS.seen) == []
    monkeypatch.setattr(routes, "TABLE", lacking)
    assert routes.unlisted(ANSWERS.seen) == ["GET /admin/tags: unauthorized"]
    ANSWERS.seen.clear()
