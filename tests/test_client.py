"""The Python client (client/idpool_client) against real `idpool serve` processes.

The nodes run without a preloader, so the ledger and the pool list change only
by the client's own leases and returns: every ID below the ledger's max_id must
then be handed out once or be back in the list.
"""

from __future__ import annotations

import asyncio
import http.server
import json
import os
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from idpool_client import (
    AsyncIdPoolClient,
    IdPoolAuthError,
    IdPoolClient,
    IdPoolClosed,
    IdPoolRequestError,
    IdPoolStrictTag,
    IdPoolUnavailable,
    Lease,
)
from idpool_client.transport import Transport

from idpool.pool.ledger import Ledger
from idpool.pool.redis_pool import RedisPool
from idpool.pool.settings import Settings
from idpool.pool.tokens import hash_token
from idpool.service.kinds import rules_of
from ops.toolkit import NodeProcess, env_with, free_port

from .conftest import MYSQL_URL, REDIS_URL, drop_keys, new_name

# The nodes' store timeout and the clients' HTTP timeout, out of reach of the
# tests' own load: a claim, pop or lease record the machine slowed past a timeout
# is waste by design (its outcome is unknown), and zero waste is what the
# conservation tests assert of the client. 2 s (the default) was reached on a
# loaded machine: a node's timed-out claim wasted a whole step of 1,000 IDs.
NODE_STORE_TIMEOUT = 60.0
CLIENT_TIMEOUT = 2 * NODE_STORE_TIMEOUT  # a node's slowest answer still arrives


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Settings, list[str]]]:
    settings = Settings(mysql_url=MYSQL_URL, redis_url=REDIS_URL, redis_prefix=new_name("idpc"))
    env = env_with(
        IDPOOL_MYSQL_URL=settings.mysql_url,
        IDPOOL_REDIS_URL=settings.redis_url,
        IDPOOL_REDIS_PREFIX=settings.redis_prefix,
        IDPOOL_PRELOAD="0",
        IDPOOL_STORE_TIMEOUT=str(NODE_STORE_TIMEOUT),
    )
    tmp = tmp_path_factory.mktemp("client")
    nodes = [NodeProcess(env, tmp / f"node{i}") for i in range(2)]
    for node in nodes:
        node.start()
    try:
        yield settings, [node.base_url for node in nodes]
    finally:
        for node in nodes:
            if node.proc is not None:
                node.stop()
        drop_keys(settings.redis_prefix)


def add_tag(settings: Settings, step: int, token: str | None = None) -> str:
    """A new tag; with ``token``, guarded by it (before any node has read the tag)."""
    tag = new_name("ctag")

    async def go() -> None:
        ledger = await Ledger.connect(settings)
        await ledger.add_tag(tag, step=step, start=1)
        if token is not None:
            await ledger.add_token(tag, "t1", hash_token(token))
        await ledger.close()

    asyncio.run(go())
    return tag


def ledger_and_pool(settings: Settings, tag: str) -> tuple[int, int, list[tuple[int, int]]]:
    async def go() -> tuple[int, int, list[tuple[int, int]]]:
        ledger = await Ledger.connect(settings)
        pool = RedisPool.from_settings(settings)
        try:
            row = await ledger.get_tag(tag)
            return row.start_id, row.max_id, [(r.start, r.end) for r in await pool.ranges(tag)]
        finally:
            await pool.close()
            await ledger.close()

    return asyncio.run(go())


def assert_conserved(settings: Settings, tag: str, ids: list[int]) -> None:
    """No duplicate, and every claimed ID handed out or back in the list (zero waste)."""
    issued = set(ids)
    assert len(issued) == len(ids), f"{len(ids) - len(issued)} duplicate IDs"
    start, max_id, pooled = ledger_and_pool(settings, tag)
    in_pool: set[int] = set()
    for s, e in pooled:
        block = set(range(s, e))
        assert not block & issued, f"returned range {s}-{e - 1} was also handed out"
        assert not block & in_pool, f"range {s}-{e - 1} is in the list twice"
        in_pool |= block
    missing = set(range(start, max_id)) - issued - in_pool
    assert not missing, f"{len(missing)} IDs wasted, e.g. {sorted(missing)[:5]}"
    assert max(issued | in_pool) < max_id


def test_threads_never_share_an_id_and_close_returns_the_rest(
    cluster: tuple[Settings, list[str]],
) -> None:
    settings, urls = cluster
    tag = add_tag(settings, step=1000)
    # Small leases (at most 500 IDs, cut from the pool's 1000): thousands of
    # switches and prefetches in the run, each lease within the client's max_count.
    client = IdPoolClient(urls, timeout=CLIENT_TIMEOUT, max_count=500, return_at_exit=False)
    got: list[list[int]] = [[] for _ in range(8)]
    answers: list[int] = []
    lease = client.transport.lease

    def counted(tag: str, count: int) -> list[Lease]:
        leases = lease(tag, count)
        answers.append(sum(map(len, leases)))
        return leases

    client.transport.lease = counted  # type: ignore[method-assign]

    def draw(n: int) -> None:
        mine = got[n]
        for k in range(12_000):
            if k % 1000 == 999:
                mine.extend(client.next_ids(tag, 1 + n * 37))
            else:
                mine.append(client.next_id(tag))

    threads = [threading.Thread(target=draw, args=(n,)) for n in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    report = client.close()
    assert report.lost == [] and report.returned > 0
    assert client.close() is report  # twice: nothing returned again
    with pytest.raises(IdPoolClosed):
        client.next_id(tag)
    ids = [i for mine in got for i in mine]
    assert len(ids) == 8 * (12_000 - 12) + 12 * sum(1 + n * 37 for n in range(8))
    assert_conserved(settings, tag, ids)
    assert len(answers) > 100 and max(answers) <= 500  # holdings: at most 2 x 500


def test_a_forked_child_never_hands_out_its_parents_ids(
    cluster: tuple[Settings, list[str]],
) -> None:
    """A process that used a client and forks (multiprocessing's default start on
    Linux, gunicorn --preload, celery prefork) gave the child a copy of the leases
    in memory, which the parent goes on serving: both handed out the same IDs.
    The child forgets them (os.register_at_fork) and leases its own, through
    next_id, next_ids, and a chain it got before the fork alike."""
    settings, urls = cluster
    tag = add_tag(settings, step=1000)
    client = IdPoolClient(urls, timeout=CLIENT_TIMEOUT, max_count=500, return_at_exit=False)
    chain = client.ids(tag)
    parent = [next(chain), client.next_id(tag)]  # a lease in memory, its chunk cut
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child
        try:
            got = [next(chain) for _ in range(100)] + [client.next_id(tag) for _ in range(100)]
            got += list(client.next_ids(tag, 100))
            client.close()  # its own leases' tails go back
            os.write(write, json.dumps(got).encode())
        finally:
            os._exit(0)
    os.close(write)
    parent += [next(chain) for _ in range(100)] + [client.next_id(tag) for _ in range(100)]
    parent += list(client.next_ids(tag, 100))
    os.waitpid(pid, 0)
    with os.fdopen(read, "rb") as f:
        child = json.loads(f.read())
    report = client.close()
    assert len(child) == 300 and len(set(child)) == 300
    both = set(parent) & set(child)
    assert not both, f"{len(both)} IDs handed out by both the parent and its forked child"
    assert report.lost == []
    assert_conserved(settings, tag, parent + child)


def test_failover_to_the_next_node(cluster: tuple[Settings, list[str]], tmp_path: Path) -> None:
    settings, urls = cluster
    tag = add_tag(settings, step=50)
    dead = f"http://127.0.0.1:{free_port()}"  # nothing listens there
    with IdPoolClient(
        [dead, *urls], timeout=CLIENT_TIMEOUT, max_count=50, return_at_exit=False
    ) as client:
        ids = [client.next_id(tag) for _ in range(1000)]
        assert client.lease_calls >= 20
    assert_conserved(settings, tag, ids)


def test_no_node_reachable_serves_from_memory_then_raises(
    cluster: tuple[Settings, list[str]], tmp_path: Path
) -> None:
    settings, _ = cluster
    tag = add_tag(settings, step=100)
    env = env_with(
        IDPOOL_MYSQL_URL=settings.mysql_url,
        IDPOOL_REDIS_URL=settings.redis_url,
        IDPOOL_REDIS_PREFIX=settings.redis_prefix,
        IDPOOL_PRELOAD="0",
    )
    node = NodeProcess(env, tmp_path / "lonely").start()
    try:
        client = IdPoolClient(
            [node.base_url], max_count=100, initial_count=100, return_at_exit=False
        )
        ids = [client.next_id(tag) for _ in range(20)]  # the 16th started the next lease
        for _ in range(200):
            if client._tags[tag].pending:
                break
            threading.Event().wait(0.02)
        assert node.stop()
        ids += [client.next_id(tag) for _ in range(180)]  # the rest of both leases, from memory
        assert sorted(ids) == list(range(1, 201))
        with pytest.raises(IdPoolUnavailable) as failed:
            client.next_id(tag)
        assert failed.value.failures[0][0] == node.base_url
        assert "ConnectionRefusedError" in failed.value.failures[0][1]
        node.start()  # the node is back: the client recovers (after its backoff)
        threading.Event().wait(0.6)
        assert client.next_id(tag) > 200
        client.close()
    finally:
        if node.proc is not None:
            node.stop()  # the node started again above: stopped by PID, never left behind


def test_unknown_tag_is_a_request_error(cluster: tuple[Settings, list[str]]) -> None:
    _, urls = cluster
    with IdPoolClient(urls, timeout=CLIENT_TIMEOUT, return_at_exit=False) as client:
        with pytest.raises(IdPoolRequestError) as refused:
            client.next_id(new_name("nosuch"))
        assert refused.value.code == "unknown_tag" and refused.value.status == 404


def test_a_strict_tag_is_refused_with_a_clear_error(cluster: tuple[Settings, list[str]]) -> None:
    settings, urls = cluster
    tag = new_name("strict")

    async def add() -> None:
        ledger = await Ledger.connect(settings)
        await ledger.add_tag(tag, step=100, start=1, rules=rules_of("strict"))
        await ledger.close()

    asyncio.run(add())
    with IdPoolClient(urls, timeout=CLIENT_TIMEOUT, return_at_exit=False) as client:
        with pytest.raises(IdPoolStrictTag) as refused:
            client.next_id(tag)
        assert refused.value.code == "strict_tag" and refused.value.status == 409
        assert "strict" in str(refused.value) and f"/id/{tag}" in str(refused.value)
        assert isinstance(refused.value, IdPoolRequestError)  # a 4xx: no other node is tried


def test_async_client_tasks_never_share_an_id(cluster: tuple[Settings, list[str]]) -> None:
    settings, urls = cluster
    tag = add_tag(settings, step=100)

    async def run() -> list[int]:
        got: list[int] = []
        async with AsyncIdPoolClient(
            urls, timeout=CLIENT_TIMEOUT, max_count=300, return_at_exit=False
        ) as client:

            async def draw(n: int) -> None:
                for k in range(3000):
                    if k % 500 == 0:
                        got.extend(await client.next_ids(tag, 7 + n))
                    else:
                        got.append(await client.next_id(tag))

            await asyncio.gather(*(draw(n) for n in range(8)))
        assert client.report.lost == [] and client.report.returned > 0
        return got

    assert_conserved(settings, tag, asyncio.run(run()))


class FakeTransport:
    """Leases from a counter, in memory: for the interleavings no real run can force.
    Like a node, a lease holds at most the count asked for."""

    def __init__(self, size: int) -> None:
        self.size = size
        self.next_start = 1
        self.returned: list[tuple[int, int]] = []
        self.leased: list[int] = []  # each lease's length
        self.timeout = 1.0
        self.servers = ["fake"]
        self.calls = {"lease": 0, "return": 0}

    def lease(self, tag: str, count: int) -> list[Lease]:
        size = min(self.size, count)
        start, self.next_start = self.next_start, self.next_start + size
        self.leased.append(size)
        return [Lease(new_name("l"), tag, start, start + size)]

    def give_back(self, lease: Lease, start: int) -> int:
        self.returned.append((start, lease.end))
        return lease.end - start


def fake_client(size: int, **options: Any) -> tuple[IdPoolClient, FakeTransport]:
    client = IdPoolClient(["http://unused"], return_at_exit=False, **options)
    fake = FakeTransport(size)
    client.transport = fake  # type: ignore[assignment]
    return client, fake


def test_a_cut_and_racing_refills_never_repeat_an_id() -> None:
    client, fake = fake_client(1000, initial_count=1000)
    ids = client.ids("t")
    first = next(ids)
    t = client._tags["t"]
    # Two threads whose draws both found the chunk used up refill at once: both
    # get the same chunk object, so whichever the chain keeps, each ID is drawn once.
    a = client._refill(t)
    assert client._refill(t) is a
    drawn = [first, next(a), next(ids), client.next_id("t")]
    assert drawn == [1, 2, 3, 4]
    batch = client.next_ids("t", 10)  # cuts the chunk under the chain
    assert batch == range(5, 15)
    with pytest.raises(StopIteration):
        next(a)  # the cut chunk is used up for everyone...
    assert next(ids) == 15  # ...and the chain refills from the lease's rest
    stale = client._refill(t)  # a refill that lost the race to that one
    report = client.close()
    with pytest.raises(StopIteration):
        next(stale)  # close cut it too
    with pytest.raises(IdPoolClosed):
        next(ids)
    with pytest.raises(IdPoolClosed):
        client.next_id("t")
    assert fake.returned == [(16, 1001)] and report.returned == 985


def test_a_chain_that_ended_is_replaced_without_repeating_an_id() -> None:
    client, fake = fake_client(100, initial_count=100)
    got = [client.next_id("t") for _ in range(10)]
    client._ids["t"] = iter(())  # as a chain whose refill was interrupted ends
    got += [client.next_id("t") for _ in range(10)]
    assert got == list(range(1, 21))
    client.close()
    assert sorted(fake.returned) == [(21, 101), (101, 201)]  # the rest, and the prefetched lease


def test_holdings_stay_within_twice_max_count() -> None:
    client, fake = fake_client(10_000, max_count=300, prefetch_at=0.0)
    most = 0
    for k in range(20_000):
        if k % 100 == 0:
            client.next_ids("t", 1 + k % 250)
        client.next_id("t")
        if k % 50 == 0:
            most = max(most, client.held("t"))
    assert max(fake.leased) == 300 and 0 < most <= 600
    client.close()


def test_a_return_whose_answer_was_lost_is_retried_once_safely(
    cluster: tuple[Settings, list[str]],
) -> None:
    settings, urls = cluster
    tag = add_tag(settings, step=100)
    client = IdPoolClient(
        [urls[0], urls[1]], timeout=CLIENT_TIMEOUT, max_count=100, return_at_exit=False
    )
    ids = [client.next_id(tag) for _ in range(10)]
    real = client.transport._request
    lost_answers: list[str] = []

    def answer_lost(server: Any, path: str, payload: Any, tag: str, sent: Any) -> Any:
        result = real(server, path, payload, tag, sent)  # the node acts on it...
        if path == "/lease/return" and not lost_answers:
            lost_answers.append(server.url)
            raise ConnectionResetError("answer lost")  # ...but the client never hears
        return result

    client.transport._request = answer_lost  # type: ignore[method-assign]
    report = client.close()
    assert lost_answers and report.lost == [] and report.returned >= 90
    assert_conserved(settings, tag, ids)  # the tail is in the list once


def test_a_guarded_tag_is_served_with_its_token_and_refused_by_name_without(
    cluster: tuple[Settings, list[str]],
) -> None:
    """Issue 19 item 4: tokens per tag and a default, sent on leases and returns,
    never shown; a tag that refuses raises an error naming the tag."""
    settings, urls = cluster
    token = "client-token-" + new_name("s")
    tag = add_tag(settings, step=100, token=token)
    open_tag = add_tag(settings, step=100)
    with IdPoolClient(urls, timeout=CLIENT_TIMEOUT, max_count=100, return_at_exit=False) as bare:
        with pytest.raises(IdPoolAuthError) as refused:
            bare.next_id(tag)
        assert refused.value.tag == tag and refused.value.status == 401
        assert repr(tag) in str(refused.value) and "no token" in str(refused.value)
        assert bare.next_id(open_tag) >= 1  # an open tag needs none
    with IdPoolClient(
        urls, timeout=CLIENT_TIMEOUT, max_count=100, tokens={tag: "wrong"}, return_at_exit=False
    ) as bad:
        with pytest.raises(IdPoolAuthError, match="does not accept"):
            bad.next_id(tag)
    ids: list[int] = []
    for client in (
        IdPoolClient(
            urls,
            timeout=CLIENT_TIMEOUT,
            max_count=100,
            tokens={tag: token},
            token="x",
            return_at_exit=False,
        ),
        IdPoolClient(
            urls, timeout=CLIENT_TIMEOUT, max_count=100, token=token, return_at_exit=False
        ),
    ):
        ids += [client.next_id(tag) for _ in range(10)]
        lease = client._tags[tag].lease
        assert lease is not None
        shown = [repr(client), repr(client.transport), repr(client.transport.tokens), repr(lease)]
        assert not any(token in text or lease.secret in text for text in shown)
        report = client.close()
        assert report.lost == [] and report.returned > 0  # the return sent the token too
        assert_conserved(settings, tag, ids)

    async def run() -> list[int]:
        async with AsyncIdPoolClient(
            urls, timeout=CLIENT_TIMEOUT, max_count=100, tokens={tag: token}
        ) as aio:
            got = [await aio.next_id(tag) for _ in range(5)]
        assert aio.report.lost == [] and aio.report.returned > 0
        async with AsyncIdPoolClient(
            urls, timeout=CLIENT_TIMEOUT, max_count=100, return_at_exit=False
        ) as none:
            with pytest.raises(IdPoolAuthError):
                await none.next_id(tag)
        return got

    assert_conserved(settings, tag, ids + asyncio.run(run()))


def test_refills_that_waited_for_the_same_lease_lose_no_id() -> None:
    """Two draws that found nothing both wait in a refill; when the lease comes each
    cuts a chunk, and the chain keeps the one answered last: the other must not hold
    IDs that nobody will draw or return."""
    client, fake = fake_client(100, initial_count=100)
    gate = threading.Event()
    lease = fake.lease

    def slow(tag: str, count: int) -> list[Lease]:
        gate.wait(10)
        return lease(tag, count)

    fake.lease = slow  # type: ignore[method-assign]
    t = client._tag("t")
    answered: list[Any] = []
    waiting = [threading.Thread(target=lambda: answered.append(client._refill(t))) for _ in "ab"]
    for thread in waiting:
        thread.start()
    threading.Event().wait(0.2)  # both wait for the one fetch
    gate.set()
    for thread in waiting:
        thread.join()
    drawn = list(answered[-1])  # the chain's active chunk: the one assigned last
    client.close()
    returned = [i for s, e in fake.returned for i in range(s, e)]
    assert sorted(drawn + returned) == list(range(1, fake.next_start))


def test_threads_switching_at_every_chance_under_a_tracer_repeat_and_lose_nothing() -> None:
    """Draws, batches and refills of 8 threads, the GIL handed over as often as it
    can be and a Python tracer running (which makes every line a switch point):
    each leased ID is handed out once or returned at close."""
    client, fake = fake_client(64, max_count=64, initial_count=64)
    got: list[list[int]] = [[] for _ in range(8)]

    def tracer(*_: Any) -> Any:
        return tracer

    def draw(n: int) -> None:
        sys.settrace(tracer)
        ids, mine = client.ids("t"), got[n]
        for k in range(3000):
            if k % 5 == 0:
                mine.extend(client.next_ids("t", 1 + k % 7))
            elif n % 2:
                mine.append(next(ids))
            else:
                mine.append(client.next_id("t"))

    switch = sys.getswitchinterval()
    sys.setswitchinterval(1e-6)
    try:
        threads = [threading.Thread(target=draw, args=(n,)) for n in range(8)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
    finally:
        sys.setswitchinterval(switch)
    client.close()
    drawn = [i for mine in got for i in mine]
    assert len(set(drawn)) == len(drawn), "an ID was handed out twice"
    returned = [i for s, e in fake.returned for i in range(s, e)]
    assert sorted(drawn + returned) == list(range(1, fake.next_start))
    assert max(fake.leased) <= 64


def test_next_id_for_a_tag_draws_from_the_same_chain_as_next_id() -> None:
    client, fake = fake_client(100, initial_count=100, max_count=100)
    next_id = client.next_id_for("t")
    drawn = [next_id(), client.next_id("t"), next_id(), next(client.ids("t"))]
    drawn += [next_id() for _ in range(300)]  # across leases: refills run under it
    drawn += list(client.next_ids("t", 5))
    assert drawn == list(range(1, len(drawn) + 1))
    client.close()


def test_a_failover_tries_every_node_even_when_another_call_moves_the_first_node() -> None:
    # Another thread's call that succeeds on node b moves `_first` while this call
    # waits on node a: the failover must still try b, not a twice (a return then
    # reported a healthy cluster as down and its tail as lost).
    transport = Transport(["http://a.invalid:1", "http://b.invalid:1"], timeout=0.1)
    tried: list[str] = []

    def request(server: Any, *args: Any) -> tuple[int, dict[str, Any]]:
        tried.append(server.url)
        if server.url == "http://a.invalid:1":
            transport._first = 1  # as a concurrent call answered by b does
            raise TimeoutError("timed out")
        return 200, {"count": 7}

    transport._request = request  # type: ignore[method-assign]
    lease = Lease("id", "orders", 1, 11, "secret")
    assert transport.give_back(lease, 4) == 7
    assert tried == ["http://a.invalid:1", "http://b.invalid:1"]


def test_next_ids_refuses_more_than_max_batch_before_leasing() -> None:
    """Issue 28: next_ids(tag, 10**9) leased a billion IDs (all wasted) and built a
    list of them. A count above max_batch (default 100,000) is a ValueError naming
    the bound, before any lease; the async client's too."""
    client, fake = fake_client(1000)
    with pytest.raises(ValueError, match=r"max_batch=100000"):
        client.next_ids("t", 100_001)
    assert fake.leased == []
    small, fake = fake_client(1000, max_batch=50)
    with pytest.raises(ValueError, match=r"n is 51: .*max_batch=50"):
        small.next_ids("t", 51)
    assert small.next_ids("t", 50) == range(1, 51)
    small.close()
    client.close()

    async def run() -> None:
        aio = AsyncIdPoolClient(["http://unused"], return_at_exit=False, max_batch=50)
        aio.transport = FakeTransport(1000)  # type: ignore[assignment]
        with pytest.raises(ValueError, match=r"max_batch=50"):
            await aio.next_ids("t", 51)
        with pytest.raises(ValueError, match=r"max_batch=100000"):
            await AsyncIdPoolClient(["http://unused"], return_at_exit=False).next_ids("t", 10**9)
        assert aio.transport.leased == []  # type: ignore[attr-defined]
        assert await aio.next_ids("t", 50) == range(1, 51)
        await aio.aclose()

    asyncio.run(run())


ROOT = Path(__file__).resolve().parent.parent


def exits_while_taking(mode: str, url: str, tag: str, tmp: Path, runs: int) -> list[dict[str, Any]]:
    """``runs`` client processes (tests/client_exit_worker.py) that exit while a
    taker thread takes IDs, four at a time; what each handed out and gave back."""
    results: list[dict[str, Any]] = []
    for first in range(0, runs, 4):
        procs = []
        for k in range(first, min(runs, first + 4)):
            out = tmp / f"{mode}{k}.json"
            seconds = str(0.05 + 0.02 * (k % 8))  # exit at a different moment each run
            command = [sys.executable, "-m", "tests.client_exit_worker", mode, url, tag]
            procs.append((subprocess.Popen([*command, str(out), seconds], cwd=ROOT), out))
        for proc, out in procs:
            assert proc.wait(60) == 0
            results.append(json.loads(out.read_text()))
    return results


@pytest.mark.parametrize("mode", ["async", "async-warm", "sync"])
def test_a_client_exiting_while_another_thread_takes_returns_only_unused_ids(
    cluster: tuple[Settings, list[str]], tmp_path: Path, mode: str
) -> None:
    """Issue 28: the asyncio client's atexit hook cut its tails in the main thread
    while its loop, in another thread, still took IDs: a cut between reading the
    next ID and advancing past it returned an ID just handed out (5 of 40 exits),
    and a take after the cut's first write handed out 0 (7 of 40). Now the loop
    waits for takes under way in other threads before it reads what is left (asking
    the loop to cut was not enough: a client warmed up in asyncio.run, then served
    by next_id from a loop thread, was cut beside that thread: 18,400 IDs returned
    while handed out, then handed out again by another process). The sync client
    (threads and an atexit hook) is checked alike."""
    settings, urls = cluster
    # warm: whole 200,000-ID leases, so the loop thread takes only on the fast path
    tag = add_tag(settings, step=1_000_000 if mode == "async-warm" else 1000)
    results = exits_while_taking(mode, urls[0], tag, tmp_path, 20 if mode == "sync" else 40)
    handed: list[int] = []
    zeros, both, errors = 0, [], []
    for run in results:
        zeros += 0 in run["handed"]
        mine = set(run["handed"])
        both += [(s, e) for s, e in run["returned"] if mine.intersection(range(s, e))]
        handed += run["handed"]
        errors += run["errors"]
    shown = f"{zeros} of {len(results)} exits handed out 0; returned, yet handed out: {both}"
    assert (zeros, both) == (0, []), shown
    assert errors == [], errors[0]
    assert len(handed) == len(set(handed))  # a tail returned by one run served by another
    assert sum(1 for run in results if run["returned"]) >= len(results) // 2  # exits gave back
    issued = set(handed)
    for s, e in ledger_and_pool(settings, tag)[2]:  # a lease in flight at exit may be waste
        assert not issued.intersection(range(s, e)), f"{s}-{e - 1} is in the list, and handed out"


class _NotANode(http.server.BaseHTTPRequestHandler):
    """Some other web server: 404 with its own page, as most answer a path they lack."""

    def do_POST(self) -> None:  # noqa: N802 (the stdlib's name)
        body = b"<html><body>Not Found</body></html>"
        self.send_response(404)
        self.send_header("Content-Type", "text/html")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args: Any) -> None:
        pass


def test_a_server_that_is_not_an_idpool_node_is_named_as_such() -> None:
    """Issue 29: a client pointed at another web server said `answered 404 None: None`."""
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _NotANode)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    url = f"http://127.0.0.1:{server.server_address[1]}"
    try:
        with pytest.raises(IdPoolUnavailable) as raised:
            IdPoolClient([url], return_at_exit=False).next_id("orders")
    finally:
        server.shutdown()
        server.server_close()
        thread.join()
    message = str(raised.value)
    assert f"{url} is not an idpool node" in message and "HTTP 404" in message, message
    assert "Not Found" in message and "None" not in message


def test_a_second_running_event_loop_is_refused() -> None:
    """Two loops in two threads take from one client with no lock between them (an
    adversarial run: 5-26 IDs handed out twice). The slow path refuses the second
    while the first runs; a loop that ended (a warm-up's asyncio.run) hands over."""
    client = AsyncIdPoolClient(["http://unused"], return_at_exit=False)
    client.transport = FakeTransport(1000)  # type: ignore[assignment]
    assert asyncio.run(client.next_ids("t", 3)) == range(1, 4)  # warm-up: its loop ends
    first = asyncio.new_event_loop()
    thread = threading.Thread(target=first.run_forever, daemon=True)
    thread.start()
    try:
        got = asyncio.run_coroutine_threadsafe(client.next_ids("t", 2), first).result(10)
        assert list(got) == [4, 5]

        async def second() -> None:
            with pytest.raises(RuntimeError, match="another running event loop"):
                await client.next_ids("t", 2)

        asyncio.run(second())
    finally:
        first.call_soon_threadsafe(first.stop)
        thread.join(10)
        first.close()
