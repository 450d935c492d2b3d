"""Fuzzing the HTTP API with hypothesis, against the real MariaDB and Redis.

A few thousand requests with arbitrary tags, counts, paths, methods, tokens and
admin bodies: never a 5xx, every 4xx is JSON with a code and a message, and
every ID handed out is a positive 64-bit integer seen only once.
"""

from __future__ import annotations

import string
from collections.abc import Iterator
from urllib.parse import quote

import pytest
from hypothesis import HealthCheck, given
from hypothesis import settings as hypothesis_settings
from hypothesis import strategies as st
from starlette.testclient import TestClient

from idpool.pool.ranges import MAX_ID
from idpool.pool.settings import Settings
from idpool.service.app import create_app

from .test_app import add_tag

TOKEN = "fuzz-secret-token"
RUNS = hypothesis_settings(
    max_examples=600,
    deadline=None,
    database=None,
    suppress_health_check=[HealthCheck.too_slow],
)

TAG_CHARS = string.ascii_letters + string.digits + "_.-"
tags = st.one_of(
    st.text(alphabet=TAG_CHARS, min_size=0, max_size=70),
    st.text(min_size=0, max_size=20),  # any unicode, slashes, NUL, %, spaces
    st.sampled_from(["", ".", "..", "-", "_x", "a" * 64, "a" * 65, "é", "a/b", "a:b", "*"]),
)
counts = st.one_of(
    st.integers(min_value=-(2**70), max_value=2**70).map(str),
    st.text(max_size=12),
    st.sampled_from(["", "1", "10000", "10001", "0", "-0", "+5", " 5", "1e3", "0x10", "٣"]),
)


class Checker:
    """Holds the client and everything seen, and checks each answer."""

    def __init__(self, client: TestClient) -> None:
        self.client = client
        self.issued: set[int] = set()

    def check(self, status: int, content_type: str, body: bytes) -> int:
        import orjson

        assert status < 500, f"{status}: {body[:200]!r}"
        if status >= 400:
            assert content_type.startswith("application/json"), (status, body[:200])
            answer = orjson.loads(body)
            assert isinstance(answer["error"], str) and answer["error"]
            assert isinstance(answer["message"], str) and len(answer["message"]) > 10
            assert TOKEN not in answer["message"]
        return status

    def record(self, ids: list[int]) -> None:
        for i in ids:
            assert 0 < i <= MAX_ID
            assert i not in self.issued, f"ID {i} handed out twice"
            self.issued.add(i)


@pytest.fixture
def checker(settings: Settings, tag: str) -> Iterator[Checker]:
    add_tag(settings, tag, step=50)
    with TestClient(create_app(settings.with_changes(admin_token=TOKEN))) as client:
        yield Checker(client)


def test_fuzz_id_and_batch_routes(checker: Checker, tag: str) -> None:
    @RUNS
    @given(raw_tag=tags, raw_count=counts, repeat=st.booleans(), known=st.booleans())
    def run(raw_tag: str, raw_count: str, repeat: bool, known: bool) -> None:
        name = tag if known else raw_tag
        path = quote(name, safe="")
        for route in ("/id/", "/api/segment/get/"):
            r = checker.client.get(route + path)
            checker.check(r.status_code, r.headers.get("content-type", ""), r.content)
            if r.status_code == 200:
                checker.record([int(r.text)])
        params = [("count", raw_count)] + ([("count", raw_count)] if repeat else [])
        r = checker.client.get("/ids/" + path, params=params)
        checker.check(r.status_code, r.headers.get("content-type", ""), r.content)
        if r.status_code == 200:
            body = r.json()
            assert body["tag"] == name and len(body["ids"]) == int(raw_count)
            checker.record(body["ids"])

    run()
    assert checker.issued, "the fuzz never drew an ID from the known tag"


def test_fuzz_paths_and_methods(checker: Checker) -> None:
    @RUNS
    @given(
        method=st.sampled_from(["GET", "POST", "PUT", "PATCH", "DELETE", "OPTIONS"]),
        path=st.text(alphabet=string.printable, max_size=40),
    )
    def run(method: str, path: str) -> None:
        r = checker.client.request(method, "/" + quote(path, safe="/?=&"))
        checker.check(r.status_code, r.headers.get("content-type", ""), r.content)

    run()


def test_fuzz_admin_bodies_and_tokens(checker: Checker) -> None:
    json_values = st.recursive(
        st.none()
        | st.booleans()
        | st.integers()
        | st.floats(allow_nan=False, allow_infinity=False)
        | st.text(max_size=70),
        lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(), inner, max_size=3),
        max_leaves=6,
    )
    bodies = st.one_of(
        st.fixed_dictionaries(
            {"tag": tags},
            optional={"step": json_values, "start": json_values, "description": json_values},
        ),
        json_values,
    )

    @RUNS
    @given(
        body=bodies,
        raw=st.binary(max_size=30),
        use_raw=st.booleans(),
        auth=st.sampled_from([f"Bearer {TOKEN}", "Bearer wrong", "", f"Basic {TOKEN}", TOKEN]),
        patch_tag=tags,
    )
    def run(body: object, raw: bytes, use_raw: bool, auth: str, patch_tag: str) -> None:
        headers = {"authorization": auth} if auth else {}
        for method, path in (
            ("POST", "/admin/tags"),
            ("PATCH", "/admin/tags/" + quote(patch_tag, safe="")),
        ):
            if use_raw:
                r = checker.client.request(method, path, content=raw, headers=headers)
            else:
                r = checker.client.request(method, path, json=body, headers=headers)
            status = checker.check(r.status_code, r.headers.get("content-type", ""), r.content)
            if auth != f"Bearer {TOKEN}":
                assert status in (401, 404, 405), status

    run()
