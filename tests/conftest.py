from __future__ import annotations

import contextlib
import dis
import importlib
import inspect
import os
import subprocess
import time
import types
import uuid
from collections.abc import AsyncIterator, Callable, Iterator
from pathlib import Path
from urllib.parse import quote

import pymysql
import pytest
import redis

from idpool.pool.clock import FakeClock
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
# In every name a test makes (tags, key prefixes, databases): the end of the run
# finds what this run left behind, and only that (other runs share the servers).
RUN_MARK = f"r{os.getpid()}x"
# Inherited by every process the run starts (env_with copies os.environ): the end
# of the run finds any still alive, children of children and orphans included.
RUN_ENV = "IDPOOL_TEST_RUN"
os.environ[RUN_ENV] = str(os.getpid())


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
    """Drop the run's database, then FAIL the run if it left anything behind: a
    process, a Redis key or a database (each then removed, so the next run starts clean)."""
    with contextlib.suppress(pymysql.err.MySQLError):
        conn = pymysql.connect(host="127.0.0.1", user="root", autocommit=True, connect_timeout=3)
        conn.cursor().execute(f"DROP DATABASE IF EXISTS `{TEST_DATABASE}`")
        conn.close()
    leaks = leftovers()
    if leaks:
        session.config.get_terminal_writer().line(
            "\ntests left behind: " + "; ".join(leaks), red=True, bold=True
        )
        session.exitstatus = pytest.ExitCode.TESTS_FAILED


# The fast tier (`make test-fast`, `pytest -m "not process"`): a test is marked
# `process` when it, a fixture it uses, or a function of tests/ or ops/ they call
# names one of these: a process or server starter of ops/toolkit.py, a subprocess,
# a fork, a signal that stops or kills, or a TcpProxy cutting a store off. `slow`
# tests are `process` too. A test left unmarked that starts a process anyway fails
# (the guard below), in `make test` as well, so the tier cannot rot silently.
PROCESS_NAMES = frozenset({
    "NodeProcess", "PreloaderProcess", "RedisServer", "MariaServer", "RedisSentinelGroup",
    "MariaPair", "GaleraCluster", "LocalCluster", "TcpProxy", "ServerProcess",
    "SentinelServer", "GaleraMember", "ClusterNodeServer", "subprocess", "Popen",
    "create_subprocess_exec", "create_subprocess_shell", "fork", "multiprocessing",
    "SIGSTOP", "SIGKILL",
})


def _imported(source: str, name: str, package: str) -> object:
    """What ``from <source> import <name>`` gives, for a module of tests/ or ops/."""
    if not source.startswith((".", "tests", "ops")):
        return None
    with contextlib.suppress(ImportError):
        return getattr(importlib.import_module(source, package), name, None)
    return None


def _names(code: types.CodeType, package: str) -> tuple[set[str], list[object]]:
    """The global and attribute names a code object and its nested ones use, and
    what their imports from tests/ and ops/ bring in (``from .test_cli import idpool``
    inside a test binds a local name that no global lookup would find)."""
    names, imported = set(code.co_names), []
    consts: list[object] = []
    source = ""
    for ins in dis.get_instructions(code):
        if ins.opname == "IMPORT_NAME":  # after LOAD_CONST level, LOAD_CONST fromlist
            level = consts[-2] if len(consts) >= 2 and isinstance(consts[-2], int) else 0
            source = "." * level + str(ins.argval)
        elif ins.opname == "IMPORT_FROM":
            imported.append(_imported(source, str(ins.argval), package))
        elif ins.opname == "LOAD_CONST":
            consts.append(ins.argval)
    for const in code.co_consts:
        if isinstance(const, types.CodeType):
            more, also = _names(const, package)
            names |= more
            imported += also
    return names, imported


def _starts_processes(func: object, seen: set[int]) -> bool:
    """Whether ``func`` (a function or class of tests/ or ops/), or what it calls
    among tests/ and ops/, names a process starter."""
    func = inspect.unwrap(func)  # type: ignore[arg-type]
    module = getattr(func, "__module__", "") or ""
    if id(func) in seen or not module.startswith(("tests", "ops")):
        return False
    seen.add(id(func))
    if isinstance(func, type):
        return any(_starts_processes(v, seen) for v in vars(func).values())
    code = getattr(func, "__code__", None)
    if code is None:
        return False
    names, imported = _names(code, module.rpartition(".")[0])
    if names & PROCESS_NAMES:
        return True
    space = getattr(func, "__globals__", {})
    called = [space[n] for n in names if n in space] + imported
    return any(_starts_processes(f, seen) for f in called)


def _needs_process(item: pytest.Item) -> bool:
    if item.get_closest_marker("slow") or item.get_closest_marker("process"):
        return True
    seen: set[int] = set()
    if _starts_processes(getattr(item, "obj", None), seen):
        return True
    info = getattr(item, "_fixtureinfo", None)
    defs = info.name2fixturedefs.values() if info is not None else []
    return any(_starts_processes(d.func, seen) for ds in defs for d in ds)


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    for item in items:
        if _needs_process(item):
            item.add_marker(pytest.mark.process)


class UnmarkedProcess(Exception):
    """A test not marked `process` started a process: the fast tier would run it."""


def _refuse(nodeid: str, what: str) -> Callable[..., object]:
    def refuse(*args: object, **kwargs: object) -> object:
        raise UnmarkedProcess(
            f"{nodeid} starts a process ({what}) but is not marked `process`: add "
            "@pytest.mark.process, or the starter's name to PROCESS_NAMES in tests/conftest.py"
        )
    return refuse


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item: pytest.Item, nextitem: pytest.Item | None) -> Iterator[None]:
    """Setup, call and teardown of an unmarked test may start no process."""
    if item.get_closest_marker("process"):
        yield
        return
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(subprocess.Popen, "__init__", _refuse(item.nodeid, "subprocess"))
        patch.setattr(os, "fork", _refuse(item.nodeid, "os.fork"))
        yield


def _run_processes() -> dict[int, str]:
    """pid -> command line of every live process started by this run (but this one)."""
    found = {}
    marker = f"{RUN_ENV}={os.getpid()}".encode()
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) == os.getpid():
            continue
        with contextlib.suppress(OSError):
            if marker in (entry / "environ").read_bytes().split(b"\0"):
                command = (entry / "cmdline").read_bytes().replace(b"\0", b" ")
                text = command.decode(errors="replace").strip()
                if "multiprocessing.resource_tracker" not in text:  # ends with pytest itself
                    found[int(entry.name)] = text
    return found


def leftovers(grace: float = 10.0) -> list[str]:
    """What this run left: live processes it started (after ``grace`` seconds for
    those stopping), Redis keys and MariaDB databases with ``RUN_MARK`` in their
    names. Each found is stopped (SIGKILL, by PID) or removed."""
    deadline = time.monotonic() + grace
    while (processes := _run_processes()) and time.monotonic() < deadline:
        time.sleep(0.2)
    leaks = [f"process {pid} ({command[:120]})" for pid, command in processes.items()]
    for pid in processes:
        with contextlib.suppress(OSError):
            os.kill(pid, 9)
    client = redis.Redis.from_url(REDIS_URL)
    keys = list(client.scan_iter(f"*{RUN_MARK}*", count=1000))
    if keys:
        leaks.append(f"{len(keys)} Redis keys, e.g. {keys[0].decode(errors='replace')}")
        client.delete(*keys)
    client.close()
    conn = pymysql.connect(host="127.0.0.1", user="root", autocommit=True, connect_timeout=3)
    cur = conn.cursor()
    cur.execute("SHOW DATABASES")
    for (name,) in cur.fetchall():
        if RUN_MARK in name or name == TEST_DATABASE:
            leaks.append(f"database {name}")
            cur.execute(f"DROP DATABASE IF EXISTS `{name}`")
    conn.close()
    return leaks


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


def new_name(prefix: str = "t") -> str:
    """A name of this run's own (``RUN_MARK`` in it): a tag, key prefix or database."""
    return f"{prefix}{RUN_MARK}{uuid.uuid4().hex[:12]}"


def drop_keys(prefix: str) -> None:
    """Delete every Redis key under ``prefix`` (a test's or a fixture's own)."""
    client = redis.Redis.from_url(REDIS_URL)
    keys = list(client.scan_iter(f"{prefix}:*", count=1000))
    if keys:
        client.delete(*keys)
    client.close()


@pytest.fixture
def clock() -> FakeClock:
    """Time that moves only when the test says (pool/clock.py): hand it to
    open_runtime or to any part that takes a clock (docs/testing.md lists them), then
    ``await clock.advance(seconds)`` instead of sleeping."""
    return FakeClock()


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
    drop_keys(prefix)


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


@pytest.fixture(autouse=True)
def error_codes_match_the_route_table() -> Iterator[None]:
    """Every error a route's handler answers in a test must be among its row's codes
    in the route table (service/routes.py): a code raised but not declared would be
    missing from /openapi.json and docs/api.md. Checked after each test."""
    from idpool.service.errors import ANSWERS
    from idpool.service.routes import unlisted

    ANSWERS.seen.clear()
    ANSWERS.recording = True
    try:
        yield
    finally:
        ANSWERS.recording = False
    wrong = unlisted(ANSWERS.seen)
    assert not wrong, f"answered with codes their route's row lacks: {wrong}"
