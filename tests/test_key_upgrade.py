"""Upgrading a running single-Redis deployment to the per-tag key layout.

Nodes of the old version (tests/old_layout.py: its scripts, verbatim) and of the
new one run side by side on one Redis: the new scripts take in the old layout's
lists whole (when the old layout cleaned this incarnation) in the same script
that pops or pushes, the old mark counts in every new claim and every new raise
raises it too, and an old lease is returned once through a new node.
"""

from __future__ import annotations

import asyncio
import random
from typing import Any

import pytest
import redis.asyncio as aioredis

from idpool.pool.errors import LeaseRefused
from idpool.pool.keys import Keys, Legacy
from idpool.pool.lease_store import LeaseStore, hash_secret
from idpool.pool.ranges import IdRange
from idpool.pool.redis_pool import RedisPool
from idpool.pool.settings import Settings

from . import old_layout

pytestmark = pytest.mark.anyio


def R(text: str) -> IdRange:
    return IdRange.from_text(text)


class OldNode:
    """What a node of the old version sends: its scripts, on its own client."""

    def __init__(self, settings: Settings) -> None:
        self.client = aioredis.Redis.from_url(settings.redis_url, decode_responses=True)
        self.old = Legacy(settings.redis_prefix)
        self.p = settings.redis_prefix
        self._pop = self.client.register_script(old_layout._POP)
        self._push = self.client.register_script(old_layout._PUSH)
        self._raise = self.client.register_script(old_layout._RAISE_HWM)
        self._record = self.client.register_script(old_layout._RECORD)

    def _head(self, tag: str) -> tuple[list[str], list[str]]:
        keys = [self.old.pools, f"{self.p}:incarnation", self.old.pool(tag)]
        return keys, [self.old.clean_prefix, self.old.pool("")]

    async def pop(self, tag: str, ids: int = 1) -> list[IdRange]:
        keys, args = self._head(tag)
        keys += [f"{self.p}:stats:{tag}", f"{self.p}:moved"]
        _, texts, _, _ = await self._pop(keys=keys, args=[*args, str(ids), "10000", tag])
        return [R(t) for t in texts]

    async def push(self, tag: str, ranges: list[IdRange], head: bool = False) -> None:
        keys, args = self._head(tag)
        side = "head" if head else "tail"
        keys.append(f"{self.p}:preloader")
        await self._push(keys=keys, args=[*args, tag, side, "", *(r.to_text() for r in ranges)])

    async def raise_mark(self, tag: str, value: int) -> None:
        await self._raise(keys=[self.old.hwm(tag)], args=[str(value)])

    async def lease(self, tag: str, lease_id: str, secret: str, r: IdRange) -> None:
        keys, args = self._head(tag)
        args += [self.old.leased_prefix, "600", tag, "0", lease_id, str(r.start), str(r.end - 1)]
        await self._record(keys=keys[:2], args=[*args, str(r.end), hash_secret(secret)])

    async def close(self) -> None:
        await self.client.aclose()


@pytest.fixture
async def old(settings: Settings) -> Any:
    node = OldNode(settings)
    yield node
    await node.close()


async def test_old_lists_move_in_whole_and_are_served_once(
    redis_pool: RedisPool, old: OldNode, tag: str
) -> None:
    await old.push(tag, [R("1-10"), R("11-20")])
    await redis_pool.push(tag, [R("21-30")], head=False)  # moves the old list in, ahead
    assert await redis_pool.ranges(tag) == [R("1-10"), R("11-20"), R("21-30")]
    assert not await redis_pool.client.exists(Legacy(redis_pool.keys.prefix).pool(tag))
    assert await old.pop(tag) == []  # the old node finds nothing left to take
    await old.push(tag, [R("31-40")], head=True)  # an old node's remainder, later
    popped = await redis_pool.pop(tag, 25)
    assert popped.ranges == [R("31-40"), R("1-10"), R("11-20")] and popped.dropped == []


async def test_an_old_list_of_an_earlier_incarnation_is_dropped_not_moved(
    redis_pool: RedisPool, old: OldNode, tag: str
) -> None:
    await old.push(tag, [R("1-10")])
    client = redis_pool.client
    legacy = Legacy(redis_pool.keys.prefix)
    # as if Redis restarted since: the old layout's marker names another incarnation
    for key in [k async for k in client.scan_iter(legacy.clean_prefix + "*")]:
        await client.delete(key)
    popped = await redis_pool.pop(tag)
    assert popped.ranges == [] and popped.dropped == [(tag, R("1-10"))]


async def test_a_removed_tags_old_and_new_lists_are_both_drained(
    redis_pool: RedisPool, old: OldNode, tag: str
) -> None:
    await old.push(tag, [R("1-10")])  # an old preloader's push, not taken in yet
    await redis_pool.client.rpush(redis_pool.keys.pool(tag), "11-20")
    drained = await redis_pool.take_all(tag)
    assert sorted(r.start for r in drained) == [1, 11]
    assert await old.pop(tag) == [] and (await redis_pool.pop(tag)).ranges == []


async def test_the_old_mark_counts_and_is_raised_with_the_new(
    redis_pool: RedisPool, old: OldNode, tag: str
) -> None:
    await old.raise_mark(tag, 5000)
    assert await redis_pool.high_water(tag) == 5000  # before any new key exists
    assert await redis_pool.raise_high_water(tag, 100) == 5000
    assert await redis_pool.raise_high_water(tag, 7000) == 7000
    legacy = Legacy(redis_pool.keys.prefix)
    assert await redis_pool.client.get(legacy.hwm(tag)) == "7000"  # old nodes stay fenced
    assert await redis_pool.client.get(redis_pool.keys.hwm(tag)) == "7000"


async def test_an_old_lease_is_returned_once_through_a_new_node(
    redis_pool: RedisPool, old: OldNode, tag: str, settings: Settings
) -> None:
    await old.lease(tag, "oldlease0123456789abcd", "the-secret", R("1-100"))
    store = LeaseStore(redis_pool.client, redis_pool.keys, 600, redis_pool.send, redis_pool.legacy)
    with pytest.raises(LeaseRefused) as e:
        await store.give_back("oldlease0123456789abcd", "not-the-secret", 41, tag)
    assert e.value.code == "wrong_secret"
    with pytest.raises(LeaseRefused) as e:
        await store.give_back("oldlease0123456789abcd", "the-secret", 41, "another-tag")
    assert e.value.code == "wrong_tag"
    returned = await store.give_back("oldlease0123456789abcd", "the-secret", 41, tag)
    assert returned.tag == tag and returned.tail == R("41-100")
    with pytest.raises(LeaseRefused) as e:
        await store.give_back("oldlease0123456789abcd", "the-secret", 41, tag)
    assert e.value.code == "already_returned"
    assert await redis_pool.ranges(tag) == [R("41-100")]


async def test_old_and_new_nodes_side_by_side_hand_out_every_id_once(
    settings: Settings, old: OldNode, tag: str
) -> None:
    """A rolling upgrade: old and new nodes pop and return remainders at once."""
    pools = [RedisPool.from_settings(settings) for _ in range(3)]
    olds = [old, OldNode(settings)]
    total = 400
    await old.push(tag, [IdRange(i * 10 + 1, i * 10 + 11) for i in range(total)])
    served: list[int] = []

    async def consume(n: int) -> None:
        rng = random.Random(n)
        for _ in range(30 if n % 2 else 10**6):  # old nodes stop early, as in an upgrade
            if n % 2:
                got = await olds[n % len(olds)].pop(tag, 1)
            else:
                got = (await pools[n % len(pools)].pop(tag, 1)).ranges
            if not got:
                return
            for r in got:
                cut = r.start + 1 + rng.randrange(len(r))  # serve part, give the rest back
                served.extend(range(r.start, cut))
                if cut < r.end:
                    back = [IdRange(cut, r.end)]
                    if n % 2:
                        await olds[n % len(olds)].push(tag, back, head=True)
                    else:
                        await pools[n % len(pools)].push(tag, back, head=True)
            await asyncio.sleep(0)

    try:
        await asyncio.gather(*(consume(n) for n in range(8)))
        # what the old nodes left in the old list is served by the new ones
        while got := (await pools[0].pop(tag, 10**9)).ranges:
            served.extend(i for r in got for i in range(r.start, r.end))
    finally:
        for p in pools:
            await p.close()
        await olds[1].close()
    assert len(served) == len(set(served)), "an ID was handed out twice"
    assert sorted(served) == list(range(1, total * 10 + 1))  # and none was lost


def test_new_keys_share_the_tags_slot_and_old_ones_are_named_as_before() -> None:
    keys, legacy = Keys("idpool"), Legacy("idpool")
    assert keys.pool("orders") == "idpool:{orders}:pool"
    assert legacy.pool("orders") == "idpool:pool:orders"
    assert legacy.hwm("orders") == "idpool:hwm:orders"
