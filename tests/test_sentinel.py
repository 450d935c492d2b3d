"""Redis behind Sentinel: the ``redis+sentinel://`` URL, the client it builds, and
a real failover to a lagging replica (a primary, a replica and three Sentinels
of the test's own)."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

import pytest

from idpool.pool.errors import ConfigError, StoreUnavailable
from idpool.pool.ranges import IdRange, TaggedRange
from idpool.pool.redis_pool import RedisPool, make_client
from idpool.pool.sentinel import SentinelMaster
from idpool.pool.settings import SentinelParams, Settings, parse_sentinel_url
from ops.toolkit import RedisSentinelGroup

pytestmark = pytest.mark.anyio


def test_sentinel_url_names_hosts_master_db_and_passwords() -> None:
    p = parse_sentinel_url(
        "redis+sentinel://:s%40cret@10.0.0.1:26379,10.0.0.2,[::1]:26380/orders-master/3"
        "?sentinel_password=sp"
    )
    assert p.sentinels == (("10.0.0.1", 26379), ("10.0.0.2", 26379), ("::1", 26380))
    assert (p.service, p.db, p.username, p.password, p.sentinel_password) == (
        "orders-master",
        3,
        None,
        "s@cret",
        "sp",
    )


def test_sentinel_url_defaults_and_user() -> None:
    p = parse_sentinel_url("redis+sentinel://app:pw@sentinel1/mymaster")
    assert p == SentinelParams((("sentinel1", 26379),), "mymaster", 0, "app", "pw", None)


def test_passwords_stay_out_of_the_repr() -> None:
    p = parse_sentinel_url("redis+sentinel://:datapw@h/m?sentinel_password=sentpw")
    assert "datapw" not in repr(p) and "sentpw" not in repr(p)
    s = Settings.from_env({"IDPOOL_REDIS_URL": "redis+sentinel://:datapw@h/m"})
    assert "datapw" not in repr(s)


@pytest.mark.parametrize(
    "url",
    [
        "redis+sentinel://h1:26379,h2:26379",  # no master name
        "redis+sentinel://h1:26379/",  # empty master name
        "redis+sentinel://h1:26379/m/zero",  # db not a number
        "redis+sentinel://h1:26379/m/0/extra",
        "redis+sentinel://h1:port/m",
        "redis+sentinel://h1:70000/m",
        "redis+sentinel://h1,,h2/m",  # empty host
        "redis+sentinel:///m",
        "redis+sentinel://h1/m?password=x",  # unknown parameter
        "redis+sentinel://[::1/m",
        "sentinel://h1/m",  # not a scheme idpool knows
    ],
)
def test_malformed_sentinel_urls_are_refused_naming_the_variable(url: str) -> None:
    with pytest.raises(ConfigError, match="IDPOOL_REDIS_URL"):
        Settings.from_env({"IDPOOL_REDIS_URL": url})


def test_plain_urls_have_no_sentinel_params() -> None:
    assert Settings.from_env({"IDPOOL_REDIS_URL": "redis://h:6379/0"}).sentinel_params() is None


async def test_sentinel_client_runs_every_command_at_most_once() -> None:
    s = Settings.from_env(
        {"IDPOOL_REDIS_URL": "redis+sentinel://:pw@127.0.0.1:1,127.0.0.1:2/m/2?sentinel_password=x"}
    )
    client = make_client(s)
    assert isinstance(client, SentinelMaster)
    kwargs = client.connection_pool.connection_kwargs
    assert kwargs["retry"].get_retries() == 0 and not kwargs.get("retry_on_error")
    assert (kwargs["db"], kwargs["password"], kwargs["socket_timeout"]) == (2, "pw", 2.0)
    assert kwargs["decode_responses"] is True
    for sentinel in client.connection_pool.sentinel_manager.sentinels:  # type: ignore[attr-defined]
        asked = sentinel.connection_pool.connection_kwargs
        assert asked["retry"].get_retries() == 0 and asked["password"] == "x"
        assert asked["socket_timeout"] == 2.0
    with pytest.raises(StoreUnavailable, match="IDPOOL_REDIS_URL"):
        await RedisPool(client, RedisPool.from_settings(s).keys).check()  # no Sentinel there
    await client.aclose()
    await client.aclose()  # closing twice is harmless


@pytest.mark.slow
async def test_failover_to_a_lagging_replica_is_followed_and_fenced(
    settings: Settings, tmp_path: Path, tag: str
) -> None:
    """Nodes follow Sentinel to the promoted replica without a restart; a range
    popped before the failover, which the lagging replica still lists, is never
    handed out again."""
    group = RedisSentinelGroup(tmp_path, "--appendonly", "yes", "--save", "").start()
    pool = RedisPool.from_settings(settings.with_changes(redis_url=group.url, store_timeout=1.0))
    try:
        first = [IdRange(i * 100 + 1, i * 100 + 101) for i in range(6)]
        await pool.push(tag, first, head=False)
        group.wait_replicated(group.replica(), 10)
        old = group.master()
        replica = group.lag_replica()
        popped = [(await pool.pop(tag)).range for _ in range(3)]  # the replica never sees these
        assert popped == first[:3]
        await pool.push(tag, [IdRange(1001, 1101)], head=False)  # nor this push
        assert group.replica_offset_behind() > 0
        old.kill9()
        killed = time.monotonic()
        served: list[IdRange] = []
        dropped: list[str] = []
        errors = 0
        while time.monotonic() - killed < 30:
            try:
                result = await pool.pop(tag)
            except StoreUnavailable:
                errors += 1
                await asyncio.sleep(0.1)
                continue
            dropped += result.dropped
            if result.range is None:
                break
            served.append(result.range)
        outage = time.monotonic() - killed
        assert group.port == replica.port, "Sentinel promoted the replica"
        assert errors > 0 and outage < 15, (errors, outage)
        print(f"failover: {errors} failed pops over {outage:.1f} s")
        # The promoted replica listed first[0..5]; the first script on it dropped them all.
        assert served == [], served
        assert sorted(dropped) == sorted(TaggedRange(tag, r) for r in first)
        # and it takes writes: the pool works on the new master
        await pool.push(tag, [IdRange(2001, 2101)], head=False)
        assert (await pool.pop(tag)).range == IdRange(2001, 2101)
    finally:
        await pool.close()
        group.stop()
