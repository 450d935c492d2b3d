"""``POST /admin/drain`` on a node of several workers drains every worker
(service/drain.py), on both HTTP servers: real ``idpool serve --workers 2``."""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import signal
import subprocess
import tempfile
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest

from idpool.pool.clock import FakeClock
from idpool.pool.settings import Settings
from idpool.service.drain import ENV, LOOK_EVERY, DrainFlag, drain_flag_file
from ops.processes import NodeProcess, env_with

from .test_cli import idpool

TOKEN = "drain-test-token"


def _get(url: str, **headers: str) -> tuple[int, bytes]:
    # a new connection each time: the kernel hands it to either worker
    request = urllib.request.Request(url, headers={**headers, "Connection": "close"})
    try:
        with urllib.request.urlopen(request, timeout=10) as r:
            return r.status, r.read()
    except urllib.error.HTTPError as e:
        return e.code, e.read()
    except (ConnectionError, urllib.error.URLError):  # a worker killed under it
        return 0, b""


def _pids(base: str, seconds: float = 20.0) -> set[int]:
    """The worker PIDs that answered /status.json over new connections, until
    both did or ``seconds`` passed (the node is ready once its first worker is)."""
    seen: set[int] = set()
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        status, body = _get(f"{base}/status.json")
        if status == 200:
            seen.add(json.loads(body)["node"]["pid"])
        if len(seen) == 2:
            break
    return seen


def _two_workers(settings: Settings, tmp_path: Path, http: str, **env: str) -> NodeProcess:
    """A real `idpool serve --workers 2` on ``http``, on the test's stores."""
    started = env_with(
        IDPOOL_MYSQL_URL=settings.mysql_url,
        IDPOOL_REDIS_URL=settings.redis_url,
        IDPOOL_REDIS_PREFIX=settings.redis_prefix,
        IDPOOL_PRELOAD="0",
        **env,
    )
    return NodeProcess(started, tmp_path / "node", args=("--workers", "2", "--http", http)).start()


@pytest.mark.parametrize("http", ["uvicorn", "granian"])
def test_a_drain_reaches_every_worker_of_the_node(
    settings: Settings, tag: str, tmp_path: Path, http: str
) -> None:
    assert idpool(settings, "tag", "add", tag, "--step", "100").returncode == 0
    node = _two_workers(settings, tmp_path, http, IDPOOL_ADMIN_TOKEN=TOKEN)
    try:
        base = node.base_url
        assert len(_pids(base)) == 2, "the kernel gave every connection to one worker"
        for _ in range(20):  # both workers hold a buffer of the tag
            assert _get(f"{base}/id/{tag}")[0] == 200
        request = urllib.request.Request(
            f"{base}/admin/drain", method="POST", headers={"Authorization": f"Bearer {TOKEN}"}
        )
        with urllib.request.urlopen(request, timeout=30) as r:
            assert json.loads(r.read())["draining"] is True
        # /readyz says it at once on every worker; /id once each has looked (0.1 s)
        readyz = [_get(f"{base}/readyz")[0] for _ in range(30)]
        time.sleep(1.0)
        ids = [_get(f"{base}/id/{tag}")[0] for _ in range(30)]
        assert readyz == [503] * 30, readyz  # it alternated 503/200 with one worker drained
        assert ids == [503] * 30, ids
        assert len(_pids(base)) == 2  # both still there, draining
    finally:
        assert node.stop()
    text = node.logs[-1].read_text()
    returned = [line.split()[4] for line in text.splitlines() if "event=range_returned" in line]
    assert len(set(returned)) == 2, text  # each worker (its PID) gave its remainder back


def test_a_drain_flag_is_this_runs_only(monkeypatch: pytest.MonkeyPatch) -> None:
    # the flag a drained run made is not there for the next run: a new one each run
    from idpool.service.drain import ENV, DrainFlag, drain_flag_file

    monkeypatch.setenv(ENV, "")  # put back as it was after the test
    with drain_flag_file() as first:
        flag = DrainFlag.from_env()
        assert flag is not None and flag.path == first and not flag.raised()
        flag.raise_()
        assert flag.raised()
    assert not Path(first).exists()
    with drain_flag_file() as second:
        assert second != first and not DrainFlag(second).raised()


@pytest.mark.anyio
async def test_a_worker_drains_at_its_next_look_on_the_runtimes_clock(
    tmp_path: Path, clock: FakeClock
) -> None:
    """A worker looks for the flag every LOOK_EVERY on its runtime's clock, and
    drains at the first look that finds it; a drain under way is not started twice."""
    flag = DrainFlag(str(tmp_path / "drain"))
    drained: list[float] = []

    async def drain() -> None:
        drained.append(clock.monotonic())

    watch = asyncio.ensure_future(flag.watch(lambda: False, drain, clock))
    await clock.until_sleeping()
    start = clock.monotonic()
    await clock.advance(LOOK_EVERY * 3.5)  # three looks, no flag
    assert not drained and not watch.done()
    flag.raise_()
    await clock.advance(LOOK_EVERY / 4)  # no look yet: it serves on
    assert not drained and not watch.done()
    await clock.advance(LOOK_EVERY / 2)  # its fourth look finds the flag
    await asyncio.wait_for(watch, 5.0)
    assert drained == [pytest.approx(start + LOOK_EVERY * 4)]
    # this worker drains already (its own request, or the stop): not a second time
    await asyncio.wait_for(flag.watch(lambda: True, drain, clock), 5.0)
    assert len(drained) == 1


def test_a_run_removes_the_flag_directories_of_runs_killed_before(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """kill -9 leaves a run's flag directory behind (an adversarial run found 41):
    the next run removes those whose PID is gone, and keeps a live run's."""
    monkeypatch.setenv(ENV, "")  # the flag's name is set for this process: undone after
    gone = subprocess.Popen(["true"])
    gone.wait()
    root = Path(tempfile.gettempdir())
    dead = Path(tempfile.mkdtemp(prefix=f"idpool-drain-{gone.pid}-"))
    live = Path(tempfile.mkdtemp(prefix=f"idpool-drain-{os.getpid()}-"))
    try:
        with drain_flag_file() as flag:
            assert Path(flag).parent.parent == root
            assert not dead.exists() and live.exists()
    finally:
        shutil.rmtree(live, ignore_errors=True)
        shutil.rmtree(dead, ignore_errors=True)


@pytest.mark.parametrize("http", ["uvicorn", "granian"])
def test_a_worker_killed_is_started_again_and_the_node_serves_on(
    settings: Settings, tag: str, tmp_path: Path, http: str
) -> None:
    """An adversarial run: kill -9 of one granian worker stopped the whole node
    (granian's default); uvicorn's supervisor starts a dead worker again."""
    assert idpool(settings, "tag", "add", tag, "--step", "100").returncode == 0
    node = _two_workers(settings, tmp_path, http)
    try:
        base = node.base_url
        workers = _pids(base)
        assert len(workers) == 2, "the kernel gave every connection to one worker"
        os.kill(min(workers), signal.SIGKILL)
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline and len(_pids(base, 2.0) - workers) < 1:
            time.sleep(0.2)
        now = _pids(base)
        assert len(now) == 2 and len(now - workers) == 1, (workers, now)  # one new worker
        assert node.proc is not None and node.proc.poll() is None  # the node still runs
        got = [int(_get(f"{base}/id/{tag}")[1]) for _ in range(20)]
        assert len(set(got)) == 20
    finally:
        assert node.stop()
