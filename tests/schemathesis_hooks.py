"""schemathesis hooks for tests/test_openapi.py (loaded via SCHEMATHESIS_HOOKS).

``no_server_error``: schemathesis's own not_a_server_error, except for the
5xx that are correct answers to a valid request: 503 ``tag_exhausted`` for a
tag the run itself created with a small ``max`` (or moved its start past it),
and 503 ``worker_unavailable`` in the quarantine of a snowflake tag made by an
earlier test (the test database is shared; this test's Redis prefix never saw
the tag's worker IDs, which reads as a Redis that forgot them).
"""

from __future__ import annotations

import json

import schemathesis


@schemathesis.check
def no_server_error(
    ctx: schemathesis.CheckContext, response: schemathesis.Response, case: schemathesis.Case
) -> bool | None:
    if response.status_code < 500:
        return None
    try:
        code = json.loads(response.content).get("error")
    except (ValueError, AttributeError):
        code = None
    if response.status_code == 503 and code == "tag_exhausted":
        return None
    quarantine = b"a new Redis incarnation was seen" in response.content
    if response.status_code == 503 and code == "worker_unavailable" and quarantine:
        return None
    raise AssertionError(f"server error {response.status_code}: {response.content[:300]!r}")
