from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from ops.processes import env_with, free_port
from pool.settings import Settings


def idpool(settings: Settings, *args: str, **env: str) -> subprocess.CompletedProcess[str]:
    base = env_with(
        IDPOOL_MYSQL_URL=settings.mysql_url,
        IDPOOL_REDIS_URL=settings.redis_url,
        IDPOOL_REDIS_PREFIX=settings.redis_prefix,
    )
    base.update(env)
    return subprocess.run(
        [sys.executable, "-m", "service.cli", *args],
        env=base, capture_output=True, text=True, timeout=60,
    )  # fmt: skip


def test_tag_add_list_step_and_pool_show(settings: Settings, tag: str) -> None:
    added = idpool(settings, "tag", "add", tag, "--step", "250", "--start", "1000")
    assert added.returncode == 0, added.stderr
    assert f"added {tag}: first ID 1000, step 250" in added.stdout
    again = idpool(settings, "tag", "add", tag)
    assert again.returncode == 2 and "already exists" in again.stderr
    listed = idpool(settings, "tag", "list")
    assert any(
        line.split()[:4] == [tag, "1000", "250", "1000"] for line in listed.stdout.splitlines()
    )
    assert idpool(settings, "tag", "step", tag, "500").returncode == 0
    back = idpool(settings, "tag", "start", tag, "999")
    assert back.returncode == 2 and "can only move forward, to 1000 or above" in back.stderr
    moved = idpool(settings, "tag", "start", tag, "7000")
    assert moved.returncode == 0 and "starts at 7000" in moved.stdout
    shown = idpool(settings, "pool", "show")
    assert shown.returncode == 0, shown.stderr
    row = next(line.split() for line in shown.stdout.splitlines() if line.startswith(tag))
    assert row[1:3] == ["500", "7000"]  # step, max_id


@pytest.mark.parametrize("value", ["0", "-5", "x", "2147483648"])
def test_bad_step_is_refused_before_any_store(settings: Settings, tag: str, value: str) -> None:
    r = idpool(settings, "tag", "add", tag, "--step", value)
    assert r.returncode == 2 and "--step" in r.stderr


def test_invalid_tag_is_refused(settings: Settings) -> None:
    r = idpool(settings, "tag", "add", "bad tag")
    assert r.returncode == 2 and "not a valid tag" in r.stderr


def test_unreachable_stores_name_the_variable(settings: Settings) -> None:
    port = free_port()
    r = idpool(settings, "serve", IDPOOL_MYSQL_URL=f"mysql://root@127.0.0.1:{port}/x")
    assert r.returncode == 3 and "IDPOOL_MYSQL_URL" in r.stderr
    r = idpool(settings, "pool", "show", IDPOOL_REDIS_URL=f"redis://127.0.0.1:{port}/0")
    assert r.returncode == 3 and "IDPOOL_REDIS_URL" in r.stderr


def test_bad_setting_names_the_variable(settings: Settings) -> None:
    r = idpool(settings, "tag", "list", IDPOOL_POOL_DEPTH="lots")
    assert r.returncode == 2 and "IDPOOL_POOL_DEPTH" in r.stderr


def test_each_worker_is_a_node_that_logs_and_returns_its_remainder(
    settings: Settings, tag: str, tmp_path: Path
) -> None:
    import json
    import signal
    import urllib.request

    from ops.processes import wait_for_port

    assert idpool(settings, "tag", "add", tag, "--step", "1000").returncode == 0
    port = free_port()
    log = tmp_path / "serve.log"
    env = env_with(
        IDPOOL_MYSQL_URL=settings.mysql_url,
        IDPOOL_REDIS_URL=settings.redis_url,
        IDPOOL_REDIS_PREFIX=settings.redis_prefix,
        IDPOOL_PRELOAD="0",
    )
    with open(log, "wb") as out:
        proc = subprocess.Popen(
            [sys.executable, "-m", "service.cli", "serve", "--port", str(port), "--workers", "2"],
            env=env, stdout=out, stderr=subprocess.STDOUT,
        )  # fmt: skip
    try:
        wait_for_port(port, 30)
        ids: list[int] = []
        for _ in range(40):
            url = f"http://127.0.0.1:{port}/ids/{tag}?count=10"
            ids += json.loads(urllib.request.urlopen(url, timeout=10).read())["ids"]
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.wait(30)
    assert len(set(ids)) == 400
    text = log.read_text()
    assert text.count("event=node_started") == 2  # two workers, two nodes, both logging
    assert text.count("event=node_stopped") == 2
    assert "event=range_returned" in text


def test_access_log_is_kept_at_any_log_level() -> None:
    # uvicorn writes access lines at INFO; at --log-level warning they were dropped.
    from service.cli import logging_config

    assert logging_config("warning", True)["loggers"]["uvicorn.access"] == {"level": "INFO"}
    assert "uvicorn.access" not in logging_config("warning")["loggers"]


def test_a_bad_log_level_is_a_usage_error_not_a_traceback(settings: Settings) -> None:
    r = idpool(settings, "--log-level", "nonsense", "tag", "list")
    assert r.returncode == 2 and "invalid choice: 'nonsense'" in r.stderr
    assert "Traceback" not in r.stderr


def test_common_options_are_taken_after_the_subcommand_too(settings: Settings) -> None:
    after = idpool(settings, "tag", "list", "--log-level", "warning")
    assert after.returncode == 0, after.stderr
    # --embedded parses in both places (and is then refused beside a MySQL URL, as documented)
    for args in (("--embedded", "tag", "list"), ("tag", "list", "--embedded")):
        r = idpool(settings, *args)
        assert r.returncode == 2 and "two different ledgers" in r.stderr, r.stderr


def test_a_port_in_use_is_said_plainly(settings: Settings) -> None:
    import socket

    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        r = idpool(settings, "serve", "--port", str(port))
    assert r.returncode == 4, r.stderr
    assert f"cannot listen on 127.0.0.1:{port}" in r.stderr and "--port" in r.stderr
    assert "Traceback" not in r.stderr


def test_sigterm_stops_a_node_without_an_error_line(
    settings: Settings, tag: str, tmp_path: Path
) -> None:
    import signal
    import time
    import urllib.request

    from ops.processes import wait_for_port

    assert idpool(settings, "tag", "add", tag, "--step", "100").returncode == 0
    port = free_port()
    log = tmp_path / "serve.log"
    env = env_with(
        IDPOOL_MYSQL_URL=settings.mysql_url,
        IDPOOL_REDIS_URL=settings.redis_url,
        IDPOOL_REDIS_PREFIX=settings.redis_prefix,
        IDPOOL_PRELOAD_INTERVAL="0.05",  # the preloader is mid-tick when SIGTERM lands
    )
    with open(log, "wb") as out:
        proc = subprocess.Popen(
            [sys.executable, "-m", "service.cli", "serve", "--port", str(port)],
            env=env, stdout=out, stderr=subprocess.STDOUT,
        )  # fmt: skip
    try:
        wait_for_port(port, 30)
        urllib.request.urlopen(f"http://127.0.0.1:{port}/id/{tag}", timeout=10).read()
        time.sleep(0.5)
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.wait(30)
    text = log.read_text()
    assert "event=node_stopped" in text
    assert " ERROR " not in text and "Traceback" not in text, text
