"""ops/alerts.yml: valid Prometheus rules, unit-tested with promtool, and every
series it names is one a node really exposes."""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

from starlette.testclient import TestClient

from idpool.pool.settings import Settings
from idpool.service.app import create_app

from .test_app import add_tag

OPS = Path(__file__).resolve().parent.parent / "ops"
RULES = OPS / "alerts.yml"
# Debian's `prometheus` package; `make test` installs it (the Makefile's promtool target).
PROMTOOL = shutil.which("promtool")


def promtool(*args: str) -> subprocess.CompletedProcess[str]:
    assert PROMTOOL, "promtool is not installed: `make promtool` (apt-get install prometheus)"
    return subprocess.run([PROMTOOL, *args], capture_output=True, text=True, timeout=120, cwd=OPS)


def test_rules_are_valid() -> None:
    checked = promtool("check", "rules", RULES.name)
    assert checked.returncode == 0, checked.stdout + checked.stderr


def test_rules_pass_their_unit_tests() -> None:
    tested = promtool("test", "rules", "alerts_test.yml")
    assert tested.returncode == 0, tested.stdout + tested.stderr
    assert "SUCCESS" in tested.stdout


def test_every_series_the_rules_name_is_exposed_by_a_node(settings: Settings, tag: str) -> None:
    named = set(re.findall(r"\bidpool_[a-z_]+", RULES.read_text()))
    assert {"idpool_store_up", "idpool_tag_runway_seconds", "idpool_http_requests_total"} <= named
    add_tag(settings, tag, step=10, end_id=1_000)
    with TestClient(create_app(settings)) as c:
        assert c.get(f"/id/{tag}").status_code == 200
        exposed = set(re.findall(r"^# TYPE (\w+) (\w+)", c.get("/metrics").text, re.M))
    names = {name for name, _ in exposed} | {
        f"{name}_total" for name, kind in exposed if kind == "counter"
    }
    assert named <= names, f"rules name series no node exposes: {sorted(named - names)}"


def test_tag_exhausted_answers_are_counted_apart_from_failures(
    settings: Settings, tag: str
) -> None:
    """IdpoolErrorRate leaves out 503 tag_exhausted (a tag at its max), so a node
    counts error answers by their code."""
    add_tag(settings, tag, step=10, end_id=21)  # IDs 1..20
    with TestClient(create_app(settings)) as c:
        served = c.get(f"/ids/{tag}", params={"count": 20})
        assert served.status_code == 200, served.text
        refused = c.get(f"/id/{tag}")
        assert refused.status_code == 503 and refused.json()["error"] == "tag_exhausted"
        metrics = c.get("/metrics").text
    assert 'idpool_http_requests_total{code="503",route="id"} 1.0' in metrics
    assert 'idpool_http_errors_total{error="tag_exhausted",route="id"} 1.0' in metrics
