from __future__ import annotations

import asyncio
import os
import re
import subprocess
import sys
from pathlib import Path

import pymysql
import pytest

from idpool.pool.ledger import Ledger
from idpool.pool.settings import HTTP_SERVERS, Settings
from idpool.pool.snowflake import Layout, lease_ms_of
from idpool.pool.values import TagRow
from ops.redis_cluster import ClusterNodeServer
from ops.toolkit import env_with, free_port

from .conftest import MYSQL_SERVER, new_name


def idpool(settings: Settings, *args: str, **env: str) -> subprocess.CompletedProcess[str]:
    base = env_with(
        IDPOOL_MYSQL_URL=settings.mysql_url,
        IDPOOL_REDIS_URL=settings.redis_url,
        IDPOOL_REDIS_PREFIX=settings.redis_prefix,
    )
    base.update(env)
    return subprocess.run(
        [sys.executable, "-m", "idpool.service.cli", *args],
        env=base, capture_output=True, text=True, timeout=60,
    )  # fmt: skip


def test_tag_add_list_step_and_pool_show(settings: Settings, tag: str) -> None:
    added = idpool(settings, "tag", "add", tag, "--step", "250", "--start", "1000")
    assert added.returncode == 0, added.stderr
    assert f"added {tag}: first ID 1000, step 250" in added.stdout
    assert f"in the MySQL database {settings.mysql_params().database!r}" in added.stdout
    again = idpool(settings, "tag", "add", tag)
    assert again.returncode == 2 and "already exists" in again.stderr
    listed = idpool(settings, "tag", "list")
    assert any(
        line.split()[:4] == [tag, "1000", "250", "1000"] for line in listed.stdout.splitlines()
    )
    row = next(line.split() for line in listed.stdout.splitlines() if line.startswith(tag))
    assert row[4:6] == ["-", "unbounded"]  # no max: no runway to count down
    assert idpool(settings, "tag", "step", tag, "500").returncode == 0
    back = idpool(settings, "tag", "start", tag, "999")
    assert back.returncode == 2 and "can only move forward, to 1000 or above" in back.stderr
    moved = idpool(settings, "tag", "start", tag, "7000")
    assert moved.returncode == 0 and "starts at 7000" in moved.stdout
    listed = idpool(settings, "tag", "list")  # the start now, not the one it was added with
    assert any(
        line.split()[:4] == [tag, "7000", "500", "7000"] for line in listed.stdout.splitlines()
    ), listed.stdout
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
    # never the default port: a node the user runs there (`make serve`) must not matter
    serve = ("serve", "--port", str(free_port()))
    r = idpool(settings, *serve, IDPOOL_MYSQL_URL=f"mysql://root@127.0.0.1:{port}/x")
    assert r.returncode == 3 and "IDPOOL_MYSQL_URL" in r.stderr
    r = idpool(settings, "pool", "show", IDPOOL_REDIS_URL=f"redis://127.0.0.1:{port}/0")
    assert r.returncode == 3 and "IDPOOL_REDIS_URL" in r.stderr


def test_a_plain_url_at_a_redis_cluster_node_is_refused_at_start(
    settings: Settings, tmp_path: Path
) -> None:
    """Issue 29: redis:// at a Cluster node started "ready" and answered every
    request 503 MovedError (each tag's keys are in another node's slot)."""
    node = ClusterNodeServer(tmp_path / "redis", "--cluster-enabled", "yes").start()
    try:
        serve = ("serve", "--port", str(free_port()))
        r = idpool(settings, *serve, IDPOOL_REDIS_URL=node.url)
        # Nor do the tag commands write half of what they do (an adversarial run:
        # `tag add` said "added" with nothing in Redis; `tag remove` asked to be
        # run again, which could never help)
        added = idpool(settings, "tag", "add", new_name("cl"), IDPOOL_REDIS_URL=node.url)
    finally:
        node.kill9()
    for run in (r, added):
        assert run.returncode == 2, run.stderr
        assert "Redis Cluster" in run.stderr and "redis+cluster://" in run.stderr
        assert "Traceback" not in run.stderr


def test_an_unknown_option_in_the_redis_url_is_a_configuration_error(
    settings: Settings,
) -> None:
    """An adversarial run: `redis://host:port/0?x=1` ended in a TypeError traceback
    at the first command (redis-py makes connections lazily)."""
    url = settings.redis_url.split("?")[0] + "?x=1"
    r = idpool(settings, "tag", "list", IDPOOL_REDIS_URL=url)
    assert r.returncode == 2 and "IDPOOL_REDIS_URL" in r.stderr, r.stderr
    assert "Traceback" not in r.stderr


def test_bad_setting_names_the_variable(settings: Settings) -> None:
    r = idpool(settings, "tag", "list", IDPOOL_POOL_DEPTH="lots")
    assert r.returncode == 2 and "IDPOOL_POOL_DEPTH" in r.stderr


@pytest.mark.parametrize("server", HTTP_SERVERS)
def test_each_worker_is_a_node_that_logs_and_returns_its_remainder(
    settings: Settings, tag: str, tmp_path: Path, server: str
) -> None:
    import json
    import signal
    import time
    import urllib.request

    from ops.toolkit import wait_for_port

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
            [sys.executable, "-m", "idpool.service.cli", "serve", "--port", str(port)]
            + ["--workers", "2", "--http", server],
            env=env, stdout=out, stderr=subprocess.STDOUT,
        )  # fmt: skip
    try:
        wait_for_port(port, 30)
        # The port opens with the first worker: wait for both to have started (a
        # SIGTERM before the second's lifespan ran left one node_started line)
        deadline = time.monotonic() + 30
        while log.read_text().count("event=node_started") < 2 and time.monotonic() < deadline:
            time.sleep(0.1)
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
    from idpool.service.cli.logs import logging_config

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


def test_version_prints_the_version() -> None:
    from idpool.service.metrics import VERSION

    r = subprocess.run(
        [sys.executable, "-m", "idpool.service.cli", "--version"], capture_output=True, text=True
    )
    assert r.returncode == 0 and r.stdout.strip() == f"idpool {VERSION}", r


@pytest.mark.parametrize(
    ("args", "code", "message"),
    [
        (("--port", "99999"), 2, "argument --port: 99999 is not a port: use 1 to 65535"),
        (("--port", "0"), 2, "argument --port: 0 is not a port"),
        (("--port", "eighty"), 2, "argument --port: 'eighty' is not a port number"),
        (("--workers", "0"), 2, "argument --workers: 0 must be from 1 to"),
        (("--host", "999.1.1.1"), 4, "'999.1.1.1' is not an address or host name"),
    ],
)
def test_bad_serve_options_get_one_clear_line(
    settings: Settings, args: tuple[str, ...], code: int, message: str
) -> None:
    port = ("--port", str(free_port())) if "--port" not in args else ()
    r = idpool(settings, "serve", *port, *args)
    assert r.returncode == code and message in r.stderr, r.stderr
    assert "Traceback" not in r.stderr
    if "--host" in args:
        assert "--host" in r.stderr and "--port" not in r.stderr


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


@pytest.mark.parametrize("server", HTTP_SERVERS)
@pytest.mark.parametrize("stop", ["SIGTERM", "SIGINT"])
def test_sigterm_stops_a_node_without_an_error_line(
    settings: Settings, tag: str, tmp_path: Path, server: str, stop: str
) -> None:
    import signal
    import time
    import urllib.request

    from ops.toolkit import wait_for_port

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
            [sys.executable, "-m", "idpool.service.cli", "serve", "--port", str(port)]
            + ["--http", server],
            env=env, stdout=out, stderr=subprocess.STDOUT,
        )  # fmt: skip
    try:
        wait_for_port(port, 30)
        urllib.request.urlopen(f"http://127.0.0.1:{port}/id/{tag}", timeout=10).read()
        time.sleep(0.5)
    finally:
        proc.send_signal(getattr(signal, stop))
        proc.wait(30)
    text = log.read_text()
    # its remainder given back, nothing abandoned
    assert re.search(r"event=node_stopped returned=[1-9]\d* abandoned=0", text), text
    assert " ERROR " not in text and "Traceback" not in text, text


def test_tag_max_disable_enable_and_list(settings: Settings, tag: str) -> None:
    js_max = str(2**53 - 1)
    added = idpool(settings, "tag", "add", tag, "--step", "10", "--max", js_max)
    assert added.returncode == 0 and f"max {js_max}" in added.stdout, added.stderr
    low = idpool(settings, "tag", "add", tag + "x", "--start", "50", "--max", "49")
    assert low.returncode == 2 and "below --start" in low.stderr
    over = idpool(settings, "tag", "add", tag + "y", "--max", str(2**63 - 1))
    assert over.returncode == 2 and "--max" in over.stderr

    def listed() -> list[str]:
        out = idpool(settings, "tag", "list")
        assert out.returncode == 0, out.stderr
        return next(line.split() for line in out.stdout.splitlines() if line.startswith(tag))

    assert listed()[1:] == ["1", "10", "1", js_max, "-", "enabled"]  # no rate yet: no runway
    off = idpool(settings, "tag", "disable", tag)
    assert off.returncode == 0 and "disabled" in off.stdout and "max_id 1 is kept" in off.stdout
    assert listed()[-1] == "disabled"
    on = idpool(settings, "tag", "enable", tag)
    assert on.returncode == 0 and "enabled" in on.stdout
    assert listed()[-1] == "enabled"
    missing = idpool(settings, "tag", "disable", tag + "nope")
    assert missing.returncode == 2 and "does not exist" in missing.stderr
    # A start past the max would leave the tag nothing: refused, and nothing moved.
    past = idpool(settings, "tag", "start", tag, str(2**53))
    assert past.returncode == 2 and f"above the tag's max {js_max}" in past.stderr
    assert listed()[1] == "1"


def test_tag_token_add_list_revoke(settings: Settings, tag: str) -> None:
    assert idpool(settings, "tag", "add", tag).returncode == 0
    added = idpool(settings, "tag", "token", "add", tag)
    assert added.returncode == 0, added.stderr
    # the token alone on stdout, as TOKEN=$(idpool tag token add TAG) needs; words on stderr
    assert added.stdout.count("\n") == 1
    token, token_id = added.stdout.strip(), added.stderr.split()[2]
    assert len(token) >= 40 and token not in added.stderr  # shown once, never logged
    listed = idpool(settings, "tag", "token", "list", tag)
    assert listed.stdout.split()[0] == token_id and token not in listed.stdout
    revoked = idpool(settings, "tag", "token", "revoke", tag, token_id)
    assert revoked.returncode == 0 and "revoked" in revoked.stdout
    again = idpool(settings, "tag", "token", "revoke", tag, token_id)
    assert again.returncode == 2 and "no token" in again.stderr
    assert "no tokens" in idpool(settings, "tag", "token", "list", tag).stdout
    missing = idpool(settings, "tag", "token", "add", tag + "nope")
    assert missing.returncode == 2 and "does not exist" in missing.stderr


def test_tokens_in_query_strings_never_reach_a_log_line() -> None:
    import logging

    from idpool.service.cli.logs import RedactTokens

    record = logging.LogRecord(
        "uvicorn.access", logging.INFO, "", 0, '%s - "%s %s HTTP/%s" %d',
        ("127.0.0.1:5000", "GET", "/ids/orders?count=3&token=s3cr3t&x=1", "1.1", 200), None,
    )  # fmt: skip
    from idpool.service.cli.logs import logging_config

    stderr = logging_config("info", access_log=True)["handlers"]["stderr"]
    assert stderr["filters"] == ["redact_tokens"]  # every line, uvicorn's access log too
    assert RedactTokens().filter(record)
    line = record.getMessage()
    assert "s3cr3t" not in line and "count=3&token=[redacted]&x=1" in line


def test_a_token_is_redacted_however_its_name_is_spelled() -> None:
    # Starlette decodes %74oken to token and accepts it: the log must not show it.
    from idpool.service.cli.logs import redact as _redact

    for query in ("%74oken=s3cr3t", "TOKEN=s3cr3t", "to%6Ben=s3cr3t&count=3", "x=1&token=s3cr3t"):
        line = _redact(f'"GET /id/orders?{query} HTTP/1.1" 200')
        assert "s3cr3t" not in line and "[redacted]" in line, line
    assert _redact("GET /ids/orders?count=3") == "GET /ids/orders?count=3"
    # A client that separates parameters with ; (Starlette does not) still sent its token.
    assert "s3cr3t" not in _redact('"GET /id/orders?x=1;token=s3cr3t HTTP/1.1" 401')


def test_tag_remove_needs_yes_and_the_name_comes_back_above_all_it_issued(
    settings: Settings, tag: str
) -> None:
    import redis

    from idpool.pool.keys import Keys

    assert idpool(settings, "tag", "add", tag, "--step", "100").returncode == 0
    plain = redis.Redis.from_url(settings.redis_url)
    plain.rpush(Keys(settings.redis_prefix).pool(tag), "1-100", "101-200")  # as if preloaded
    idpool(settings, "tag", "start", tag, "201")  # the ledger is past the pooled ranges
    asked = idpool(settings, "tag", "remove", tag)
    assert asked.returncode == 2 and "--yes" in asked.stderr and "for good" in asked.stderr
    assert tag in idpool(settings, "tag", "list").stdout  # nothing done without --yes
    removed = idpool(settings, "tag", "remove", tag, "--yes")
    assert removed.returncode == 0, removed.stderr
    assert "removed" in removed.stdout and "200 ready IDs in 2 ranges wasted" in removed.stdout
    assert "reason=tag_removed" in removed.stderr
    assert plain.llen(Keys(settings.redis_prefix).pool(tag)) == 0
    assert tag not in idpool(settings, "tag", "list").stdout
    again = idpool(settings, "tag", "remove", tag, "--yes")
    assert again.returncode == 2 and "does not exist" in again.stderr
    assert "removed before" in again.stderr  # not a typo of the name: said so
    plain.delete(Keys(settings.redis_prefix).hwm(tag))  # Redis lost the high-water mark
    added = idpool(settings, "tag", "add", tag)
    assert added.returncode == 0 and f"added {tag}: first ID 201" in added.stdout, added.stdout


def test_tag_kind_is_checked_as_the_admin_api_checks_it_and_listed(
    settings: Settings, tag: str
) -> None:
    bad = idpool(settings, "tag", "add", tag, "--kind", "uuid7")
    assert bad.returncode == 2 and "--kind 'uuid7' is not a kind of ID" in bad.stderr
    assert idpool(settings, "tag", "add", tag, "--kind", "segment").returncode == 0
    listed = idpool(settings, "tag", "list").stdout.splitlines()
    row = next(i for i, line in enumerate(listed) if line.startswith(tag))
    groups = [line for line in listed[:row] if line.startswith("-- kind ")]
    assert groups[-1].startswith("-- kind segment: ")


def test_tag_add_strict_makes_a_strict_tag_and_list_shows_it(settings: Settings, tag: str) -> None:
    made = idpool(settings, "tag", "add", tag, "--strict")
    assert made.returncode == 0 and "kind strict" in made.stdout, made.stderr
    both = idpool(settings, "tag", "add", tag + "x", "--strict", "--kind", "counting")
    assert both.returncode == 2
    listed = idpool(settings, "tag", "list").stdout.splitlines()
    row = next(i for i, line in enumerate(listed) if line.startswith(tag))
    groups = [line for line in listed[:row] if line.startswith("-- kind ")]
    assert groups[-1].startswith("-- kind strict: ")


def test_snowflake_tag_add_list_and_decode(settings: Settings, tag: str) -> None:
    added = idpool(settings, "tag", "add", tag, "--snowflake", "--layout", "js53")
    assert added.returncode == 0, added.stderr
    assert "kind snowflake, 37 bits of 10 ms" in added.stdout and "(53-bit IDs)" in added.stdout
    listed = idpool(settings, "tag", "list")
    assert "-- kind snowflake" in listed.stdout and tag in listed.stdout
    layout = Layout(37, 8, 8, 10, int(added.stdout.split(" since ")[1].split(",")[0]))
    value = layout.encode(1234, 5, 6)
    decoded = idpool(settings, "tag", "decode", tag, str(value))
    assert decoded.returncode == 0, decoded.stderr
    assert "worker     5" in decoded.stdout and "sequence   6" in decoded.stdout
    bad = idpool(settings, "tag", "add", tag + "b", "--snowflake", "--time-bits", "50")
    assert bad.returncode == 2 and "add up to 72" in bad.stderr
    wrong = idpool(settings, "tag", "add", tag + "c", "--unit-ms", "10")
    assert wrong.returncode == 2 and "--unit-ms is for snowflake tags only" in wrong.stderr
    # Added again, a new epoch would repeat its IDs: it is disabled, never removed.
    refused = idpool(settings, "tag", "remove", tag, "--yes")
    assert refused.returncode == 2 and "idpool tag disable" in refused.stderr
    assert tag in idpool(settings, "tag", "list").stdout


def test_snowflake_tag_refuses_start_and_step_and_records_its_lease(
    settings: Settings, tag: str
) -> None:
    refused = idpool(settings, "tag", "add", tag, "--snowflake", "--start", "5")
    assert refused.returncode == 2 and "takes no --start" in refused.stderr, refused.stderr
    added = idpool(settings, "tag", "add", tag, "--snowflake", IDPOOL_WORKER_LEASE_SECONDS="7")
    assert added.returncode == 0, added.stderr
    for args in (("start", tag, "1000000"), ("step", tag, "5")):
        refused = idpool(settings, "tag", *args)
        assert refused.returncode == 2 and "is a snowflake tag" in refused.stderr, refused.stderr

    async def row() -> TagRow:
        ledger = await Ledger.connect(settings)
        try:
            return await ledger.get_tag(tag)
        finally:
            await ledger.close()

    made = asyncio.run(row())
    assert (made.start_id, made.step, made.max_id) == (1, 1, 1)  # nothing moved
    assert lease_ms_of(made.layout) == 7000  # the adder's IDPOOL_WORKER_LEASE_SECONDS


def test_a_reader_that_leaves_early_gets_no_traceback(settings: Settings, tag: str) -> None:
    """Issue 29: `idpool tag list | head -1` (and pool show, status) ended in a
    BrokenPipeError traceback. Here the pipe's read end is closed before idpool
    writes a byte, so every write meets EPIPE."""
    assert idpool(settings, "tag", "add", tag).returncode == 0
    env = env_with(
        IDPOOL_MYSQL_URL=settings.mysql_url,
        IDPOOL_REDIS_URL=settings.redis_url,
        IDPOOL_REDIS_PREFIX=settings.redis_prefix,
    )
    for command in (("tag", "list"), ("pool", "show"), ("status",)):
        read, write = os.pipe()
        os.close(read)
        try:
            ran = subprocess.run(
                [sys.executable, "-m", "idpool.service.cli", *command],
                stdout=write, stderr=subprocess.PIPE, env=env, text=True, timeout=60,
            )  # fmt: skip
        finally:
            os.close(write)
        assert ran.stderr == "", (command, ran.stderr)
        assert ran.returncode == 141, command  # as a command killed by SIGPIPE


def test_conflicting_kind_flags_are_refused(settings: Settings, tag: str) -> None:
    """Issue 29: --strict --snowflake (either order) and --kind segment --strict made
    a strict tag with rc 0; the admin API refuses the same request."""
    for flags in (
        ("--strict", "--snowflake"),
        ("--snowflake", "--strict"),
        ("--kind", "segment", "--strict"),
        ("--kind", "strict", "--snowflake"),
    ):
        r = idpool(settings, "tag", "add", tag, *flags)
        assert r.returncode == 2 and "name different kinds: give one" in r.stderr, (flags, r)
    listed = idpool(settings, "tag", "list")
    assert tag not in listed.stdout  # nothing was made
    agreeing = idpool(settings, "tag", "add", tag, "--kind", "strict", "--strict")
    assert agreeing.returncode == 0 and "kind strict" in agreeing.stdout, agreeing


def test_a_snowflake_tag_in_embedded_mode_is_refused_without_a_traceback(
    tmp_path: Path,
) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith("IDPOOL_")}
    r = subprocess.run(
        [sys.executable, "-m", "idpool.service.cli", "tag", "add", "sf", "--snowflake",
         "--embedded"],
        cwd=tmp_path, env=env, capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert r.returncode == 2 and "Traceback" not in r.stderr, r.stderr
    assert "snowflake tags need Redis" in r.stderr


def test_listings_keep_their_columns_and_count_in_words(settings: Settings, tag: str) -> None:
    """Issue 29: "1 tags"; snowflake rows of `tag list` out of the columns; `pool
    show` gave a snowflake tag step 1; a token's time without its zone. A ledger
    of its own: the shared one holds the tags of other tests."""
    database = new_name("idpool_listing_")
    settings = settings.with_changes(mysql_url=f"{MYSQL_SERVER}/{database}")
    try:
        _listings(settings, tag)
    finally:
        conn = pymysql.connect(host="127.0.0.1", user="root", autocommit=True)
        conn.cursor().execute(f"DROP DATABASE IF EXISTS `{database}`")
        conn.close()


def _listings(settings: Settings, tag: str) -> None:
    flake = tag + "sf"
    assert idpool(settings, "tag", "add", tag).returncode == 0
    assert idpool(settings, "tag", "add", flake, "--snowflake").returncode == 0
    listed = idpool(settings, "tag", "list").stdout.splitlines()
    assert "-- kind segment: 1 tag" in listed and "-- kind snowflake: 1 tag" in listed
    header = listed[0]
    rows = {line.split()[0]: line for line in listed if line.startswith(tag)}
    for name in (tag, flake):  # the state column ends where its heading ends
        state = "enabled"
        assert rows[name].index(state) + len(state) == header.index("state") + len("state")
    assert rows[flake].split()[1:6] == ["-"] * 5
    shown = idpool(settings, "pool", "show").stdout.splitlines()
    (row,) = [line.split() for line in shown if line.startswith(flake)]
    assert row[1:8] == ["-"] * 7 and "snowflake: no pool" in " ".join(row)
    assert idpool(settings, "tag", "token", "add", tag).returncode == 0
    tokens = idpool(settings, "tag", "token", "list", tag).stdout
    assert tokens.rstrip().endswith(" UTC"), tokens
