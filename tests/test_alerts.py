"""ops/alerts.yml: valid Prometheus rules, unit-tested with promtool, and every
series it names is one a node really exposes."""

from __future__ import annotations

import asyncio
import re
import shutil
import subprocess
from pathlib import Path

import pytest
from starlette.testclient import TestClient

from idpool.pool.redis_pool import RedisPool
from idpool.pool.settings import Settings
from idpool.service import status
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


def _supply_series(metrics: str, tag: str) -> list[str]:
    names = ("idpool_pool_supply_seconds", "idpool_pool_depth", "idpool_pool_target_depth")
    return [line for line in metrics.splitlines() if line.startswith(names) and tag in line]


def test_a_disabled_or_removed_tag_exports_no_supply_to_page_on(
    settings: Settings, tag: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Issue 29: after `tag disable` (or remove) the node that served the tag kept
    exporting idpool_pool_supply_seconds 0.0, and IdpoolPoolRunningDry paged."""
    monkeypatch.setattr(status, "STORE_READS_SECONDS", 0.0)  # every scrape reads the stores
    add_tag(settings, tag, step=10)
    asyncio.run(_published(settings, tag))  # as a preloader publishes: rate and target
    auth = {"Authorization": "Bearer t0ken"}
    with TestClient(create_app(settings.with_changes(admin_token="t0ken"))) as c:
        assert c.get(f"/id/{tag}").status_code == 200
        serving = c.get("/metrics").text
        assert f'idpool_pool_supply_seconds{{tag="{tag}"}} 0.0' in serving  # empty: real
        assert f'idpool_tag_disabled{{tag="{tag}"}} 0.0' in serving
        assert c.patch(f"/admin/tags/{tag}", json={"disabled": True}, headers=auth).is_success
        disabled = c.get("/metrics").text
        assert _supply_series(disabled, tag) == []
        assert f'idpool_tag_disabled{{tag="{tag}"}} 1.0' in disabled  # says what it is
        assert f'reason="tag_disabled",tag="{tag}"' in disabled  # its waste stays shown
        assert c.delete(f"/admin/tags/{tag}", headers=auth).is_success
        removed = c.get("/metrics").text
        cluster_tags = c.get("/status.json").json()["cluster"]["tags"]
    assert (
        _supply_series(removed, tag) == [] and f'idpool_tag_disabled{{tag="{tag}"}}' not in removed
    )
    (row,) = [t for t in cluster_tags if t["tag"] == tag]
    assert row["problems"] == ["removed"]  # not "supply under target": no red


async def _published(settings: Settings, tag: str) -> None:
    pool = RedisPool.from_settings(settings)
    try:
        await pool.write_stats(tag, {"rate": "50", "target_depth": "4"})
    finally:
        await pool.close()


DISABLED_TAG_RULES_TEST = """
rule_files: [{rules}]
evaluation_interval: 1m
tests:
  - interval: 1m
    input_series:
      # A node scraped as the tag was disabled (or one of an older version) still
      # says 0 s of supply; idpool_tag_disabled says why the pool is empty.
      - series: 'idpool_pool_supply_seconds{{tag="paused",instance="a"}}'
        values: '600 600 0x15'
      - series: 'idpool_pool_depth{{tag="paused",instance="a"}}'
        values: '10 10 0x15'
      - series: 'idpool_pool_target_depth{{tag="paused",instance="a"}}'
        values: '10x17'
      - series: 'idpool_tag_disabled{{tag="paused",instance="a"}}'
        values: '0 0 1x15'
    alert_rule_test:
      - {{eval_time: 15m, alertname: IdpoolPoolRunningDry, exp_alerts: []}}
      - {{eval_time: 15m, alertname: IdpoolPoolBelowTarget, exp_alerts: []}}
"""


def test_a_disabled_tag_pages_no_one(tmp_path: Path) -> None:
    unit = tmp_path / "disabled_test.yml"
    unit.write_text(DISABLED_TAG_RULES_TEST.format(rules=RULES))
    tested = promtool("test", "rules", str(unit))
    assert tested.returncode == 0, tested.stdout + tested.stderr
