from __future__ import annotations

import asyncio
import logging
import math
from collections.abc import Sequence

import pytest

from idpool.pool.claims import Claim, LedgerClaims
from idpool.pool.clock import FakeClock
from idpool.pool.errors import StoreUnavailable
from idpool.pool.ledger import Ledger
from idpool.pool.preloader import Preloader
from idpool.pool.ranges import IdRange
from idpool.pool.redis_pool import RedisPool
from idpool.pool.settings import Settings
from idpool.pool.values import PushResult

pytestmark = pytest.mark.anyio


async def test_refill_tops_up_to_depth_with_one_claim(
    settings: Settings, ledger: Ledger, redis_pool: RedisPool, tag: str
) -> None:
    row = await ledger.add_tag(tag, step=100, start=1)
    pre = Preloader(settings.with_changes(pool_depth=4), ledger, redis_pool)
    report = await pre.refill_tag(row)
    assert [r.to_text() for r in report.pushed] == ["1-100", "101-200", "201-300", "301-400"]
    assert (await ledger.get_tag(tag)).max_id == 401
    await redis_pool.pop(tag)
    report = await pre.refill_tag(row)
    assert [r.to_text() for r in report.pushed] == ["401-500"]
    assert (await pre.refill_tag(row)).skipped == "full"
    assert await redis_pool.high_water(tag) == 501


async def test_one_preloader_leads_the_others_stand_by(
    settings: Settings, ledger: Ledger, redis_pool: RedisPool, tag: str
) -> None:
    await ledger.add_tag(tag, step=10, start=1)
    s = settings.with_changes(pool_depth=5)
    preloaders = [Preloader(s, ledger, redis_pool) for _ in range(8)]
    for _ in range(3):
        await asyncio.gather(*(p.refill_all() for p in preloaders))
    assert [p.leading for p in preloaders].count(True) == 1
    assert await redis_pool.depth(tag) == 5
    ranges = await redis_pool.ranges(tag)
    assert ranges == IdRange(1, 51).split(10)
    leader = next(p for p in preloaders if p.leading)
    await leader.close()  # hands the lease on at once
    await redis_pool.pop(tag)
    standby = next(p for p in preloaders if p is not leader)
    await standby.refill_all()
    assert standby.leading and await redis_pool.depth(tag) == 5


class AmbiguousPush(RedisPool):
    """The push lands, but the answer is lost (a timeout after the server ran it)."""

    pushes = 0

    async def push(
        self, tag: str, ranges: Sequence[IdRange], *, head: bool, leader: str = ""
    ) -> PushResult:
        AmbiguousPush.pushes += 1
        await super().push(tag, ranges, head=head, leader=leader)
        raise StoreUnavailable("redis", "Timeout reading from socket")


async def test_push_with_unknown_outcome_is_abandoned_not_retried(
    settings: Settings, ledger: Ledger, tag: str
) -> None:
    row = await ledger.add_tag(tag, step=10, start=1)
    plain = RedisPool.from_settings(settings)
    pool = AmbiguousPush(plain.client, plain.keys)
    pre = Preloader(settings.with_changes(pool_depth=2), ledger, pool)
    report = await pre.refill_tag(row)
    assert AmbiguousPush.pushes == 1
    assert [r.to_text() for r in report.abandoned] == ["1-10", "11-20"]
    assert report.pushed == []
    ranges = await pool.ranges(tag)
    assert ranges == [IdRange(1, 11), IdRange(11, 21)]  # landed once, never twice
    await pool.close()


async def test_scheduled_ticks_fill_every_tag_and_close_waits(
    settings: Settings, ledger: Ledger, redis_pool: RedisPool, tag: str
) -> None:
    await ledger.add_tag(tag, step=10, start=1)
    pre = Preloader(settings.with_changes(pool_depth=3, preload_interval=0.05), ledger, redis_pool)
    pre.start()
    for _ in range(100):
        if await redis_pool.depth(tag) == 3:
            break
        await asyncio.sleep(0.02)
    await pre.close()
    await pre.close()  # harmless twice
    assert await redis_pool.depth(tag) == 3
    row = await ledger.get_tag(tag)
    assert row.max_id == 31  # nothing claimed that is not in the list


async def test_mysql_down_skips_the_tick(settings: Settings, redis_pool: RedisPool) -> None:
    from ops.toolkit import TcpProxy

    from .conftest import TEST_DATABASE

    proxy = TcpProxy(3306)
    url = f"mysql://root@127.0.0.1:{proxy.port}/{TEST_DATABASE}"
    ledger = await Ledger.connect(settings.with_changes(mysql_url=url))
    proxy.cut()
    pre = Preloader(settings, ledger, redis_pool)
    assert await pre.refill_all() == []
    await ledger.close()


async def test_depth_follows_the_consumption_rate(
    settings: Settings, ledger: Ledger, redis_pool: RedisPool, tag: str, clock: FakeClock
) -> None:
    """Enough ranges for pool_seconds of supply at the recent rate, at least pool_depth."""
    row = await ledger.add_tag(tag, step=100, start=1)
    s = settings.with_changes(pool_depth=2, pool_seconds=10, step_seconds=0, rate_window=0.5)
    pre = Preloader(s, ledger, redis_pool, clock=clock)
    assert len((await pre.refill_tag(row)).pushed) == 2  # no rate yet: the minimum
    await clock.advance(0.5)
    await redis_pool.report_issued({tag: 1000})  # nodes handed out 1,000 IDs in ~0.5 s
    report = await pre.refill_tag(row)
    stats = await redis_pool.read_stats(tag)
    rate = float(stats["rate"])
    assert 1000 < rate < 2100
    expected = math.ceil(rate * 10 / 100)  # 10 s of supply in ranges of 100
    assert int(stats["target_depth"]) == expected
    assert await redis_pool.depth(tag) == expected
    assert len(report.pushed) == expected - 2


async def test_dynamic_step_doubles_halves_and_persists(
    settings: Settings, ledger: Ledger, redis_pool: RedisPool, tag: str
) -> None:
    row = await ledger.add_tag(tag, step=100, start=1, max_step=300)
    pre = Preloader(settings.with_changes(step_seconds=60), ledger, redis_pool)
    await redis_pool.report_lifetime(tag, 100, 10.0)  # a range lasted 10 s < 60 s
    await pre.refill_tag(row)
    row = await ledger.get_tag(tag)
    assert row.step == 200  # persisted in the ledger
    assert (await redis_pool.read_stats(tag))["step"] == "200"
    await redis_pool.report_lifetime(tag, 200, 10.0)
    await pre.refill_tag(row)
    assert (await ledger.get_tag(tag)).step == 300  # capped by max_step
    await pre.refill_tag(await ledger.get_tag(tag))  # no new observation: no change
    assert (await ledger.get_tag(tag)).step == 300
    # a restarted preloader claims with the persisted step
    while (await redis_pool.pop(tag)).range is not None:
        pass
    await redis_pool.resign(pre.owner)  # as a stop does: the lease is free at once
    fresh = Preloader(settings.with_changes(step_seconds=60), ledger, redis_pool)
    pushed = (await fresh.refill_tag(await ledger.get_tag(tag))).pushed
    assert pushed and all(len(r) == 300 for r in pushed)
    await redis_pool.resign(fresh.owner)
    await redis_pool.report_lifetime(tag, 300, 400.0)  # lasted > 2 x 60 s
    await pre.refill_tag(await ledger.get_tag(tag))
    assert (await ledger.get_tag(tag)).step == 150
    await redis_pool.report_lifetime(tag, 150, 1000.0)
    await pre.refill_tag(await ledger.get_tag(tag))
    assert (await ledger.get_tag(tag)).step == 100  # not below min_step (the initial step)


async def test_refill_soon_fills_without_waiting_for_a_tick(
    settings: Settings, ledger: Ledger, redis_pool: RedisPool, tag: str, clock: FakeClock
) -> None:
    await ledger.add_tag(tag, step=10, start=1)
    pre = Preloader(settings.with_changes(pool_depth=3), ledger, redis_pool, clock=clock)
    pre.refill_soon(tag)  # not the active preloader (yet): left to the one that is
    await asyncio.sleep(0.05)
    assert await redis_pool.depth(tag) == 0
    await pre.refill_all()  # takes the lease and fills the list
    assert pre.leading and (await ledger.get_tag(tag)).max_id == 31
    await redis_pool.pop(tag, 30)  # a surge empties it
    pre.refill_soon(tag)
    await clock.advance(0.9)
    pre.refill_soon(tag)  # rate-limited: one refill a second
    await asyncio.wait(set(pre._urgent))
    await redis_pool.pop(tag, 30)
    await clock.advance(0.1)
    pre.refill_soon(tag)  # a second later: refilled again
    await pre.close()  # waits for the urgent refill
    assert await redis_pool.depth(tag) == 3
    assert (await ledger.get_tag(tag)).max_id == 91


class CountingPool:
    """The real pool, recording which tags each tick reads."""

    def __init__(self, pool: RedisPool) -> None:
        self.pool = pool
        self.visited: list[str] = []

    async def summaries(self, tags: Sequence[str]) -> object:
        self.visited += tags
        return await self.pool.summaries(tags)

    def __getattr__(self, name: str) -> object:
        return getattr(self.pool, name)


async def test_a_tick_visits_only_the_tags_that_moved(
    settings: Settings, ledger: Ledger, redis_pool: RedisPool, tag: str
) -> None:
    # Issue 11: every preloader visited every tag every second (six round trips
    # each): 1,000 idle tags cost a node half a core.
    tags = [f"{tag}-{i:03d}" for i in range(300)]
    for name in tags:
        await ledger.add_tag(name, step=10, start=1)
    counting = CountingPool(redis_pool)
    s = settings.with_changes(pool_depth=2, step_seconds=0)
    pre = Preloader(s, ledger, counting, LedgerClaims(ledger, redis_pool))  # type: ignore[arg-type]
    await pre.refill_all()  # takes the lease: the first sweep fills every list
    assert set(tags) <= set(counting.visited)
    assert all(n == 2 for n in (await redis_pool.depths(tags)).values())
    counting.visited.clear()
    await pre.refill_all()
    await pre.refill_all()
    assert counting.visited == []  # nothing moved: nothing read per tag
    await redis_pool.pop(tags[7])  # a node takes a range
    await redis_pool.report_issued({tags[9]: 5})  # another hands out IDs
    await pre.refill_all()
    assert sorted(counting.visited) == [tags[7], tags[9]]
    assert await redis_pool.depth(tags[7]) == 2  # refilled
    await pre.close()


async def test_the_rate_is_ids_handed_out_not_ranges_taken(
    settings: Settings, ledger: Ledger, redis_pool: RedisPool, tag: str, clock: FakeClock
) -> None:
    # Issue 11: 3 IDs served after a restart made it claim 484,000 and publish
    # "266 IDs/s": ranges taken were counted as consumption.
    await ledger.add_tag(tag, step=100_000, start=1)
    s = settings.with_changes(pool_depth=2, pool_seconds=600, step_seconds=0, rate_window=1.0)
    pre = Preloader(s, ledger, redis_pool, clock=clock)
    await pre.refill_all()
    for _ in range(3):
        await redis_pool.pop(tag)  # nodes take whole ranges of 100,000 ...
        await redis_pool.report_issued({tag: 1})  # ... and hand out one ID each
        await clock.advance(0.4)
        await pre.refill_all()
    stats = await redis_pool.read_stats(tag)
    assert float(stats["rate"]) < 10  # 3 IDs in about a second; ranges taken read 250,000/s
    assert stats["target_depth"] == "2"  # the minimum: no supply sized for a burst
    assert (await ledger.get_tag(tag)).max_id == 1 + 5 * 100_000  # 2 + the 3 taken
    await pre.close()


async def test_a_preloader_frozen_past_its_lease_claims_and_pushes_nothing_more(
    settings: Settings, ledger: Ledger, redis_pool: RedisPool, tag: str
) -> None:
    """Frozen (SIGSTOP) past its lease mid-tick, a preloader wakes while another
    fills the lists: it asks again before each claim, and its push lands only if it
    still holds the lease, so what it claimed while losing it is waste, not overfill."""
    row = await ledger.add_tag(tag, step=10, start=1)
    s = settings.with_changes(pool_depth=2)
    stale, active = Preloader(s, ledger, redis_pool), Preloader(s, ledger, redis_pool)
    await stale.refill_all()
    assert stale.leading and await redis_pool.depth(tag) == 2
    await redis_pool.client.delete(redis_pool.keys.preloader)  # its lease expired, frozen
    await active.refill_all()
    assert active.leading
    while (await redis_pool.pop(tag)).range is not None:
        pass
    claimed = (await ledger.get_tag(tag)).max_id
    report = await stale.refill_tag(row)  # it wakes with its tags already chosen
    assert report.skipped == "lease lost" and not stale.leading
    assert (await ledger.get_tag(tag)).max_id == claimed  # no claim
    # Lost between its check and its push: the claim is given up, never pushed.
    await redis_pool.resign(active.owner)
    claim = stale.claims.claim

    async def claim_while_the_lease_moves(tag: str, ranges: int = 1) -> Claim:
        got = await claim(tag, ranges)
        await redis_pool.client.delete(redis_pool.keys.preloader)
        assert await redis_pool.lead(active.owner, 10)
        return got

    stale.claims.claim = claim_while_the_lease_moves  # type: ignore[method-assign]
    report = await stale.refill_tag(row)
    assert report.pushed == [] and [r.to_text() for r in report.abandoned] == ["21-30", "31-40"]
    assert await redis_pool.depth(tag) == 0 and not stale.leading
    assert stale.waste.of(tag)["lease_lost"] == 20


async def test_a_tag_disabled_removed_or_run_out_since_the_sweep_is_skipped_quietly(
    settings: Settings,
    ledger: Ledger,
    redis_pool: RedisPool,
    tag: str,
    caplog: pytest.LogCaptureFixture,
) -> None:
    """Issue 29: the sweep's cached row still said enabled, the claim was refused,
    and the preloader logged event=preload_failed reason='X' every tick until the
    next sweep: an operator's disable or remove read as an outage."""
    pre = Preloader(settings.with_changes(pool_depth=2), ledger, redis_pool)
    disabled, removed, full = f"{tag}d", f"{tag}r", f"{tag}f"
    rows = [await ledger.add_tag(t, step=10, start=1) for t in (disabled, removed)]
    rows.append(await ledger.add_tag(full, step=10, start=1, end_id=11))
    await ledger.set_disabled(disabled, True)
    await ledger.remove_tag(removed)
    await ledger.claim(full, 10)  # every ID of the bounded tag claimed elsewhere
    caplog.set_level(logging.INFO, logger="idpool.preloader")
    reports = [await pre.refill_tag(row) for row in rows]  # the rows as cached before
    assert [r.skipped for r in reports] == ["disabled", "removed", "exhausted"]
    assert not [r for r in caplog.records if r.levelno >= logging.WARNING], caplog.text
    assert "event=preload_failed" not in caplog.text
    assert all(not r.pushed for r in reports)
