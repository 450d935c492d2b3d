from __future__ import annotations

import contextlib
import os
import uuid
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from urllib.parse import quote

import pymysql
import pytest
import redis

from idpool.pool.ledger import Ledger
from idpool.pool.redis_pool import RedisPool
from idpool.pool.settings import Settings
from ops.toolkit import RedisServer

# The machine's MariaDB and Redis. Each test run has a database of its own (a
# preloader fills every tag of its database, so runs must not share one), and
# each test a Redis key prefix of its own.
MYSQL_SERVER = os.environ.get("IDPOOL_TEST_MYSQL_SERVER", "mysql://root@127.0.0.1:3306")
TEST_DATABASE = f"idpool_test_{os.getpid()}"
MYSQL_URL = f"{MYSQL_SERVER}/{TEST_DATABASE}"
REDIS_URL = os.environ.get("IDPOOL_TEST_REDIS_URL", "redis://127.0.0.1:6379/0")


def pytest_sessionstart(session: pytest.Session) -> None:
    """The suite tests real servers: fail at once, never skip, when one is down."""
    problems = []
    try:
        pymysql.connect(host="127.0.0.1", port=3306, user="root", connect_timeout=3).close()
    except pymysql.err.MySQLError as e:
        problems.append(f"MariaDB at 127.0.0.1:3306: {e}")
    try:
        redis.Redis.from_url(REDIS_URL, socket_timeout=3).ping()
    except redis.RedisError as e:
        problems.append(f"Redis at {REDIS_URL}: {e}")
    if problems:
        pytest.exit("test servers unreachable: " + "; ".join(problems), returncode=3)


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    with contextlib.suppress(pymysql.err.MySQLError):
        conn = pymysql.connect(host="127.0.0.1", user="root", autocommit=True, connect_timeout=3)
        conn.cursor().execute(f"DROP DATABASE IF EXISTS `{TEST_DATABASE}`")
        conn.close()


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


def new_name(prefix: str = "t") -> str:
    return f"{prefix}{uuid.uuid4().hex[:12]}"


@pytest.fixture
def tag() -> str:
    return new_name("tag")


@pytest.fixture
def settings() -> Iterator[Settings]:
    prefix = new_name("idpt")
    yield Settings(
        mysql_url=MYSQL_URL,
        redis_url=REDIS_URL,
        redis_prefix=prefix,
        preload=False,
        store_timeout=1.0,
    )
    client = redis.Redis.from_url(REDIS_URL)
    keys = list(client.scan_iter(f"{prefix}:*"))
    if keys:
        client.delete(*keys)


@pytest.fixture
def sqlite_settings(settings: Settings, tmp_path: Path) -> Settings:
    """The embedded mode: ledger and pool in a SQLite file of the test's own."""
    return settings.with_changes(mysql_url="sqlite://" + quote(str(tmp_path / "idpool.db")))


@pytest.fixture
async def ledger(settings: Settings) -> AsyncIterator[Ledger]:
    led = await Ledger.connect(settings)
    yield led
    await led.close()


@pytest.fixture
async def redis_pool(settings: Settings) -> AsyncIterator[RedisPool]:
    pool = RedisPool.from_settings(settings)
    yield pool
    await pool.close()


@pytest.fixture
def redis_server(tmp_path: Path) -> Iterator[RedisServer]:
    """A private redis-server with AOF everysec, that a test may kill -9 and restart."""
    server = RedisServer(
        tmp_path / "redis", "--appendonly", "yes", "--appendfsync", "everysec", "--save", ""
    )
    server.start()
    yield server
    server.kill9()
