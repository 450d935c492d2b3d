"""The clients across fork, against a real ``idpool serve`` node (the fork
attack on 18d1914, issue 25). A child forgets its parent's leases and worker
IDs (tests/test_client.py::test_a_forked_child_never_hands_out_its_parents_ids);
here, what a child started by multiprocessing gives back when it ends. Its
children end with os._exit, which runs no atexit handler: a module-level
client's leases in a Pool worker or a Process were never returned (64k IDs of
two workers that drew 10 each), nor a snowflake client's worker IDs released.
multiprocessing runs its own finalizers first; the clients register theirs in
the child (close_at_child_exit). A child also starts with the first lease size,
not the parent's grown one. And the asyncio client used in one loop, then
another, lost a prefetch in flight when the first loop ended (_Handoff).
"""

from __future__ import annotations

import asyncio
import multiprocessing
import os
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from idpool_client import AsyncIdPoolClient, IdPoolClient, Lease
from idpool_client.snowflake import SnowflakeClient

from idpool.pool.settings import Settings

from .test_client import add_tag, assert_conserved, cluster  # noqa: F401  (cluster: a fixture)
from .test_client_snowflake_attack import fake_node, unit_starting_now

# The module-level client of the pattern under test (a Pool worker inherits it).
CLIENT: IdPoolClient | None = None
TAG = ""


def _draw(n: int) -> list[int]:
    assert CLIENT is not None
    return [CLIENT.next_id(TAG) for _ in range(n)]


@pytest.fixture
def module_client(cluster: tuple[Settings, list[str]]) -> Iterator[tuple[Settings, str]]:  # noqa: F811
    global CLIENT, TAG
    settings, urls = cluster
    TAG = add_tag(settings, step=1000)
    CLIENT = IdPoolClient(urls)  # the defaults: return_at_exit=True
    try:
        yield settings, TAG
    finally:
        CLIENT.close()
        CLIENT = None


def test_a_multiprocessing_pool_worker_returns_its_leases_when_the_pool_closes(
    module_client: tuple[Settings, str],
) -> None:
    """A module-level client used in a multiprocessing Pool (fork start, the
    default on Linux): each worker leases its own and returns its tails when the
    pool is closed and joined gracefully, though it ends with os._exit. The
    parent's 20,000 draws grew the lease size it asks for; a worker starts from
    the first size again."""
    settings, tag = module_client
    assert CLIENT is not None
    parent = _draw(20_000)  # grows the lease size asked for (doubling from 1,000)
    with multiprocessing.get_context("fork").Pool(2) as pool:
        children = pool.map(_draw, [10, 10], chunksize=1)
        pool.close()
        pool.join()  # a graceful end: the workers exit on their own
    report = CLIENT.close()
    assert report.lost == []
    assert_conserved(settings, tag, parent + [i for c in children for i in c])


def _draw_to(queue: multiprocessing.Queue[list[int]], n: int) -> None:  # type: ignore[type-arg]
    queue.put(_draw(n))


def test_a_multiprocessing_process_returns_its_leases_when_it_ends(
    module_client: tuple[Settings, str],
) -> None:
    """The same with one multiprocessing.Process (fork start) whose target
    returns normally: its lease (1,000 IDs, 10 drawn) goes back to the pool."""
    settings, tag = module_client
    assert CLIENT is not None
    ctx = multiprocessing.get_context("fork")
    queue = ctx.Queue()
    child = ctx.Process(target=_draw_to, args=(queue, 10))
    child.start()
    drawn = queue.get(timeout=30)
    child.join(30)
    assert child.exitcode == 0
    report = CLIENT.close()
    assert report.lost == []
    assert_conserved(settings, tag, drawn)


def test_an_async_client_loses_no_lease_when_the_loop_it_prefetched_in_ends(
    cluster: tuple[Settings, list[str]],  # noqa: F811
) -> None:
    """The asyncio client across loops (a forked child's loop after its parent's):
    a loop that ends while a prefetch is in flight cancels the fetch task, but
    the executor thread still leases the range. Its answer was dropped, neither
    served nor returned by ``aclose()`` (100 or 200 IDs here); now the thread
    gives it back. Waste only, never a duplicate."""
    settings, urls = cluster
    tag = add_tag(settings, step=1000)
    client = AsyncIdPoolClient(urls, max_count=100, initial_count=100, return_at_exit=False)

    lease, calling = client.transport.lease, threading.Event()

    def slow_lease(tag: str, count: int) -> list[Lease]:
        calling.set()
        time.sleep(0.2)  # a lease call takes a while (a node far away, a busy ledger)
        return lease(tag, count)

    client.transport.lease = slow_lease  # type: ignore[method-assign]

    async def warm_up() -> list[int]:
        got = [await client.next_id(tag)]  # the first lease
        calling.clear()
        got += [await client.next_id(tag) for _ in range(19)]  # past the trigger (15 of 100)
        assert await asyncio.to_thread(calling.wait, 5)  # the prefetch's call is under way
        return got

    async def draw(n: int) -> list[int]:
        return [await client.next_id(tag) for _ in range(n)]

    ids = asyncio.run(warm_up())  # ends its loop with the prefetch in flight
    ids += asyncio.run(draw(150))  # the next loop (a forked child's, or the parent's own)
    report = asyncio.run(client.aclose())
    assert report.lost == []
    assert_conserved(settings, tag, ids)


SNOWFLAKES: SnowflakeClient | None = None


def _snowflake_draw() -> None:
    assert SNOWFLAKES is not None
    for _ in range(10):
        SNOWFLAKES.next_id("t")


def test_a_snowflake_client_in_a_multiprocessing_child_releases_its_worker_id(
    tmp_path: Path,
) -> None:
    """A module-level SnowflakeClient in a multiprocessing child: the child takes a
    worker ID of its own and releases it when it ends (it held it for its lease's
    TTL: one worker ID per process of a pool that replaces its workers)."""
    global SNOWFLAKES
    released = tmp_path / "released"
    ids = SnowflakeClient("http://127.0.0.1:1")
    fake_node(ids, unit_starting_now())  # grants worker 7, then 8, ...
    answer = ids.transport._post

    def post(kind: str, path: str, payload: object, what: str, sent: object = None) -> object:
        if "/release" in path:
            assert isinstance(payload, dict)
            with released.open("a") as f:
                f.write(f"{os.getpid()} {payload['worker']}\n")
        return answer(kind, path, payload, what, sent)  # type: ignore[arg-type]

    ids.transport._post = post  # type: ignore[method-assign,assignment]
    ids.next_id("t")  # the parent holds worker 7
    SNOWFLAKES = ids
    try:
        child = multiprocessing.get_context("fork").Process(target=_snowflake_draw)
        child.start()
        child.join(30)
        assert child.exitcode == 0
        assert released.read_text().split() == [str(child.pid), "8"]  # its own, at its end
    finally:
        SNOWFLAKES = None
        ids.close()
    assert released.read_text().split()[2:] == [str(os.getpid()), "7"]
