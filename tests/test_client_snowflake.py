"""The client's snowflake generator and SnowflakeClient
(client/idpool_client/snowflake.py) against real nodes."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from idpool_client.snowflake import Generator as ClientGenerator
from idpool_client.snowflake import Layout as ClientLayout
from idpool_client.snowflake import (
    SnowflakeBatchTooLarge,
    SnowflakeClient,
    SnowflakeStopped,
    lease_clock,
)

from idpool.pool.settings import Settings
from idpool.pool.snowflake import ClockBehind, Generator, Layout
from ops.toolkit import NodeProcess, env_with

from .test_snowflake_cluster import add_snowflake

NOW = 1_764_000_000_000


def test_the_client_makes_the_same_ids_as_the_server_from_the_same_clocks() -> None:
    wall = [NOW]
    layout = Layout(39, 6, 4, 10, NOW - 10_000)
    server = Generator("t", layout, 5, NOW - 20, 1e9, clock_ms=lambda: wall[0])
    mirror = ClientLayout(39, 6, 4, 10, NOW - 10_000)
    client = ClientGenerator(mirror, 5, NOW - 20, 1e9, clock_ms=lambda: wall[0])
    steps = [0, 0, 3, 10, 10, 25, -15, -5, 40, 2000, -1500, 0, 700]
    for step in steps:
        wall[0] += step
        for _ in range(20):
            try:
                expected: int | None | str = server.take()
            except ClockBehind:
                expected = "behind"
            try:
                got: int | None | str = client.take()
            except SnowflakeStopped:
                got = "behind"
            assert got == expected
        assert client.last_ms == server.last_ms


@pytest.fixture
def nodes(settings: Settings, tmp_path: Path) -> Iterator[list[NodeProcess]]:
    env = env_with(
        IDPOOL_MYSQL_URL=settings.mysql_url,
        IDPOOL_REDIS_URL=settings.redis_url,
        IDPOOL_REDIS_PREFIX=settings.redis_prefix,
        IDPOOL_PRELOAD="0",
        IDPOOL_WORKER_LEASE_SECONDS="2",
        IDPOOL_WORKER_MARGIN_SECONDS="0.5",
    )
    started = [NodeProcess(env, tmp_path / f"node{i}").start() for i in range(2)]
    yield started
    for node in started:
        if node.proc is not None:
            node.stop()


def test_threads_of_one_client_share_a_worker_id_and_never_repeat(
    nodes: list[NodeProcess], settings: Settings, tag: str
) -> None:
    add_snowflake(settings, tag)
    seen: list[int] = []
    lock = threading.Lock()
    with SnowflakeClient([n.base_url for n in nodes]) as ids:

        def draw() -> None:
            got = [ids.next_id(tag) for _ in range(5000)]
            assert got == sorted(got)  # increasing within a thread
            with lock:
                seen.extend(got)

        threads = [threading.Thread(target=draw) for _ in range(4)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert len(set(seen)) == 20_000
        assert ids.transport.calls["worker"] == 1  # one grant, no call per ID
        time.sleep(1.2)  # past two renewal periods: renewed, still serving
        later = ids.next_id(tag)
        assert later > max(seen) and ids.transport.calls["worker"] >= 3


def test_a_client_that_cannot_renew_stops_before_its_lease_could_expire(
    nodes: list[NodeProcess], settings: Settings, tag: str
) -> None:
    add_snowflake(settings, tag)
    with SnowflakeClient([n.base_url for n in nodes]) as ids:
        granted = time.monotonic()
        ids.next_id(tag)
        for node in nodes:
            node.kill9()  # no renewal can reach any node
        killed = time.monotonic()
        while time.monotonic() < granted + 1.5 - 0.1:  # lease 2 s less the 0.5 s margin
            ids.next_id(tag)  # still within its lease
            time.sleep(0.01)
        # the deadline, and at most one time unit's run past it (a unit chosen in time)
        time.sleep(max(0.0, killed + 1.5 + 0.1 - time.monotonic()))
        with pytest.raises(SnowflakeStopped) as stopped:
            ids.next_id(tag)  # stopped before Redis could let the lease go
    # Issue 29: the message named neither the tag nor why the lease ran out
    message = str(stopped.value)
    assert f"tag {tag!r}, worker ID " in message and "not renewed in time" in message
    assert "the last renewal failed: renewal: every idpool node failed" in message, message


def fake_node(client: SnowflakeClient, epoch_ms: int) -> None:
    """Answers the client's grant and renewals in-process (no node)."""

    def post(kind: str, path: str, payload: object, what: str, sent: object = None) -> object:
        if "/renew" in path or "/release" in path:
            return {}
        layout = {"time_bits": 41, "worker_bits": 10, "sequence_bits": 12}
        return {
            "worker": 7,
            "generation": 1,
            "secret": "s",
            "floor_ms": 0,
            "ttl_ms": 60_000,
            "margin_ms": 2_000,
            "layout": {**layout, "unit_ms": 1, "epoch_ms": epoch_ms},
        }

    client.transport._post = post  # type: ignore[method-assign,assignment]


def test_a_client_batch_is_bounded_to_what_one_worker_makes_in_500_ms() -> None:
    with SnowflakeClient("http://127.0.0.1:1") as ids:
        fake_node(ids, int(time.time() * 1000) - 1000)
        limit = 4096 * 500  # 12 sequence bits, 1 ms units: a node's /ids limit too
        with pytest.raises(SnowflakeBatchTooLarge, match=f"at most {limit} IDs") as refused:
            ids.next_ids("t", limit + 1)
        assert isinstance(refused.value, ValueError) and refused.value.limit == limit
        got = ids.next_ids("t", 5000)
    assert len(set(got)) == 5000 and got == sorted(got)


def test_a_client_called_now_and_then_hands_out_the_current_time() -> None:
    epoch = int(time.time() * 1000) - 1000
    with SnowflakeClient("http://127.0.0.1:1") as ids:
        fake_node(ids, epoch)
        first = ids.next_id("t")
        time.sleep(0.3)
        second = ids.next_id("t")  # not the rest of the first one's millisecond
    layout = Layout(41, 10, 12, 1, epoch)
    apart = layout.decode(second)["time_ms"] - layout.decode(first)["time_ms"]
    assert apart >= 250


def test_a_client_never_hands_out_a_time_unit_over_before_the_call() -> None:
    wall = [time.time_ns()]
    epoch = wall[0] // 1_000_000 - 1000
    with SnowflakeClient("http://127.0.0.1:1", clock_ns=lambda: wall[0]) as ids:
        fake_node(ids, epoch)
        first = ids.next_id("t")  # its unit's rest is now the lock-free run
        wall[0] += 1_500_000_000  # paused 1.5 s, no thread ran in between
        second = ids.next_id("t")
        third = ids.next_id("t")
        assert first < second < third
    layout = Layout(41, 10, 12, 1, epoch)
    now_ms = wall[0] // 1_000_000
    assert layout.decode(second)["time_ms"] == now_ms  # the run's rest was dropped
    # the generator is past the dropped rest: nothing of it is ever made again
    assert layout.decode(second)["sequence"] == 0


def test_a_client_paused_by_sigstop_hands_out_no_id_older_than_the_call() -> None:
    root = Path(__file__).resolve().parent.parent
    env = {**os.environ, "PYTHONPATH": f"{root}{os.pathsep}{root / 'client'}"}
    child = subprocess.Popen(
        [sys.executable, "-m", "tests.client_pause_worker", "2.5"],
        cwd=root,
        env=env,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert child.stdout is not None and child.stdout.readline().strip() == "ready"
        time.sleep(0.5)  # in full swing: a run half used
        os.kill(child.pid, signal.SIGSTOP)
        time.sleep(1.2)
        os.kill(child.pid, signal.SIGCONT)
        out, _ = child.communicate(timeout=60)
    finally:
        if child.poll() is None:
            child.kill()
            child.wait()
    found = json.loads(out.strip().splitlines()[-1])
    assert found["count"] > 1000 and found["rising"]
    assert found["stale"] == 0, found  # every ID's unit still running when the call began


def test_a_client_counts_its_deadline_from_the_ttl_each_renewal_answers() -> None:
    epoch = int(time.time() * 1000) - 1000
    with SnowflakeClient("http://127.0.0.1:1") as ids:
        fake_node(ids, epoch)
        granted = ids.transport._post

        def post(kind: str, path: str, payload: object, what: str, tag: str) -> object:
            if "/renew" in path:
                return {"renewed": True, "ttl_ms": 200}  # shorter than the grant's
            answer = granted(kind, path, payload, what, tag)
            return {**answer, "ttl_ms": 400, "margin_ms": 100}

        ids.transport._post = post  # type: ignore[method-assign,assignment]
        ids.next_id("t")
        time.sleep(0.3)  # renewals every quarter of the TTL
        held = ids._held["t"]
        assert held.ttl == 0.2
        assert held.gen.stop_at - lease_clock() <= 0.2 - 0.1  # never the grant's 0.4 s


def test_a_run_ends_at_the_lease_deadline_when_that_comes_before_its_unit_ends() -> None:
    now = 1_764_000_000_000
    layout = ClientLayout(41, 10, 12, 1000, now - 10_000)  # 1 s units: this one ends at now + 1 s
    gen = ClientGenerator(layout, 0, 0, 100.2, clock_ms=lambda: now, monotonic=lambda: 100.0)
    got = gen.take_unit()
    assert got is not None
    assert got[2] == (now + 200) * 1_000_000  # the deadline, 0.2 s on: not the unit's end


def test_the_c_run_is_built_here_and_both_runs_end_at_the_deadline_for_good() -> None:
    """The client's run of one unit is C's ClockRun where it was built (make install
    builds it; the benchmark's numbers are its), else the same logic in Python
    building blocks: both draw in order and end for good at the first draw the
    lease clock reads the run's deadline (or, with a test's own wall clock, that
    clock the unit's end), that draw skipped."""
    from idpool_client import snowflake

    assert snowflake.ClockRun is not None, "idpool_client/_clockrun.c was not built"
    boot = snowflake.lease_clock
    assert boot is snowflake._BOOTTIME  # Linux: the clock ClockRun reads
    soon = time.time_ns() + 10**10
    later = boot() + 10
    wall, lease = [soon - 10], [later - 1.0]

    def own_lease(first: int, limit: int, until: float) -> tuple[Iterator[int], Callable[[], None]]:
        return snowflake._clock_run(first, limit, until, lambda: lease[0])

    def own_wall(first: int, limit: int, until_ns: int) -> tuple[Iterator[int], Callable[[], None]]:
        return snowflake._clock_run(first, limit, later, boot, until_ns, lambda: wall[0])

    c_run = snowflake._clock_run(5, 9, later, boot)
    assert type(c_run[0]).__name__ == "ClockRun"
    assert type(own_lease(5, 9, later)[0]).__name__ == "compress"  # no C: any other clock
    for run, _ in (c_run, own_lease(5, 9, later), own_wall(5, 9, soon)):
        assert [next(run), next(run), next(run), next(run)] == [5, 6, 7, 8]
        assert next(run, None) is None  # the unit's sequence used up
    for run, end in (snowflake._clock_run(5, 9, later, boot), own_lease(5, 9, later),
                     own_wall(5, 9, soon)):  # fmt: skip
        assert next(run) == 5
        end()  # close(): a thread holding the run draws nothing more
        assert next(run, None) is None
    for run, _ in (
        snowflake._clock_run(5, 9, boot() - 0.001, boot),  # the deadline passed
        own_lease(5, 9, lease[0] - 1),
        own_wall(5, 9, wall[0] - 1),  # the unit over on the test's wall clock
    ):
        assert next(run, None) is None  # 5 skipped
    for clock in ("wall", "lease"):
        wall[0], lease[0] = soon - 10, later - 1.0
        run, _ = own_wall(5, 9, soon) if clock == "wall" else own_lease(5, 9, later)
        assert next(run) == 5
        if clock == "wall":
            wall[0] = soon  # the unit's end
        else:
            lease[0] = later  # the run's deadline
        assert next(run, None) is None
        wall[0], lease[0] = soon - 10, later - 1.0  # back again: the run stays over
        assert next(run, None) is None


def test_a_client_whose_clock_leaps_past_its_lease_makes_no_id_a_later_holder_makes_again(
    nodes: list[NodeProcess], settings: Settings, tag: str
) -> None:
    """Issue 28 with real nodes: a client whose wall clock leaps forward by more
    than the lease's TTL (2 s) and a second made IDs at the leaped time, its
    renewal was refused (bad_last) recording nothing, it took another worker ID
    and leaped on that one too; the worker IDs came back with floors at real
    time and a client with a good clock repeated the leaped IDs as real time got
    there. The leaped client now stops at the lease's expiry as Redis recorded it."""
    add_snowflake(settings, tag)
    urls = [n.base_url for n in nodes]
    leap = [0]
    leaped: list[int] = []
    stopped: list[str] = []
    a = SnowflakeClient(urls, clock_ns=lambda: time.time_ns() + leap[0])
    before = a.next_id(tag)  # worker 0, granted with a good clock
    leap[0] = 6 * 10**9  # 6 s ahead
    leaped_at = time.monotonic()
    while time.monotonic() < leaped_at + 1.1:  # past two renewals
        try:
            leaped.append(a.next_id(tag))
        except SnowflakeStopped as e:
            stopped.append(str(e))
        time.sleep(0.001)
    a.close()
    time.sleep(2.2)  # A's worker IDs expired (lease 2 s): B is granted worker 0
    later: list[int] = []
    with SnowflakeClient(urls) as b:
        while time.monotonic() < leaped_at + 1.1 + 6 + 0.2:  # real time past A's times
            later.append(b.next_id(tag))
            time.sleep(0.001)
    again = {before, *leaped}.intersection(later)
    assert not again, f"{len(again)} IDs made again by a later holder of the leaped worker IDs"
    assert not leaped, f"{len(leaped)} IDs made at the leaped time"
    assert stopped and "past the worker lease's expiry" in stopped[-1]
