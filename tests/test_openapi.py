"""/openapi.json: it describes every route, and a live node answers as it says
(schemathesis, a bounded run)."""

from __future__ import annotations

import json
import re
import subprocess
import sys
import urllib.request
from pathlib import Path

from starlette.routing import Route
from starlette.testclient import TestClient

from idpool.pool.settings import Settings
from idpool.service.app import create_app
from idpool.service.openapi import document
from idpool.service.routes import TABLE
from ops.toolkit import NodeProcess, env_with

from .test_app import add_tag

TOKEN = "openapi-test-token"
ROOT = str(Path(__file__).resolve().parent.parent)


def test_every_route_is_described_and_nothing_else() -> None:
    app = create_app(Settings(admin_token=TOKEN))
    routed = {
        (route.path, method.lower())
        for route in app.routes
        if isinstance(route, Route)
        for method in route.methods or ()
        if method != "HEAD"  # Starlette adds HEAD to every GET route; /id refuses it (405)
    }
    described = {
        (path, method) for path, ops in document(TABLE, 100)["paths"].items() for method in ops
    }
    assert routed == described


def test_the_document_is_served(settings: Settings) -> None:
    with TestClient(create_app(settings.with_changes(max_count=77))) as c:
        r = c.get("/openapi.json")
    assert r.status_code == 200 and r.headers["content-type"] == "application/json"
    doc = r.json()
    assert doc["openapi"] == "3.0.3" and doc["info"]["version"] == "0.1.0"
    count = next(p for p in doc["paths"]["/ids/{tag}"]["get"]["parameters"] if p["name"] == "count")
    assert count["schema"]["maximum"] == 77
    for path, ops in doc["paths"].items():
        for method, op in ops.items():
            assert op["responses"], (path, method)
            for status, answer in op["responses"].items():
                assert answer["description"], (path, method, status)


def test_a_live_node_answers_as_documented(settings: Settings, tag: str, tmp_path: Path) -> None:
    """schemathesis: generated requests (valid and invalid) to every route but
    /admin/drain (it would stop the node); no 5xx (but 503 tag_exhausted for a
    tag the run made with a small max: see schemathesis_hooks.py), and every
    status code, content type and body as the document says. A fixed seed and a few
    examples per route keep it to seconds."""
    add_tag(settings, tag, step=100)
    env = env_with(
        IDPOOL_MYSQL_URL=settings.mysql_url,
        IDPOOL_REDIS_URL=settings.redis_url,
        IDPOOL_REDIS_PREFIX=settings.redis_prefix,
        IDPOOL_PRELOAD="0",
        IDPOOL_ADMIN_TOKEN=TOKEN,
    )
    node = NodeProcess(env, tmp_path / "node").start()
    try:
        run = subprocess.run(
            [
                sys.executable, "-m", "schemathesis.cli", "run", f"{node.base_url}/openapi.json",
                "--checks", "no_server_error,status_code_conformance,"
                "content_type_conformance,response_schema_conformance",
                "--exclude-path", "/admin/drain",
                "--header", f"Authorization: Bearer {TOKEN}",
                "--phases", "examples,coverage,fuzzing",
                "--max-examples", "15", "--seed", "14", "--workers", "1",
                "--generation-database", "none", "--request-timeout", "10",
            ],
            capture_output=True, text=True, timeout=300, cwd=tmp_path,
            env={**env, "SCHEMATHESIS_HOOKS": "tests.schemathesis_hooks", "PYTHONPATH": ROOT},
        )  # fmt: skip
        status = json.loads(urllib.request.urlopen(f"{node.base_url}/status.json").read())
    finally:
        node.stop()
    assert run.returncode == 0, run.stdout[-6000:] + run.stderr[-2000:]
    # every generated case passed (a lease return with a made-up lease id is always
    # refused, which schemathesis notes as a warning: lease ids cannot be guessed)
    assert re.search(r"(\d+) generated, \1 passed", run.stdout), run.stdout[-3000:]
    assert status["node"]["ready"]
